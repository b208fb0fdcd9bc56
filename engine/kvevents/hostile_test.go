package kvevents

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"slices"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// greeting is a ZMTP 3.0 greeting for the NULL mechanism, as a client
// sends it.
func greeting() []byte {
	g := make([]byte, 64)
	g[0], g[9], g[10] = 0xff, 0x7f, 3
	copy(g[12:], "NULL")
	return g
}

// ready is a READY command announcing socket type typ.
func ready(typ string) []byte {
	body := append([]byte{5}, "READY"...)
	body = append(body, 11)
	body = append(body, "Socket-Type"...)
	body = binary.BigEndian.AppendUint32(body, uint32(len(typ)))
	body = append(body, typ...)
	return append([]byte{0x04, byte(len(body))}, body...)
}

// longFrame is the header of a frame (flags: long, plus extra) that
// announces size bytes, without the bytes.
func longFrame(extra byte, size uint64) []byte {
	return binary.BigEndian.AppendUint64([]byte{0x02 | extra}, size)
}

// hostileStreams are what a peer that means harm, or is broken, sends to
// a ZMTP socket of peer type typ: headers announcing frames too large to
// allocate, or to be worth allocating, and garbage.
func hostileStreams(typ string) map[string][]byte {
	rnd := rand.New(rand.NewPCG(1, 2))
	garbage := make([]byte, 4096)
	for i := range garbage {
		garbage[i] = byte(rnd.Uint32())
	}
	return map[string][]byte{
		// The probe that found the defect, byte for byte.
		"probe": slices.Concat([]byte{0xff}, make([]byte, 8), []byte{0x7f, 3, 0}, []byte("NULL"),
			make([]byte, 16), make([]byte, 31), []byte{6, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}),
		"huge command in the handshake":    slices.Concat(greeting(), longFrame(0x04, 1<<63-1)),
		"huge frame after the handshake":   slices.Concat(greeting(), ready(typ), longFrame(0, 1<<63-1)),
		"64 GiB frame after the handshake": slices.Concat(greeting(), ready(typ), longFrame(0, 1<<36)),
		"garbage":                          garbage,
		"garbage after the greeting":       slices.Concat(greeting(), garbage),
	}
}

// sendHostile connects to addr, sends stream, and waits for the other
// side to close the connection.
func sendHostile(t *testing.T, addr string, stream []byte) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	go c.Write(stream) // the peer may stop reading, or close, midway
	if err := c.SetReadDeadline(time.Now().Add(30 * time.Second)); err != nil {
		t.Fatal(err)
	}
	// The socket sends its own greeting and READY first; then it closes.
	if _, err := io.Copy(io.Discard, c); err != nil && !isReset(err) {
		t.Fatalf("the connection was not closed before its 30 s deadline: %v", err)
	}
}

// isReset reports whether err is the other side resetting the connection
// (it closed it with bytes unread), which is a close too.
func isReset(err error) bool { return errors.Is(err, syscall.ECONNRESET) }

// TestPublisherSurvivesHostilePeers: a peer that connects to the PUB or
// the replay port and announces a frame of 2^63-1 bytes, or of 64 GiB,
// or sends garbage, has its connection closed; the process lives on, and
// a well-behaved subscriber that comes after gets every batch.
func TestPublisherSurvivesHostilePeers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	p, err := NewPublisher(PublisherConfig{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ports := map[string]struct{ addr, typ string }{
		"PUB": {p.Addr(), "SUB"}, "replay": {p.ReplayAddr(), "DEALER"},
	}
	for port, pt := range ports {
		for name, stream := range hostileStreams(pt.typ) {
			t.Run(port+"/"+name, func(t *testing.T) { sendHostile(t, pt.addr, stream) })
		}
	}

	c, s := subscribe(t, nil, SubscriberConfig{Endpoint: "tcp://" + p.Addr(), ReplayEndpoint: "tcp://" + p.ReplayAddr()})
	publishUntil(t, ctx, p, c.heard)
	last, err := p.Publish(sampleBatches()[0])
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, ctx, "the subscriber hears the last batch", func() bool { return c.upTo(last) })
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, seq := range c.seqs {
		if seq != int64(i) {
			t.Fatalf("delivered %v, want every batch from 0 to %d", c.seqs, last)
		}
	}
	if st := s.Stats(); st.Lost != 0 || len(c.lost) != 0 || st.BadPeers != 0 {
		t.Errorf("lost %v; stats %+v", c.lost, st)
	}
	// Each hostile connection is counted once, when it is closed, and
	// the well-behaved subscriber's are not.
	if st, want := p.Stats(), uint64(2*len(hostileStreams(""))); st.BadPeers != want || st.Refused != 0 {
		t.Errorf("publisher stats %+v, want %d bad peers", st, want)
	}
}

// hostilePublisher is a TCP server that answers every connection with
// stream, and counts them.
func hostilePublisher(t *testing.T, stream []byte) (addr string, conns *atomic.Int64) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	conns = new(atomic.Int64)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			go func() {
				defer c.Close()
				go c.Write(stream)
				io.Copy(io.Discard, c) // until the subscriber closes it
			}()
		}
	}()
	return l.Addr().String(), conns
}

// TestSubscriberSurvivesHostilePublisher: a Subscriber that dials a
// "publisher" announcing a frame of 2^63-1 bytes, in the handshake or
// after it, or sending garbage, survives, counts it as a bad peer, and
// keeps dialing; one whose replay socket does that reports the gap lost
// and goes on with live delivery.
func TestSubscriberSurvivesHostilePublisher(t *testing.T) {
	for name, stream := range hostileStreams("PUB") {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			addr, conns := hostilePublisher(t, stream)
			_, s := subscribe(t, nil, SubscriberConfig{Endpoint: "tcp://" + addr, RetryInterval: 10 * time.Millisecond})
			waitUntil(t, ctx, "three connections refused", func() bool { return s.Stats().BadPeers >= 3 })
			if n := conns.Load(); n < 3 {
				t.Errorf("%d connections made for %d bad peers", n, s.Stats().BadPeers)
			}
		})
	}
	t.Run("replay", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		pub := rawPub(t)
		replay, _ := hostilePublisher(t, hostileStreams("ROUTER")["huge frame after the handshake"])
		c, s := subscribe(t, nil, SubscriberConfig{
			Endpoint: "tcp://" + pub.Addr().String(), ReplayEndpoint: "tcp://" + replay,
			RetryInterval: 10 * time.Millisecond,
		})
		untilJoined(t, ctx, pub, s)
		send(t, pub, []byte{}, SeqBytes(5), payload(t, 5))
		send(t, pub, []byte{}, SeqBytes(6), payload(t, 6))
		waitUntil(t, ctx, "the subscriber hears batch 6", func() bool { return c.upTo(6) })
		c.mu.Lock()
		defer c.mu.Unlock()
		if !slices.Equal(c.seqs, []int64{5, 6}) || !slices.Equal(c.lost, [][2]int64{{0, 5}}) {
			t.Errorf("delivered %v, lost %v; want 5 6, lost [0, 5)", c.seqs, c.lost)
		}
		if st := s.Stats(); st.BadPeers != 1 || st.Replays != 1 {
			t.Errorf("stats %+v, want one replay, from one bad peer", st)
		}
	})
}

// TestPublisherConnectionFlood: of more connections than MaxConns, each
// socket holds MaxConns and closes the others as it accepts them (they
// hear not a byte). When the flood is gone, a subscriber gets every
// batch.
func TestPublisherConnectionFlood(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	const maxConns, flood = 8, 20
	p, err := NewPublisher(PublisherConfig{
		Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0", MaxConns: maxConns,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()

	for _, pt := range []struct{ addr, typ string }{{p.Addr(), "SUB"}, {p.ReplayAddr(), "DEALER"}} {
		results := make(chan int, flood)
		var conns []net.Conn
		for range flood {
			c, err := net.Dial("tcp", pt.addr)
			if err != nil {
				t.Fatal(err)
			}
			conns = append(conns, c)
			go func() {
				c.Write(slices.Concat(greeting(), ready(pt.typ)))
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
			t.Errorf("%s: %d connections of %d admitted, want %d", pt.typ, admitted, flood, maxConns)
		}
		for _, c := range conns {
			c.Close()
		}
	}
	if st := p.Stats(); st.Refused != 2*(flood-maxConns) || st.BadPeers != 0 {
		t.Errorf("stats %+v, want %d refused", st, 2*(flood-maxConns))
	}
	subscribeAll(t, ctx, p)
}

// TestPublisherSilentPeer: a peer that connects and says nothing, which
// holds up zmq4's accept loop, is closed past the handshake timeout; a
// subscriber that comes after gets every batch.
func TestPublisherSilentPeer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	p, err := NewPublisher(PublisherConfig{
		Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0", HandshakeTimeout: 500 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for _, addr := range []string{p.Addr(), p.ReplayAddr()} {
		silent, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		silent.SetReadDeadline(time.Now().Add(30 * time.Second))
		if _, err := io.Copy(io.Discard, silent); err != nil && !isReset(err) {
			t.Fatalf("the silent connection was not closed before its 30 s deadline: %v", err)
		}
		silent.Close()
	}
	if st := p.Stats(); st.BadPeers < 2 {
		t.Errorf("stats %+v, want the 2 silent peers counted", st)
	}
	subscribeAll(t, ctx, p)
}

// subscribeAll checks that a subscriber of p gets every batch.
func subscribeAll(t *testing.T, ctx context.Context, p *Publisher) {
	t.Helper()
	c, s := subscribe(t, nil, SubscriberConfig{Endpoint: "tcp://" + p.Addr(), ReplayEndpoint: "tcp://" + p.ReplayAddr()})
	publishUntil(t, ctx, p, c.heard)
	last, err := p.Publish(sampleBatches()[0])
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, ctx, "the subscriber hears the last batch", func() bool { return c.upTo(last) })
	if st := s.Stats(); st.Lost != 0 || st.Delivered != uint64(last+1) {
		t.Errorf("subscriber stats %+v, want every batch from 0 to %d", st, last)
	}
}

// TestSubscriberSilentPublisher: a "publisher" that accepts connections
// and never says a word does not hold a Subscriber: Run returns when its
// context ends, in the handshake too (zmq4's handshake heeds no context,
// and it waited for ever), and the connection is closed.
func TestSubscriberSilentPublisher(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			defer c.Close()
			select {
			case accepted <- c:
			default:
			}
		}
	}()
	s, err := NewSubscriber(SubscriberConfig{Endpoint: "tcp://" + l.Addr().String()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx, func(int64, *Batch) {}) }()
	c := <-accepted // the Subscriber is in its handshake
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Run = %v, want context.Canceled", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("Run did not return before its 60 s deadline after its context ended in a handshake")
	}
	// The connection is closed.
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.Copy(io.Discard, c); err != nil && !isReset(err) {
		t.Fatalf("the subscriber's connection was not closed before its 30 s deadline: %v", err)
	}
}

// TestPublisherStalledSubscriber: a subscriber that subscribes and then
// never reads would hold up zmq4's PUB socket, which writes to its
// subscribers one after the other; past the write timeout its connection
// is closed, and a well-behaved subscriber gets every batch.
func TestPublisherStalledSubscriber(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	p, err := NewPublisher(PublisherConfig{
		Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0", WriteTimeout: 2 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	// While the publisher waits out the stalled peer (WriteTimeout per
	// write), a replay the healthy subscriber asks for can wait longer
	// than the default 5 s on a loaded machine: give it the test's time.
	c, s := subscribe(t, nil, SubscriberConfig{Endpoint: "tcp://" + p.Addr(), ReplayEndpoint: "tcp://" + p.ReplayAddr(),
		ReplayTimeout: time.Minute})
	publishUntil(t, ctx, p, c.heard)

	stalled, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer stalled.Close()
	stalled.(*net.TCPConn).SetReadBuffer(4096)
	// A greeting, READY, and a subscription to every topic; then silence.
	if _, err := stalled.Write(slices.Concat(greeting(), ready("SUB"), []byte{0, 1, 1})); err != nil {
		t.Fatal(err)
	}
	big := &Batch{TS: 1}
	for i := range 64 {
		big.Events = append(big.Events, &BlockStored{BlockHashes: []Hash{UintHash(uint64(i))}, TokenIDs: make([]int64, 256), BlockSize: 256})
	}
	for p.Stats().BadPeers == 0 {
		for range 10 {
			if _, err := p.Publish(big); err != nil {
				t.Fatal(err)
			}
		}
		select {
		case <-time.After(20 * time.Millisecond):
		case <-ctx.Done():
			t.Fatal("the stalled subscriber was not dropped before the test's deadline")
		}
	}
	// Until the subscriber hears the last one published (it may have
	// been dropped too, on a loaded machine, and be dialing again).
	for {
		last, err := p.Publish(sampleBatches()[0])
		if err != nil {
			t.Fatal(err)
		}
		select {
		case <-time.After(20 * time.Millisecond):
		case <-ctx.Done():
			t.Fatal("the subscriber did not catch up before the test's deadline")
		}
		if c.upTo(last) {
			break
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, seq := range c.seqs {
		if seq != int64(i) {
			t.Fatalf("batch %d has seq %d", i, seq)
		}
	}
	if st := s.Stats(); st.Lost != 0 {
		t.Errorf("subscriber stats %+v, want nothing lost", st)
	}
}
