package kvevents

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
)

// TestPublisherSubscribeAndReplay: a SUB socket receives published
// batches as three frames, and a DEALER asking the replay socket for
// sequence 1 on gets every buffered batch from there, then EndSeq.
func TestPublisherSubscribeAndReplay(t *testing.T) {
	p, err := NewPublisher(PublisherConfig{
		Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0",
		Topic: "kv", Encoding: Maps, BufferSteps: 3,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sub := zmq4.NewSub(ctx)
	defer sub.Close()
	if err := sub.Dial("tcp://" + p.Addr()); err != nil {
		t.Fatal(err)
	}
	if err := sub.SetOption(zmq4.OptionSubscribe, "kv"); err != nil {
		t.Fatal(err)
	}

	// A PUB drops what it sends before a subscriber has joined: publish
	// until the subscriber hears one, as a vLLM subscriber would (and then
	// it asks for the rest by replay).
	got := make(chan zmq4.Msg, 1)
	go func() {
		msg, err := sub.Recv()
		if err == nil {
			got <- msg
		}
	}()
	batches := sampleBatches()
	var first zmq4.Msg
publishing:
	for i := 0; ; i++ {
		if _, err := p.Publish(batches[i%len(batches)]); err != nil {
			t.Fatal(err)
		}
		select {
		case first = <-got:
			break publishing
		case <-time.After(50 * time.Millisecond):
		case <-ctx.Done():
			t.Fatal("the subscriber heard nothing before its 30 s deadline")
		}
	}
	topic, seq, payload, err := ParseFrames(first.Frames)
	if err != nil || topic != "kv" {
		t.Fatalf("first message: topic %q, %v", topic, err)
	}
	b, err := Decode(payload)
	if err != nil {
		t.Fatal(err)
	}
	if want := describe(batches[int(seq)%len(batches)]); describe(b) != want {
		t.Fatalf("message %d:\n got %s\nwant %s", seq, describe(b), want)
	}

	// Three more, so that the buffer of three holds only these.
	var last int64
	for i := range 3 {
		if last, err = p.Publish(batches[i]); err != nil {
			t.Fatal(err)
		}
	}
	dealer := zmq4.NewDealer(ctx)
	defer dealer.Close()
	if err := dealer.Dial("tcp://" + p.ReplayAddr()); err != nil {
		t.Fatal(err)
	}
	if err := dealer.SendMulti(zmq4.NewMsgFrom(append([][]byte{{}}, ReplayRequest(0)...)...)); err != nil {
		t.Fatal(err)
	}
	var replayed []string
	for {
		msg, err := dealer.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if len(msg.Frames) < 1 || len(msg.Frames[0]) != 0 {
			t.Fatalf("reply without the empty delimiter: %q", msg.Frames)
		}
		seq, payload, end, err := ParseReplayReply(msg.Frames[1:])
		if err != nil {
			t.Fatal(err)
		}
		if end {
			break
		}
		b, err := Decode(payload)
		if err != nil {
			t.Fatal(err)
		}
		replayed = append(replayed, fmt.Sprintf("%d %s", seq, describe(b)))
	}
	var want []string
	for i := range 3 {
		want = append(want, fmt.Sprintf("%d %s", last-2+int64(i), describe(batches[i])))
	}
	if fmt.Sprint(replayed) != fmt.Sprint(want) {
		t.Fatalf("replayed:\n%q\nwant\n%q", replayed, want)
	}
}

func TestPublisherConfig(t *testing.T) {
	if _, err := NewPublisher(PublisherConfig{
		Encoding: Encoding(9), BufferSteps: -1, HWM: -1, MaxConns: -1, HandshakeTimeout: -1, WriteTimeout: -1,
	}); err == nil || strings.Count(err.Error(), "\n") != 6 {
		t.Fatalf("a config without endpoint, with a bad encoding, a negative buffer, high-water mark, connection limit and timeouts: %v; want 7 errors", err)
	} else {
		t.Log(err)
	}
}

// alreadyClosed is a socket whose Close meets a connection closed before:
// zmq4's does when a subscriber's connection failed a write and was
// closed, and the socket closes before its reaper forgot it.
type alreadyClosed struct{ pubSocket }

func (alreadyClosed) Close() error {
	return &net.OpError{Op: "close", Net: "tcp", Err: net.ErrClosed}
}

// TestCloseIgnoresConnectionsClosedAlready: a connection closed before the
// publisher closes (a subscriber that hung up: a router that dropped the
// worker) is no error of Close's, which is there to close it.
func TestCloseIgnoresConnectionsClosedAlready(t *testing.T) {
	done := make(chan struct{})
	close(done)
	p := &Publisher{pub: alreadyClosed{}, done: done}
	if err := p.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
}
