package main

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/api/client"
	pb "github.com/kvstrata/kvstrata/api/v1"
)

// End-to-end tests of the worker registry with real processes: a cache
// node, sim workers that register themselves (`kvstrata worker
// --register`), and two frontend replicas that discover them
// (`kvstrata frontend --discover`) and nothing else.

// registryTTL is the workers' lease in these tests: long enough that a
// worker's failure is seen well before it ends.
const registryTTL = 20 * time.Second

// startRegisteredWorker starts a sim worker that registers with the cache
// node at cache.
func startRegisteredWorker(t *testing.T, cache string) *wproc {
	t.Helper()
	return startWorkerProcess(t, cache, "--register", "--register-ttl", registryTTL.String(), "--speedup", "4")
}

// metricOf is the value of the sample of metric name whose worker label
// is worker, and whether there is one.
func metricOf(body, name, worker string) (float64, bool) {
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + `\{[^}]*worker="` + regexp.QuoteMeta(worker) + `"[^}]*\} (\S+)$`)
	var sum float64
	found := false
	for _, m := range re.FindAllStringSubmatch(body, -1) {
		v, _ := strconv.ParseFloat(m[1], 64)
		sum += v
		found = true
	}
	return sum, found
}

// candidate says whether the frontend at url counts worker a candidate
// (its health gauge is 1), and whether it has the worker at all.
func candidate(t *testing.T, url, worker string) (healthy, known bool) {
	v, ok := metricOf(scrapeWorker(t, url), "kvstrata_frontend_worker_healthy", worker)
	return ok && v == 1, ok
}

// routedOn returns the worker of ws that the frontend at url routed the
// request run sends to it: the one whose decisions grew.
func routedOn(t *testing.T, url string, ws []*wproc, run func()) *wproc {
	t.Helper()
	count := func() []float64 {
		body := scrapeWorker(t, url)
		var n []float64
		for _, w := range ws {
			v, _ := metricOf(body, "kvstrata_frontend_routing_decisions_total", w.url)
			n = append(n, v)
		}
		return n
	}
	before := count()
	run()
	after := count()
	var got *wproc
	for i, w := range ws {
		if after[i] != before[i] {
			if got != nil {
				t.Fatalf("one request was routed twice on %s: %v → %v", url, before, after)
			}
			got = w
		}
	}
	if got == nil {
		t.Fatalf("%s routed the request to none of the workers", url)
	}
	return got
}

// registered lists the URLs of the workers the cache node at node lists.
func registered(t *testing.T, node *proc) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	recs, err := node.api().ListWorkers(ctx)
	if err != nil {
		t.Fatalf("ListWorkers: %v", err)
	}
	var urls []string
	for _, r := range recs {
		urls = append(urls, r.Url)
	}
	return urls
}

// registryPrompt is a prompt of a long preamble of its own for prefix p,
// then a question q.
func registryPrompt(p, q int) string {
	var b strings.Builder
	for i := range 12 {
		fmt.Fprintf(&b, "Preamble %d, paragraph %d: the worker that computed this prefix holds its blocks in its pool. ", p, i)
	}
	fmt.Fprintf(&b, "Question %d?", q)
	return b.String()
}

// TestTwoFrontendsDiscoverRegisteredWorkers: two workers register with the
// cache node and two frontend replicas, given no worker, discover both.
// Requests sharing a prefix that one worker computed go to that worker
// through either replica. A worker killed with SIGKILL leaves both
// replicas' candidates at once, while the registry still lists it (its
// lease has long to run), and the registry drops it when the lease ends;
// a worker that registers later is used by both replicas; a worker stopped
// cleanly deregisters, and both replicas drop it at once.
func TestTwoFrontendsDiscoverRegisteredWorkers(t *testing.T) {
	node := startNode(t, t.TempDir())
	ws := []*wproc{startRegisteredWorker(t, node.grpc), startRegisteredWorker(t, node.grpc)}
	discover := []string{"--discover", "--discover-interval", "200ms"}
	_, fe1 := startFrontendProcess(t, node.grpc, nil, discover...)
	_, fe2 := startFrontendProcess(t, node.grpc, nil, discover...)
	fes := []string{fe1, fe2}
	bothSee := func(w *wproc, want bool, what string) {
		t.Helper()
		eventually(t, 30*time.Second, what, func() bool {
			for _, fe := range fes {
				if healthy, _ := candidate(t, fe, w.url); healthy != want {
					return false
				}
			}
			return true
		})
	}
	for _, w := range ws {
		bothSee(w, true, "both frontends count "+w.url+" a candidate")
	}
	registeredAt := time.Now() // the first leases end before registeredAt + registryTTL

	// Each prefix is computed first on a worker of its own, asked
	// directly; then requests sharing it go, alternately, to the two
	// frontends. Both route every one of them to that worker.
	checkRouting := func(ws []*wproc, holders []*wproc, prefixes []int) {
		t.Helper()
		for i, p := range prefixes {
			workerComplete(t, holders[i], registryPrompt(p, 0), 4)
		}
		time.Sleep(time.Second) // the holders' KV events reach both frontends
		for i, p := range prefixes {
			for q := 1; q <= 4; q++ {
				fe := fes[q%2]
				got := routedOn(t, fe, ws, func() {
					r := streamCompletion(frontendSDK(fe), "kvstrata-sim", registryPrompt(p, q), 4, nil)
					if r.err != nil || r.completion != 4 {
						t.Fatalf("prefix %d, question %d through %s: %+v", p, q, fe, r)
					}
				})
				if got != holders[i] {
					t.Errorf("prefix %d, question %d: %s routed it to %s; %s holds the prefix", p, q, fe, got.url, holders[i].url)
				}
			}
		}
	}
	checkRouting(ws, []*wproc{ws[0], ws[1], ws[1], ws[0]}, []int{1, 2, 3, 4})
	for _, fe := range fes {
		if n := workerMetricSum(scrapeWorker(t, fe), "kvstrata_frontend_routed_overlap_blocks_sum"); n == 0 {
			t.Errorf("%s routed with no pool or tier overlap at all", fe)
		}
	}

	// A worker killed with SIGKILL leaves both candidate sets by its
	// failed health, long before its lease ends.
	killed := ws[0]
	killedAt := time.Now()
	killed.kill()
	bothSee(killed, false, "both frontends take the killed worker out of the candidates")
	if left := time.Since(killedAt); left >= registryTTL {
		t.Fatalf("the killed worker left the candidates after %v, not before its %v lease ended", left, registryTTL)
	}
	if urls := registered(t, node); !strings.Contains(strings.Join(urls, " "), killed.url) {
		t.Fatalf("the registry no longer lists the killed worker (%v) — the test did not check that the frontends were faster than its lease", urls)
	}
	t.Logf("a worker killed with SIGKILL left both frontends' candidates after %v", time.Since(killedAt).Round(time.Millisecond))
	for _, fe := range fes {
		r := streamCompletion(frontendSDK(fe), "kvstrata-sim", registryPrompt(1, 9), 4, nil)
		if r.err != nil || r.completion != 4 {
			t.Fatalf("a request through %s after the kill: %+v", fe, r)
		}
	}

	// A worker that registers now is used by both frontends.
	late := startRegisteredWorker(t, node.grpc)
	bothSee(late, true, "both frontends count the new worker a candidate")
	checkRouting([]*wproc{ws[1], late}, []*wproc{late, ws[1]}, []int{5, 6})

	// The killed worker's lease ends: the registry and both frontends
	// drop it.
	eventually(t, registryTTL+30*time.Second, "the registry drops the killed worker when its lease ends", func() bool {
		return !strings.Contains(strings.Join(registered(t, node), " "), killed.url)
	})
	eventually(t, 30*time.Second, "both frontends forget the killed worker", func() bool {
		for _, fe := range fes {
			if _, known := candidate(t, fe, killed.url); known {
				return false
			}
		}
		return true
	})

	// The live worker renews its lease: once its first lease has ended,
	// the registry and both frontends have it still.
	if wait := time.Until(registeredAt.Add(registryTTL + 2*time.Second)); wait > 0 {
		time.Sleep(wait)
	}
	for _, w := range []*wproc{ws[1]} {
		if !strings.Contains(strings.Join(registered(t, node), " "), w.url) {
			t.Fatalf("%s is not registered after its first lease ended: renewals failed\n%s", w.url, w.log)
		}
		bothSee(w, true, "both frontends still count "+w.url+" a candidate after its first lease")
	}

	// A worker stopped cleanly deregisters: both frontends drop it, well
	// before its lease would have ended.
	stoppedAt := time.Now()
	ws[1].stop()
	eventually(t, registryTTL/2, "both frontends drop the worker that deregistered", func() bool {
		for _, fe := range fes {
			if _, known := candidate(t, fe, ws[1].url); known {
				return false
			}
		}
		return true
	})
	t.Logf("a worker stopped cleanly left both frontends after %v", time.Since(stoppedAt).Round(time.Millisecond))
	if !strings.Contains(ws[1].log.String(), "worker registry: deregistered") {
		t.Errorf("the stopped worker's log does not say it deregistered:\n%s", ws[1].log)
	}
}

func TestRegisterBadFlagsExitTwo(t *testing.T) {
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"worker", "--register", "--cache", "", "--register-ttl", "1ms", "--advertise-url", "ftp://x"},
			[]string{"no --cache to register with", `--register-ttl 1ms`, `--advertise-url "ftp://x"`}},
		{[]string{"frontend", "--discover", "--cache", ""}, []string{"discovering workers needs a cache node"}},
	} {
		usageErrorSays(t, c.args, c.want...)
	}
}

// TestClientWorkerRegistryCalls: the Go client's registry calls against a
// real node — a lease kept by KeepWorker is listed with its record and
// renewed, Close deregisters it, and bad input is an error matching
// client.ErrInvalid that changes nothing.
func TestClientWorkerRegistryCalls(t *testing.T) {
	node := startNode(t, t.TempDir())
	c := node.api()
	ctx := context.Background()
	rec := &pb.WorkerRecord{Url: "http://127.0.0.1:1", Events: "tcp://127.0.0.1:2", Role: "aggregated", Model: "m",
		Namespace: 7, BlockTokens: 16, PoolBlocks: 99}
	for name, bad := range map[string]func() error{
		"an empty URL": func() error {
			_, err := c.RegisterWorker(ctx, &pb.WorkerRecord{}, 5*time.Second)
			return err
		},
		"a 1 ms lease": func() error { _, err := c.RegisterWorker(ctx, rec, time.Millisecond); return err },
		"a huge model": func() error {
			_, err := c.RegisterWorker(ctx, &pb.WorkerRecord{Url: "http://a:1", Model: strings.Repeat("m", 4096)}, 5*time.Second)
			return err
		},
		"KeepWorker of an empty URL": func() error {
			_, err := c.KeepWorker(ctx, &pb.WorkerRecord{}, 5*time.Second, nil)
			return err
		},
		"deregistering the empty URL": func() error { return c.DeregisterWorker(ctx, "") },
	} {
		if err := bad(); !errors.Is(err, client.ErrInvalid) {
			t.Errorf("%s: %v, want an error matching client.ErrInvalid", name, err)
		}
	}
	if urls := registered(t, node); len(urls) != 0 {
		t.Fatalf("bad registrations left %v in the registry", urls)
	}

	lease, err := c.KeepWorker(ctx, rec, time.Second, nil)
	if err != nil {
		t.Fatalf("KeepWorker: %v", err)
	}
	first := lease.Expires()
	ws, err := c.ListWorkers(ctx)
	if err != nil || len(ws) != 1 || ws[0].Url != rec.Url || ws[0].PoolBlocks != 99 || ws[0].Namespace != 7 ||
		ws[0].ExpiresUnixMs != first.UnixMilli() {
		t.Fatalf("ListWorkers = %v, %v; want the record, its lease ending at %v", ws, err, first)
	}
	eventually(t, 10*time.Second, "the lease is renewed", func() bool { return lease.Expires().After(first) })
	if err := lease.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if urls := registered(t, node); len(urls) != 0 {
		t.Fatalf("after Close the registry lists %v", urls)
	}
}
