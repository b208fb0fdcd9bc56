package openai

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"unicode/utf8"

	"github.com/kvstrata/kvstrata/engine/tokenizer"
)

// sse writes server-sent events: each "data: {json}\n\n", flushed at
// once, and "data: [DONE]\n\n" at the end, as vLLM streams.
type sse struct {
	w  http.ResponseWriter
	rc *http.ResponseController
}

// newSSE answers 200 with the event-stream headers.
func newSSE(w http.ResponseWriter) *sse {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	return &sse{w: w, rc: http.NewResponseController(w)}
}

// send writes v as one event and flushes it.
func (s *sse) send(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return s.write(b)
}

// fail writes an error event, as vLLM reports an error mid-stream.
func (s *sse) fail(e *apiError) error { return s.send(e.body()) }

// done writes the [DONE] event.
func (s *sse) done() error { return s.write([]byte("[DONE]")) }

func (s *sse) write(data []byte) error {
	buf := make([]byte, 0, len(data)+8)
	buf = append(buf, "data: "...)
	buf = append(buf, data...)
	buf = append(buf, "\n\n"...)
	if _, err := s.w.Write(buf); err != nil {
		return err
	}
	return s.rc.Flush()
}

// detokenizer turns a request's generated ids into text incrementally, as
// vLLM's incremental detokenizer does: it decodes a window of recent ids
// and never passes on the first bytes of a character whose last bytes are
// still to come, so no emitted piece splits a character. It also ends the
// text at the first stop string, and holds back the last
// len(longest stop)-1 bytes until they cannot begin one.
type detokenizer struct {
	tok tokenizer.Tokenizer
	ids []uint32
	// The window: ids[prefix:read] were decoded before (context for the
	// ids after them); of the text of ids[read:], the first extra bytes
	// are in text already.
	prefix, read int
	extra        int
	text         []byte // decoded so far, cut at a stop string
	sent         int    // bytes of text taken
	stops        []string
	maxStop      int
	stopped      bool
	stopString   any // the stop string that ended the text, or nil
}

func newDetokenizer(tok tokenizer.Tokenizer, stops []string) *detokenizer {
	d := &detokenizer{tok: tok, stops: stops}
	for _, s := range stops {
		d.maxStop = max(d.maxStop, len(s))
	}
	return d
}

// add decodes ids after those added before.
func (d *detokenizer) add(ids []uint32) {
	if d.stopped || len(ids) == 0 {
		return
	}
	d.ids = append(d.ids, ids...)
	d.decode(false)
}

// flush decodes whatever is held back, complete or not.
func (d *detokenizer) flush() {
	if !d.stopped {
		d.decode(true)
	}
}

// decode appends the window's new text up to its incomplete tail (all of
// it if final), and moves the window on once no character is pending.
func (d *detokenizer) decode(final bool) {
	prev := len(d.tok.Decode(d.ids[d.prefix:d.read]))
	full := d.tok.Decode(d.ids[d.prefix:])
	tail := 0
	if !final {
		tail = incompleteTail(full)
	}
	if from, to := prev+d.extra, len(full)-tail; to > from {
		d.appendText(full[from:to])
		d.extra = to - prev
	}
	if tail == 0 && len(full) >= prev {
		d.prefix, d.read, d.extra = d.read, len(d.ids), 0
	}
}

// appendText adds decoded text and cuts it at the first stop string.
func (d *detokenizer) appendText(s string) {
	from := max(0, len(d.text)-d.maxStop+1)
	d.text = append(d.text, s...)
	cut := -1
	for _, stop := range d.stops {
		if i := bytes.Index(d.text[from:], []byte(stop)); i >= 0 && (cut < 0 || from+i < cut) {
			cut, d.stopString = from+i, stop
		}
	}
	if cut >= 0 {
		d.text = d.text[:cut]
		d.stopped = true
	}
}

// take returns the text not taken yet that is safe to emit; final (the
// request has ended) takes everything.
func (d *detokenizer) take(final bool) string {
	if final {
		d.flush()
	}
	end := len(d.text)
	if !final && !d.stopped && d.maxStop > 1 {
		end -= d.maxStop - 1
		for end > d.sent && end < len(d.text) && !utf8.RuneStart(d.text[end]) {
			end--
		}
	}
	if end <= d.sent {
		return ""
	}
	s := string(d.text[d.sent:end])
	d.sent = end
	return s
}

// incompleteTail is the length of the first bytes of a multi-byte UTF-8
// character that end s and that later bytes could complete, or 0.
func incompleteTail(s string) int {
	for i := 1; i <= utf8.UTFMax-1 && i <= len(s); i++ {
		if utf8.RuneStart(s[len(s)-i]) {
			if utf8.FullRuneInString(s[len(s)-i:]) {
				return 0
			}
			return i
		}
	}
	return 0
}

// streamPieces sends the jobs' pieces as they come, each with chunk, but a
// piece that neither finishes its prompt nor has content (worth) is skipped.
// It returns the finished prompts' usage, and false when the stream is
// over already: an engine request failed (told the client, then [DONE]),
// or the client is gone (returning cancels the requests).
func (s *Server) streamPieces(ctx context.Context, out *sse, id string, jobs []*job, worth func(piece) bool, chunk func(piece) error) (*usageJSON, bool) {
	total := &usageJSON{}
	for pc := range merge(ctx, jobs) {
		f := pc.fin
		if f != nil && f.err != nil {
			s.logFailure(ctx, "openai: streamed request failed", id, f.err)
			out.fail(engineError(f.err))
			out.done()
			return nil, false
		}
		if f == nil && !worth(pc) {
			continue
		}
		if chunk(pc) != nil {
			return nil, false
		}
		if f != nil {
			total.add(f.usage)
		}
	}
	return total, ctx.Err() == nil
}
