package loadgen

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// memStore is a map shared by the memTargets of a run.
type memStore struct {
	mu     sync.Mutex
	values map[uint64][]byte
	puts   atomic.Int64
	gets   atomic.Int64
	opened atomic.Int64

	corrupt  map[uint64]bool // keys whose values come back with a byte flipped
	drop     map[uint64]bool // keys a put does not keep
	failGets atomic.Int64    // gets that fail before they fail no more
}

func newMemStore() *memStore {
	return &memStore{values: map[uint64][]byte{}, corrupt: map[uint64]bool{}, drop: map[uint64]bool{}}
}

func (s *memStore) dialer() Dialer {
	return func(context.Context) (Target, error) {
		s.opened.Add(1)
		return &memTarget{s: s}, nil
	}
}

type memTarget struct{ s *memStore }

func (t *memTarget) Put(_ context.Context, keys []uint64, values [][]byte) error {
	t.s.puts.Add(1)
	t.s.mu.Lock()
	defer t.s.mu.Unlock()
	for i, k := range keys {
		if !t.s.drop[k] {
			t.s.values[k] = bytes.Clone(values[i])
		}
	}
	return nil
}

func (t *memTarget) Get(_ context.Context, keys []uint64, fn func(int, []byte, bool) error) error {
	t.s.gets.Add(1)
	if t.s.failGets.Add(-1) >= 0 {
		return errors.New("node on fire")
	}
	for i, k := range keys {
		t.s.mu.Lock()
		v, ok := t.s.values[k]
		if ok && t.s.corrupt[k] {
			v = bytes.Clone(v)
			v[len(v)/2] ^= 1
		}
		t.s.mu.Unlock()
		if err := fn(i, v, ok); err != nil {
			return err
		}
	}
	return nil
}

func (t *memTarget) Close() error { return nil }

// memLooker adds lookups to memTarget.
type memLooker struct{ memTarget }

func (t *memLooker) Lookup(_ context.Context, chain []uint64) (int, error) {
	t.s.mu.Lock()
	defer t.s.mu.Unlock()
	for i, k := range chain {
		if _, ok := t.s.values[k]; !ok {
			return i, nil
		}
	}
	return len(chain), nil
}

func TestPutRunWritesEveryKeyInTurnWithItsValue(t *testing.T) {
	s := newMemStore()
	rep, err := Run(context.Background(), s.dialer(), Config{Op: OpPut, ValueSize: 1000, Keys: 40, Batch: 4, Concurrency: 3, Requests: 10})
	if err != nil {
		t.Fatal(err)
	}
	r := rep.Run
	if rep.Populate != nil || r.Requests != 10 || r.Blocks != 40 || r.Bytes != 40_000 || r.Errors != 0 || r.Latency.Count() != 10 {
		t.Fatalf("populate %v; run %d requests, %d blocks, %d bytes, %d errors, %d latencies",
			rep.Populate, r.Requests, r.Blocks, r.Bytes, r.Errors, r.Latency.Count())
	}
	c, _ := NewContent(1000, 0)
	for k := range uint64(40) {
		if !bytes.Equal(s.values[k], c.Of(k)) {
			t.Fatalf("key %d holds %d bytes that are not its value", k, len(s.values[k]))
		}
	}
	if s.opened.Load() != 3 {
		t.Fatalf("%d targets opened for 3 workers", s.opened.Load())
	}
}

func TestGetRunPopulatesFirstAndVerifiesEveryValue(t *testing.T) {
	s := newMemStore()
	var phases []string
	rep, err := Run(context.Background(), s.dialer(), Config{Op: OpGet, ValueSize: 4096, Keys: 25, Batch: 2, Concurrency: 4, Requests: 50,
		Progress: func(p Progress) {
			if len(phases) == 0 || phases[len(phases)-1] != p.Phase {
				phases = append(phases, p.Phase)
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	if p := rep.Populate; p == nil || p.Requests != 13 || p.Blocks != 25 || p.Bytes != 25*4096 {
		t.Fatalf("populate: %+v, want 13 requests of 25 blocks", p)
	}
	if r := rep.Run; r.Requests != 50 || r.Blocks != 100 || r.Bytes != 100*4096 || r.Errors != 0 || r.Misses != 0 {
		t.Fatalf("run: %d requests %d blocks %d bytes %d errors %d misses", r.Requests, r.Blocks, r.Bytes, r.Errors, r.Misses)
	}
	if s.puts.Load() != 13 || s.gets.Load() != 50 {
		t.Fatalf("the target saw %d puts and %d gets", s.puts.Load(), s.gets.Load())
	}
	if strings.Join(phases, ",") != "populate,run" {
		t.Fatalf("progress reported phases %v", phases)
	}
}

func TestWrongBytesAreErrorsAndMissingKeysAreMisses(t *testing.T) {
	s := newMemStore()
	s.corrupt[3] = true
	s.drop[5] = true
	rep, err := Run(context.Background(), s.dialer(), Config{Op: OpGet, ValueSize: 100, Keys: 8, Batch: 8, Concurrency: 2, Requests: 10})
	if err != nil {
		t.Fatal(err)
	}
	r := rep.Run
	if r.Mismatches != 10 || r.Errors != 10 || r.Misses != 10 || r.Blocks != 60 {
		t.Fatalf("%d mismatches, %d errors, %d misses, %d good blocks; want 10, 10, 10, 60", r.Mismatches, r.Errors, r.Misses, r.Blocks)
	}
	if r.FirstError == nil || !strings.Contains(r.FirstError.Error(), "key 3: 100 bytes came back that differ from the 100 put") {
		t.Fatalf("first error: %v", r.FirstError)
	}
}

func TestFailedRequestsCountAndReopenTheTarget(t *testing.T) {
	s := newMemStore()
	s.failGets.Store(3)
	rep, err := Run(context.Background(), s.dialer(), Config{Op: OpGet, ValueSize: 10, Keys: 4, Concurrency: 1, Requests: 10})
	if err != nil {
		t.Fatal(err)
	}
	r := rep.Run
	if r.Requests != 10 || r.Errors != 3 || r.Latency.Count() != 7 || !strings.Contains(r.FirstError.Error(), "node on fire") {
		t.Fatalf("%d requests, %d errors, %d latencies, first error %v", r.Requests, r.Errors, r.Latency.Count(), r.FirstError)
	}
	if s.opened.Load() != 4 {
		t.Fatalf("%d targets opened: want the first and one after each failure", s.opened.Load())
	}
}

func TestLookupNeedsALooker(t *testing.T) {
	s := newMemStore()
	_, err := Run(context.Background(), s.dialer(), Config{Op: OpLookup, Keys: 4, Requests: 1})
	if !errors.Is(err, ErrUnsupported) {
		t.Fatalf("lookup on a target without Lookup: %v", err)
	}
	s.drop[2] = true
	looker := func(context.Context) (Target, error) { return &memLooker{memTarget{s}}, nil }
	rep, err := Run(context.Background(), looker, Config{Op: OpLookup, Keys: 4, Batch: 4, Concurrency: 1, Requests: 1})
	if err != nil {
		t.Fatal(err)
	}
	// The chain starts anywhere in the ring 0 1 2 3: its prefix ends at 2.
	if r := rep.Run; r.Blocks+r.Misses != 4 || r.Misses == 0 || r.Bytes != 0 {
		t.Fatalf("lookup found %d and missed %d of 4 keys, %d bytes", r.Blocks, r.Misses, r.Bytes)
	}
}

func TestMixedRunSplitsByGetRatio(t *testing.T) {
	s := newMemStore()
	rep, err := Run(context.Background(), s.dialer(), Config{Op: OpMixed, GetRatio: 0.75, ValueSize: 10, Keys: 10, Concurrency: 2, Requests: 2000})
	if err != nil {
		t.Fatal(err)
	}
	puts := s.puts.Load() - rep.Populate.Requests
	if gets := s.gets.Load(); gets+puts != 2000 || gets < 1400 || gets > 1600 || rep.Run.Errors != 0 {
		t.Fatalf("%d gets and %d puts (errors %d), want about 1500 and 500", gets, puts, rep.Run.Errors)
	}
	// The gets' latencies are kept apart as well as in the total.
	if n := rep.Run.GetLatency.Count(); n != uint64(s.gets.Load()) || rep.Run.Latency.Count() != 2000 {
		t.Fatalf("%d get latencies of %d gets, %d latencies of 2000 requests", n, s.gets.Load(), rep.Run.Latency.Count())
	}
}

func TestTimedRunStopsOnTimeAndCancelStopsEarly(t *testing.T) {
	s := newMemStore()
	start := time.Now()
	rep, err := Run(context.Background(), s.dialer(), Config{Op: OpPut, ValueSize: 10, Keys: 10, Concurrency: 2, Duration: 100 * time.Millisecond})
	if took := time.Since(start); err != nil || took < 100*time.Millisecond || took > 2*time.Second || rep.Run.Requests == 0 {
		t.Fatalf("a 100ms run took %v, made %d requests, err %v", took, rep.Run.Requests, err)
	}
	if e := rep.Run.Elapsed; e < 100*time.Millisecond {
		t.Fatalf("elapsed %v, shorter than the run", e)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start = time.Now()
	rep, err = Run(ctx, s.dialer(), Config{Op: OpPut, ValueSize: 10, Keys: 10, Duration: time.Hour})
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 2*time.Second || rep == nil || rep.Run.Requests == 0 {
		t.Fatalf("cancelled run: err %v after %v", err, time.Since(start))
	}
}

func TestCancelDuringPopulateLeavesAnEmptyRun(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	s := newMemStore()
	slow := func(context.Context) (Target, error) { return &slowTarget{memTarget{s}, cancel}, nil }
	rep, err := Run(ctx, slow, Config{Op: OpGet, ValueSize: 10, Keys: 100, Concurrency: 2, Requests: 10})
	if !errors.Is(err, context.Canceled) || rep == nil || rep.Populate == nil || rep.Run.Requests != 0 || rep.Run.Latency.Count() != 0 {
		t.Fatalf("err %v, report %+v", err, rep)
	}
}

// slowTarget cancels the run on its first put.
type slowTarget struct {
	memTarget
	cancel func()
}

func (t *slowTarget) Put(ctx context.Context, keys []uint64, values [][]byte) error {
	t.cancel()
	<-ctx.Done()
	return ctx.Err()
}

func TestConfigReportsEveryProblem(t *testing.T) {
	c := Config{Op: "scan", GetRatio: 2, ValueSize: -1, Keys: 2, Batch: 3, Concurrency: -1}
	c.EnsureDefaults()
	err := c.Validate()
	if err == nil {
		t.Fatal("a bad config passed")
	}
	for _, want := range []string{`unknown op "scan"`, "get ratio 2 outside [0, 1]", "value size -1 is negative",
		"batch of 3 keys outside [1, keys = 2]", "concurrency -1"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q does not say %q", err, want)
		}
	}
}

func TestContentIsDeterministicPerKey(t *testing.T) {
	a, _ := NewContent(1<<20, 9)
	b, _ := NewContent(1<<20, 9)
	if !bytes.Equal(a.Of(5), b.Of(5)) || len(a.Of(5)) != 1<<20 {
		t.Fatal("the same key and seed give different values")
	}
	if bytes.Equal(a.Of(5), a.Of(6)) {
		t.Fatal("two keys have the same value")
	}
	if z, _ := NewContent(0, 1); z.Of(3) == nil || len(z.Of(3)) != 0 {
		t.Fatal("a zero-size value is not an empty slice")
	}
	if KeyHash(1) == KeyHash(2) {
		t.Fatal("two keys share a hash")
	}
}
