package main

import (
	"context"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/replay"
	"github.com/kvstrata/kvstrata/trace"
)

// The first 20 requests of the Mooncake conversation trace, replayed by
// the replay package (what `kvctl replay` runs) against a real sim worker
// backed by a real cache node.
func TestReplayOfTheConversationTraceCompletesAgainstASimWorker(t *testing.T) {
	all, err := trace.ReadFile("../../testdata/traces/conversation_trace.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	reqs := all[:20]
	node := startNode(t, t.TempDir())
	// 8192 blocks of 16 tokens hold the longest of the 20 (87,571 tokens
	// with its output); the trace's 3 s between its two bursts pass in
	// 3 ms at --speedup 1000.
	w := startWorkerProcess(t, node.grpc, "--model", "sim", "--speedup", "50", "--num-gpu-blocks", "8192",
		"--kv-events", "", "--kv-events-replay", "")
	target, err := replay.NewTarget(w.url, "", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	prompts := replay.Prompts{Vocab: replay.DefaultVocab}
	results := make([]replay.Result, len(reqs))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// One request at a time, so that each finds the blocks of those
	// before it computed: the trace's timestamps still set when each is
	// due, and every one after the first is counted as having waited.
	rep, err := replay.Run(ctx, reqs, replay.Config{Speedup: 1000, MaxInFlight: 1}, func(ctx context.Context, i int, r trace.Request) replay.Result {
		ids, err := prompts.Tokens(r)
		if err != nil {
			t.Errorf("request %d: %v", i, err)
			return replay.Result{ErrKind: "prompt", Err: err}
		}
		results[i] = target.Send(ctx, ids, r.OutputLength, time.Minute)
		return results[i]
	})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Completed != len(reqs) || rep.Failed != 0 {
		t.Fatalf("%d of %d completed; errors %v, first: %s\n%s", rep.Completed, len(reqs), rep.Errors, rep.FirstError, w.log)
	}
	for i, r := range results {
		want := reqs[i]
		if r.PromptTokens != want.InputLength || r.OutputTokens != want.OutputLength {
			t.Errorf("request %d: %d prompt and %d output tokens, want the trace's %d and %d",
				i, r.PromptTokens, r.OutputTokens, want.InputLength, want.OutputLength)
		}
		// Every token is timed: the worker's continuous usage says how
		// many tokens a chunk carries when a token's text ends
		// mid-character and comes with the next one.
		if n := int64(len(r.ITL)) + 1; n != want.OutputLength {
			t.Errorf("request %d: %d tokens timed, want %d", i, n, want.OutputLength)
		}
		// Every request starts with hash id 0 and, among the first 20,
		// shares nothing more: the second and later find exactly its 512
		// tokens cached, the first none.
		wantCached := int64(512)
		if i == 0 {
			wantCached = 0
		}
		if r.CachedTokens != wantCached {
			t.Errorf("request %d: %d cached tokens, want %d", i, r.CachedTokens, wantCached)
		}
	}
	if rep.Waited == 0 {
		t.Errorf("no request waited for the one slot; the trace's first ten are due at once")
	}
	if rep.TTFT.Count != 20 || rep.TTFT.Mean <= 0 || rep.E2E.Mean < rep.TTFT.Mean {
		t.Errorf("TTFT %+v, E2E %+v", rep.TTFT, rep.E2E)
	}
}
