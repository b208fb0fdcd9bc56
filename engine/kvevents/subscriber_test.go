package kvevents

import (
	"context"
	"errors"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
)

// rawPub is a PUB socket that sends whatever a test says, for a
// Subscriber to hear.
func rawPub(t *testing.T) zmq4.Socket {
	t.Helper()
	pub := zmq4.NewPub(context.Background())
	if err := pub.Listen("tcp://127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })
	return pub
}

func send(t *testing.T, pub zmq4.Socket, frames ...[]byte) {
	t.Helper()
	if err := pub.SendMulti(zmq4.NewMsgFrom(frames...)); err != nil {
		t.Fatal(err)
	}
}

// untilJoined sends a one-frame message, which is no event batch, until
// the subscriber has counted one: then it hears what follows.
func untilJoined(t *testing.T, ctx context.Context, pub zmq4.Socket, s *Subscriber) uint64 {
	t.Helper()
	for s.Stats().Malformed == 0 {
		send(t, pub, []byte("hello"))
		select {
		case <-time.After(20 * time.Millisecond):
		case <-ctx.Done():
			t.Fatal("the subscriber joined not before the test's deadline")
		}
	}
	return s.Stats().Malformed
}

func payload(t *testing.T, i int) []byte {
	t.Helper()
	p, err := Encode(sampleBatches()[i%len(sampleBatches())], Maps)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestSubscriberSkipsGarbage: messages that are not event batches — the
// wrong number of frames, a sequence number that is not 8 bytes or is
// negative, a payload that is not msgpack — are counted and skipped, and
// change nothing; a batch whose number was real but whose payload is
// garbage is reported lost when the next one shows the gap (there is no
// replay socket here to ask).
func TestSubscriberSkipsGarbage(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pub := rawPub(t)
	c, s := subscribe(t, nil, SubscriberConfig{Endpoint: "tcp://" + pub.Addr().String()})
	before := untilJoined(t, ctx, pub, s)

	garbage := [][][]byte{
		{[]byte("a"), []byte("b")},
		{{}, SeqBytes(0), payload(t, 0), []byte("extra")},
		{{}, {0, 0, 1}, payload(t, 0)},
		{{}, SeqBytes(-1), payload(t, 0)},
		{{}, SeqBytes(0), {0xc1}},
		{{}, SeqBytes(0), append(payload(t, 0), 0)},
	}
	for _, g := range garbage {
		send(t, pub, g...)
	}
	for seq := range int64(3) {
		send(t, pub, []byte{}, SeqBytes(seq), payload(t, int(seq)))
	}
	send(t, pub, []byte{}, SeqBytes(3), []byte("not msgpack"))
	send(t, pub, []byte{}, SeqBytes(4), payload(t, 4))
	waitUntil(t, ctx, "the subscriber hears batch 4", func() bool { return c.upTo(4) })

	st := s.Stats()
	if got := st.Malformed - before; got != uint64(len(garbage))+1 {
		t.Errorf("%d malformed messages counted, want %d", got, len(garbage)+1)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !slices.Equal(c.seqs, []int64{0, 1, 2, 4}) || !slices.Equal(c.lost, [][2]int64{{3, 4}}) {
		t.Errorf("delivered %v, lost %v; want 0 1 2 4, lost [3, 4)", c.seqs, c.lost)
	}
	if st.Delivered != 4 || st.Lost != 1 || st.Replays != 0 || st.Resets != 0 {
		t.Errorf("stats %+v", st)
	}
}

// TestSubscriberReplayDeadOrStalled: a replay socket that refuses
// connections, or accepts them and never answers, does not stop live
// delivery: past the replay timeout the gap is reported lost and the
// batches heard are delivered.
func TestSubscriberReplayDeadOrStalled(t *testing.T) {
	refused, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused.Close()
	stalled, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var held sync.WaitGroup
	held.Add(1)
	go func() { // accept, and never say a word
		defer held.Done()
		var conns []net.Conn
		for {
			conn, err := stalled.Accept()
			if err != nil {
				for _, c := range conns {
					c.Close()
				}
				return
			}
			conns = append(conns, conn)
		}
	}()
	defer held.Wait()
	defer stalled.Close()

	for name, replay := range map[string]string{"refused": refused.Addr().String(), "stalled": stalled.Addr().String()} {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			pub := rawPub(t)
			c, s := subscribe(t, nil, SubscriberConfig{
				Endpoint: "tcp://" + pub.Addr().String(), ReplayEndpoint: "tcp://" + replay,
				ReplayTimeout: 100 * time.Millisecond,
			})
			untilJoined(t, ctx, pub, s)
			for _, seq := range []int64{0, 1, 5, 6} {
				send(t, pub, []byte{}, SeqBytes(seq), payload(t, int(seq)))
			}
			waitUntil(t, ctx, "the subscriber hears batch 6", func() bool { return c.upTo(6) })
			c.mu.Lock()
			defer c.mu.Unlock()
			if !slices.Equal(c.seqs, []int64{0, 1, 5, 6}) || !slices.Equal(c.lost, [][2]int64{{2, 5}}) {
				t.Errorf("delivered %v, lost %v; want 0 1 5 6, lost [2, 5)", c.seqs, c.lost)
			}
			if st := s.Stats(); st.Replays != 1 || st.Lost != 3 {
				t.Errorf("stats %+v", st)
			}
		})
	}
}

// TestSubscriberPublisherRestart: a worker's publisher that restarts on
// the same endpoints numbers its batches from 0 again; the subscriber
// reconnects, reports the reset (the old publisher's blocks are gone),
// and delivers the new publisher's batches from 0, replaying those sent
// before it reconnected.
func TestSubscriberPublisherRestart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cfg := PublisherConfig{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0"}
	old, err := NewPublisher(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Endpoint, cfg.ReplayEndpoint = "tcp://"+old.Addr(), "tcp://"+old.ReplayAddr()
	c, s := subscribe(t, nil, SubscriberConfig{Endpoint: cfg.Endpoint, ReplayEndpoint: cfg.ReplayEndpoint})
	publishUntil(t, ctx, old, c.heard)
	// Many batches, so that the new publisher's numbers stay below the
	// old one's while the subscriber reconnects: vLLM's messages carry no
	// epoch, a sequence number going back is the only sign of a restart.
	var last int64
	for i := range 2000 {
		if last, err = old.Publish(sampleBatches()[i%3]); err != nil {
			t.Fatal(err)
		}
	}
	waitUntil(t, ctx, "the subscriber hears the old publisher's last batch", func() bool { return c.upTo(last) })
	old.Close()

	restarted, err := NewPublisher(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer restarted.Close()
	publishUntil(t, ctx, restarted, func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.resets > 0 && len(c.seqs) > 0
	})
	if last, err = restarted.Publish(sampleBatches()[0]); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, ctx, "the subscriber hears the new publisher's last batch", func() bool { return c.upTo(last) })

	c.mu.Lock()
	defer c.mu.Unlock()
	for i, seq := range c.seqs {
		if seq != int64(i) {
			t.Fatalf("after the reset: batch %d has seq %d (%v)", i, seq, c.seqs)
		}
	}
	if st := s.Stats(); c.resets != 1 || st.Resets != 1 || st.Lost != 0 || len(c.lost) != 0 {
		t.Fatalf("resets %d, stats %+v, lost %v: want one reset, nothing lost", c.resets, st, c.lost)
	}
}

// TestSubscriberReplayCutShort: a replay answer cut off part way — the
// publisher closes a replay client that does not take its writes within
// WriteTimeout, as a subscriber busy with the batches it was already
// given can be on a loaded machine — is asked for again from the first
// batch it did not bring, for as long as each answer brings some: every
// batch is delivered, nothing is reported lost.
func TestSubscriberReplayCutShort(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	p, err := NewPublisher(PublisherConfig{
		Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0", WriteTimeout: 200 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	// 400 batches of about 70 KB, published before anyone listens: the
	// subscriber's first batch heard is preceded by a replay of them all,
	// some 28 MB, more than the sockets' buffers hold.
	big := &Batch{TS: 1}
	for i := range 64 {
		big.Events = append(big.Events, &BlockStored{BlockHashes: []Hash{UintHash(uint64(i))}, TokenIDs: make([]int64, 256), BlockSize: 256})
	}
	for range 400 {
		if _, err := p.Publish(big); err != nil {
			t.Fatal(err)
		}
	}
	c := &collector{}
	s, err := NewSubscriber(SubscriberConfig{Endpoint: "tcp://" + p.Addr(), ReplayEndpoint: "tcp://" + p.ReplayAddr(),
		ReplayTimeout: time.Minute, OnReset: c.reset, OnLost: c.lose})
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	// A callback slow enough that the publisher's writes of the replay
	// wait past its WriteTimeout.
	go func() {
		done <- s.Run(rctx, func(seq int64, b *Batch) {
			if seq < 400 {
				time.Sleep(5 * time.Millisecond)
			}
			c.batch(seq, b)
		})
	}()
	defer func() {
		stop()
		<-done
	}()
	publishUntil(t, ctx, p, c.heard)
	last, err := p.Publish(sampleBatches()[0])
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, ctx, "the subscriber hears the last batch", func() bool { return c.upTo(last) })

	if p.Stats().BadPeers == 0 {
		t.Fatal("the publisher never cut a replay short: the test proves nothing")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, seq := range c.seqs {
		if seq != int64(i) {
			t.Fatalf("batch %d has seq %d; lost %v", i, seq, c.lost)
		}
	}
	if st := s.Stats(); st.Lost != 0 || len(c.lost) != 0 || st.Replays < 2 {
		t.Errorf("stats %+v, lost %v: want nothing lost, after more than one replay request", st, c.lost)
	}
}

// publishUntil publishes sample batches until done says so.
func publishUntil(t *testing.T, ctx context.Context, p *Publisher, done func() bool) {
	t.Helper()
	for i := 0; !done(); i++ {
		if _, err := p.Publish(sampleBatches()[i%3]); err != nil {
			t.Fatal(err)
		}
		select {
		case <-time.After(20 * time.Millisecond):
		case <-ctx.Done():
			t.Fatal("not heard before the test's deadline")
		}
	}
}

func TestSubscriberConfig(t *testing.T) {
	_, err := NewSubscriber(SubscriberConfig{ReplayTimeout: -1, RetryInterval: -1, MaxMessage: -1})
	if err == nil || strings.Count(err.Error(), "\n") != 3 {
		t.Fatalf("a config without endpoint, with negative timeouts and message limit: %v; want 4 errors", err)
	}
	t.Log(err)
	_, err = NewSubscriber(SubscriberConfig{Endpoint: "tpc://127.0.0.1:5557", ReplayEndpoint: "tcp://127.0.0.1"})
	if err == nil || strings.Count(err.Error(), "\n") != 1 {
		t.Fatalf("an endpoint of an unknown transport, and a replay endpoint without a port: %v; want 2 errors", err)
	}
	t.Log(err)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := Subscribe(ctx, SubscriberConfig{Endpoint: "tcp://127.0.0.1:1"}, func(int64, *Batch) {}); !errors.Is(err, context.Canceled) {
		t.Fatalf("Subscribe with a cancelled context = %v", err)
	}
}

// BenchmarkSubscriberIngest: a router's cost to take in a worker's
// message — parse the frames, decode, order — of 32 BlockStored events
// of one 16-token block each; block events/s is reported.
func BenchmarkSubscriberIngest(b *testing.B) {
	for _, enc := range []Encoding{TaggedArrays, Maps} {
		b.Run(enc.String(), func(b *testing.B) {
			batch := &Batch{TS: 1, DataParallelRank: new(int64)}
			medium := MediumGPU
			for i := range 32 {
				parent := UintHash(uint64(i) << 40)
				batch.Events = append(batch.Events, &BlockStored{BlockHashes: []Hash{UintHash(uint64(i+1) << 40)},
					ParentBlockHash: &parent, TokenIDs: make([]int64, 16), BlockSize: 16, Medium: &medium})
			}
			p, err := Encode(batch, enc)
			if err != nil {
				b.Fatal(err)
			}
			s, err := NewSubscriber(SubscriberConfig{Endpoint: "tcp://127.0.0.1:1"})
			if err != nil {
				b.Fatal(err)
			}
			var events int
			fn := func(_ int64, b *Batch) { events += len(b.Events) }
			b.ReportAllocs()
			var seq int64
			for b.Loop() {
				s.onMessage(context.Background(), Frames("", seq, p), fn)
				seq++
			}
			b.ReportMetric(float64(events)/b.Elapsed().Seconds(), "blocks/s")
		})
	}
}
