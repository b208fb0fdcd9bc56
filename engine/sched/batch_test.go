package sched

import (
	"context"
	"slices"
	"sync"
	"testing"
)

// runAll starts every request at once and checks each gets the model's
// tokens.
func runAll(t *testing.T, e *Engine, m interface{ Next([]uint32) uint32 }, reqs []Request) []Output {
	t.Helper()
	chans := make([]<-chan Output, len(reqs))
	for i, r := range reqs {
		ch, err := e.Generate(context.Background(), r)
		if err != nil {
			t.Fatal(err)
		}
		chans[i] = ch
	}
	lasts := make([]Output, len(reqs))
	for i, ch := range chans {
		toks, last := collect(t, ch)
		if last.Err != nil {
			t.Fatalf("request %d: %v", i, last.Err)
		}
		w := slices.Clone(reqs[i].Prompt)
		for range reqs[i].MaxTokens {
			w = append(w, m.Next(w))
		}
		if !slices.Equal(toks, w[len(reqs[i].Prompt):]) {
			t.Errorf("request %d: tokens %v, want the model's %v", i, toks, w[len(reqs[i].Prompt):])
		}
		lasts[i] = last
	}
	return lasts
}

func TestContinuousBatchingRespectsMaxNumSeqsAndMaxNumBatchedTokens(t *testing.T) {
	m := newSim(t)
	rec := &recorder{Model: m}
	const seqs, budget = 4, 48
	e := newEngine(t, Config{Model: rec, MaxNumSeqs: seqs, MaxNumBatchedTokens: budget})
	rec.engine = e
	var reqs []Request
	for i := range 12 {
		reqs = append(reqs, Request{Prompt: prompt(5+i*9, uint32(i)), MaxTokens: 3 + i%5})
	}
	runAll(t, e, m, reqs)

	its := rec.iterations()
	full, mixed := false, false
	for n, it := range its {
		tokens, inBatch := 0, 0
		for _, c := range it {
			tokens += c.tokens()
			inBatch += len(c.seqs)
		}
		if inBatch > seqs {
			t.Errorf("iteration %d has %d sequences, more than MaxNumSeqs %d", n, inBatch, seqs)
		}
		if tokens > budget {
			t.Errorf("iteration %d computes %d tokens, more than MaxNumBatchedTokens %d", n, tokens, budget)
		}
		full = full || inBatch == seqs
		mixed = mixed || len(it) == 2
	}
	if !full {
		t.Errorf("no iteration ran %d sequences at once: the requests were not batched", seqs)
	}
	if !mixed {
		t.Errorf("no iteration decoded some sequences while prefilling others")
	}
	rec.checkKV(t)
}

func TestAPromptLongerThanTheBudgetIsPrefilledInChunks(t *testing.T) {
	m := newSim(t)
	rec := &recorder{Model: m}
	e := newEngine(t, Config{Model: rec, MaxNumSeqs: 4, MaxNumBatchedTokens: 64})
	p := prompt(200, 1)
	runAll(t, e, m, []Request{{Prompt: p, MaxTokens: 2}})

	var chunks [][2]int // cached, tokens of each prefill
	for _, c := range rec.calls {
		if !c.decode {
			chunks = append(chunks, [2]int{c.seqs[0].Cached, len(c.seqs[0].Tokens)})
		}
	}
	if w := [][2]int{{0, 64}, {64, 128}, {128, 192}, {192, 200}}; !slices.Equal(chunks, w) {
		t.Errorf("prefill chunks (cached, up to) %v, want %v", chunks, w)
	}
	rec.checkKV(t)
}

func TestASecondRequestComputesOnlyWhatThePoolLacks(t *testing.T) {
	m := newSim(t)
	rec := &recorder{Model: m}
	e := newEngine(t, Config{Model: rec})
	shared := prompt(100, 1) // 6 full blocks and 4 tokens
	runAll(t, e, m, []Request{{Prompt: shared, MaxTokens: 4}})
	before := e.Stats().Pool

	second := append(slices.Clone(shared[:96]), prompt(30, 2)...)
	rec.calls = nil
	lasts := runAll(t, e, m, []Request{{Prompt: second, MaxTokens: 4}})
	if first := rec.calls[0]; first.decode || first.seqs[0].Cached != 96 {
		t.Errorf("the second request's prefill starts at token %d, want 96 (six blocks from the pool)", first.seqs[0].Cached)
	}
	if u := lasts[0].Usage; u.CachedTokens != 96 || u.OnboardedTokens != 0 {
		t.Errorf("usage %+v, want 96 cached, none onboarded", u)
	}
	after := e.Stats().Pool
	if q, h := after.QueriedTokens-before.QueriedTokens, after.HitTokens-before.HitTokens; q != uint64(len(second)) || h != 96 {
		t.Errorf("pool counted %d queried and %d hit tokens, want %d and 96", q, h, len(second))
	}
	rec.checkKV(t)
}

func TestAPromptOfFullBlocksComputesItsLastBlock(t *testing.T) {
	m := newSim(t)
	rec := &recorder{Model: m}
	e := newEngine(t, Config{Model: rec})
	p := prompt(64, 3)
	runAll(t, e, m, []Request{{Prompt: p, MaxTokens: 1}})
	rec.calls = nil
	runAll(t, e, m, []Request{{Prompt: p, MaxTokens: 3}})
	if c := rec.calls[0]; c.seqs[0].Cached != 48 {
		t.Errorf("the repeated prompt of 4 full blocks starts at token %d, want 48: the last block is computed for its logits", c.seqs[0].Cached)
	}
	rec.checkKV(t)
}

func TestATinyPoolPreemptsAndEveryRequestStillFinishes(t *testing.T) {
	m := newSim(t)
	rec := &recorder{Model: m}
	// 12 blocks of 16 tokens; each request grows to 20+80 = 100 tokens, 7
	// blocks, so three admitted together cannot all finish without
	// preemption.
	e := newEngine(t, Config{Model: rec, Blocks: 12, MaxNumSeqs: 4, MaxNumBatchedTokens: 64})
	var reqs []Request
	for i := range 3 {
		reqs = append(reqs, Request{Prompt: prompt(20, uint32(i)), MaxTokens: 80})
	}
	runAll(t, e, m, reqs)
	st := e.Stats()
	if st.Preemptions == 0 {
		t.Errorf("no preemption in a pool too small for the batch")
	}
	if st.Pool.Free != st.Pool.Blocks {
		t.Errorf("%d of %d blocks free at the end, want all", st.Pool.Free, st.Pool.Blocks)
	}
	rec.checkKV(t)
}

func TestConcurrentRequestsWithTheSamePrompt(t *testing.T) {
	m := newSim(t)
	e := newEngine(t, Config{Model: m, MaxNumSeqs: 8})
	p := prompt(90, 5)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			ch, err := e.Generate(context.Background(), Request{Prompt: p, MaxTokens: 30})
			if err != nil {
				t.Error(err)
				return
			}
			if toks, _ := collect(t, ch); !slices.Equal(toks, want(m, p, 30)) {
				t.Error("a request sharing its prompt got other tokens")
			}
		})
	}
	wg.Wait()
	if st := e.Stats(); st.Pool.Free != st.Pool.Blocks {
		t.Errorf("%d of %d blocks free at the end", st.Pool.Free, st.Pool.Blocks)
	}
}
