package sched

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestGenerateReturnsTheModelsTokens(t *testing.T) {
	m := newSim(t)
	e := newEngine(t, Config{Model: m})
	p := prompt(50, 1)
	toks, last := generate(t, e, Request{ID: "a", Prompt: p, MaxTokens: 20})
	if w := want(m, p, 20); !slices.Equal(toks, w) {
		t.Fatalf("tokens %v, want the model's %v", toks, w)
	}
	if last.Finish != FinishLength || last.Err != nil {
		t.Errorf("last Output: finish %q, err %v; want length, nil", last.Finish, last.Err)
	}
	if u := last.Usage; u.PromptTokens != 50 || u.CompletionTokens != 20 || u.CachedTokens != 0 {
		t.Errorf("usage %+v, want 50 prompt, 20 completion, 0 cached", u)
	}
}

func TestStopTokensEndGenerationUnlessIgnoreEOS(t *testing.T) {
	m := newSim(t)
	e := newEngine(t, Config{Model: m})
	p := prompt(20, 2)
	w := want(m, p, 10)
	stop := w[3]
	if slices.Index(w, stop) != 3 {
		t.Skip("the stop token occurs earlier; pick another prompt")
	}
	toks, last := generate(t, e, Request{Prompt: p, MaxTokens: 10, StopTokens: []uint32{stop}})
	if !slices.Equal(toks, w[:4]) || last.Finish != FinishStop {
		t.Errorf("with stop token %d: %v, finish %q; want %v (the stop token included), stop", stop, toks, last.Finish, w[:4])
	}
	toks, last = generate(t, e, Request{Prompt: p, MaxTokens: 10, StopTokens: []uint32{stop}, IgnoreEOS: true})
	if !slices.Equal(toks, w) || last.Finish != FinishLength {
		t.Errorf("ignoring EOS: %v, finish %q; want all of %v, length", toks, last.Finish, w)
	}
}

func TestGenerateRejectsBadRequests(t *testing.T) {
	m := newSim(t)
	e := newEngine(t, Config{Model: m, Blocks: 64}) // context length 64 × 16 = 1024
	for _, tc := range []struct {
		name string
		req  Request
		err  error
		says string
	}{
		{"empty prompt", Request{MaxTokens: 1}, ErrBadRequest, "prompt is empty"},
		{"no max tokens", Request{Prompt: prompt(3, 1)}, ErrBadRequest, "max tokens is 0"},
		{"negative temperature", Request{Prompt: prompt(3, 1), MaxTokens: 1, Sampling: Sampling{Temperature: -1}}, ErrBadRequest, "temperature"},
		{"too long", Request{Prompt: prompt(1000, 1), MaxTokens: 25}, ErrTooLong, "context length of 1024 tokens"},
		{"both transfer directions", Request{Prompt: prompt(3, 1), MaxTokens: 1,
			Transfer: &KVTransferParams{DoRemoteDecode: true, DoRemotePrefill: true}}, ErrBadRequest, "both"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.Generate(context.Background(), tc.req)
			if !errors.Is(err, tc.err) || !strings.Contains(err.Error(), tc.says) {
				t.Errorf("error %v, want %v saying %q", err, tc.err, tc.says)
			}
		})
	}
	// A prompt that fits exactly is fine.
	if _, last := generate(t, e, Request{Prompt: prompt(1000, 1), MaxTokens: 24}); last.Err != nil {
		t.Errorf("a request of exactly the context length: %v", last.Err)
	}
}

func TestNewReportsEveryBadField(t *testing.T) {
	_, err := New(Config{Model: newSim(t), Blocks: -1, MaxNumSeqs: 8, MaxNumBatchedTokens: 4, MaxWaiting: -1})
	for _, s := range []string{"Blocks is -1", "MaxNumBatchedTokens is 4", "MaxWaiting is -1"} {
		if !errors.Is(err, ErrBadConfig) || !strings.Contains(err.Error(), s) {
			t.Errorf("New: %v, want ErrBadConfig saying %q", err, s)
		}
	}
	if _, err := New(Config{}); !errors.Is(err, ErrBadConfig) || !strings.Contains(err.Error(), "Model is nil") {
		t.Errorf("New without a model: %v", err)
	}
	if _, err := New(Config{Model: newSim(t), Blocks: 4, ContextLen: 65}); err == nil || !strings.Contains(err.Error(), "ContextLen is 65") {
		t.Errorf("a context longer than the pool: %v", err)
	}
}

func TestOverloadedWhenTheQueueIsFull(t *testing.T) {
	g := newGate(newSim(t))
	e := newEngine(t, Config{Model: g, MaxNumSeqs: 1, MaxWaiting: 1})
	first, err := e.Generate(context.Background(), Request{Prompt: prompt(10, 1), MaxTokens: 2})
	if err != nil {
		t.Fatal(err)
	}
	<-g.entered // the first request is in the batch, its prefill under way
	second, err := e.Generate(context.Background(), Request{Prompt: prompt(10, 2), MaxTokens: 2})
	if err != nil {
		t.Fatalf("the second request fills the queue of one: %v", err)
	}
	if _, err := e.Generate(context.Background(), Request{Prompt: prompt(10, 3), MaxTokens: 2}); !errors.Is(err, ErrOverloaded) {
		t.Fatalf("a third request: %v, want ErrOverloaded", err)
	}
	g.open()
	for _, ch := range []<-chan Output{first, second} {
		if _, last := collect(t, ch); last.Err != nil {
			t.Errorf("a queued request failed: %v", last.Err)
		}
	}
	if _, err := e.Generate(context.Background(), Request{Prompt: prompt(10, 3), MaxTokens: 2}); err != nil {
		t.Errorf("once the queue drained: %v", err)
	}
}

func TestCancellationFreesTheRequestsBlocks(t *testing.T) {
	g := newGate(newSim(t))
	e := newEngine(t, Config{Model: g, Blocks: 64})
	ctx, cancel := context.WithCancel(context.Background())
	ch, err := e.Generate(ctx, Request{Prompt: prompt(100, 1), MaxTokens: 500})
	if err != nil {
		t.Fatal(err)
	}
	<-g.entered // prefill
	g.release <- struct{}{}
	<-g.entered // first decode
	g.release <- struct{}{}
	<-g.entered // second decode, held
	cancel()
	g.open()
	toks, last := collect(t, ch)
	if last.Finish != FinishAbort || !errors.Is(last.Err, context.Canceled) {
		t.Errorf("last Output: finish %q err %v, want abort with context.Canceled", last.Finish, last.Err)
	}
	if len(toks) >= 500 {
		t.Errorf("got all %d tokens despite the cancellation", len(toks))
	}
	st := e.Stats()
	if st.Running != 0 || st.Pool.Free != st.Pool.Blocks || st.Pool.Usage != 0 {
		t.Errorf("after the cancellation: %d running, %d of %d blocks free, usage %v; want none held",
			st.Running, st.Pool.Free, st.Pool.Blocks, st.Pool.Usage)
	}
	if st.Pool.Cached == 0 {
		t.Errorf("the cancelled request's full blocks are no longer cached")
	}
}

func TestCancelledWhileWaiting(t *testing.T) {
	g := newGate(newSim(t))
	e := newEngine(t, Config{Model: g, MaxNumSeqs: 1})
	// The first request holds the only batch slot for as long as the test
	// lets it run.
	firstCtx, cancelFirst := context.WithCancel(context.Background())
	first, _ := e.Generate(firstCtx, Request{Prompt: prompt(10, 1), MaxTokens: 10000})
	<-g.entered
	ctx, cancel := context.WithCancel(context.Background())
	second, err := e.Generate(ctx, Request{Prompt: prompt(10, 2), MaxTokens: 2})
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	// The loop sees the cancellation between two steps.
	g.release <- struct{}{}
	var last Output
	for last.Finish == "" {
		select {
		case o := <-second:
			if len(o.Tokens) != 0 {
				t.Errorf("the queued request generated %v", o.Tokens)
			}
			last = o
		case <-g.entered:
			g.release <- struct{}{}
		}
	}
	if last.Finish != FinishAbort || !errors.Is(last.Err, context.Canceled) {
		t.Errorf("a request cancelled while queued ended with %q, %v", last.Finish, last.Err)
	}
	cancelFirst()
	g.open()
	collect(t, first)
	if st := e.Stats(); st.Waiting != 0 || st.Pool.Free != st.Pool.Blocks {
		t.Errorf("stats %+v: want nothing waiting or held", st)
	}
}

func TestAReaderThatNeverReadsStallsNoOne(t *testing.T) {
	m := newSim(t)
	e := newEngine(t, Config{Model: m})
	idle, err := e.Generate(context.Background(), Request{Prompt: prompt(30, 9), MaxTokens: 40})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		p := prompt(20+i, uint32(i))
		if toks, _ := generate(t, e, Request{Prompt: p, MaxTokens: 30}); !slices.Equal(toks, want(m, p, 30)) {
			t.Errorf("request %d: wrong tokens next to an idle reader", i)
		}
	}
	// The idle reader's tokens were merged, none lost.
	toks, last := collect(t, idle)
	if !slices.Equal(toks, want(m, prompt(30, 9), 40)) || last.Finish != FinishLength {
		t.Errorf("the late reader got %d tokens, finish %q; want all 40", len(toks), last.Finish)
	}
}

func TestCloseAbortsRequestsInFlight(t *testing.T) {
	g := newGate(newSim(t))
	e, err := New(Config{Model: g, MaxNumSeqs: 1})
	if err != nil {
		t.Fatal(err)
	}
	running, _ := e.Generate(context.Background(), Request{Prompt: prompt(10, 1), MaxTokens: 100})
	<-g.entered
	queued, _ := e.Generate(context.Background(), Request{Prompt: prompt(10, 2), MaxTokens: 100})
	e.Close()
	for name, ch := range map[string]<-chan Output{"running": running, "queued": queued} {
		if _, last := collect(t, ch); last.Finish != FinishAbort || !errors.Is(last.Err, ErrClosed) {
			t.Errorf("%s request: finish %q err %v, want abort with ErrClosed", name, last.Finish, last.Err)
		}
	}
	if _, err := e.Generate(context.Background(), Request{Prompt: prompt(10, 3), MaxTokens: 1}); !errors.Is(err, ErrClosed) {
		t.Errorf("Generate after Close: %v, want ErrClosed", err)
	}
	e.Close() // twice is fine
}
