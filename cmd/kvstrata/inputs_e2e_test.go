package main

import (
	"bytes"
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/api/client"
	"github.com/kvstrata/kvstrata/index"
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
