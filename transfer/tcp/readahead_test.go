package tcp

import (
	"bytes"
	"context"
	"errors"
	"io"
	"slices"
	"testing"
	"testing/iotest"
	"time"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/transfer"
	"github.com/kvstrata/kvstrata/transfer/internal/frame"
	"github.com/kvstrata/kvstrata/transfer/transfertest"
)

// A client takes in a Get's response and its first block's header with
// one read, and reads the block's bytes with reads of their own, straight
// into the receiver's buffer: no read asks for a byte of payload along
// with a frame.
func TestClientReadsAGetsFramesTogetherAndItsPayloadApart(t *testing.T) {
	b := transfertest.MakeBlock(1, 3000)
	stream := getAnswer(frame.StatusOK, "", b)
	r := &sizedReads{r: bytes.NewReader(stream)}
	c := fakeClient(r)
	col := transfertest.NewCollector(1)
	if err := c.Get(context.Background(), []index.Key{b.Key}, col); err != nil {
		t.Fatal(err)
	}
	if col.Errs[0] != nil || !bytes.Equal(col.Data[0], b.Data) {
		t.Fatalf("block: %v, %d bytes; want the %d bytes put", col.Errs[0], len(col.Data[0]), len(b.Data))
	}
	if want := []int{responseSize + frame.HeaderSize, len(b.Data)}; !slices.Equal(r.asked, want) {
		t.Errorf("reads asked for %v bytes, want %v", r.asked, want)
	}
}

// A put's results come in with one read, however many blocks it had.
func TestClientReadsAPutsResultsTogether(t *testing.T) {
	blocks := []transfer.Block{transfertest.MakeBlock(1, 10), transfertest.MakeBlock(2, 10), transfertest.MakeBlock(3, 10)}
	stream := putAnswer([]frame.Status{frame.StatusOK, frame.StatusFull, frame.StatusOK}, []string{"", "no room", ""})
	r := &sizedReads{r: bytes.NewReader(stream)}
	c := fakeClient(r)
	errs, err := c.Put(context.Background(), blocks)
	if err != nil {
		t.Fatal(err)
	}
	if errs[0] != nil || !errors.Is(errs[1], transfer.ErrFull) || errs[2] != nil {
		t.Fatalf("results %v, want OK, Full, OK", errs)
	}
	// The results ask for 3×4 bytes past the response; the message of
	// the second takes one more read.
	if len(r.asked) > 2 || r.asked[0] != responseSize+3*frame.ResultSize {
		t.Errorf("reads asked for %v bytes, want %d and then the rest", r.asked, responseSize+3*frame.ResultSize)
	}
}

// Frames that trickle in a byte at a time are read whole, and the blocks
// between them come out right.
func TestClientReadsFramesThatArriveAByteAtATime(t *testing.T) {
	blocks := []transfer.Block{transfertest.MakeBlock(1, 700), transfertest.MakeBlock(2, 0), transfertest.MakeBlock(3, 90)}
	get := getAnswer(frame.StatusOK, "", blocks...)
	put := putAnswer([]frame.Status{frame.StatusCorrupt, frame.StatusOK, frame.StatusError}, []string{"", "", "disk gone"})
	c := fakeClient(iotest.OneByteReader(bytes.NewReader(append(get, put...))))
	col := transfertest.NewCollector(3)
	if err := c.Get(context.Background(), []index.Key{blocks[0].Key, blocks[1].Key, blocks[2].Key}, col); err != nil {
		t.Fatal(err)
	}
	for i, b := range blocks {
		if col.Errs[i] != nil || !bytes.Equal(col.Data[i], b.Data) {
			t.Fatalf("block %d: %v, %d bytes; want the %d bytes put", i, col.Errs[i], len(col.Data[i]), len(b.Data))
		}
	}
	errs, err := c.Put(context.Background(), blocks)
	if err != nil {
		t.Fatal(err)
	}
	if !errors.Is(errs[0], transfer.ErrCorrupt) || errs[1] != nil || errs[2] == nil || !bytes.Contains([]byte(errs[2].Error()), []byte("disk gone")) {
		t.Fatalf("results %v, want Corrupt, OK, an error saying disk gone", errs)
	}
}

// A refusal's message is all that follows it: the connection carries the
// next request.
func TestClientReadsARefusalAndGoesOn(t *testing.T) {
	b := transfertest.MakeBlock(1, 64)
	refusal := getAnswer(frame.StatusRefused, "get of 9 blocks, over the 8-block limit; split it")
	stream := append(refusal, getAnswer(frame.StatusOK, "", b)...)
	c := fakeClient(bytes.NewReader(stream))
	err := c.Get(context.Background(), []index.Key{b.Key}, transfertest.NewCollector(1))
	if !errors.Is(err, transfer.ErrRefused) || !bytes.Contains([]byte(err.Error()), []byte("split it")) {
		t.Fatalf("Get = %v, want the refusal", err)
	}
	col := transfertest.NewCollector(1)
	if err := c.Get(context.Background(), []index.Key{b.Key}, col); err != nil || !bytes.Equal(col.Data[0], b.Data) {
		t.Fatalf("Get after a refusal = %v, %d bytes", err, len(col.Data[0]))
	}
}

// Bytes before a response are a protocol violation, not the response.
func TestClientRejectsBytesBeforeAResponse(t *testing.T) {
	b := transfertest.MakeBlock(1, 64)
	c := fakeClient(bytes.NewReader(getAnswer(frame.StatusOK, "", b)))
	c.ahead = append(c.aheadBuf[:0], 0, 0)
	err := c.Get(context.Background(), []index.Key{b.Key}, transfertest.NewCollector(1))
	if !errors.Is(err, frame.ErrProtocol) {
		t.Fatalf("Get with bytes before the response = %v, want a protocol violation", err)
	}
}

// fakeClient is a client conn whose server sends what r reads.
func fakeClient(r io.Reader) *conn {
	opts := Options{}
	opts.EnsureDefaults()
	return &conn{nc: &fakeConn{r: r}, addr: "fake", opts: &opts}
}

// sizedReads notes how many bytes each read asked for.
type sizedReads struct {
	r     io.Reader
	asked []int
}

func (s *sizedReads) Read(p []byte) (int, error) {
	s.asked = append(s.asked, len(p))
	return s.r.Read(p)
}

// getAnswer is a server's answer to a Get of blocks: its response, then
// each block's header and bytes.
func getAnswer(st frame.Status, msg string, blocks ...transfer.Block) []byte {
	out := make([]byte, responseSize+len(msg))
	putResponse(out, st, 0, len(msg), len(blocks))
	copy(out[responseSize:], msg)
	for _, b := range blocks {
		h := make([]byte, frame.HeaderSize)
		frame.PutHeader(h, &b.Header, frame.StatusOK, 0)
		out = append(append(out, h...), b.Data...)
	}
	return out
}

// putAnswer is a server's answer to a Put: its response and a result per
// block.
func putAnswer(codes []frame.Status, msgs []string) []byte {
	out := make([]byte, responseSize)
	putResponse(out, frame.StatusOK, 0, 0, len(codes))
	for i, st := range codes {
		r := make([]byte, frame.ResultSize)
		frame.PutResult(r, st, len(msgs[i]))
		out = append(append(out, r...), msgs[i]...)
	}
	return out
}

// Requests that come in together, a put with its payload, a Get of no
// block and Gets of one, are each answered in turn: a read of a request's
// header that takes in bytes of the next request leaves them to it.
func TestServerAnswersRequestsThatArriveTogether(t *testing.T) {
	mem := transfertest.NewMemory()
	c := rawDial(t, serve(t, Options{}, mem))
	b := transfertest.MakeBlock(1, 100)
	send(t, c, putFrames(b), b.Data, getFrame(), getFrame(b.Key), getFrame(b.Key))
	if st, _, msg := readResponse(t, c); st != frame.StatusOK {
		t.Fatalf("put: status %d, %q", st, msg)
	}
	if st, _, _ := frame.DecodeResult(recv(t, c, frame.ResultSize)); st != frame.StatusOK {
		t.Fatalf("put's block: status %d", st)
	}
	if st, _, msg := readResponse(t, c); st != frame.StatusOK {
		t.Fatalf("get of no block: status %d, %q", st, msg)
	}
	for range 2 {
		if st, _, msg := readResponse(t, c); st != frame.StatusOK {
			t.Fatalf("get: status %d, %q", st, msg)
		}
		h, st, _, err := frame.DecodeHeader(recv(t, c, frame.HeaderSize))
		if err != nil || st != frame.StatusOK || h.Key != b.Key {
			t.Fatalf("block: %v, status %d, %v", h.Key, st, err)
		}
		if got := recv(t, c, int(h.Size)); !bytes.Equal(got, b.Data) {
			t.Fatal("the block's bytes differ from those put")
		}
	}
}

// A request that trickles in a byte at a time is answered.
func TestServerAnswersARequestThatTricklesIn(t *testing.T) {
	mem := transfertest.NewMemory()
	b := transfertest.MakeBlock(1, 100)
	mem.Store(b)
	c := rawDial(t, serve(t, Options{}, mem))
	for _, x := range getFrame(b.Key) {
		send(t, c, []byte{x})
		time.Sleep(time.Millisecond)
	}
	if st, _, msg := readResponse(t, c); st != frame.StatusOK {
		t.Fatalf("get: status %d, %q", st, msg)
	}
	if h, st, _, _ := frame.DecodeHeader(recv(t, c, frame.HeaderSize)); st != frame.StatusOK || h.Key != b.Key {
		t.Fatalf("block %v: status %d", h.Key, st)
	}
}
