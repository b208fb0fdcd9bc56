package kvevents

import (
	"context"
	"errors"
	"io"
	"net"
	"slices"
	"sync/atomic"
	"testing"
	"time"
)

// listen starts a Listener of cfg (on a free loopback port unless cfg
// names one) until the test ends.
func listen(t *testing.T, cfg ListenerConfig) *Listener {
	t.Helper()
	if cfg.Endpoint == "" {
		cfg.Endpoint = "tcp://127.0.0.1:0"
	}
	l, err := NewListener(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// connectPub starts a Publisher of topic that connects to l, with a
// replay socket of its own, until the test ends.
func connectPub(t *testing.T, l *Listener, topic string) *Publisher {
	t.Helper()
	p, err := NewPublisher(PublisherConfig{Endpoint: "tcp://" + l.Addr(), Connect: true, Topic: topic,
		ReplayEndpoint: "tcp://127.0.0.1:0", RetryInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// follow runs l's Subscriber of topic (replaying from replay, if not "")
// into a new collector until the test ends.
func follow(t *testing.T, l *Listener, topic, replay string) (*collector, *Subscriber) {
	t.Helper()
	c := &collector{}
	s, err := l.Subscriber(SubscriberConfig{Topic: topic, ReplayEndpoint: replay, OnReset: c.reset, OnLost: c.lose})
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

// publishNext publishes batch seq of the round of sampleBatches, seq
// being the publisher's next number, and returns seq.
func publishNext(t *testing.T, p *Publisher) int64 {
	t.Helper()
	p.mu.Lock()
	next := p.seq
	p.mu.Unlock()
	seq, err := p.Publish(sampleBatches()[next%3])
	if err != nil {
		t.Fatal(err)
	}
	return seq
}

// publishNextUntil publishes the next batch every 20 ms until done.
func publishNextUntil(t *testing.T, ctx context.Context, p *Publisher, done func() bool) {
	t.Helper()
	for !done() {
		publishNext(t, p)
		select {
		case <-time.After(20 * time.Millisecond):
		case <-ctx.Done():
			t.Fatal("not heard before the test's deadline")
		}
	}
}

// everyBatch checks that c got every batch from 0 to last, in order, and
// that each is the one published (sampleBatches, round and round).
func everyBatch(t *testing.T, name string, c *collector, last int64) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, seq := range c.seqs {
		if seq != int64(i) {
			t.Fatalf("%s: delivered %v, want every batch from 0 to %d", name, c.seqs, last)
		}
		if want := describe(sampleBatches()[i%3]); c.descs[i] != want {
			t.Fatalf("%s: batch %d is %s, want %s", name, i, c.descs[i], want)
		}
	}
	if len(c.lost) != 0 || c.resets != 0 {
		t.Fatalf("%s: lost %v, %d resets", name, c.lost, c.resets)
	}
}

// TestListenerTellsWorkersByTopic: two workers' publishers connect to one
// Listener; each worker's Subscriber gets exactly its own batches, every
// one from 0 (what was sent before it joined comes by replay from that
// worker's replay socket), and a publisher of a topic no one follows is
// counted and changes nothing.
func TestListenerTellsWorkersByTopic(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	l := listen(t, ListenerConfig{})
	a, b := connectPub(t, l, "worker-a"), connectPub(t, l, "worker-b")
	stranger := connectPub(t, l, "worker-a-not") // a prefix of no one's, but worker-a is one of its
	// Batches sent before anyone follows: the first heard brings them
	// by replay.
	for range 4 {
		for _, p := range []*Publisher{a, b, stranger} {
			publishNext(t, p)
		}
	}
	ca, _ := follow(t, l, "worker-a", "tcp://"+a.ReplayAddr())
	cb, _ := follow(t, l, "worker-b", "tcp://"+b.ReplayAddr())
	publishNextUntil(t, ctx, a, ca.heard)
	publishNextUntil(t, ctx, b, cb.heard)
	for _, w := range []struct {
		name string
		p    *Publisher
		c    *collector
	}{{"worker-a", a, ca}, {"worker-b", b, cb}} {
		last := publishNext(t, w.p)
		waitUntil(t, ctx, w.name+" hears its last batch", func() bool { return w.c.upTo(last) })
		everyBatch(t, w.name, w.c, last)
	}
	waitUntil(t, ctx, "the stranger's batches are counted", func() bool {
		_, err := stranger.Publish(sampleBatches()[0])
		return err == nil && l.Stats().UnknownTopic > 0
	})
	if st := l.Stats(); st.BadPeers != 0 || st.Refused != 0 || st.Malformed != 0 {
		t.Errorf("listener stats %+v", st)
	}
}

// TestListenerSubscriberConfig: a Listener's Subscriber has no endpoint
// of its own, follows a topic once at a time, and frees it when its Run
// ends.
func TestListenerSubscriberConfig(t *testing.T) {
	l := listen(t, ListenerConfig{})
	if _, err := l.Subscriber(SubscriberConfig{Endpoint: "tcp://127.0.0.1:1", Topic: "w"}); err == nil {
		t.Error("a Listener's subscriber with an endpoint: no error")
	}
	if _, err := l.Subscriber(SubscriberConfig{Topic: "w", ReplayEndpoint: "nonsense"}); err == nil {
		t.Error("a bad replay endpoint: no error")
	}
	s, err := l.Subscriber(SubscriberConfig{Topic: "w"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Subscriber(SubscriberConfig{Topic: "w"}); !errors.Is(err, ErrTopicTaken) {
		t.Errorf("the same topic twice: %v, want ErrTopicTaken", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Run(ctx, func(int64, *Batch) {}); err != context.Canceled {
		t.Errorf("Run = %v", err)
	}
	if _, err := l.Subscriber(SubscriberConfig{Topic: "w"}); err != nil {
		t.Errorf("the topic after Run ended: %v", err)
	}
	for _, cfg := range []ListenerConfig{{}, {Endpoint: "127.0.0.1:5557"}, {Endpoint: "tcp://x", MaxConns: -1}} {
		if _, err := NewListener(cfg); err == nil {
			t.Errorf("NewListener(%+v): no error", cfg)
		}
	}
}

// TestListenerSurvivesHostilePeers: the Listener's socket faces the
// network. A peer that announces a frame of 2^63-1 bytes or of 64 GiB,
// or sends garbage, has its connection closed and counted; the process
// lives on, and a worker's publisher that connects after is heard in
// full.
func TestListenerSurvivesHostilePeers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	l := listen(t, ListenerConfig{})
	for name, stream := range hostileStreams("PUB") {
		t.Run(name, func(t *testing.T) { sendHostile(t, l.Addr(), stream) })
	}
	if st, want := l.Stats(), uint64(len(hostileStreams(""))); st.BadPeers != want {
		t.Errorf("stats %+v, want %d bad peers", st, want)
	}
	heardInFull(t, ctx, l)
}

// heardInFull checks that a publisher connecting to l is heard, every
// batch.
func heardInFull(t *testing.T, ctx context.Context, l *Listener) {
	t.Helper()
	p := connectPub(t, l, "w")
	c, _ := follow(t, l, "w", "tcp://"+p.ReplayAddr())
	publishNextUntil(t, ctx, p, c.heard)
	last := publishNext(t, p)
	waitUntil(t, ctx, "the worker's last batch is heard", func() bool { return c.upTo(last) })
	everyBatch(t, "w", c, last)
}

// TestListenerConnectionFlood: of more connections than MaxConns, the
// Listener holds MaxConns and closes the others as it accepts them; a
// peer that connects and says nothing is closed past the handshake
// timeout. When the flood is gone, a worker is heard in full.
//
// The Listener frees a connection's slot when it sees the connection
// end, some time after the peer closes it: until then a new one is
// refused, and the silent peer dials again until it is let in (it is
// sent the socket's greeting).
func TestListenerConnectionFlood(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	const maxConns, flood = 8, 20
	// A handshake timeout the flood's own handshakes, sent at once, finish
	// well within even on a loaded machine.
	l := listen(t, ListenerConfig{MaxConns: maxConns, HandshakeTimeout: 2 * time.Second})
	results := make(chan int, flood)
	var conns []net.Conn
	for range flood {
		c, err := net.Dial("tcp", l.Addr())
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		go func() {
			c.Write(slices.Concat(greeting(), ready("PUB")))
			n, _ := io.ReadFull(c, make([]byte, 64)) // the socket's greeting, or nothing
			results <- n
		}()
	}
	admitted := 0
	for range flood {
		if <-results == 64 {
			admitted++
		}
	}
	if admitted != maxConns {
		t.Errorf("%d connections of %d admitted, want %d", admitted, flood, maxConns)
	}
	for _, c := range conns {
		c.Close()
	}
	var silent net.Conn
	refused := uint64(flood - maxConns)
	for silent == nil {
		c, err := net.Dial("tcp", l.Addr())
		if err != nil {
			t.Fatal(err)
		}
		if n, _ := io.ReadFull(c, make([]byte, 64)); n == 64 {
			silent = c
			break
		}
		c.Close()
		refused++
		select {
		case <-time.After(10 * time.Millisecond):
		case <-ctx.Done():
			t.Fatal("the silent peer is let in: not before the test's deadline")
		}
	}
	defer silent.Close()
	heardInFull(t, ctx, l)
	if dl, ok := ctx.Deadline(); ok {
		silent.SetReadDeadline(dl)
	}
	if _, err := io.Copy(io.Discard, silent); err != nil && !isReset(err) {
		t.Fatalf("the silent peer is closed: %v", err)
	}
	if st := l.Stats(); st.BadPeers != 1 || st.Refused != refused {
		t.Errorf("stats %+v, want 1 bad peer, %d refused", st, refused)
	}
}

// TestListenerBoundsItsQueue: while a Subscriber's callback is stuck,
// what its topic brings past MaxQueued is dropped, not queued; when the
// callback goes on, the gap is replayed and nothing is lost.
func TestListenerBoundsItsQueue(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	l := listen(t, ListenerConfig{MaxQueued: 4 << 10})
	p := connectPub(t, l, "w")
	c := &collector{}
	s, err := l.Subscriber(SubscriberConfig{Topic: "w", ReplayEndpoint: "tcp://" + p.ReplayAddr(), OnReset: c.reset, OnLost: c.lose})
	if err != nil {
		t.Fatal(err)
	}
	stuck := make(chan struct{})
	rctx, rcancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- s.Run(rctx, func(seq int64, b *Batch) {
			<-stuck
			c.batch(seq, b)
		})
	}()
	defer func() {
		rcancel()
		<-done
	}()
	waitUntil(t, ctx, "batches are dropped past the queue's bound", func() bool {
		publishNext(t, p)
		return l.Stats().Dropped > 0
	})
	close(stuck)
	last := publishNext(t, p)
	waitUntil(t, ctx, "the last batch is heard", func() bool { return c.upTo(last) })
	everyBatch(t, "w", c, last)
}

// TestListenerReplaysWhatItDrops: a message the Listener drops is
// replayed even when no later one shows the gap. With MaxQueued below
// every batch's size, each batch heard is dropped, and the worker sends
// nothing after its last one: each comes by replay all the same, in
// order, none lost.
func TestListenerReplaysWhatItDrops(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	l := listen(t, ListenerConfig{MaxQueued: 8})
	p := connectPub(t, l, "w")
	c, s := follow(t, l, "w", "tcp://"+p.ReplayAddr())
	publishNextUntil(t, ctx, p, c.heard)
	last := publishNext(t, p)
	waitUntil(t, ctx, "the last batch, dropped, is replayed", func() bool { return c.upTo(last) })
	everyBatch(t, "w", c, last)
	if st := l.Stats(); st.Heard != 0 || st.Dropped == 0 {
		t.Errorf("listener stats %+v, want every batch heard dropped", st)
	}
	if st := s.Stats(); st.Replayed != st.Delivered {
		t.Errorf("subscriber stats %+v, want every batch replayed", st)
	}
}

// TestPublisherConnectsAgain: a Publisher that connects goes on after its
// Listener restarts on the same port: the new Listener's Subscriber hears
// it, from batch 0 by replay.
func TestPublisherConnectsAgain(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	l, err := NewListener(ListenerConfig{Endpoint: "tcp://127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	p := connectPub(t, l, "w")
	c, _ := follow(t, l, "w", "tcp://"+p.ReplayAddr())
	publishNextUntil(t, ctx, p, c.heard)
	addr := l.Addr()
	l.Close()
	l2 := listen(t, ListenerConfig{Endpoint: "tcp://" + addr})
	c2, _ := follow(t, l2, "w", "tcp://"+p.ReplayAddr())
	publishNextUntil(t, ctx, p, c2.heard)
	last := publishNext(t, p)
	waitUntil(t, ctx, "the new listener hears the last batch", func() bool { return c2.upTo(last) })
	everyBatch(t, "w", c2, last)
}

// BenchmarkIntake: batches of 32 one-block BlockStored events from a
// Publisher to a Subscriber over loopback TCP, in connect mode (the
// Subscriber dials the Publisher) and in bind mode (the Publisher
// connects to a Listener); block events/s is reported.
func BenchmarkIntake(b *testing.B) {
	batch := &Batch{TS: 1, DataParallelRank: new(int64)}
	medium := MediumGPU
	for i := range 32 {
		parent := UintHash(uint64(i) << 40)
		batch.Events = append(batch.Events, &BlockStored{BlockHashes: []Hash{UintHash(uint64(i+1) << 40)},
			ParentBlockHash: &parent, TokenIDs: make([]int64, 16), BlockSize: 16, Medium: &medium})
	}
	for _, mode := range []string{"connect", "bind"} {
		b.Run(mode, func(b *testing.B) {
			var p *Publisher
			var s *Subscriber
			var err error
			if mode == "connect" {
				if p, err = NewPublisher(PublisherConfig{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0"}); err != nil {
					b.Fatal(err)
				}
				s, err = NewSubscriber(SubscriberConfig{Endpoint: "tcp://" + p.Addr(), ReplayEndpoint: "tcp://" + p.ReplayAddr()})
			} else {
				l, lerr := NewListener(ListenerConfig{Endpoint: "tcp://127.0.0.1:0"})
				if lerr != nil {
					b.Fatal(lerr)
				}
				defer l.Close()
				if p, err = NewPublisher(PublisherConfig{Endpoint: "tcp://" + l.Addr(), Connect: true, ReplayEndpoint: "tcp://127.0.0.1:0"}); err != nil {
					b.Fatal(err)
				}
				s, err = l.Subscriber(SubscriberConfig{ReplayEndpoint: "tcp://" + p.ReplayAddr()})
			}
			if err != nil {
				b.Fatal(err)
			}
			defer p.Close()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var last atomic.Int64
			last.Store(-1)
			go s.Run(ctx, func(seq int64, _ *Batch) { last.Store(seq) })
			for s.Stats().Delivered == 0 { // joined
				if _, err := p.Publish(batch); err != nil {
					b.Fatal(err)
				}
				time.Sleep(10 * time.Millisecond)
			}
			before := s.Stats().Delivered
			b.ResetTimer()
			var seq int64
			for range b.N {
				if seq, err = p.Publish(batch); err != nil {
					b.Fatal(err)
				}
			}
			for last.Load() < seq {
				time.Sleep(time.Millisecond)
			}
			b.StopTimer()
			b.ReportMetric(float64(32*(s.Stats().Delivered-before))/b.Elapsed().Seconds(), "blocks/s")
		})
	}
}
