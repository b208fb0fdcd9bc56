package main

import (
	"bufio"
	"context"
	le "encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/internal/freeport"
	"github.com/kvstrata/kvstrata/transfer"
	"github.com/kvstrata/kvstrata/transfer/tcp"
)

// The floods of clients that stall mid-request, against a real node: while
// they hold their connections, well-behaved clients keep getting answers
// before their 5 s deadline, and the node's memory stays bounded.

// floodStallSET starts a SET that announces a 16 MiB value and sends none.
const floodStallSET = "*3\r\n$3\r\nSET\r\n$6\r\nstall0\r\n$16777216\r\n"

// floodDial opens n connections that each send part and then stall.
func floodDial(t *testing.T, addr string, n int, part []byte) []net.Conn {
	t.Helper()
	conns := make([]net.Conn, 0, n)
	for range n {
		nc, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("flood connection %d: %v", len(conns), err)
		}
		t.Cleanup(func() { nc.Close() })
		if _, err := nc.Write(part); err != nil {
			t.Fatal(err)
		}
		conns = append(conns, nc)
	}
	return conns
}

// stalledPut is a data-plane hello and a put that announces one block of
// size bytes, followed by the block's first sent bytes (the wire format of
// transfer/tcp's doc.go).
func stalledPut(i, size, sent int) []byte {
	b := []byte("KVST\x01\x00\x00\x00")    // hello, version 1
	b = append(b, 2, 0, 0, 0, 1, 0, 0, 0)  // put of 1 block
	b = le.LittleEndian.AppendUint64(b, 7) // key: namespace, hash
	b = le.LittleEndian.AppendUint64(b, uint64(900000+i))
	b = le.LittleEndian.AppendUint64(b, 0) // parent
	b = le.LittleEndian.AppendUint64(b, 0) // sum
	b = le.LittleEndian.AppendUint32(b, uint32(size))
	b = append(b, 0, 0, 0, 0) // flags, status, msglen
	return append(b, make([]byte, sent)...)
}

// respAnswers connects afresh, SETs and GETs key, retrying while the node
// is at its connection limit, all before a 5 s deadline.
func respAnswers(addr, key string) error {
	deadline := time.Now().Add(5 * time.Second)
	for {
		nc, err := net.DialTimeout("tcp", addr, time.Until(deadline))
		if err != nil {
			return err
		}
		nc.SetDeadline(deadline)
		br := bufio.NewReader(nc)
		fmt.Fprintf(nc, "*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$2\r\nok\r\n*2\r\n$3\r\nGET\r\n$%d\r\n%s\r\n", len(key), key, len(key), key)
		set, err := br.ReadString('\n')
		if strings.HasPrefix(set, "-ERR max number of clients") {
			nc.Close()
			time.Sleep(50 * time.Millisecond)
			continue
		}
		hdr, _ := br.ReadString('\n')
		val, _ := br.ReadString('\n')
		nc.Close()
		if err != nil || set != "+OK\r\n" || hdr != "$2\r\n" || val != "ok\r\n" {
			return fmt.Errorf("SET/GET %s: %q %q %q, %v", key, set, hdr, val, err)
		}
		return nil
	}
}

// dataAnswers puts a 1 MiB block over a fresh data-plane connection and
// gets it back, before a 5 s deadline.
func dataAnswers(addr string, i int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := tcp.New(tcp.Options{}).Dial(ctx, addr)
	if err != nil {
		return err
	}
	defer c.Close()
	b := transfer.Block{Header: index.Header{Key: index.Key{NS: 7, Hash: index.Hash(i + 1)}}, Data: blockData(i, 1<<20)}
	b.Size, b.Sum = uint32(len(b.Data)), index.Checksum(b.Data)
	errs, err := c.Put(ctx, []transfer.Block{b})
	if err != nil {
		return err
	}
	return errs[0]
}

// waitRESPClients waits until the node serves n RESP connections, by its
// metrics.
func waitRESPClients(t *testing.T, p *proc, n int) {
	t.Helper()
	want := fmt.Sprintf("kvstrata_resp_connected_clients %d\n", n)
	deadline := time.Now().Add(60 * time.Second)
	var last string
	for time.Now().Before(deadline) {
		if resp, err := http.Get("http://" + p.http + "/metrics"); err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if strings.Contains(string(body), want) {
				return
			}
			if i := strings.Index(string(body), "\nkvstrata_resp_connected_clients "); i >= 0 {
				last, _, _ = strings.Cut(string(body[i+1:]), "\n")
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("the node does not serve %d RESP connections after 60 s (%s)\n%s", n, last, p.log)
}

// rssBytes is a process's resident memory.
func rssBytes(t *testing.T, pid int) int64 {
	t.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	t.Fatal("no VmRSS")
	return 0
}

// As many stalled RESP SETs as the node takes connections, and 70 stalled
// 4 MiB data-plane puts, more than its 64 MiB DRAM tier holds, lock no one
// out: RESP and data-plane clients keep being answered. (The node is built
// with the race detector, which makes it accept slowly: the limit is 128
// connections here, 1,024 in the measurements.)
func TestFloodsOfStalledRequestsStarveNoClient(t *testing.T) {
	const conns = 128
	dataAddr := freeport.Addr(t)
	p := startNode(t, t.TempDir(), "--listen-data", dataAddr, "--limits-max-connections", strconv.Itoa(conns))
	floodDial(t, p.resp, conns, []byte(floodStallSET))
	for i := range 70 {
		floodDial(t, dataAddr, 1, stalledPut(i, 4<<20, 1))
	}
	waitRESPClients(t, p, conns)
	for i := range 5 {
		if err := respAnswers(p.resp, fmt.Sprint("good", i)); err != nil {
			t.Fatalf("RESP client %d was not answered before its 5 s deadline: %v", i, err)
		}
		if err := dataAnswers(dataAddr, i); err != nil {
			t.Fatalf("data-plane put %d was not stored before its 5 s deadline: %v", i, err)
		}
	}
}

// Unfinished 7 × 16 MiB MSETs hold at most limits.max-pending-resp-bytes:
// the node stops reading them there, and its resident memory stays near it.
func TestUnfinishedMSETsHoldBoundedMemory(t *testing.T) {
	const pending = 160 << 20
	// Values of 16 MiB leave commands of up to 128 MiB (pending less one
	// value, at most 128 MiB): the 7 × 16 MiB MSETs are held, not refused.
	p := startNode(t, t.TempDir(), "--limits-max-pending-resp-bytes", "160MiB", "--limits-max-value-size", "16MiB")
	before := rssBytes(t, p.cmd.Process.Pid)
	value := make([]byte, 16<<20)
	for range 12 {
		nc := floodDial(t, p.resp, 1, nil)[0]
		go func() { // blocks once the node stops reading; closed at the end
			fmt.Fprintf(nc, "*15\r\n$4\r\nMSET\r\n")
			for k := range 7 {
				fmt.Fprintf(nc, "$2\r\nk%d\r\n$%d\r\n", k, len(value))
				if k == 6 { // all of it but the last byte
					nc.Write(value[:len(value)-1])
					return
				}
				if _, err := nc.Write(value); err != nil {
					return
				}
				nc.Write([]byte("\r\n"))
			}
		}()
	}
	time.Sleep(2 * time.Second) // let the node read what it will
	grown := rssBytes(t, p.cmd.Process.Pid) - before
	t.Logf("resident memory grew by %d MiB under 12 unfinished 7 × 16 MiB MSETs", grown>>20)
	// The race detector's shadow memory about doubles what the heap holds,
	// and the garbage collector lets the heap run ahead of what is live
	// before it collects: a bound of four times the budget still tells a
	// node that stops reading (≈ 3×) from one that does not (12 × 112 MiB,
	// doubled: over 2.5 GiB).
	if limit := int64(4*pending + 64<<20); grown > limit {
		t.Errorf("resident memory grew by %d MiB, over %d MiB", grown>>20, limit>>20)
	}
	if err := respAnswers(p.resp, "good"); err != nil {
		t.Fatalf("a RESP client was not answered before its 5 s deadline: %v", err)
	}
}
