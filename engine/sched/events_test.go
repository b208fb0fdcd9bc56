package sched

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/engine/pool"
	"github.com/kvstrata/kvstrata/index"
)

// sink is an EventSink that keeps the batches Flush ends.
type sink struct {
	mu      sync.Mutex
	pending []pool.Event
	batches [][]pool.Event
}

func (s *sink) Event(e pool.Event) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pending = append(s.pending, e)
}

func (s *sink) Flush() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.pending) == 0 {
		panic("Flush of an empty batch")
	}
	s.batches = append(s.batches, s.pending)
	s.pending = nil
}

func TestPoolEventsGoToTheSinkInBatchesPerStep(t *testing.T) {
	m := newSim(t)
	ev := &sink{}
	// A pool of 8 blocks: the second prompt evicts the first one's blocks.
	e := newEngine(t, Config{Model: m, Blocks: 8, Events: ev})
	a, b := prompt(100, 1), prompt(100, 2)
	generate(t, e, Request{Prompt: a, MaxTokens: 1})
	generate(t, e, Request{Prompt: b, MaxTokens: 1})
	e.Stats() // the last step's batch is flushed

	ev.mu.Lock()
	defer ev.mu.Unlock()
	if len(ev.pending) != 0 {
		t.Errorf("%d events never flushed", len(ev.pending))
	}
	var stored, removed []index.Hash
	for _, batch := range ev.batches {
		for _, x := range batch {
			switch x.Kind {
			case pool.BlockStored:
				stored = append(stored, x.Hashes...)
			case pool.BlockRemoved:
				removed = append(removed, x.Hashes...)
			}
		}
	}
	ns := m.Layout().Namespace
	ha, hb := ns.Hashes(a), ns.Hashes(b)
	if w := append(slices.Clone(ha), hb...); !slices.Equal(stored, w) {
		t.Errorf("stored %v, want both prompts' blocks %v", stored, w)
	}
	if len(removed) == 0 || !slices.ContainsFunc(removed, func(h index.Hash) bool { return slices.Contains(ha, h) }) {
		t.Errorf("removed %v: the first prompt's blocks should have been evicted", removed)
	}
}

func TestSamplingSettingsReachTheModel(t *testing.T) {
	rec := &recorder{Model: newSim(t)}
	e := newEngine(t, Config{Model: rec})
	generate(t, e, Request{Prompt: prompt(20, 1), MaxTokens: 3, Sampling: Sampling{Temperature: 0.7, Seed: 42}})
	for _, c := range rec.calls {
		for _, s := range c.seqs {
			if s.Temperature != 0.7 || s.Seed != 42 {
				t.Errorf("the model was given temperature %v seed %d, want 0.7 and 42", s.Temperature, s.Seed)
			}
		}
	}
}

func TestCloseAbortsOnboardingAndStoringRequests(t *testing.T) {
	p := prompt(100, 1)
	conn := warm(t, p, 1)
	conn.set(func(c *mapConn) { c.hang = true })
	e, err := New(Config{Model: newSim(t), Connector: conn, CacheTimeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	onboarding, _ := e.Generate(context.Background(), Request{Prompt: p, MaxTokens: 5})
	<-conn.hanging
	// One full block to store, none to onboard (the last is computed).
	storing, _ := e.Generate(context.Background(), Request{Prompt: prompt(16, 2), MaxTokens: 1, Transfer: &KVTransferParams{DoRemoteDecode: true}})
	<-conn.hanging
	e.Close()
	for name, ch := range map[string]<-chan Output{"onboarding": onboarding, "storing": storing} {
		if _, last := collect(t, ch); last.Finish != FinishAbort || !errors.Is(last.Err, ErrClosed) || last.Transfer != nil {
			t.Errorf("%s request: finish %q err %v transfer %+v, want abort with ErrClosed, no transfer", name, last.Finish, last.Err, last.Transfer)
		}
	}
}
