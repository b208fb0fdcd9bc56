package s3_test

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/tiers"
	"github.com/kvstrata/kvstrata/tiers/dram"
	"github.com/kvstrata/kvstrata/tiers/s3"
	"github.com/kvstrata/kvstrata/tiers/s3/s3test"
)

// deleteOnly hides the tier's Invalidator, so that the hierarchy deletes
// older copies from it the way it does for any tier: at once in the map,
// later in the bucket.
type deleteOnly struct{ tiers.Tier }

// overS3 stacks a DRAM tier over tier and returns the hierarchy.
func overS3(t *testing.T, tier tiers.Tier) *tiers.Hierarchy {
	t.Helper()
	dr, err := dram.New(dram.Config{Capacity: 1 << 20, MaxBlockSize: 64 << 10})
	must(t, err)
	h, err := tiers.New(tiers.Config{
		Inline: true,
		Levels: []tiers.LevelConfig{
			{Kind: index.TierDRAM, Tier: dr},
			{Kind: index.TierS3, Tier: tier},
		},
	})
	must(t, err)
	t.Cleanup(func() { _ = h.Close() })
	return h
}

// crashConfig is a tier configuration whose deletes reach the bucket only
// when Invalidate or Flush applies them, and which never rescans: a
// second tier opened on it reads the bucket as a node restarted after a
// crash of the first would.
func crashConfig(srv *s3test.Server, bucket string) s3.Config {
	cfg := srv.Config(bucket)
	cfg.DeleteDelay = time.Hour
	cfg.RescanInterval = time.Hour
	cfg.MissRescanInterval = -1
	return cfg
}

// TestOverwriteOfAnS3BlockSurvivesACrash: keys whose older version is in
// the bucket are overwritten through a hierarchy of DRAM over S3; then a
// second tier opens the bucket without the first being closed, as the
// node restarted after a crash would. No key may be found there. Three
// ways an older copy is in the bucket are covered: the S3 tier holds it
// in a stored segment; it holds a newer one in its open segment and the
// stored one waits for its removal; it deleted it (an eviction, say) and
// the removal waits. Without Invalidate (the hierarchy deletes from the
// tier as from any other), the second tier finds every key: the
// resurrection Invalidate prevents.
func TestOverwriteOfAnS3BlockSurvivesACrash(t *testing.T) {
	srv := s3test.Start(t)
	for _, tc := range []struct {
		name       string
		hide       bool
		wantInNext bool
	}{
		{"invalidate", false, false},
		{"delete-only", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := crashConfig(srv, "crash-"+tc.name)
			tr := openTier(t, cfg)
			const stored, reput, evicted = 1, 2, 3 // namespaces: the three ways
			for h := index.Hash(1); h <= 4; h++ {
				for _, ns := range []index.NamespaceID{stored, reput, evicted} {
					must(t, tr.Put(block(ns, h, 1000)))
				}
			}
			flush(t, tr)
			for h := index.Hash(1); h <= 4; h++ {
				m, b := block(reput, h, 1000)
				b[1]++ // a newer version, in the open segment
				m.Sum = index.Checksum(b)
				must(t, tr.Put(m, b))
				must(t, tr.Delete(index.Key{NS: evicted, Hash: h}))
			}

			var lower tiers.Tier = tr
			if tc.hide {
				lower = deleteOnly{tr}
			}
			hier := overS3(t, lower)
			for h := index.Hash(1); h <= 4; h++ {
				for _, ns := range []index.NamespaceID{stored, reput, evicted} {
					m, b := block(ns, h, 1000)
					b[2]++ // the acknowledged version, in DRAM only
					m.Sum = index.Checksum(b)
					must(t, hier.Put(m, b))
				}
			}

			next := openTier(t, cfg) // the first is never closed: a crash
			for h := index.Hash(1); h <= 4; h++ {
				for _, ns := range []index.NamespaceID{stored, reput, evicted} {
					key := index.Key{NS: ns, Hash: h}
					_, err := next.Stat(key)
					switch found := err == nil; {
					case !found && !errors.Is(err, tiers.ErrNotFound):
						t.Fatalf("Stat %v after the crash: %v", key, err)
					case found != tc.wantInNext:
						t.Errorf("after the crash the bucket has an older copy of %v: %v, want %v", key, found, tc.wantInNext)
					}
				}
			}
			if tc.hide {
				return
			}
			if s := tr.S3Stats(); s.PendingDeletes != 0 {
				t.Errorf("PendingDeletes = %d after the overwrites, want 0", s.PendingDeletes)
			}
			for h := index.Hash(1); h <= 4; h++ {
				if key := (index.Key{NS: evicted, Hash: h}); tr.MayResurrect(key) {
					t.Errorf("MayResurrect(%v) after its invalidation", key)
				}
			}
		})
	}
}

// TestOverwriteOfAnotherNodesS3BlockSurvivesACrash: another node uploads
// a key's block to the shared bucket after this node's hierarchy was
// built, so the hierarchy does not know the S3 tier has it (the tier
// found it with a rescan). An overwrite on this node still removes it
// from the bucket before it returns.
func TestOverwriteOfAnotherNodesS3BlockSurvivesACrash(t *testing.T) {
	srv := s3test.Start(t)
	cfg := crashConfig(srv, "other")
	cfg.MissRescanInterval = 0 // a Stat of an unknown key lists the bucket
	tr := openTier(t, cfg)
	hier := overS3(t, tr)

	other := openTier(t, cfg)
	m, b := block(1, 1, 1000)
	must(t, other.Put(m, b))
	flush(t, other)
	if _, err := tr.Stat(m.Key); err != nil {
		t.Fatalf("this node's tier does not find the other node's block: %v", err)
	}
	b[2]++
	m.Sum = index.Checksum(b)
	must(t, hier.Put(m, b))

	if _, err := openTier(t, crashConfig(srv, "other")).Stat(m.Key); !errors.Is(err, tiers.ErrNotFound) {
		t.Fatalf("after the crash the bucket has the older copy of %v: %v, want ErrNotFound", m.Key, err)
	}
}

// TestMayResurrectUntilTheIndexIsRewritten: a deleted block of a stored
// segment may come back until its index object is rewritten; a deleted
// block of the open segment never reached the store, and a key the tier
// never had has nothing to bring back. A block the tier holds may.
func TestMayResurrectUntilTheIndexIsRewritten(t *testing.T) {
	srv := s3test.Start(t)
	tr := openTier(t, crashConfig(srv, "mayresurrect"))
	stored, open, never, held := index.Key{NS: 1, Hash: 1}, index.Key{NS: 2, Hash: 1}, index.Key{NS: 3, Hash: 1}, index.Key{NS: 4, Hash: 1}
	must(t, tr.Put(block(stored.NS, stored.Hash, 1000)))
	must(t, tr.Put(block(held.NS, held.Hash, 1000)))
	flush(t, tr)
	must(t, tr.Put(block(open.NS, open.Hash, 1000)))
	must(t, tr.Delete(stored))
	must(t, tr.Delete(open))
	for key, want := range map[index.Key]bool{stored: true, open: false, never: false, held: true} {
		if got := tr.MayResurrect(key); got != want {
			t.Errorf("MayResurrect(%v) = %v before Flush, want %v", key, got, want)
		}
	}
	flush(t, tr)
	if tr.MayResurrect(stored) {
		t.Errorf("MayResurrect(%v) after Flush rewrote its index", stored)
	}
	must(t, tr.Invalidate(never)) // nothing to do: no error
}

// TestConcurrentInvalidationsShareIndexRewrites: many overwrites of keys
// of one stored segment at once rewrite its index fewer times than there
// are keys, and every one of them is gone from the bucket.
func TestConcurrentInvalidationsShareIndexRewrites(t *testing.T) {
	srv := s3test.Start(t)
	cfg := crashConfig(srv, "group")
	tr := openTier(t, cfg)
	const n = 32
	for h := range index.Hash(n + 1) {
		must(t, tr.Put(block(1, h, 1000)))
	}
	flush(t, tr)
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() { errs[i] = tr.Invalidate(index.Key{NS: 1, Hash: index.Hash(i)}) })
	}
	wg.Wait()
	must(t, errors.Join(errs...))
	if s := tr.S3Stats(); s.IndexRewrites >= n {
		t.Errorf("%d concurrent invalidations rewrote the index %d times: none shared a rewrite", n, s.IndexRewrites)
	}
	if s := openTier(t, cfg).Stats(); s.Blocks != 1 {
		t.Errorf("the bucket lists %d blocks after %d of %d were invalidated, want 1", s.Blocks, n, n+1)
	}
}

// TestOverwriteIsRefusedWhileTheStoreIsDown: with the store down, the
// older copy cannot be removed from the bucket, so the Put that replaces
// it fails, within the request deadline, with an error that says the
// store is unavailable: the write is not acknowledged. The removal stays
// queued and is applied once the store is back.
func TestOverwriteIsRefusedWhileTheStoreIsDown(t *testing.T) {
	srv := s3test.Start(t)
	cfg := outageConfig(srv, "down")
	cfg.DeleteDelay = 10 * time.Millisecond
	tr := openTier(t, cfg)
	m, b := block(1, 1, 1000)
	must(t, tr.Put(m, b))
	flush(t, tr)
	hier := overS3(t, tr)

	srv.Pause()
	b[2]++
	m.Sum = index.Checksum(b)
	start := time.Now()
	err := hier.Put(m, b)
	if took := time.Since(start); !errors.Is(err, tiers.ErrUnavailable) || took > cfg.RequestTimeout+time.Second {
		t.Fatalf("overwrite with the store hung: %v after %v; want ErrUnavailable within RequestTimeout (%v)",
			err, took, cfg.RequestTimeout)
	}
	t.Logf("the overwrite fails with: %v", err)
	if !tr.MayResurrect(m.Key) {
		t.Fatal("MayResurrect is false while the older copy is still in the bucket")
	}
	srv.Resume()
	waitFor(t, 10*time.Second, "the older copy removed from the bucket", func() bool { return !tr.MayResurrect(m.Key) })
	if _, err := openTier(t, cfg).Stat(m.Key); !errors.Is(err, tiers.ErrNotFound) {
		t.Fatalf("Stat of the overwritten key in the bucket once the store is back: %v, want ErrNotFound", err)
	}
}

// BenchmarkOverwrite puts 4 KiB blocks through a hierarchy of DRAM over
// S3, 16 goroutines per core, each key once: "stored" keys have an older
// copy in a stored segment (the overwrite removes it from the bucket),
// "new" keys the tier never had (the overwrite asks MayResurrect).
// "invalidate" is the tier as it is; "delete-only" hides its Invalidator,
// so that the hierarchy deletes the older copy as it does from any tier:
// at once in memory, in the bucket DeleteDelay later (not timed).
//
//	go test -run '^$' -bench BenchmarkOverwrite -benchtime 2000x ./tiers/s3/
func BenchmarkOverwrite(b *testing.B) {
	srv := s3test.Start(b)
	const size = 4 << 10
	for _, keys := range []string{"stored", "new"} {
		for _, mode := range []string{"invalidate", "delete-only"} {
			b.Run(keys+"/"+mode, func(b *testing.B) {
				tr := openTier(b, srv.Config(benchBucket("overwrite")))
				if keys == "stored" {
					for i := range b.N {
						must(b, tr.Put(block(1, index.Hash(i), size)))
					}
					flush(b, tr)
				}
				var lower tiers.Tier = tr
				if mode == "delete-only" {
					lower = deleteOnly{tr}
				}
				dr, err := dram.New(dram.Config{Capacity: int64(2*b.N*size + 1<<20), MaxBlockSize: size})
				must(b, err)
				h, err := tiers.New(tiers.Config{Inline: true, Levels: []tiers.LevelConfig{
					{Kind: index.TierDRAM, Tier: dr}, {Kind: index.TierS3, Tier: lower},
				}})
				must(b, err)
				b.Cleanup(func() { _ = h.Close() })
				m, v := block(1, 0, size)
				v[0]++
				m.Sum = index.Checksum(v)
				var next atomic.Int64
				b.SetParallelism(16)
				b.SetBytes(size)
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						m := m
						m.Key.Hash = index.Hash(next.Add(1) - 1)
						must(b, h.Put(m, v))
					}
				})
				b.StopTimer()
				b.ReportMetric(float64(tr.S3Stats().IndexRewrites)/float64(b.N), "rewrites/op")
			})
		}
	}
}
