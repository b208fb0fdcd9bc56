package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/api/client"
	"github.com/kvstrata/kvstrata/api/nodetest"
	"github.com/kvstrata/kvstrata/engine/worker"
	"github.com/kvstrata/kvstrata/internal/freeport"
	"github.com/kvstrata/kvstrata/planner"
	"github.com/kvstrata/kvstrata/planner/connector/local"
)

// tokenCompletion is one completion read whole, streamed or not: its generated
// token ids and finish reason.
type tokenCompletion struct {
	tokens []uint32
	finish string
	status int
	err    error
}

// streamTokenIDs posts a streaming tokenCompletion of token-id prompt to
// base and reads it on a goroutine; first is closed at its first chunk,
// done when it has ended.
func streamTokenIDs(base string, prompt []uint32, maxTokens int) (first, done <-chan struct{}, c *tokenCompletion) {
	f, d := make(chan struct{}), make(chan struct{})
	c = &tokenCompletion{}
	go func() {
		defer close(d)
		closed := false
		defer func() {
			if !closed {
				close(f)
			}
		}()
		body, _ := json.Marshal(map[string]any{"prompt": prompt, "max_tokens": maxTokens, "stream": true, "return_token_ids": true, "ignore_eos": true})
		resp, err := http.Post(base+"/v1/completions", "application/json", strings.NewReader(string(body)))
		if err != nil {
			c.err = err
			return
		}
		defer resp.Body.Close()
		c.status = resp.StatusCode
		if resp.StatusCode != http.StatusOK {
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
			c.err = fmt.Errorf("status %d: %s", resp.StatusCode, b)
			return
		}
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			line, ok := strings.CutPrefix(sc.Text(), "data: ")
			if !ok || line == "[DONE]" {
				continue
			}
			var chunk struct {
				Choices []struct {
					TokenIDs     []uint32 `json:"token_ids"`
					FinishReason *string  `json:"finish_reason"`
				} `json:"choices"`
			}
			if err := json.Unmarshal([]byte(line), &chunk); err != nil {
				c.err = err
				return
			}
			for _, ch := range chunk.Choices {
				c.tokens = append(c.tokens, ch.TokenIDs...)
				if ch.FinishReason != nil {
					c.finish = *ch.FinishReason
				}
			}
			if !closed {
				close(f)
				closed = true
			}
		}
		c.err = sc.Err()
	}()
	return f, d, c
}

func completeTokenIDs(t *testing.T, base string, prompt []uint32, maxTokens int) *tokenCompletion {
	t.Helper()
	_, done, c := streamTokenIDs(base, prompt, maxTokens)
	waitClosed(t, "a tokenCompletion", done)
	if c.err != nil || len(c.tokens) != maxTokens {
		t.Fatalf("tokenCompletion at %s: %d tokens, %v; want %d", base, len(c.tokens), c.err, maxTokens)
	}
	return c
}

func waitClosed(t *testing.T, what string, c <-chan struct{}) {
	t.Helper()
	select {
	case <-c:
	case <-time.After(2 * time.Minute):
		t.Fatalf("still waiting after two minutes: %s", what)
	}
}

// distinctTokenPrompt is n token ids that share no block with another seed's.
func distinctTokenPrompt(seed, n int) []uint32 {
	p := make([]uint32, n)
	for i := range p {
		p[i] = uint32((2000 + seed*7919 + i*31) % 190000) // within o200k's vocabulary
	}
	return p
}

// The local connector's scale-down loses nothing: two sim workers that
// offload to a cache node, behind the frontend; each computes distinct
// long prompts; scaled 2→1 while a stream is running on the worker it
// drains, that stream ends whole, new requests go to the other worker,
// and once the drain is reported every full block of every prompt and
// output the drained worker computed is found by a cache Lookup, with
// nothing dropped.
func TestScaleDownThroughTheLocalConnectorLosesNoComputedPrefix(t *testing.T) {
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	node := nodetest.Start(t, nodetest.Options{DRAMBytes: 256 << 20})
	tmpl := worker.DefaultConfig()
	tmpl.Cache, tmpl.Speedup = node.Addr, 2
	sp := upSpawner{tmpl: tmpl, host: "127.0.0.1", events: true, log: log}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var ws []upWorker
	var cfgs []worker.Config
	for range 2 {
		w, err := sp.Spawn(ctx, planner.Aggregated)
		if err != nil {
			t.Fatal(err)
		}
		u := w.(upWorker)
		ws = append(ws, u)
		c := u.w.Config()
		spec := u.spec()
		c.Listen, c.KVEvents, c.KVEventsReplay = u.w.Addr(), spec.Events, spec.Replay
		cfgs = append(cfgs, c)
	}
	fe, err := upFrontend(freeport.Addr(t), node.Addr, cfgs, log)
	if err != nil {
		t.Fatal(err)
	}
	if err := fe.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		fe.Stop(ctx)
	})
	conn, err := local.New(local.Config{Spawner: sp, Router: upRouter{fe}, Pools: []planner.Pool{planner.Aggregated}, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := conn.Close(ctx); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	for _, w := range ws {
		if err := conn.Adopt(w); err != nil {
			t.Fatal(err)
		}
	}

	// Distinct long prompts on both workers; the drained one will be the
	// newest (both idle to the router: least loaded, newest first).
	kept, drained := ws[0], ws[1]
	var computed [][]uint32 // the token ids whose KV the drained worker computed
	for i := range 4 {
		for j, w := range ws {
			p := distinctTokenPrompt(10*i+j, 400+37*i)
			c := completeTokenIDs(t, w.URL(), p, 24)
			if w == drained {
				computed = append(computed, append(p, c.tokens[:len(c.tokens)-1]...)) // the last token's KV is never computed
			}
		}
	}
	long := distinctTokenPrompt(99, 700)
	const longTokens = 150
	first, done, running := streamTokenIDs(drained.URL(), long, longTokens)
	waitClosed(t, "the long stream's first token", first)

	if err := conn.Scale(ctx, planner.Aggregated, 1); err != nil {
		t.Fatal(err)
	}
	if r, _ := conn.Replicas(ctx); r[planner.Aggregated] != (planner.Replicas{Desired: 1, Ready: 1}) {
		t.Fatalf("replicas right after the scale-down: %+v, want 1 and 1", r)
	}
	if got := fe.Router().Workers(); len(got) != 1 || got[0].URL != kept.URL() {
		t.Fatalf("the frontend's workers after the scale-down: %+v, want only %s", got, kept.URL())
	}
	// New requests, through the frontend, all go to the worker kept; the
	// one being drained turns them away if asked.
	for i := range 3 {
		completeTokenIDs(t, "http://"+fe.Addr(), distinctTokenPrompt(200+i, 300), 8)
	}
	if resp, err := http.Post(drained.URL()+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"x","max_tokens":1}`)); err == nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("a new request to the draining worker: %d, want 503", resp.StatusCode)
		}
	} else if !finished(done) {
		t.Fatalf("a new request to the draining worker while its stream runs: %v, want a 503", err)
	}

	waitClosed(t, "the long stream's end", done)
	if running.err != nil || running.finish != "length" || len(running.tokens) != longTokens {
		t.Fatalf("the stream running on the drained worker: %d tokens, finish %q, %v; want all %d (not cut)",
			len(running.tokens), running.finish, running.err, longTokens)
	}
	computed = append(computed, append(slices.Clone(long), running.tokens[:longTokens-1]...))

	var d local.Drained
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(10 * time.Millisecond) {
		if st := conn.Status(); len(st.Drained) == 1 {
			d = st.Drained[0]
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no drain reported two minutes after the scale-down")
		}
	}
	if d.URL != drained.URL() || d.Err != "" || d.Report.Dropped != 0 || d.Report.Unfinished != 0 || d.Report.InFlight < 1 {
		t.Fatalf("drain %+v: want %s drained with its request finished and nothing dropped", d, drained.URL())
	}
	cl, err := client.Dial(ctx, node.Addr, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ns := drained.w.Model().Layout().Namespace
	blocks := 0
	for i, toks := range computed {
		hashes := ns.Hashes(toks)
		lr, err := cl.Lookup(ctx, ns.ID(), hashes)
		if err != nil || int(lr.GetBlocks()) != len(hashes) {
			t.Fatalf("request %d of the drained worker: the cache holds %d of its %d full blocks (prompt and output), %v",
				i, lr.GetBlocks(), len(hashes), err)
		}
		blocks += len(hashes)
	}
	t.Logf("all %d full blocks the drained worker computed are in the cache; drain %+v", blocks, d.Report)
}

// finished reports whether done is closed.
func finished(done <-chan struct{}) bool {
	select {
	case <-done:
		return true
	default:
		return false
	}
}

// up --planner refuses bad planner flags, saying which, before it starts
// anything.
func TestUpPlannerFlagsAreCheckedFirst(t *testing.T) {
	dir := t.TempDir()
	usageErrorSays(t, []string{"up", "--data-dir", dir, "--planner", "testdata/none.json", "--min-workers", "3", "--max-workers", "2", "--planner-mode", "eager"},
		"--planner testdata/none.json", "--slo-ttft 0s", "--slo-itl 0s", "--min-workers 3 --max-workers 2", `--planner-mode "eager"`)
	usageErrorSays(t, []string{"up", "--data-dir", dir, "--slo-ttft", "2s"}, "--slo-ttft needs --planner PROFILE")
}

// `up --planner` runs the planner over up's workers: its status at GET
// /v1/planner/status on --planner-listen names the pool, its limits, its
// targets and the connector's workers, and the frontend serves through
// the worker the connector owns.
func TestUpPlannerServesItsStatus(t *testing.T) {
	httpBase, eventsBase := freePortRun(t, 1), freePortRun(t, 2)
	fe, status := freeport.Addr(t), freeport.Addr(t)
	node := []string{freeport.Addr(t), freeport.Addr(t), freeport.Addr(t), freeport.Addr(t)}
	p := &proc{t: t, dir: t.TempDir()}
	p.args = []string{"up", "--http-port", strconv.Itoa(httpBase), "--kv-events-port", strconv.Itoa(eventsBase),
		"--frontend", fe, "--speedup", "20", "--num-gpu-blocks", "256", "--data-dir", p.dir, "--dram-capacity", "64MiB",
		"--ssd-capacity", "256MiB", "--listen-grpc", node[0], "--listen-data", node[1], "--listen-http", node[2],
		"--cluster-raft-addr", node[3], "--listen-resp", "",
		"--planner", "../../engine/model/sim/testdata/dynamo-mocker.json", "--slo-ttft", "2s", "--slo-itl", "50ms",
		"--min-workers", "1", "--max-workers", "3", "--planner-interval", "1s", "--planner-listen", status}
	p.launch()
	url := "http://" + fe
	waitWorkerHealth(t, p, url)
	waitUpPlannerAnswers(t, p, status)
	completeTokenIDs(t, url, distinctTokenPrompt(1, 40), 4)
	resp, err := http.Get("http://" + status + "/v1/planner/status")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st upStatus
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	if st.Mode != "active" || st.SLO["ttft"] != "2s" || st.Limits[planner.Aggregated] != (planner.Limits{Min: 1, Max: 3}) ||
		st.Replicas[planner.Aggregated] != (planner.Replicas{Desired: 1, Ready: 1}) ||
		len(st.Connector.Workers) != 1 || st.Connector.Workers[0].URL != fmt.Sprintf("http://127.0.0.1:%d", httpBase) {
		t.Fatalf("planner status %+v: want active, 2s, limits 1..3, the one worker on %d serving", st, httpBase)
	}
}

// waitUpPlannerAnswers waits until `up --planner`'s status answers on
// addr: the planner starts after the workers it watches, so a worker
// serving does not mean the status does yet.
func waitUpPlannerAnswers(t *testing.T, p *proc, addr string) {
	t.Helper()
	p.waitOK("answering on "+addr+"/v1/planner/status", 30*time.Second, func() (*http.Response, error) {
		return http.Get("http://" + addr + "/v1/planner/status")
	})
}

// upPlannerStatus reads `up --planner`'s status.
func upPlannerStatus(t *testing.T, addr string) upStatus {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/v1/planner/status")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st upStatus
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	return st
}

// `up --planner` closes the loop: a burst of long prompts through the
// frontend, more than one worker meets the TTFT target for, scales the
// aggregated pool up (within its maximum of 3); once the traffic stops,
// the idle rule brings it back to its minimum of 1, the workers scaled
// down drained with nothing dropped.
func TestUpPlannerScalesUpOnABurstAndBackToOneWhenIdle(t *testing.T) {
	httpBase, eventsBase := freePortRun(t, 1), freePortRun(t, 2)
	fe, status := freeport.Addr(t), freeport.Addr(t)
	node := []string{freeport.Addr(t), freeport.Addr(t), freeport.Addr(t), freeport.Addr(t)}
	p := &proc{t: t, dir: t.TempDir()}
	// A prompt of 1000 tokens takes the profile's worker about 33ms to
	// prefill: at a 40ms TTFT target, queueing included, one worker takes
	// about 9 a second.
	p.args = []string{"up", "--http-port", strconv.Itoa(httpBase), "--kv-events-port", strconv.Itoa(eventsBase),
		"--frontend", fe, "--data-dir", p.dir, "--dram-capacity", "256MiB",
		"--ssd-capacity", "256MiB", "--listen-grpc", node[0], "--listen-data", node[1], "--listen-http", node[2],
		"--cluster-raft-addr", node[3], "--listen-resp", "",
		"--planner", "../../engine/model/sim/testdata/dynamo-mocker.json", "--slo-ttft", "40ms", "--slo-itl", "50ms",
		"--min-workers", "1", "--max-workers", "3", "--planner-interval", "1s", "--planner-cooldown", "1s",
		"--planner-startup-delay", "1s", "--planner-predictor", "constant", "--planner-listen", status}
	p.launch()
	url := "http://" + fe
	waitWorkerHealth(t, p, url)
	waitUpPlannerAnswers(t, p, status)

	maxDesired := 0
	watch := func() planner.Replicas {
		r := upPlannerStatus(t, status).Replicas[planner.Aggregated]
		maxDesired = max(maxDesired, r.Desired)
		return r
	}
	// About 12 requests a second for 6 seconds, each on its own. On a
	// loaded machine one worker may fall behind them: the frontend then
	// turns some away (503, every worker busy past its queue wait), which
	// is what scaling up is for; any other failure fails the test.
	done := make(chan struct{})
	var sent int
	var mu sync.Mutex
	turnedAway := 0
	go func() {
		defer close(done)
		var wg sync.WaitGroup
		tick := time.NewTicker(80 * time.Millisecond)
		defer tick.Stop()
		for end := time.Now().Add(6 * time.Second); time.Now().Before(end); <-tick.C {
			sent++
			prompt := distinctTokenPrompt(1000+sent, 1000)
			wg.Go(func() {
				_, d, c := streamTokenIDs(url, prompt, 8)
				<-d
				switch {
				case c.err == nil:
				case c.status == http.StatusServiceUnavailable && (strings.Contains(c.err.Error(), "no worker became free in time") ||
					strings.Contains(c.err.Error(), "the wait queue is full")):
					mu.Lock()
					turnedAway++
					mu.Unlock()
				default:
					t.Errorf("a request of the burst: %v", c.err)
				}
			})
		}
		wg.Wait()
	}()
	defer func() { <-done }() // the burst's requests report to t: none after the test ends
	for !finished(done) {
		watch()
		time.Sleep(200 * time.Millisecond)
	}
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline) && maxDesired < 2; time.Sleep(200 * time.Millisecond) {
		watch()
	}
	if maxDesired < 2 {
		t.Fatalf("a burst of %d requests of 1000 tokens in 6s never scaled the pool up: %+v", sent, upPlannerStatus(t, status))
	}
	var st upStatus
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(200 * time.Millisecond) {
		st = upPlannerStatus(t, status)
		if r := st.Replicas[planner.Aggregated]; r == (planner.Replicas{Desired: 1, Ready: 1}) && len(st.Connector.Workers) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("still not back to 1 worker two minutes after the burst: %+v", st)
		}
	}
	if len(st.Connector.Drained) != maxDesired-1 || st.Connector.Errors != 0 {
		t.Fatalf("connector %+v: want the %d workers scaled down drained, no errors", st.Connector, maxDesired-1)
	}
	for _, d := range st.Connector.Drained {
		if d.Err != "" || d.Report.Dropped != 0 {
			t.Errorf("drain of %s: %+v: want nothing dropped", d.URL, d)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	t.Logf("burst of %d requests (%d turned away, every worker busy): up to %d workers, then back to 1; drains %+v",
		sent, turnedAway, maxDesired, st.Connector.Drained)
}
