//go:build ucx

package ucx_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/transfer"
	"github.com/kvstrata/kvstrata/transfer/ucx"
)

// benchBatch is the number of blocks a benchmarked Get fetches.
const benchBatch = 16

// BenchmarkGet measures Get throughput between a listener and a client in
// one process (two UCX workers, as two nodes would have): batches of 16
// blocks of each size, over 1 and 4 connections, every block checked
// against its checksum, over each UCX_TLS choice. MB/s counts block bytes;
// compare it with ucx_perftest on the same transports
// (bench/ucx-vs-perftest.sh).
func BenchmarkGet(b *testing.B) {
	for _, c := range tlsChoices {
		for _, size := range []int{64 << 10, 1 << 20, 4 << 20} {
			for _, conns := range []int{1, 4} {
				name := fmt.Sprintf("tls=%s/size=%s/conns=%d", c.name, sizeName(size), conns)
				b.Run(name, func(b *testing.B) { benchGet(b, ucx.Options{TLS: c.tls}, size, conns) })
			}
		}
	}
}

func benchGet(b *testing.B, opts ucx.Options, size, conns int) {
	h := newStatic(benchBatch, size)
	tr := ucx.New(opts)
	ln := listen(b, tr, h)
	cs := make([]transfer.Conn, conns)
	sinks := make([]*sink, conns)
	for i := range cs {
		cs[i] = dial(b, tr, ln.Addr())
		sinks[i] = newSink(benchBatch, size)
	}
	ctx := context.Background()
	b.SetBytes(int64(benchBatch * size))
	b.ReportAllocs()
	b.ResetTimer()
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make([]error, conns)
	for i := range cs {
		wg.Go(func() {
			for next.Add(1) <= int64(b.N) {
				if err := cs[i].Get(ctx, h.keys, sinks[i]); err != nil {
					errs[i] = err
					return
				}
			}
			errs[i] = sinks[i].err
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

// BenchmarkGetLatency measures the round trip of a Get of one 64 KiB block
// over an idle connection and reports its median and 99th percentile, over
// each UCX_TLS choice.
func BenchmarkGetLatency(b *testing.B) {
	for _, c := range tlsChoices {
		b.Run("tls="+c.name, func(b *testing.B) { benchLatency(b, ucx.Options{TLS: c.tls}) })
	}
}

func benchLatency(b *testing.B, opts ucx.Options) {
	const size = 64 << 10
	h := newStatic(1, size)
	tr := ucx.New(opts)
	c := dial(b, tr, listen(b, tr, h).Addr())
	r := newSink(1, size)
	ctx := context.Background()
	keys := []index.Key{h.keys[0]}
	took := make([]time.Duration, b.N)
	b.SetBytes(size)
	b.ResetTimer()
	for i := range b.N {
		began := time.Now()
		if err := c.Get(ctx, keys, r); err != nil || r.err != nil {
			b.Fatalf("Get: %v, %v", err, r.err)
		}
		took[i] = time.Since(began)
	}
	b.StopTimer()
	slices.Sort(took)
	b.ReportMetric(micros(took[len(took)/2]), "p50-µs")
	b.ReportMetric(micros(took[len(took)*99/100]), "p99-µs")
}

func micros(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

func sizeName(n int) string {
	if n >= 1<<20 {
		return fmt.Sprintf("%dMiB", n>>20)
	}
	return fmt.Sprintf("%dKiB", n>>10)
}

// BenchmarkDial measures opening and closing a connection: a UCP context
// and worker, the hellos, the endpoints.
func BenchmarkDial(b *testing.B) {
	for _, c := range tlsChoices {
		b.Run("tls="+c.name, func(b *testing.B) {
			tr := ucx.New(ucx.Options{TLS: c.tls})
			ln := listen(b, tr, newStatic(1, 1))
			for b.Loop() {
				conn, err := tr.Dial(context.Background(), ln.Addr())
				if err != nil {
					b.Fatal(err)
				}
				_ = conn.Close()
			}
		})
	}
}
