//go:build ucx

package ucx_test

import (
	"context"
	"errors"
	"testing"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/transfer"
	"github.com/kvstrata/kvstrata/transfer/transfertest"
	"github.com/kvstrata/kvstrata/transfer/ucx"
)

// tlsChoices are the UCX transport lists the suite runs over: shared
// memory (posix for messages; cma is left out by UCX when endpoints ask for
// peer-failure handling) and TCP.
var tlsChoices = []struct{ name, tls string }{
	{"sm", "posix,cma,self"},
	{"tcp", "tcp"},
}

func TestConformance(t *testing.T) {
	for _, c := range tlsChoices {
		t.Run(c.name, func(t *testing.T) {
			transfertest.Run(t, transfertest.Factory{
				New: func(t *testing.T, lim transfertest.Limits) transfer.Transport {
					return ucx.New(ucx.Options{TLS: c.tls, MaxBlockSize: lim.MaxBlockSize, MaxBlocks: lim.MaxBlocks})
				},
			})
		})
	}
}

// listen serves h on a free loopback port until the test ends.
func listen(t testing.TB, tr transfer.Transport, h transfer.Handler) transfer.Listener {
	t.Helper()
	ln, err := tr.Listen("127.0.0.1:0", h)
	if err != nil {
		t.Fatalf("Listen: %v", err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	return ln
}

// dial connects to addr until the test ends.
func dial(t testing.TB, tr transfer.Transport, addr string) transfer.Conn {
	t.Helper()
	c, err := tr.Dial(context.Background(), addr)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// static is a Handler that serves n fixed blocks and costs nothing per
// Open, so that benchmarks measure the transport.
type static struct {
	blocks map[index.Key]transfer.Block
	keys   []index.Key
}

func newStatic(n, size int) *static {
	s := &static{blocks: make(map[index.Key]transfer.Block)}
	for i := range n {
		b := transfertest.MakeBlock(index.Hash(i+1), size)
		s.blocks[b.Key] = b
		s.keys = append(s.keys, b.Key)
	}
	return s
}

func noRelease() {}

func (s *static) Open(k index.Key) (transfer.Header, []byte, func(), error) {
	b, ok := s.blocks[k]
	if !ok {
		return transfer.Header{}, nil, nil, transfer.ErrNotFound
	}
	return b.Header, b.Data, noRelease, nil
}

func (s *static) Reserve(transfer.Header) ([]byte, func(bool) error, error) {
	return nil, nil, errors.New("static: read-only")
}

// sink is a Receiver that reuses one buffer per block and keeps the first
// error.
type sink struct {
	bufs [][]byte
	err  error
}

func newSink(n, size int) *sink {
	s := &sink{bufs: make([][]byte, n)}
	for i := range s.bufs {
		s.bufs[i] = make([]byte, size)
	}
	return s
}

func (s *sink) Buffer(i int, h transfer.Header) []byte { return s.bufs[i][:h.Size] }

func (s *sink) Done(i int, h transfer.Header, err error) {
	if err != nil && s.err == nil {
		s.err = err
	}
}

// TestGetAllocatesNothingPerBlock checks the hot path on both sides: a Get
// of 16 blocks costs a handful of allocations, however many blocks it has.
func TestGetAllocatesNothingPerBlock(t *testing.T) {
	h := newStatic(16, 64<<10)
	tr := ucx.New(ucx.Options{TLS: "posix,cma,self"})
	c := dial(t, tr, listen(t, tr, h).Addr())
	r := newSink(16, 64<<10)
	ctx := context.Background()
	allocs := testing.AllocsPerRun(50, func() {
		if err := c.Get(ctx, h.keys, r); err != nil || r.err != nil {
			t.Fatalf("Get: %v, %v", err, r.err)
		}
	})
	if allocs > 12 {
		t.Errorf("a Get of 16 blocks allocates %.1f times, want at most 12", allocs)
	}
}
