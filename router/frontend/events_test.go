package frontend

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvstrata/kvstrata/engine/sched"
	engine "github.com/kvstrata/kvstrata/engine/worker"
	"github.com/kvstrata/kvstrata/internal/freeport"
	"github.com/kvstrata/kvstrata/router/policy"
)

// startConnectingWorkers starts n in-process sim workers whose KV-event
// publishers connect to bind, each with the topic w<i>, in the encoding
// enc(i).
func startConnectingWorkers(t *testing.T, n int, bind string, enc func(i int) string) []*testWorker {
	t.Helper()
	var ws []*testWorker
	for i := range n {
		cfg := engine.Config{
			Model: "sim", Speedup: 4, Listen: "127.0.0.1:0", Blocks: 1024, Logger: quiet,
			KVEvents: bind, KVEventsConnect: true, KVEventsTopic: fmt.Sprintf("w%d", i),
			KVEventsReplay: "tcp://" + freeport.Addr(t), KVEventsEncoding: enc(i),
		}
		w, err := engine.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		tw := &testWorker{Worker: w, spec: WorkerSpec{URL: "http://" + w.Addr(), Topic: cfg.KVEventsTopic, Replay: cfg.KVEventsReplay}}
		t.Cleanup(func() { tw.stop(10 * time.Second) })
		ws = append(ws, tw)
	}
	return ws
}

// TestBindModeSharedPrefixGoesToItsHolder: with the workers' publishers
// connecting to the Router's listening socket — one in each encoding —
// each worker's events are told apart by topic, and a request sharing a
// prefix with an earlier one goes to the worker that served it.
func TestBindModeSharedPrefixGoesToItsHolder(t *testing.T) {
	bind := "tcp://" + freeport.Addr(t)
	ws := startConnectingWorkers(t, 2, bind, func(i int) string { return []string{"arrays", "maps"}[i] })
	r, reg := newRouter(t, Config{Workers: specs(ws), Namespace: namespace(ws), EventsBind: bind, Policy: policy.Config{Policy: policy.KVHBM}})
	if r.EventsAddr() != strings.TrimPrefix(bind, "tcp://") {
		t.Errorf("EventsAddr %q, want %q", r.EventsAddr(), bind)
	}
	// A PUB socket drops what it sends before its connection is up:
	// warm each worker up directly until the index hears from it (what
	// it sent before is then replayed).
	for i, w := range ws {
		k := 0
		waitFor(t, fmt.Sprintf("the index hears worker %d", i), func() bool {
			k++
			warm := make([]uint32, 64) // new blocks, new events
			for j := range warm {
				warm[j] = uint32(150000 + 20000*i + 64*k + j)
			}
			hashes := namespace(ws).Hashes(warm)
			completeOn(t, w.spec.URL, warm)
			time.Sleep(50 * time.Millisecond)
			for _, m := range r.Index().Overlap(r.ns, hashes, nil) {
				if m.Worker == r.workerSet().list[i].id && m.Blocks == len(hashes) {
					return true
				}
			}
			return false
		})
	}
	held := map[int]bool{}
	for seed := range 6 {
		prefix := ids(seed, 256)
		first := routedTo(t, r, ws, func() {
			if res := generate(t, r, sched.Request{Prompt: prefix, MaxTokens: 4, IgnoreEOS: true}, nil); res.err != nil {
				t.Fatalf("first request: %v", res.err)
			}
		})
		hashes := namespace(ws).Hashes(prefix)
		waitFor(t, "the index learns the first request's blocks", func() bool {
			for _, m := range r.Index().Overlap(r.ns, hashes, nil) {
				if m.Worker == r.workerSet().list[first].id && m.Blocks == len(hashes) {
					return true
				}
			}
			return false
		})
		second := routedTo(t, r, ws, func() {
			res := generate(t, r, sched.Request{Prompt: append(slices.Clone(prefix), ids(100+seed, 40)...), MaxTokens: 4, IgnoreEOS: true}, nil)
			if res.err != nil {
				t.Fatalf("second request: %v", res.err)
			}
		})
		if second != first {
			t.Fatalf("prefix %d: first request on worker %d, the second sharing its prefix on %d", seed, first, second)
		}
		held[first] = true
	}
	// Each worker's blocks are indexed as its own, not the other's.
	for i, w := range r.workerSet().list {
		for _, m := range r.Index().Overlap(r.ns, namespace(ws).Hashes(ids(0, 256)), nil) {
			if m.Worker == w.id && m.Blocks > 0 && !held[i] {
				t.Errorf("worker %d holds prefix 0 in the index, but served none", i)
			}
		}
	}
	if st := r.events.Stats(); st.UnknownTopic != 0 || st.BadPeers != 0 || st.Heard == 0 {
		t.Errorf("listener stats %+v", st)
	}
	// /metrics says how many batches each worker's events brought.
	for _, w := range ws {
		if n := counter(t, reg, "kvstrata_frontend_kv_event_batches_total", "worker", w.spec.URL); n == 0 {
			t.Errorf("no batches counted for %s", w.spec.URL)
		}
	}
	if n := counter(t, reg, "kvstrata_frontend_kv_event_listener_messages_total", "outcome", "heard"); n == 0 {
		t.Error("no messages counted heard by the listener")
	}
}

// counter is the value of the counter name{label=value} in reg.
func counter(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label && lp.GetValue() == value {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("no series %s{%s=%q}", name, label, value)
	return 0
}

// completeOn runs prompt on the worker at url, not through a Router.
func completeOn(t *testing.T, url string, prompt []uint32) {
	t.Helper()
	body, err := json.Marshal(map[string]any{"prompt": prompt, "max_tokens": 1})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Post(url+"/v1/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s: %s", url, resp.Status)
	}
}

func TestEventsConfigProblems(t *testing.T) {
	ws := startWorkers(t, 1, "sim", "")
	cfg := Config{Namespace: namespace(ws), Workers: []WorkerSpec{
		{URL: "http://127.0.0.1:1", Topic: "a"},
		{URL: "http://127.0.0.1:2", Replay: "tcp://127.0.0.1:3"},
	}}
	_, err := New(cfg)
	for _, want := range []string{"has a topic but no events endpoint, and no events bind", "replay endpoint but no events endpoint or topic"} {
		if !errors.Is(err, ErrBadConfig) || !strings.Contains(fmt.Sprint(err), want) {
			t.Errorf("New: %v, want it to say %q", err, want)
		}
	}
	cfg = Config{Namespace: namespace(ws), EventsBind: "127.0.0.1:5557", Workers: []WorkerSpec{
		{URL: "http://127.0.0.1:1", Topic: "a"}, {URL: "http://127.0.0.1:2", Topic: "a"},
		{URL: "http://127.0.0.1:3", Topic: "a", Events: "tcp://127.0.0.1:4"}, // a prefix filter, no clash
	}}
	_, err = New(cfg)
	for _, want := range []string{`events bind "127.0.0.1:5557"`, `both publish on topic "a"`} {
		if !errors.Is(err, ErrBadConfig) || !strings.Contains(fmt.Sprint(err), want) {
			t.Errorf("New: %v, want it to say %q", err, want)
		}
	}
}
