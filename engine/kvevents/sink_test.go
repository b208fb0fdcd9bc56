package kvevents

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/engine/pool"
	"github.com/kvstrata/kvstrata/index"
)

// The engine loop's EventSink (engine/sched), satisfied without an import.
var _ interface {
	Event(pool.Event)
	Flush()
} = (*PoolSink)(nil)

const testNS = index.NamespaceID(0x5eed)

// worker is a block pool whose events go to a PoolSink fed Publisher, as
// a worker's engine loop wires them, and to a record of what the pool
// said.
type worker struct {
	t    *testing.T
	pub  *Publisher
	sink *PoolSink
	pool *pool.Pool

	mu   sync.Mutex
	said []pool.Event
}

func newWorker(t *testing.T, pcfg PublisherConfig, scfg SinkConfig) *worker {
	t.Helper()
	if pcfg.Endpoint == "" {
		pcfg.Endpoint, pcfg.ReplayEndpoint = "tcp://127.0.0.1:0", "tcp://127.0.0.1:0"
	}
	pub, err := NewPublisher(pcfg)
	if err != nil {
		t.Fatal(err)
	}
	sink, err := NewPoolSink(pub, scfg)
	if err != nil {
		t.Fatal(err)
	}
	w := &worker{t: t, pub: pub, sink: sink}
	w.pool, err = pool.New(pool.Config{Blocks: 8, BlockTokens: 4, Listener: func(e pool.Event) {
		w.mu.Lock()
		w.said = append(w.said, e)
		w.mu.Unlock()
		sink.Event(e)
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.close() })
	return w
}

func (w *worker) close() {
	if err := w.sink.Close(); err != nil {
		w.t.Error(err)
	}
	w.pub.Close()
}

// step runs one request of prompt through the pool (fresh blocks, named
// as they fill, freed) and ends the engine step.
func (w *worker) step(prompt []uint32) {
	w.t.Helper()
	blocks, err := w.pool.Allocate((len(prompt) + 3) / 4)
	if err != nil {
		w.t.Fatal(err)
	}
	if _, err := w.pool.Cache(testNS, blocks, prompt); err != nil {
		w.t.Fatal(err)
	}
	if err := w.pool.Free(blocks); err != nil {
		w.t.Fatal(err)
	}
	w.sink.Flush()
}

// workload stores, shares, evicts and clears blocks: prompts share
// prefixes (a child's parent is cached), the pool of 8 blocks fills and
// evicts, and a reset clears it.
func (w *worker) workload() {
	w.t.Helper()
	for i := range 12 {
		prompt := []uint32{1, 2, 3, 4} // a shared first block
		for j := range 2 + i%3 {
			prompt = append(prompt, uint32(100*i+j), uint32(200000-i), uint32(j), 7)
		}
		w.step(append(prompt, 9)) // and a partial block, never stored
	}
	if err := w.pool.Reset(); err != nil {
		w.t.Fatal(err)
	}
	w.sink.Flush()
}

// heartbeat ends engine steps of one AllBlocksCleared (a reset of the
// idle pool) until heard says a subscriber heard one: a PUB drops what it
// sends before a subscriber joins.
func (w *worker) heartbeat(ctx context.Context, heard func() bool) {
	w.t.Helper()
	for !heard() {
		if err := w.pool.Reset(); err != nil {
			w.t.Fatal(err)
		}
		w.sink.Flush()
		select {
		case <-time.After(20 * time.Millisecond):
		case <-ctx.Done():
			w.t.Fatal("no subscriber heard the worker before the test's deadline")
		}
	}
}

// expected is what the pool said, as text lines poolLine writes.
func (w *worker) expected() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for _, e := range w.said {
		out = append(out, poolLine(e))
	}
	return out
}

// poolLine writes a pool event as eventLine writes its vLLM event.
func poolLine(e pool.Event) string {
	hs := func(hs []index.Hash) string {
		var s []string
		for _, h := range hs {
			s = append(s, fmt.Sprint(uint64(h)))
		}
		return "[" + strings.Join(s, " ") + "]"
	}
	switch e.Kind {
	case pool.BlockStored:
		parent := "nil"
		if e.HasParent {
			parent = fmt.Sprint(uint64(e.Parent))
		}
		return fmt.Sprintf("Stored %s parent=%s tokens=%v size=%d medium=GPU", hs(e.Hashes), parent, e.Tokens, e.BlockTokens)
	case pool.BlockRemoved:
		return fmt.Sprintf("Removed %s medium=GPU", hs(e.Hashes))
	}
	return "Cleared"
}

// eventLine writes a vLLM event with its hashes as the pool's uint64s
// (an 8-byte string read big-endian); any other hash as Hash.String,
// which no pool hash matches.
func eventLine(ev Event) string {
	h := func(h Hash) string {
		if h.IsBytes() && len(h.Bytes()) == 8 {
			return fmt.Sprint(binary.BigEndian.Uint64(h.Bytes()))
		}
		if v, ok := h.Uint64(); ok && !h.IsBytes() {
			return fmt.Sprint(v)
		}
		return "other:" + h.String()
	}
	hs := func(hs []Hash) string {
		var s []string
		for _, x := range hs {
			s = append(s, h(x))
		}
		return "[" + strings.Join(s, " ") + "]"
	}
	medium := func(m *string) string {
		if m == nil {
			return "nil"
		}
		return *m
	}
	switch ev := ev.(type) {
	case *BlockStored:
		parent := "nil"
		if ev.ParentBlockHash != nil {
			parent = h(*ev.ParentBlockHash)
		}
		lora := ""
		if ev.LoraID != nil {
			lora = fmt.Sprintf(" lora=%d", *ev.LoraID)
		}
		return fmt.Sprintf("Stored %s parent=%s tokens=%v size=%d medium=%s%s", hs(ev.BlockHashes), parent, ev.TokenIDs, ev.BlockSize, medium(ev.Medium), lora)
	case *BlockRemoved:
		return fmt.Sprintf("Removed %s medium=%s", hs(ev.BlockHashes), medium(ev.Medium))
	}
	return "Cleared"
}

// covers checks that lines hold every kind of event, and a BlockStored
// both with and without a parent.
func covers(t *testing.T, lines []string) {
	t.Helper()
	for _, kind := range []string{"Stored", "Removed", "Cleared"} {
		if !slices.ContainsFunc(lines, func(l string) bool { return strings.HasPrefix(l, kind) }) {
			t.Fatalf("the workload made no %s event: %q", kind, lines)
		}
	}
	for _, parent := range []bool{false, true} {
		if !slices.ContainsFunc(lines, func(l string) bool {
			return strings.HasPrefix(l, "Stored") && strings.Contains(l, "parent=nil") != parent
		}) {
			t.Fatalf("the workload stored no block with parent %v: %q", parent, lines)
		}
	}
}

// collector is a Subscriber's callback that keeps what it is given.
type collector struct {
	mu     sync.Mutex
	seqs   []int64
	descs  []string // describe of each batch
	lines  []string // eventLine of each event
	ranks  []int64
	resets int
	lost   [][2]int64
}

func (c *collector) batch(seq int64, b *Batch) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seqs = append(c.seqs, seq)
	c.descs = append(c.descs, describe(b))
	if b.DataParallelRank == nil {
		c.ranks = append(c.ranks, -1)
	} else {
		c.ranks = append(c.ranks, *b.DataParallelRank)
	}
	for _, ev := range b.Events {
		c.lines = append(c.lines, eventLine(ev))
	}
}

func (c *collector) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.resets++
	c.seqs, c.descs, c.lines = nil, nil, nil
}

func (c *collector) lose(first, end int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.lost = append(c.lost, [2]int64{first, end})
}

func (c *collector) heard() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.seqs) > 0
}

// upTo reports whether the last batch delivered is seq.
func (c *collector) upTo(seq int64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.seqs) > 0 && c.seqs[len(c.seqs)-1] == seq
}

// subscribe runs a Subscriber of w's publisher into a new collector until
// the test ends.
func subscribe(t *testing.T, w *worker, cfg SubscriberConfig) (*collector, *Subscriber) {
	t.Helper()
	c := &collector{}
	if cfg.Endpoint == "" {
		cfg.Endpoint, cfg.ReplayEndpoint = "tcp://"+w.pub.Addr(), "tcp://"+w.pub.ReplayAddr()
	}
	cfg.OnReset, cfg.OnLost = c.reset, c.lose
	s, err := NewSubscriber(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx, c.batch) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != context.Canceled {
			t.Errorf("Run = %v, want context.Canceled", err)
		}
	})
	return c, s
}

// waitUntil polls cond until it holds, failing the test at ctx's deadline.
func waitUntil(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-time.After(10 * time.Millisecond):
		case <-ctx.Done():
			t.Fatalf("%s: not before the test's deadline", what)
		}
	}
}

// TestPoolSinkSubscriber: a Subscriber of a PoolSink-fed Publisher gets
// exactly the events the pool made, in order, numbered from 0 without a
// gap, in both encodings and both hash forms.
func TestPoolSinkSubscriber(t *testing.T) {
	for _, enc := range []Encoding{TaggedArrays, Maps} {
		for _, form := range []HashForm{HashInts, HashBytes} {
			t.Run(fmt.Sprintf("%v/hashes=%d", enc, form), func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				defer cancel()
				w := newWorker(t, PublisherConfig{Encoding: enc, Topic: "kv"}, SinkConfig{Hashes: form, DataParallelRank: 2})
				c, s := subscribe(t, w, SubscriberConfig{Topic: "kv"})
				w.heartbeat(ctx, c.heard)
				w.workload()
				last := int64(w.sink.Stats().Batches) - 1
				waitUntil(t, ctx, "the subscriber hears the last batch", func() bool { return c.upTo(last) })

				c.mu.Lock()
				defer c.mu.Unlock()
				want := w.expected()
				if !slices.Equal(c.lines, want) {
					t.Fatalf("events:\n got %q\nwant %q", c.lines, want)
				}
				covers(t, want)
				for i, seq := range c.seqs {
					if seq != int64(i) || c.ranks[i] != 2 {
						t.Fatalf("batch %d: seq %d rank %d, want seq %d rank 2", i, seq, c.ranks[i], i)
					}
				}
				if st := s.Stats(); st.Lost != 0 || st.Resets != 0 || st.Malformed != 0 || len(c.lost) != 0 {
					t.Fatalf("stats %+v, lost %v", st, c.lost)
				}
				if st := w.sink.Stats(); st.Dropped != 0 || st.Failed != 0 {
					t.Fatalf("sink stats %+v", st)
				}
			})
		}
	}
}

// TestPoolSinkOverflow: while the socket does not take batches, the sink
// keeps the engine loop going — each Flush returns — and drops the oldest
// waiting batches, counting them; they stay numbered in the replay buffer,
// so the subscriber sees the gap and replays it, and still gets every
// event in order.
func TestPoolSinkOverflow(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	w := newWorker(t, PublisherConfig{}, SinkConfig{QueueBatches: 2})
	c, s := subscribe(t, w, SubscriberConfig{})
	w.heartbeat(ctx, c.heard)

	w.pub.sendMu.Lock() // a send that blocks: the sender waits here
	before := w.sink.Stats()
	w.workload() // 13 batches
	flushed := w.sink.Stats().Batches - before.Batches
	w.pub.sendMu.Unlock()

	last := int64(w.sink.Stats().Batches) - 1
	waitUntil(t, ctx, "the subscriber hears the last batch", func() bool { return c.upTo(last) })
	if err := w.sink.Close(); err != nil {
		t.Fatal(err)
	}
	st := w.sink.Stats()
	// At most one batch in the sender's hands and two queued got through.
	if dropped := st.Dropped - before.Dropped; dropped < flushed-3 {
		t.Fatalf("%d of %d batches dropped, want at least %d", dropped, flushed, flushed-3)
	}
	if st.Sent+st.Dropped != st.Batches || st.Failed != 0 {
		t.Fatalf("sink stats %+v: every batch is sent or dropped", st)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if want := w.expected(); !slices.Equal(c.lines, want) {
		t.Fatalf("events:\n got %q\nwant %q", c.lines, want)
	}
	for i, seq := range c.seqs {
		if seq != int64(i) {
			t.Fatalf("batch %d has seq %d", i, seq)
		}
	}
	if ss := s.Stats(); ss.Replayed < st.Dropped || ss.Lost != 0 {
		t.Fatalf("subscriber stats %+v: want the %d dropped batches replayed, none lost", ss, st.Dropped)
	}
}

// TestPoolSinkClose: Close sends what was flushed, drops what was not,
// and returns ErrDrainTimeout when the socket does not take the queue in
// time; events after Close are ignored.
func TestPoolSinkClose(t *testing.T) {
	w := newWorker(t, PublisherConfig{}, SinkConfig{DrainTimeout: 50 * time.Millisecond})
	w.pub.sendMu.Lock() // the socket blocks before the batch is flushed, so it stays queued
	w.step([]uint32{1, 2, 3, 4})
	w.pool.Reset()
	w.sink.Event(pool.Event{Kind: pool.AllBlocksCleared}) // not flushed
	err := w.sink.Close()
	w.pub.sendMu.Unlock()
	if !errors.Is(err, ErrDrainTimeout) {
		t.Fatalf("Close while the socket blocks = %v, want ErrDrainTimeout", err)
	}
	w.sink.Event(pool.Event{Kind: pool.AllBlocksCleared})
	w.sink.Flush()
	if st := w.sink.Stats(); st.Batches != 1 || st.Events != 3 {
		t.Fatalf("stats %+v: want 1 batch flushed, 3 events, nothing after Close", st)
	}
	if err := w.sink.Close(); err != nil {
		t.Fatalf("second Close = %v", err)
	}

	w2 := newWorker(t, PublisherConfig{}, SinkConfig{})
	w2.step([]uint32{1, 2, 3, 4})
	if err := w2.sink.Close(); err != nil {
		t.Fatal(err)
	}
	if st := w2.sink.Stats(); st.Sent != 1 {
		t.Fatalf("stats %+v: Close sends what was flushed", st)
	}
}

func TestSinkConfig(t *testing.T) {
	pub, err := NewPublisher(PublisherConfig{Endpoint: "tcp://127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	if _, err := NewPoolSink(pub, SinkConfig{Hashes: 7, QueueBatches: -1, DrainTimeout: -1}); err == nil {
		t.Fatal("accepted an unknown hash form, a negative queue and drain timeout")
	} else {
		t.Log(err)
	}
}

// BenchmarkPoolSinkFlush: what the engine loop pays per step for its
// events: one BlockStored of one 16-token block and one BlockRemoved,
// then Flush (encode, number, keep for replay, queue).
func BenchmarkPoolSinkFlush(b *testing.B) {
	for _, enc := range []Encoding{TaggedArrays, Maps} {
		b.Run(enc.String(), func(b *testing.B) {
			pub, err := NewPublisher(PublisherConfig{Endpoint: "tcp://127.0.0.1:0", Encoding: enc, BufferSteps: 1000})
			if err != nil {
				b.Fatal(err)
			}
			defer pub.Close()
			sink, err := NewPoolSink(pub, SinkConfig{})
			if err != nil {
				b.Fatal(err)
			}
			defer sink.Close()
			tokens := make([]uint32, 16)
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				h := index.Hash(i)
				sink.Event(pool.Event{Kind: pool.BlockStored, NS: testNS, Hashes: []index.Hash{h}, Parent: h - 1, HasParent: true, Tokens: tokens, BlockTokens: 16})
				sink.Event(pool.Event{Kind: pool.BlockRemoved, NS: testNS, Hashes: []index.Hash{h - 100}})
				sink.Flush()
			}
		})
	}
}
