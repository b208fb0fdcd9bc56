package openai

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/kvstrata/kvstrata/engine/sched"
)

func TestDetokenizer(t *testing.T) {
	ids := func(s string) []uint32 { return testTok.Encode(s) }
	t.Run("a split character is held until complete", func(t *testing.T) {
		d := newDetokenizer(testTok, nil)
		euro := ids("€") // three bytes, three ids
		d.add(append(ids("a"), euro[0]))
		if got := d.take(false); got != "a" {
			t.Fatalf("took %q, want \"a\" (the euro sign's first byte held)", got)
		}
		d.add(euro[1:2])
		if got := d.take(false); got != "" {
			t.Fatalf("took %q with two of three bytes", got)
		}
		d.add(euro[2:])
		if got := d.take(false); got != "€" {
			t.Fatalf("took %q, want the euro sign", got)
		}
	})
	t.Run("invalid bytes are not held", func(t *testing.T) {
		d := newDetokenizer(testTok, nil)
		d.add([]uint32{0xff, 'b', 0x80})
		if got := d.take(false); got != "\xffb\x80" {
			t.Fatalf("took %q: bytes no later byte can complete are passed on", got)
		}
	})
	t.Run("an incomplete tail is flushed at the end", func(t *testing.T) {
		d := newDetokenizer(testTok, nil)
		d.add([]uint32{'x', 0xe2, 0x82})
		if got := d.take(false); got != "x" {
			t.Fatalf("took %q", got)
		}
		if got := d.take(true); got != "\xe2\x82" {
			t.Fatalf("final take %q, want the held bytes", got)
		}
	})
	t.Run("a stop string across ids and takes", func(t *testing.T) {
		d := newDetokenizer(testTok, []string{"STOP"})
		var out strings.Builder
		for _, c := range "abcSTxSTOPdef" {
			d.add(ids(string(c)))
			out.WriteString(d.take(false))
			if d.stopped {
				break
			}
		}
		out.WriteString(d.take(true))
		if out.String() != "abcSTx" || !d.stopped || d.stopString != "STOP" {
			t.Fatalf("text %q stopped %v by %v, want \"abcSTx\" stopped by STOP", out.String(), d.stopped, d.stopString)
		}
	})
	t.Run("the earliest of several stop strings wins", func(t *testing.T) {
		d := newDetokenizer(testTok, []string{"cd", "bcde"})
		d.add(ids("abcdef"))
		if got := d.take(true); got != "a" || d.stopString != "bcde" {
			t.Fatalf("took %q stopped by %v, want \"a\" by bcde", got, d.stopString)
		}
	})
}

// BenchmarkStreamedToken is the server's cost per streamed token: HTTP,
// JSON, SSE framing and detokenization, with an engine that costs nothing
// and hands over one token per Output.
func BenchmarkStreamedToken(b *testing.B) {
	const tokens = 512
	e := &testEngine{gen: func(_ sched.Request, i int) uint32 { return uint32('a' + i%26) }}
	s, err := New(Config{Engine: e, Tokenizer: testTok, ModelName: testModel, ContextLen: tokens + 8,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	ts := httptest.NewServer(s)
	defer ts.Close()
	body := `{"prompt":"x","max_tokens":512,"stream":true}`
	b.ResetTimer()
	for range b.N {
		req, _ := http.NewRequestWithContext(context.Background(), "POST", ts.URL+"/v1/completions", strings.NewReader(body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*tokens), "ns/token")
}
