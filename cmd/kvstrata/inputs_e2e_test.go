package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/api/client"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/internal/freeport"
)

// TestCallsDuringARestartSucceedOnceTheNodeIsBack kills a node under a
// workload of puts and gets, over the data plane and over gRPC, and starts
// it again: every call issued while it is down returns without an error
// once it is back, and the caller never retries. (The client once gave up
// after about 350 ms, and reported a refused data-plane dial as Unknown.)
func TestCallsDuringARestartSucceedOnceTheNodeIsBack(t *testing.T) {
	p := startNode(t, t.TempDir())
	// A budget far above a restart's 1-3 s, so that a loaded machine does
	// not fail the test; the default (5 s) is what the figures in the log
	// are compared with.
	opts := client.Options{RetryBudget: 30 * time.Second, Timeout: 60 * time.Second}
	grpcOpts := opts
	grpcOpts.NoDataPlane = true
	clients := map[string]*client.Client{"data-plane": p.client(opts), "grpc": p.client(grpcOpts)}

	var back atomic.Int64 // unix nanos when the node was ready again; 0 before
	var wg sync.WaitGroup
	stop := make(chan struct{})
	type tally struct {
		calls, afterBack int
		longest          time.Duration // the longest call
		settled          time.Duration // from ready to the end of the last call begun before it
		err              error
	}
	var mu sync.Mutex // guards the tallies
	tallies := map[string]*tally{}
	for ns, name := range []string{"data-plane", "grpc"} {
		c, tl := clients[name], &tally{}
		tallies[name] = tl
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				began := time.Now()
				key := index.Key{NS: index.NamespaceID(100 + ns), Hash: index.Hash(i)}
				data := blockData(i, 16<<10)
				err := c.Put(context.Background(), []client.Block{{Key: key, Data: data}})
				var res []client.Result
				if err == nil {
					res, err = c.Get(context.Background(), []index.Key{key})
				}
				if err == nil && res[0].Found && !bytes.Equal(res[0].Data, data) {
					t.Errorf("%s: block %v came back changed", name, key)
				}
				mu.Lock()
				tl.calls++
				tl.longest = max(tl.longest, time.Since(began))
				if b := back.Load(); b != 0 && began.UnixNano() >= b {
					tl.afterBack++
				} else if b != 0 {
					tl.settled = time.Since(time.Unix(0, b))
				}
				tl.err = err
				mu.Unlock()
				if err != nil {
					return
				}
			}
		}()
	}

	time.Sleep(300 * time.Millisecond) // the workload is running
	p.kill()
	killed := time.Now()
	time.Sleep(time.Second) // calls meet a node that is not there
	p.restart()
	back.Store(time.Now().UnixNano())
	t.Logf("node down for %v (killed, 1 s, then started until ready)", time.Since(killed).Round(time.Millisecond))
	deadline := time.Now().Add(30 * time.Second)
	for done := false; !done && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		mu.Lock()
		done = true
		for _, tl := range tallies {
			done = done && (tl.afterBack >= 20 || tl.err != nil)
		}
		mu.Unlock()
	}
	close(stop)
	wg.Wait()
	for name, tl := range tallies {
		if tl.err != nil {
			t.Errorf("%s: a call during the restart failed: %v", name, tl.err)
			continue
		}
		if tl.afterBack == 0 {
			t.Errorf("%s: no call completed after the node was back", name)
		}
		t.Logf("%s: %d calls, %d begun after the node was back; the longest took %v; the calls waiting at ready were done %v after it",
			name, tl.calls, tl.afterBack, tl.longest.Round(time.Millisecond), tl.settled.Round(time.Millisecond))
	}
}

// TestEveryConfigurationProblemIsFoundBeforeAnythingStarts: a NaN
// watermark was accepted, and a port over 65535 and a DRAM tier larger than
// the machine failed only after Raft had started, with exit status 1.
func TestEveryConfigurationProblemIsFoundBeforeAnythingStarts(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	cmd := exec.Command(binary, "serve", "--data-dir", dir, "--dram-high-watermark", "NaN",
		"--listen-resp", "127.0.0.1:99999", "--dram-capacity", "999TiB", "--cluster-raft-addr", freeport.Addr(t))
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 {
		t.Fatalf("exit %v, want status 2:\n%s", err, out)
	}
	for _, want := range []string{`dram.high-watermark: "NaN" is not a finite number`,
		`listen.resp "127.0.0.1:99999" has port 99999, over 65535`,
		"dram.capacity 999TiB (1098412116148224 bytes) is more than this machine's memory"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("output does not say %q:\n%s", want, out)
		}
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("the data directory was created (%v): something started", err)
	}
}

// TestPrintedConfigIsAConfigFile: what --print-config writes, --config
// reads back to the same configuration.
func TestPrintedConfigIsAConfigFile(t *testing.T) {
	dir := t.TempDir()
	print := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(binary, append([]string{"serve", "--print-config", "--data-dir", dir}, args...)...).Output()
		if err != nil {
			t.Fatalf("print-config %v: %v\n%s", args, err, out)
		}
		var values []string // each line without its source comment
		for _, line := range strings.Split(string(out), "\n") {
			value, _, _ := strings.Cut(line, "  # ")
			values = append(values, value)
		}
		return strings.Join(values, "\n")
	}
	first := print("--cluster-name", `007 "quoted" \ back`, "--s3-prefix", "1e5", "--dram-low-watermark", "1e-05")
	file := filepath.Join(dir, "printed.toml")
	if err := os.WriteFile(file, []byte(first), 0o644); err != nil {
		t.Fatal(err)
	}
	if again := print("--config", file); again != first {
		t.Fatalf("the printed config read back differs:\n%s\n---\n%s", first, again)
	}
}
