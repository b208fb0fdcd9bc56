//go:build ucx

package ucx_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/transfer"
	"github.com/kvstrata/kvstrata/transfer/transfertest"
	"github.com/kvstrata/kvstrata/transfer/ucx"
)

// Peers that die: the other side of the connection is a separate process
// (this test binary, re-run as a helper), killed with SIGKILL in the middle
// of a transfer. The survivor must fail the request promptly, never hang,
// and hand back every buffer it lent UCX.

const killBlocks, killSize = 16, 4 << 20

// TestHelperProcess is the peer process; it does nothing in a normal run.
func TestHelperProcess(t *testing.T) {
	role, tls := os.Getenv("KV_UCX_HELPER"), os.Getenv("KV_UCX_TLS")
	switch role {
	case "server": // serve static blocks; print the address; run until killed
		ln, err := ucx.New(ucx.Options{TLS: tls}).Listen("127.0.0.1:0", transfertest.NewStatic(killBlocks, killSize))
		if err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		fmt.Println("addr:", ln.Addr())
		select {}
	case "client": // get from KV_UCX_ADDR, dying as block 1 arrives
		c, err := ucx.New(ucx.Options{TLS: tls}).Dial(context.Background(), os.Getenv("KV_UCX_ADDR"))
		if err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		keys := make([]index.Key, killBlocks)
		for i := range keys {
			keys[i] = transfertest.Key(index.Hash(i + 1))
		}
		_ = c.Get(context.Background(), keys, &dying{transfertest.NewCollector(killBlocks)})
		os.Exit(2) // not reached
	}
}

// dying kills its own process when asked for block 1's buffer.
type dying struct{ *transfertest.Collector }

func (d *dying) Buffer(i int, h index.Header) []byte {
	if i == 1 {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	}
	return d.Collector.Buffer(i, h)
}

// helper starts this binary as the peer process in role.
func helper(t *testing.T, role, tls, addr string) (*exec.Cmd, *bufio.Reader) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$")
	cmd.Env = append(os.Environ(), "KV_UCX_HELPER="+role, "KV_UCX_TLS="+tls, "KV_UCX_ADDR="+addr)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd, bufio.NewReader(out)
}

func TestServerProcessKilledMidTransfer(t *testing.T) {
	for _, c := range tlsChoices {
		t.Run(c.name, func(t *testing.T) {
			cmd, out := helper(t, "server", c.tls, "")
			line, err := out.ReadString('\n')
			if !strings.HasPrefix(line, "addr: ") {
				t.Fatalf("helper server said %q (%v)", line, err)
			}
			conn := transfertest.Dial(t, ucx.New(ucx.Options{TLS: c.tls}), strings.TrimSpace(strings.TrimPrefix(line, "addr: ")))
			keys := transfertest.NewStatic(killBlocks, 0).Keys
			col := &killing{Collector: transfertest.NewCollector(killBlocks), kill: func() { _ = cmd.Process.Kill() }}
			began := time.Now()
			err = conn.Get(context.Background(), keys, col)
			if took := time.Since(began); took > 5*time.Second {
				t.Errorf("Get took %v to fail after the server died", took)
			}
			if !errors.Is(err, transfer.ErrClosed) {
				t.Fatalf("Get from a server killed mid-transfer = %v, want an error wrapping ErrClosed", err)
			}
			if col.Reported() > 1 {
				t.Errorf("%d blocks reported from a server killed at block 1", col.Reported())
			}
			t.Log(err)
		})
	}
}

// killing kills the server when asked for block 1's buffer.
type killing struct {
	*transfertest.Collector
	kill func()
}

func (k *killing) Buffer(i int, h index.Header) []byte {
	if i == 1 {
		k.kill()
	}
	return k.Collector.Buffer(i, h)
}

func TestClientProcessKilledMidTransfer(t *testing.T) {
	for _, c := range tlsChoices {
		t.Run(c.name, func(t *testing.T) {
			mem := transfertest.NewMemory()
			for i := range killBlocks {
				mem.Store(transfertest.MakeBlock(index.Hash(i+1), killSize))
			}
			ln, err := ucx.New(ucx.Options{TLS: c.tls}).Listen("127.0.0.1:0", mem)
			if err != nil {
				t.Fatal(err)
			}
			cmd, _ := helper(t, "client", c.tls, ln.Addr())
			err = cmd.Wait()
			if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || ws.Signal() != syscall.SIGKILL {
				t.Fatalf("helper client ended with %v, want it killed mid-transfer", err)
			}
			// The session notices the socket close at once; the listener
			// still serves, and closing it hands back every block.
			wantGet(t, c.tls, ln.Addr())
			began := time.Now()
			if err := ln.Close(); err != nil {
				t.Errorf("Listener.Close: %v", err)
			}
			if took := time.Since(began); took > 5*time.Second {
				t.Errorf("Listener.Close took %v", took)
			}
			if n := mem.Pinned(); n != 0 {
				t.Errorf("%d opened blocks were never released", n)
			}
		})
	}
}

// wantGet checks that the listener at addr serves a fresh connection.
func wantGet(t *testing.T, tls, addr string) {
	t.Helper()
	c, err := ucx.New(ucx.Options{TLS: tls}).Dial(context.Background(), addr)
	if err != nil {
		t.Fatalf("Dial after the peer died: %v", err)
	}
	defer c.Close()
	col := transfertest.NewCollector(1)
	if err := c.Get(context.Background(), []index.Key{transfertest.Key(1)}, col); err != nil || col.Errs[0] != nil {
		t.Fatalf("Get after the peer died: %v, %v", err, col.Errs[0])
	}
}
