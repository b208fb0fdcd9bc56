package worker

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/api/client"
	"github.com/kvstrata/kvstrata/api/nodetest"
	"github.com/kvstrata/kvstrata/internal/hung"
)

// tokenPrompt is n token ids no other test's prompt starts with.
func tokenPrompt(seed, n int) []uint32 {
	p := make([]uint32, n)
	for i := range p {
		p[i] = uint32(1000 + seed*7919 + i*13)
	}
	return p
}

// streamed is a streamed completion: its generated token ids and finish
// reason, and a channel closed at its first chunk.
type streamed struct {
	first  chan struct{}
	done   chan struct{}
	tokens []uint32
	finish string
	err    error
}

// streamTokens posts a streaming completion of prompt and reads it on a
// goroutine of its own.
func streamTokens(t *testing.T, base string, prompt []uint32, maxTokens int) *streamed {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"prompt": prompt, "max_tokens": maxTokens, "stream": true, "return_token_ids": true,
		"ignore_eos": true})
	s := &streamed{first: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		var once sync.Once
		defer once.Do(func() { close(s.first) })
		resp, err := http.Post(base+"/v1/completions", "application/json", strings.NewReader(string(body)))
		if err != nil {
			s.err = err
			return
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			s.err = fmt.Errorf("status %d", resp.StatusCode)
			return
		}
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			line, ok := strings.CutPrefix(sc.Text(), "data: ")
			if !ok || line == "[DONE]" {
				continue
			}
			var c struct {
				Choices []struct {
					TokenIDs     []uint32 `json:"token_ids"`
					FinishReason *string  `json:"finish_reason"`
				} `json:"choices"`
			}
			if err := json.Unmarshal([]byte(line), &c); err != nil {
				s.err = err
				return
			}
			for _, ch := range c.Choices {
				s.tokens = append(s.tokens, ch.TokenIDs...)
				if ch.FinishReason != nil {
					s.finish = *ch.FinishReason
				}
			}
			once.Do(func() { close(s.first) })
		}
		s.err = sc.Err()
	}()
	return s
}

func wait(t *testing.T, what string, c <-chan struct{}) {
	t.Helper()
	select {
	case <-c:
	case <-time.After(time.Minute):
		t.Fatalf("still waiting after a minute: %s", what)
	}
}

// A draining worker turns new requests away with a 503 (and fails
// /health), lets the streaming request it has finish whole, and returns
// once every block that request computed, prompt and output, is in the
// cache: a Lookup right after finds them all, and nothing was dropped.
func TestDrainFinishesWhatItHasOffloadsItAndTurnsNewRequestsAway(t *testing.T) {
	n := nodetest.Start(t, nodetest.Options{DRAMBytes: 64 << 20})
	w := startWorker(t, Config{Cache: n.Addr, Speedup: 2})
	base := "http://" + w.Addr()
	prompt := tokenPrompt(1, 300)
	const maxTokens = 120
	s := streamTokens(t, base, prompt, maxTokens)
	wait(t, "the stream's first chunk", s.first)

	type result struct {
		rep DrainReport
		err error
	}
	drained := make(chan result, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		rep, err := w.Drain(ctx)
		drained <- result{rep, err}
	}()
	for deadline := time.Now().Add(time.Minute); w.Ready() == nil; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the worker still ready a minute into its drain")
		}
	}
	resp, err := http.Post(base+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"new","max_tokens":2}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("a new request while draining: %d (Retry-After %q), want 503 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if status, _ := get(t, base+"/health"); status != http.StatusServiceUnavailable {
		t.Fatalf("/health while draining: %d, want 503", status)
	}

	wait(t, "the stream's end", s.done)
	if s.err != nil || s.finish != "length" || len(s.tokens) != maxTokens {
		t.Fatalf("the stream in flight: %d tokens, finish %q, %v; want all %d, length", len(s.tokens), s.finish, s.err, maxTokens)
	}
	var r result
	select {
	case r = <-drained:
	case <-time.After(time.Minute):
		t.Fatal("Drain still running a minute after the last request ended")
	}
	computed := append(append([]uint32{}, prompt...), s.tokens[:len(s.tokens)-1]...) // the last token's KV is never computed
	ns := w.Model().Layout().Namespace
	hashes := ns.Hashes(computed)
	if r.err != nil || r.rep.Dropped != 0 || r.rep.InFlight != 1 || r.rep.Unfinished != 0 || r.rep.Offloaded == 0 {
		t.Fatalf("Drain = %+v, %v; want the 1 request finished, blocks offloaded, none dropped", r.rep, r.err)
	}
	c, err := client.Dial(context.Background(), n.Addr, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	lr, err := c.Lookup(context.Background(), ns.ID(), hashes)
	if err != nil || int(lr.GetBlocks()) != len(hashes) {
		t.Fatalf("Lookup right after the drain: %d of %d blocks (prompt and output), %v", lr.GetBlocks(), len(hashes), err)
	}
}

// With its cache node hung, a drain cannot offload: it returns at its
// context's deadline, never later, saying how many blocks it drops.
func TestDrainReturnsAtItsDeadlineWhenTheCacheHangs(t *testing.T) {
	w := startWorker(t, Config{Cache: hung.Listener(t), Speedup: 100})
	prompt := tokenPrompt(2, 100)
	s := streamTokens(t, "http://"+w.Addr(), prompt, 40)
	wait(t, "the request's end", s.done)
	if s.err != nil || len(s.tokens) != 40 {
		t.Fatalf("the request with the cache hung: %d tokens, %v; want 40 (recomputed)", len(s.tokens), s.err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	type result struct {
		rep DrainReport
		err error
	}
	drained := make(chan result, 1)
	go func() {
		rep, err := w.Drain(ctx)
		drained <- result{rep, err}
	}()
	var r result
	select {
	case r = <-drained:
	case <-time.After(time.Minute):
		t.Fatal("Drain still running a minute after its 1s deadline")
	}
	want := (len(prompt) + 40 - 1) / 16 // every full block computed, all still queued
	if !errors.Is(r.err, context.DeadlineExceeded) || r.rep.Dropped != want {
		t.Fatalf("Drain = %+v, %v; want %d blocks dropped and context.DeadlineExceeded", r.rep, r.err, want)
	}
}
