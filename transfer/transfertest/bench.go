package transfertest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/transfer"
)

// The helpers every backend's own tests and benchmarks share: a listener
// and a conn that close when the test ends, a handler and a receiver that
// cost nothing per block, and the Get benchmarks.

// Listen serves h on a free loopback port until the test ends.
func Listen(tb testing.TB, tr transfer.Transport, h transfer.Handler) transfer.Listener {
	tb.Helper()
	ln, err := tr.Listen("127.0.0.1:0", h)
	if err != nil {
		tb.Fatalf("Listen: %v", err)
	}
	tb.Cleanup(func() { _ = ln.Close() })
	return ln
}

// Dial connects to addr until the test ends.
func Dial(tb testing.TB, tr transfer.Transport, addr string) transfer.Conn {
	tb.Helper()
	c, err := tr.Dial(context.Background(), addr)
	if err != nil {
		tb.Fatalf("Dial: %v", err)
	}
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// Static is a read-only Handler that serves fixed blocks and costs nothing
// per Open, so that allocation counts and benchmarks measure the transport.
type Static struct {
	Keys   []index.Key // its blocks' keys, in order
	blocks map[index.Key]transfer.Block
}

// NewStatic serves n blocks of size bytes (MakeBlock 1 … n).
func NewStatic(n, size int) *Static {
	s := &Static{blocks: make(map[index.Key]transfer.Block)}
	for i := range n {
		b := MakeBlock(index.Hash(i+1), size)
		s.blocks[b.Key] = b
		s.Keys = append(s.Keys, b.Key)
	}
	return s
}

func noRelease() {}

// Open serves a stored block in place.
func (s *Static) Open(k index.Key) (index.Header, []byte, func(), error) {
	b, ok := s.blocks[k]
	if !ok {
		return index.Header{}, nil, nil, transfer.ErrNotFound
	}
	return b.Header, b.Data, noRelease, nil
}

// Reserve refuses every put.
func (s *Static) Reserve(index.Header) ([]byte, func(bool) error, error) {
	return nil, nil, errors.New("static: read-only")
}

// Sink is a Receiver that reuses one buffer per block and keeps the first
// error in Err.
type Sink struct {
	Err  error
	bufs [][]byte
}

// NewSink receives up to n blocks of up to size bytes.
func NewSink(n, size int) *Sink {
	s := &Sink{bufs: make([][]byte, n)}
	for i := range s.bufs {
		s.bufs[i] = make([]byte, size)
	}
	return s
}

// Buffer returns block i's buffer.
func (s *Sink) Buffer(i int, h index.Header) []byte { return s.bufs[i][:h.Size] }

// Done keeps the first error.
func (s *Sink) Done(_ int, _ index.Header, err error) {
	if err != nil && s.Err == nil {
		s.Err = err
	}
}

// BenchBatch is the number of blocks a BenchGet fetches with each Get.
const BenchBatch = 16

// BenchGet measures Get throughput over tr: Gets of BenchBatch blocks of
// size bytes over conns connections in parallel, every block checked
// against its checksum. MB/s counts block bytes.
func BenchGet(b *testing.B, tr transfer.Transport, size, conns int) {
	h := NewStatic(BenchBatch, size)
	ln := Listen(b, tr, h)
	cs := make([]transfer.Conn, conns)
	sinks := make([]*Sink, conns)
	for i := range cs {
		cs[i] = Dial(b, tr, ln.Addr())
		sinks[i] = NewSink(BenchBatch, size)
	}
	ctx := context.Background()
	b.SetBytes(int64(BenchBatch * size))
	b.ReportAllocs()
	b.ResetTimer()
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make([]error, conns)
	for i := range cs {
		wg.Go(func() {
			for next.Add(1) <= int64(b.N) {
				if err := cs[i].Get(ctx, h.Keys, sinks[i]); err != nil {
					errs[i] = err
					return
				}
			}
			errs[i] = sinks[i].Err
		})
	}
	wg.Wait()
	b.StopTimer()
	for _, err := range errs {
		if err != nil {
			b.Fatal(err)
		}
	}
}

// Bin is a Handler that accepts every put into a reused buffer and keeps
// nothing, so that benchmarks of puts measure the transport: the receive
// and the checksum of each block.
type Bin struct{ bufs sync.Pool }

// Open finds nothing.
func (*Bin) Open(index.Key) (index.Header, []byte, func(), error) {
	return index.Header{}, nil, nil, transfer.ErrNotFound
}

// Reserve returns a buffer of h.Size bytes, taken back at the commit.
func (b *Bin) Reserve(h index.Header) ([]byte, func(bool) error, error) {
	p, _ := b.bufs.Get().(*[]byte)
	if p == nil || cap(*p) < int(h.Size) {
		buf := make([]byte, h.Size)
		p = &buf
	}
	return (*p)[:h.Size], func(bool) error { b.bufs.Put(p); return nil }, nil
}

// BenchPut measures Put throughput over tr: Puts of BenchBatch blocks of
// size bytes over conns connections in parallel, each block hashed by the
// transport as it arrives and checked against its checksum. MB/s counts
// block bytes.
func BenchPut(b *testing.B, tr transfer.Transport, size, conns int) {
	ln := Listen(b, tr, &Bin{})
	blocks := make([]transfer.Block, BenchBatch)
	for i := range blocks {
		blocks[i] = MakeBlock(index.Hash(i+1), size)
	}
	cs := make([]transfer.Conn, conns)
	for i := range cs {
		cs[i] = Dial(b, tr, ln.Addr())
	}
	ctx := context.Background()
	b.SetBytes(int64(BenchBatch * size))
	b.ReportAllocs()
	b.ResetTimer()
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make([]error, conns)
	for i := range cs {
		wg.Go(func() {
			for next.Add(1) <= int64(b.N) {
				bad, err := cs[i].Put(ctx, blocks)
				if err == nil {
					err = errors.Join(bad...)
				}
				if err != nil {
					errs[i] = err
					return
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	for _, err := range errs {
		if err != nil {
			b.Fatal(err)
		}
	}
}

// BenchGetLatency measures the round trip of a Get of one 64 KiB block over
// an idle connection of tr and reports its median and 99th percentile.
func BenchGetLatency(b *testing.B, tr transfer.Transport) {
	const size = 64 << 10
	h := NewStatic(1, size)
	c := Dial(b, tr, Listen(b, tr, h).Addr())
	r := NewSink(1, size)
	ctx := context.Background()
	took := make([]time.Duration, b.N)
	b.SetBytes(size)
	b.ResetTimer()
	for i := range b.N {
		began := time.Now()
		if err := c.Get(ctx, h.Keys, r); err != nil || r.Err != nil {
			b.Fatalf("Get: %v, %v", err, r.Err)
		}
		took[i] = time.Since(began)
	}
	b.StopTimer()
	slices.Sort(took)
	b.ReportMetric(micros(took[len(took)/2]), "p50-µs")
	b.ReportMetric(micros(took[len(took)*99/100]), "p99-µs")
}

func micros(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// SizeName names a block size for a benchmark: "64KiB", "4MiB".
func SizeName(n int) string {
	if n >= 1<<20 {
		return fmt.Sprintf("%dMiB", n>>20)
	}
	return fmt.Sprintf("%dKiB", n>>10)
}
