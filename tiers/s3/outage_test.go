package s3_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/tiers"
	"github.com/kvstrata/kvstrata/tiers/s3"
	"github.com/kvstrata/kvstrata/tiers/s3/s3test"
)

// outageConfig is a tier configuration that notices an outage and a
// recovery within a fraction of a second.
func outageConfig(srv *s3test.Server, bucket string) s3.Config {
	cfg := srv.Config(bucket)
	cfg.RequestTimeout = 500 * time.Millisecond
	cfg.RetryBackoff = 10 * time.Millisecond
	cfg.ProbeInterval = 20 * time.Millisecond
	cfg.FlushInterval = 20 * time.Millisecond
	cfg.MaxBlockSize = 256 << 10
	cfg.MaxPendingBytes = 1 << 20
	cfg.CloseTimeout = time.Second
	return cfg
}

// waitFor polls cond every 10ms for up to d.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(d); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, d)
		}
	}
}

func TestStoreDownThenBack(t *testing.T) {
	srv := s3test.Start(t)
	cfg := outageConfig(srv, "outage")
	tr := openTier(t, cfg)
	stored, storedBytes := block(1, 1, 1000)
	must(t, tr.Put(stored, storedBytes))
	flush(t, tr)

	srv.Stop()
	// The first read finds the store gone, after its retries.
	if _, _, err := tr.Get(stored.Key, nil); !errors.Is(err, tiers.ErrUnavailable) {
		t.Fatalf("Get with the store stopped: %v, want ErrUnavailable", err)
	}
	var ue *s3.UnavailableError
	if err := tr.Available(); !errors.As(err, &ue) || !errors.Is(err, tiers.ErrUnavailable) || ue.Since.IsZero() {
		t.Fatalf("Available() = %v, want an *UnavailableError", err)
	}
	if s := tr.S3Stats(); s.Available || s.Cause == "" {
		t.Fatalf("S3Stats while down: available %v, cause %q", s.Available, s.Cause)
	}

	// Now reads of stored blocks fail fast, without a request.
	errsBefore := tr.S3Stats().RangedGets
	start := time.Now()
	_, _, getErr := tr.Get(stored.Key, nil)
	_, statErr := tr.Stat(stored.Key)
	if took := time.Since(start); !errors.Is(getErr, tiers.ErrUnavailable) || !errors.Is(statErr, tiers.ErrUnavailable) || took > 50*time.Millisecond {
		t.Fatalf("Get and Stat while unavailable: %v, %v after %v; want ErrUnavailable at once", getErr, statErr, took)
	}
	if n := tr.S3Stats().RangedGets - errsBefore; n != 0 {
		t.Fatalf("reads while unavailable sent %d requests", n)
	}

	// Puts are buffered up to MaxPendingBytes, and served from memory.
	var buffered []index.Header
	for i := range 4 {
		m, b := block(2, index.Hash(i+1), 256<<10)
		must(t, tr.Put(m, b))
		buffered = append(buffered, m)
	}
	m, b := block(2, 99, 1000)
	start = time.Now()
	err := tr.Put(m, b)
	if !errors.Is(err, tiers.ErrBusy) || !errors.Is(err, s3.ErrBacklog) || !errors.Is(err, tiers.ErrUnavailable) || time.Since(start) > 50*time.Millisecond {
		t.Fatalf("Put over MaxPendingBytes while down: %v after %v; want ErrBusy, ErrBacklog and ErrUnavailable at once", err, time.Since(start))
	}
	got, _, err := tr.Get(buffered[0].Key, nil)
	must(t, err)
	if index.Checksum(got) != buffered[0].Sum {
		t.Fatal("a buffered block read from memory differs")
	}
	if err := tr.Flush(context.Background()); !errors.Is(err, tiers.ErrUnavailable) {
		t.Fatalf("Flush while down: %v, want ErrUnavailable", err)
	}
	if s := tr.S3Stats(); s.PendingBytes != 1<<20 {
		t.Fatalf("PendingBytes = %d while down, want %d", s.PendingBytes, 1<<20)
	}

	// The store comes back: the tier notices by itself and uploads.
	srv.Restart()
	waitFor(t, 5*time.Second, "available again", func() bool { return tr.Available() == nil })
	waitFor(t, 5*time.Second, "buffered blocks uploaded", func() bool { return tr.S3Stats().PendingBytes == 0 })
	got, _, err = tr.Get(stored.Key, nil)
	must(t, err)
	if !bytes.Equal(got, storedBytes) {
		t.Fatal("the block stored before the outage reads differently")
	}
	other := openTier(t, cfg)
	for _, m := range buffered {
		got, gm, err := other.Get(m.Key, nil)
		must(t, err)
		if gm != m || index.Checksum(got) != m.Sum {
			t.Fatalf("buffered block %v read back differently by another node", m.Key)
		}
	}
}

func TestHungStoreDoesNotHoldCallersPastTheRequestTimeout(t *testing.T) {
	srv := s3test.Start(t)
	cfg := outageConfig(srv, "hung")
	cfg.RequestTimeout = 200 * time.Millisecond
	tr := openTier(t, cfg)
	m, b := block(1, 1, 1000)
	must(t, tr.Put(m, b))
	flush(t, tr)
	// A second instance knows the block only from the bucket: it has no
	// copy of the uploaded segment in memory to answer from.
	reader := openTier(t, cfg)

	srv.Pause()
	start := time.Now()
	_, _, err := reader.Get(m.Key, nil)
	if took := time.Since(start); !errors.Is(err, tiers.ErrUnavailable) || took > cfg.RequestTimeout+500*time.Millisecond {
		t.Fatalf("Get from a hung store: %v after %v; want ErrUnavailable within RequestTimeout (%v)", err, took, cfg.RequestTimeout)
	}
	start = time.Now()
	must(t, tr.Put(block(1, 2, 1000))) // never waits for the store
	if took := time.Since(start); took >= cfg.RequestTimeout {
		t.Fatalf("Put took %v with the store hung", took)
	}
	srv.Resume()
	waitFor(t, 5*time.Second, "available again", func() bool { return tr.Available() == nil })
	_, _, err = tr.Get(m.Key, nil)
	must(t, err)
}

func TestCloseWithTheStoreDownReportsLostBlocks(t *testing.T) {
	srv := s3test.Start(t)
	cfg := outageConfig(srv, "lost")
	cfg.FlushInterval = time.Hour
	tr := openTier(t, cfg)
	srv.Stop()
	must(t, tr.Put(block(1, 1, 1000)))
	start := time.Now()
	err := tr.Close()
	if err == nil || time.Since(start) > cfg.CloseTimeout+time.Second {
		t.Fatalf("Close with a block pending and the store down: %v after %v; want an error within CloseTimeout", err, time.Since(start))
	}
	t.Log(err)
}

func TestOpenOfflineStartsUnavailableAndListsTheBucketWhenTheStoreAnswers(t *testing.T) {
	srv := s3test.Start(t)
	cfg := outageConfig(srv, "offline")
	cfg.OpenOffline = true
	first := openTier(t, cfg)
	old, oldBytes := block(1, 1, 1000)
	must(t, first.Put(old, oldBytes))
	flush(t, first)
	must(t, first.Close())

	srv.Stop()
	tr := openTier(t, cfg) // the store is down: the tier opens anyway
	if !errors.Is(tr.Available(), tiers.ErrUnavailable) {
		t.Fatalf("a tier opened with the store down: Available() = %v", tr.Available())
	}
	if _, _, err := tr.Get(old.Key, nil); err == nil {
		t.Fatal("Get answered before the bucket was listed")
	}
	fresh, freshBytes := block(1, 2, 1000)
	must(t, tr.Put(fresh, freshBytes)) // buffered, as in any outage

	srv.Restart()
	waitFor(t, 5*time.Second, "available once the store answers", func() bool { return tr.Available() == nil })
	got, _, err := tr.Get(old.Key, nil)
	if err != nil || !bytes.Equal(got, oldBytes) {
		t.Fatalf("the block stored before the outage, after the listing: %v", err)
	}
	flush(t, tr)
	again := openTier(t, outageConfig(srv, "offline"))
	if got, _, err := again.Get(fresh.Key, nil); err != nil || !bytes.Equal(got, freshBytes) {
		t.Fatalf("the block put while the store was down never reached it: %v", err)
	}
}

func TestOpenOfflineCreatesTheBucketOnceTheStoreAnswers(t *testing.T) {
	srv := s3test.Start(t)
	cfg := outageConfig(srv, "made-later")
	cfg.OpenOffline = true
	srv.Stop()
	tr := openTier(t, cfg)
	srv.Restart()
	waitFor(t, 5*time.Second, "available once the store answers", func() bool { return tr.Available() == nil })
	if ok, err := srv.Client().BucketExists(context.Background(), "made-later"); err != nil || !ok {
		t.Fatalf("bucket after the store came back: exists %v, %v", ok, err)
	}
}

func TestOpenOfflineStillRefusesAStoreThatSaysNo(t *testing.T) {
	srv := s3test.Start(t)
	cfg := outageConfig(srv, "refused")
	cfg.OpenOffline = true
	cfg.SecretKey = "not-the-secret"
	cfg.Logger = testLogger(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if tr, err := s3.Open(ctx, cfg); err == nil {
		tr.Close()
		t.Fatal("Open with a wrong secret key succeeded offline; want it refused")
	}
	cfg = outageConfig(srv, "missing")
	cfg.OpenOffline, cfg.CreateBucket = true, false
	if tr, err := s3.Open(ctx, cfg); err == nil {
		tr.Close()
		t.Fatal("Open of a missing bucket without CreateBucket succeeded offline")
	}
}

func TestDataObjectsNoIndexNamesAreSweptOnceOld(t *testing.T) {
	srv := s3test.Start(t)
	cfg := outageConfig(srv, "garbage")
	cfg.RescanInterval = 20 * time.Millisecond
	cfg.GarbageAge = 2 * time.Second // stores may list modification times in whole seconds
	tr := openTier(t, cfg)
	live, liveBytes := block(1, 1, 1000)
	must(t, tr.Put(live, liveBytes))
	flush(t, tr)
	// What a crash between a segment's data and index uploads leaves.
	garbage := "v1/seg/" + fmt.Sprintf("%016x-%016x", uint64(time.Now().UnixNano()), uint64(42))
	_, err := srv.Client().PutObject(context.Background(), "garbage", garbage, bytes.NewReader(make([]byte, 100)), 100, minio.PutObjectOptions{})
	must(t, err)

	rescans := tr.S3Stats().Rescans
	waitFor(t, 5*time.Second, "rescans", func() bool { return tr.S3Stats().Rescans >= rescans+3 })
	if !slices.Contains(objects(t, srv, "garbage", "v1/seg/"), garbage) {
		t.Fatal("a data object younger than GarbageAge was swept: it may be an upload whose index is on its way")
	}
	waitFor(t, 5*time.Second, "the old garbage swept", func() bool { return tr.S3Stats().GarbageDeletes > 0 })
	if slices.Contains(objects(t, srv, "garbage", "v1/seg/"), garbage) {
		t.Fatal("a garbage delete was counted, and the garbage is still there")
	}
	if n := tr.S3Stats().GarbageDeletes; n != 1 {
		t.Fatalf("%d garbage deletes, want 1: only the unnamed object goes", n)
	}
	got, _, err := tr.Get(live.Key, nil)
	if err != nil || !bytes.Equal(got, liveBytes) {
		t.Fatalf("the live block after the sweep: %v", err)
	}
}

// A hung store (a paused process: it takes connections and answers
// nothing) is noticed by a probe with a deadline of its own, ProbeTimeout,
// well before the RequestTimeout of the reads that ran into it; the reads
// in flight are then cut, each failing with ErrUnavailable, instead of
// each waiting out its own deadline.
func TestHungStoreIsMarkedUnavailableWithinTheProbeTimeout(t *testing.T) {
	srv := s3test.Start(t)
	cfg := outageConfig(srv, "hung-probe")
	cfg.RequestTimeout = 10 * time.Second
	cfg.ProbeTimeout = 250 * time.Millisecond
	cfg.ProbeInterval = time.Hour // no recovery probe meanwhile: only the reads notice
	writer := openTier(t, cfg)
	const readers = 4
	var metas []index.Header
	for i := range readers {
		m, b := block(1, index.Hash(i+1), 1000)
		must(t, writer.Put(m, b))
		metas = append(metas, m)
	}
	flush(t, writer)
	reader := openTier(t, cfg) // knows the blocks only from the bucket

	// Well under one request deadline: a probe notices after ProbeTimeout
	// of silence and takes ProbeTimeout more to give up.
	bound := cfg.RequestTimeout / 2
	srv.Pause()
	start := time.Now()
	var wg sync.WaitGroup
	took := make([]time.Duration, readers)
	errs := make([]error, readers)
	for i, m := range metas {
		wg.Go(func() {
			_, _, errs[i] = reader.Get(m.Key, nil)
			took[i] = time.Since(start)
		})
	}
	waitFor(t, bound, "the hung store marked unavailable", func() bool { return reader.Available() != nil })
	marked := time.Since(start)
	wg.Wait()
	t.Logf("marked unavailable after %v; reads failed after %v (ProbeTimeout %v, RequestTimeout %v)",
		marked.Round(time.Millisecond), took, cfg.ProbeTimeout, cfg.RequestTimeout)
	for i := range readers {
		if !errors.Is(errs[i], tiers.ErrUnavailable) || took[i] >= bound {
			t.Errorf("reader %d: %v after %v; want ErrUnavailable once the store is marked, well within RequestTimeout (%v)",
				i, errs[i], took[i], cfg.RequestTimeout)
		}
	}
	var ue *s3.UnavailableError
	if err := reader.Available(); !errors.As(err, &ue) {
		t.Fatalf("Available() = %v, want an *UnavailableError", err)
	}

	srv.Resume()
	must(t, reader.Close()) // its probe would wait an hour; another instance reads
	again := openTier(t, cfg)
	for _, m := range metas {
		if _, _, err := again.Get(m.Key, nil); err != nil {
			t.Fatalf("after the store resumed: %v", err)
		}
	}
}
