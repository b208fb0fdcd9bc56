package main

import (
	"context"
	be "encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/engine/kvevents"
)

// zmtpProbe is the bytes of the probe that found the defect: a ZMTP
// greeting one byte short, then a frame header announcing 2^64-1 bytes.
// zmq4 refuses that length (over 2^63-1), but left the connection open.
var zmtpProbe = slices.Concat([]byte{0xff}, make([]byte, 8), []byte{0x7f, 3, 0}, []byte("NULL"),
	make([]byte, 16), make([]byte, 31), []byte{6, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})

// zmtpHugeFrame is a well-formed greeting and READY as a peer of type typ,
// then a message frame announcing 2^63-1 bytes: zmq4 made a slice of it,
// and the runtime's panic killed the process.
func zmtpHugeFrame(typ string) []byte {
	g := make([]byte, 64)
	g[0], g[9], g[10] = 0xff, 0x7f, 3
	copy(g[12:], "NULL")
	body := append([]byte{5}, "READY"...)
	body = append(append(body, 11), "Socket-Type"...)
	body = append(be.BigEndian.AppendUint32(body, uint32(len(typ))), typ...)
	return slices.Concat(g, []byte{0x04, byte(len(body))}, body, be.BigEndian.AppendUint64([]byte{0x02}, 1<<63-1))
}

// TestWorkerSurvivesHostileKVEventsPeers: a peer that connects to a
// worker's KV events PUB or replay port and announces a frame of 2^63-1
// bytes has its connection closed; the worker process lives on, and a
// subscriber that comes after hears its events.
func TestWorkerSurvivesHostileKVEventsPeers(t *testing.T) {
	w := startWorkerProcess(t, "", "--speedup", "20")
	for _, port := range []struct{ name, ep, typ string }{{"PUB", w.events, "SUB"}, {"replay", w.replay, "DEALER"}} {
		for _, h := range []struct {
			name   string
			stream []byte
		}{{"huge frame", zmtpHugeFrame(port.typ)}, {"probe", zmtpProbe}} {
			name, stream := h.name, h.stream
			c, err := net.Dial("tcp", strings.TrimPrefix(port.ep, "tcp://"))
			if err != nil {
				t.Fatal(err)
			}
			go c.Write(stream)
			c.SetReadDeadline(time.Now().Add(30 * time.Second))
			if _, err := io.Copy(io.Discard, c); err != nil && !errors.Is(err, syscall.ECONNRESET) {
				t.Fatalf("%s port, %s: the connection was not closed before its 30 s deadline: %v", port.name, name, err)
			}
			c.Close()
			select {
			case err := <-w.exited:
				t.Fatalf("%s port, %s: the worker exited: %v\n%s", port.name, name, err, w.log)
			default:
			}
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var heard atomic.Int64
	s, err := kvevents.NewSubscriber(kvevents.SubscriberConfig{Endpoint: w.events, ReplayEndpoint: w.replay})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx, func(int64, *kvevents.Batch) { heard.Add(1) }) }()
	for i := 0; heard.Load() == 0; i++ { // a PUB drops what it sends before a subscriber joins
		workerComplete(t, w, fmt.Sprintf("%d %s", i, workerPrompt), 1)
		select {
		case <-ctx.Done():
			t.Fatalf("no KV events heard before the test's 60 s deadline\n%s", w.log)
		case <-time.After(50 * time.Millisecond):
		}
	}
	cancel()
	<-done
	if st := s.Stats(); st.BadPeers != 0 {
		t.Errorf("subscriber stats %+v", st)
	}
	select {
	case err := <-w.exited:
		t.Fatalf("the worker exited: %v\n%s", err, w.log)
	default:
	}
}
