package worker

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/engine/model/sim"
)

// BenchmarkOverhead64 measures the worker's own cost — scheduling, the
// block pool, HTTP and SSE, detokenizing, KV events — per generated token,
// against the time the sim model says the steps take, with 64 concurrent
// streaming requests over real HTTP to a worker publishing its KV events
// (no cache). The model's step sleeps are added up as they happen, so
//
//	overhead = wall time − Σ modelled step time
//
// over the whole run of 64 requests (from the first request sent to the
// last stream's [DONE]); it is reported per generated token and as a
// fraction of the modelled time ("overhead/modelled"). "virtual" runs the
// same load with the sleeps taking no time (a sim.VirtualClock): its wall
// time is all overhead, the worker's cost when the model costs nothing
// (its steps batch differently, since requests arrive over more steps, so
// its modelled-ms/op differs from real's).
//
// The load generator (64 streaming clients) runs in the same process, on
// the same cores, and its cost is in the overhead too.
func BenchmarkOverhead64(b *testing.B) {
	for _, mode := range []string{"real", "virtual"} {
		b.Run(mode, func(b *testing.B) { benchOverhead(b, mode == "virtual") })
	}
}

const (
	benchSeqs   = 64
	benchPrompt = 128 // tokens, 8 blocks
	benchGen    = 64  // tokens generated per request
)

func benchOverhead(b *testing.B, virtual bool) {
	var modelled atomic.Int64 // ns
	clock := sim.NewVirtualClock(time.Unix(0, 0))
	sleep := func(ctx context.Context, d time.Duration) error {
		modelled.Add(int64(d))
		if virtual {
			return clock.Sleep(ctx, d)
		}
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	events := "tcp://" + ln.Addr().String()
	ln.Close()
	w, err := New(Config{Listen: "127.0.0.1:0", KVEvents: events, SimSleep: sleep, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	if err := w.Start(context.Background()); err != nil {
		b.Fatal(err)
	}
	defer w.Stop(context.Background())
	url := "http://" + w.Addr() + "/v1/completions"
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: benchSeqs}}

	var wall time.Duration
	var tokens int64
	modelled.Store(0)
	b.ResetTimer()
	for i := range b.N {
		start := time.Now()
		var wg sync.WaitGroup
		var got atomic.Int64
		for s := range benchSeqs {
			// Every prompt its own (no prefix hits): its first two ids
			// number it, the rest count up; all within the vocabulary.
			n := i*benchSeqs + s
			prompt := make([]int, benchPrompt)
			for j := range prompt {
				prompt[j] = 2 + j
			}
			prompt[0], prompt[1] = 1+n%100000, 1+n/100000
			wg.Go(func() {
				n, err := stream(client, url, prompt)
				if err != nil {
					b.Error(err)
				}
				got.Add(int64(n))
			})
		}
		wg.Wait()
		wall += time.Since(start)
		tokens += got.Load()
	}
	b.StopTimer()
	if tokens != int64(b.N*benchSeqs*benchGen) {
		b.Fatalf("%d tokens streamed, want %d", tokens, b.N*benchSeqs*benchGen)
	}
	m := time.Duration(modelled.Load())
	over := wall - m
	if virtual {
		over = wall
	}
	b.ReportMetric(float64(m.Milliseconds())/float64(b.N), "modelled-ms/op")
	b.ReportMetric(float64(over.Microseconds())/float64(tokens), "overhead-µs/token")
	b.ReportMetric(float64(over)/float64(m), "overhead/modelled")
}

// stream sends one streamed completion and returns the tokens it got.
func stream(c *http.Client, url string, prompt []int) (int, error) {
	body, _ := json.Marshal(map[string]any{"prompt": prompt, "max_tokens": benchGen, "ignore_eos": true,
		"temperature": 0, "stream": true, "stream_options": map[string]any{"include_usage": true}})
	resp, err := c.Post(url, "application/json", bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("status %d", resp.StatusCode)
	}
	sc := bufio.NewScanner(resp.Body)
	n := 0
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if line == "[DONE]" {
			return n, nil
		}
		var chunk struct {
			Usage *struct {
				CompletionTokens int `json:"completion_tokens"`
			} `json:"usage"`
		}
		if err := json.Unmarshal([]byte(line), &chunk); err != nil {
			return 0, err
		}
		if chunk.Usage != nil {
			n = chunk.Usage.CompletionTokens
		}
	}
	return 0, fmt.Errorf("the stream ended without [DONE]: %v", sc.Err())
}
