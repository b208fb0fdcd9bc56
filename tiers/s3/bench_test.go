package s3_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/tiers/s3"
	"github.com/kvstrata/kvstrata/tiers/s3/s3test"
	"github.com/kvstrata/kvstrata/tiers/tiertest"
)

// The benchmarks put and get 1 MiB blocks through the tier next to plain
// minio-go PutObject and GetObject of the same bytes, one object per
// block, against the same versitygw in the same run, so that one run
// gives the ratios:
//
//	go test -run '^$' -bench . -benchtime 200x ./tiers/s3/
//
// The tier's Put benchmark ends with a Flush, timed, so that it measures
// bytes that reached the bucket, not bytes buffered in memory.

const (
	benchBlock  = 1 << 20
	benchValues = 16 // distinct block contents
)

var benchBuckets atomic.Int64

// benchBucket returns a fresh bucket name.
func benchBucket(kind string) string {
	return fmt.Sprintf("bench-%s-%d", kind, benchBuckets.Add(1))
}

// benchBlocks returns benchValues random 1 MiB blocks and their sums.
func benchBlocks() ([][]byte, []uint64) {
	r := rand.New(rand.NewPCG(1, 2))
	vals, sums := make([][]byte, benchValues), make([]uint64, benchValues)
	for i := range vals {
		vals[i] = make([]byte, benchBlock)
		for j := range vals[i] {
			vals[i][j] = byte(r.Uint32())
		}
		sums[i] = index.Checksum(vals[i])
	}
	return vals, sums
}

func benchMeta(i int, sum uint64) index.Header {
	m := index.Header{Key: index.Key{NS: 7, Hash: index.Hash(i + 1)}, Sum: sum}
	m.Size = benchBlock
	return m
}

// putObjectOptions are the options the tier uses for its uploads.
var putObjectOptions = minio.PutObjectOptions{ContentType: "application/octet-stream", DisableContentSha256: true}

func makeBucket(b *testing.B, c *minio.Client, bucket string) {
	must(b, c.MakeBucket(context.Background(), bucket, minio.MakeBucketOptions{Region: s3test.Region}))
}

func BenchmarkPut(b *testing.B) {
	srv := s3test.Start(b)
	vals, sums := benchBlocks()
	b.Run("tier", func(b *testing.B) {
		tr := openTier(b, srv.Config(benchBucket("put")))
		b.SetBytes(benchBlock)
		b.ResetTimer()
		for i := range b.N {
			m := benchMeta(i, sums[i%benchValues])
			err := tr.Put(m, vals[i%benchValues])
			if errors.Is(err, s3.ErrBacklog) {
				flush(b, tr) // the uploads fell behind: wait for them
				err = tr.Put(m, vals[i%benchValues])
			}
			must(b, err)
		}
		flush(b, tr)
	})
	b.Run("minio", func(b *testing.B) {
		c, bucket := srv.Client(), benchBucket("put")
		makeBucket(b, c, bucket)
		ctx := context.Background()
		b.SetBytes(benchBlock)
		b.ResetTimer()
		for i := range b.N {
			_, err := c.PutObject(ctx, bucket, fmt.Sprintf("obj/%d", i), bytes.NewReader(vals[i%benchValues]),
				benchBlock, putObjectOptions)
			must(b, err)
		}
	})
}

func BenchmarkGet(b *testing.B) {
	srv := s3test.Start(b)
	vals, sums := benchBlocks()
	const stored = 64 // one segment of 64 MiB

	tierBucket := benchBucket("get")
	tr := openTier(b, srv.Config(tierBucket))
	for i := range stored {
		must(b, tr.Put(benchMeta(i, sums[i%benchValues]), vals[i%benchValues]))
	}
	flush(b, tr)
	c, bucket := srv.Client(), benchBucket("get")
	makeBucket(b, c, bucket)
	ctx := context.Background()
	for i := range stored {
		_, err := c.PutObject(ctx, bucket, fmt.Sprintf("obj/%d", i), bytes.NewReader(vals[i%benchValues]),
			benchBlock, putObjectOptions)
		must(b, err)
	}

	b.Run("tier", func(b *testing.B) {
		buf := make([]byte, 0, benchBlock)
		b.SetBytes(benchBlock)
		b.ResetTimer()
		for i := range b.N {
			v, _, err := tr.Get(benchMeta(i%stored, 0).Key, buf[:0])
			must(b, err)
			buf = v
		}
	})
	b.Run("minio", func(b *testing.B) {
		buf := make([]byte, benchBlock)
		b.SetBytes(benchBlock)
		b.ResetTimer()
		for i := range b.N {
			obj, err := c.GetObject(ctx, bucket, fmt.Sprintf("obj/%d", i%stored), minio.GetObjectOptions{})
			must(b, err)
			_, err = io.ReadFull(obj, buf)
			must(b, err)
			must(b, obj.Close())
		}
	})
	// The same ranged GETs the tier sends, of the same segment object:
	// what the tier adds to the store's own cost of a ranged read.
	segment := objects(b, srv, tierBucket, "v1/seg/")[0]
	b.Run("minio-ranged", func(b *testing.B) {
		buf := make([]byte, benchBlock)
		b.SetBytes(benchBlock)
		b.ResetTimer()
		for i := range b.N {
			var opts minio.GetObjectOptions
			off := int64(i%stored) * benchBlock
			must(b, opts.SetRange(off, off+benchBlock-1))
			obj, err := c.GetObject(ctx, tierBucket, segment, opts)
			must(b, err)
			_, err = io.ReadFull(obj, buf)
			must(b, err)
			must(b, obj.Close())
		}
	})
}

// BenchmarkGetMany fetches the 64 blocks of one 64 MiB segment with
// GetMany, Concurrency ranged GETs at a time.
func BenchmarkGetMany(b *testing.B) {
	srv := s3test.Start(b)
	vals, sums := benchBlocks()
	const blocks = 64
	cfg := srv.Config(benchBucket("getmany"))
	w := openTier(b, cfg)
	keys := make([]index.Key, blocks)
	for i := range keys {
		m := benchMeta(i, sums[i%benchValues])
		must(b, w.Put(m, vals[i%benchValues]))
		keys[i] = m.Key
	}
	flush(b, w)
	if s := w.S3Stats(); s.Segments != 1 {
		b.Fatalf("%d blocks made %d segments, want 1", blocks, s.Segments)
	}

	for _, conc := range []int{1, 4, 16} {
		b.Run(fmt.Sprintf("concurrency=%d", conc), func(b *testing.B) {
			cfg := cfg
			cfg.Concurrency = conc
			tr := openTier(b, cfg)
			ctx := context.Background()
			b.SetBytes(blocks * benchBlock)
			b.ResetTimer()
			for range b.N {
				must(b, tr.GetMany(ctx, keys, func(i int, v []byte, m index.Header, err error) {
					if err != nil || len(v) != benchBlock {
						b.Errorf("block %d: %d bytes, %v", i, len(v), err)
					}
				}))
			}
		})
	}
}

// BenchmarkHungStore measures, with the default deadlines, how a store
// that hangs (a paused process) shows to readers of blocks stored in the
// bucket: how long after it hangs the tier is marked unavailable, and how
// long the reads that ran into it waited. Each reader reads its block
// again and again until the tier is marked. Each iteration takes seconds:
//
//	go test -run '^$' -bench HungStore -benchtime 1x ./tiers/s3/
func BenchmarkHungStore(b *testing.B) {
	for _, readers := range []int{1, 8} {
		b.Run(fmt.Sprintf("readers=%d", readers), func(b *testing.B) {
			var marked, longest, total time.Duration
			var reads int
			for range b.N {
				srv := s3test.Start(b)
				cfg := srv.Config(benchBucket("hung"))
				cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
				writer := openTier(b, cfg)
				var keys []index.Key
				for i := range readers {
					m, v := block(1, index.Hash(i+1), 64<<10)
					must(b, writer.Put(m, v))
					keys = append(keys, m.Key)
				}
				flush(b, writer)
				reader := openTier(b, cfg)

				srv.Pause()
				start := time.Now()
				var mu sync.Mutex
				var wg sync.WaitGroup
				for _, k := range keys {
					wg.Go(func() {
						for reader.Available() == nil {
							t0 := time.Now()
							_, _, _ = reader.Get(k, nil)
							d := time.Since(t0)
							mu.Lock()
							longest, total, reads = max(longest, d), total+d, reads+1
							mu.Unlock()
						}
					})
				}
				for reader.Available() == nil {
					time.Sleep(time.Millisecond)
				}
				marked += time.Since(start)
				wg.Wait()
				srv.Resume()
				_ = reader.Close()
				_ = writer.Close()
			}
			b.ReportMetric(marked.Seconds()/float64(b.N), "s-to-unavailable")
			b.ReportMetric(longest.Seconds(), "s-longest-read")
			b.ReportMetric(total.Seconds()/float64(reads), "s-mean-read")
			b.ReportMetric(float64(reads)/float64(b.N), "reads-until-marked")
		})
	}
}

// BenchmarkTier is the benchmark every backend runs (tiertest.Bench),
// against versitygw.
func BenchmarkTier(b *testing.B) { tiertest.Bench(b, factory(s3test.Start(b), "bench-tier")) }
