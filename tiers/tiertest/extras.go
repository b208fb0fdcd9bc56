package tiertest

import (
	"bytes"
	"context"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/tiers"
)

// extra returns tr as the extra E, or skips the test when tr lacks it.
func extra[E any](t *testing.T, tr tiers.Tier) E {
	t.Helper()
	e, ok := tr.(E)
	if !ok {
		t.Skipf("%T does not implement %v", tr, reflect.TypeFor[E]())
	}
	return e
}

// runExtras exercises each optional extra of tiers/extras.go the tier
// implements, one subtest per extra.
func runExtras(t *testing.T, f Factory) {
	t.Run("Viewer", func(t *testing.T) { testViewer(t, f) })
	t.Run("Reserver", func(t *testing.T) { testReserver(t, f) })
	t.Run("Invalidator", func(t *testing.T) { testInvalidator(t, f) })
	t.Run("ManyGetter", func(t *testing.T) { testManyGetter(t, f) })
	t.Run("PooledGetter", func(t *testing.T) { testPooledGetter(t, f) })
	t.Run("ObjectLocator", func(t *testing.T) { testObjectLocator(t, f) })
	t.Run("HostCopier", func(t *testing.T) { testHostCopier(t, f) })
	t.Run("FileFiller", func(t *testing.T) { testFileFiller(t, f) })
	t.Run("FileLocator", func(t *testing.T) { testFileLocator(t, f) })
	t.Run("AvailabilityReporter", func(t *testing.T) {
		tr := f.open(t, 1<<20, 1<<16)
		if err := extra[tiers.AvailabilityReporter](t, tr).Available(); err != nil {
			t.Fatalf("a freshly opened tier reports itself unavailable: %v", err)
		}
	})
	t.Run("DegradationReporter", func(t *testing.T) {
		tr := f.open(t, 1<<20, 1<<16)
		d := extra[tiers.DegradationReporter](t, tr)
		m, b := Block(1, 1000)
		must(t, tr.Put(m, b))
		if err := d.Degraded(); err != nil {
			t.Fatalf("a tier with room reports itself degraded: %v", err)
		}
	})
	t.Run("DetailReporter", func(t *testing.T) {
		tr := f.open(t, 1<<20, 1<<16)
		d := extra[tiers.DetailReporter](t, tr)
		m, b := Block(1, 1000)
		must(t, tr.Put(m, b))
		detail := d.Detail()
		if len(detail) == 0 {
			t.Fatal("Detail reports no counters")
		}
		for name, v := range detail {
			if name == "" || v < 0 {
				t.Errorf("Detail counter %q = %d", name, v)
			}
		}
	})
}

// testHostCopier checks CopyOut: the block's bytes land whole in the
// caller's memory, a wrong-sized destination is refused, and a missing
// block is ErrNotFound.
func testHostCopier(t *testing.T, f Factory) {
	tr := f.open(t, 1<<20, 1<<16)
	c := extra[tiers.HostCopier](t, tr)
	if _, err := c.CopyOut(index.Key{NS: ns, Hash: 99}, make([]byte, 10)); !errors.Is(err, tiers.ErrNotFound) {
		t.Fatalf("CopyOut of a missing block: %v, want ErrNotFound", err)
	}
	m, b := Block(1, 20000)
	must(t, tr.Put(m, b))
	if _, err := c.CopyOut(m.Key, make([]byte, len(b)-1)); !errors.Is(err, tiers.ErrInvalid) {
		t.Fatalf("CopyOut into one byte too few: %v, want ErrInvalid", err)
	}
	dst := make([]byte, len(b))
	got, err := c.CopyOut(m.Key, dst)
	must(t, err)
	if got != m || !bytes.Equal(dst, b) {
		t.Fatalf("CopyOut gave %+v and other bytes; want %+v", got, m)
	}
	if g, gm, err := tr.Get(m.Key, nil); err != nil || gm != m || !bytes.Equal(g, b) {
		t.Fatalf("Get after CopyOut: %+v, %v", gm, err)
	}
}

// testViewer checks that a view shows the block's bytes in place, pinned:
// neither a replacing Put nor a Delete changes them until Release.
func testViewer(t *testing.T, f Factory) {
	tr := f.open(t, 1<<20, 1<<16)
	vt := extra[tiers.Viewer](t, tr)
	if _, err := vt.View(index.Key{NS: ns, Hash: 99}, time.Minute); !errors.Is(err, tiers.ErrNotFound) {
		t.Fatalf("View of a missing block: %v, want ErrNotFound", err)
	}
	m, b := Block(1, 20000)
	must(t, tr.Put(m, b))
	v1, err := vt.View(m.Key, time.Minute)
	must(t, err)
	v2, err := vt.View(m.Key, time.Minute)
	must(t, err)
	if !bytes.Equal(v1.Bytes(), b) || v1.Meta() != m {
		t.Fatalf("view shows other bytes or meta %+v, want %+v", v1.Meta(), m)
	}
	if &v1.Bytes()[0] != &v2.Bytes()[0] {
		t.Fatal("two views of one block point at different memory: not zero-copy")
	}
	m2, b2 := Block(1, 30000) // the same key, other bytes
	must(t, tr.Put(m2, b2))
	if got, gm, err := tr.Get(m.Key, nil); err != nil || gm != m2 || !bytes.Equal(got, b2) {
		t.Fatalf("Get after a replacing Put under a view: %+v, %v", gm, err)
	}
	must(t, tr.Delete(m.Key))
	if !bytes.Equal(v1.Bytes(), b) || v1.Meta() != m {
		t.Fatal("a replacing Put or a Delete changed the bytes of a view not yet released")
	}
	must(t, v1.Release())
	must(t, v2.Release())
	if s := tr.Stats(); s.Used != 0 || s.Blocks != 0 {
		t.Fatalf("after the last view of a deleted block was released: %+v", s)
	}
	must(t, tr.Close())
	if _, err := vt.View(m.Key, time.Minute); !errors.Is(err, tiers.ErrClosed) {
		t.Fatalf("View after Close: %v, want ErrClosed", err)
	}
}

// testReserver checks that a reservation is invisible until Commit, takes
// room like a Put, and gives it all back on Abort.
func testReserver(t *testing.T, f Factory) {
	const capacity, limit = 1 << 20, 1 << 16
	tr := f.open(t, capacity, limit)
	rt := extra[tiers.Reserver](t, tr)

	m, b := Block(1, 10000)
	r, err := rt.Reserve(m)
	must(t, err)
	if len(r.Bytes()) != len(b) {
		t.Fatalf("reserved %d bytes for a %d-byte block", len(r.Bytes()), len(b))
	}
	copy(r.Bytes(), b)
	if _, err := tr.Stat(m.Key); !errors.Is(err, tiers.ErrNotFound) {
		t.Fatalf("reserved block visible before Commit: %v", err)
	}
	must(t, r.Commit())
	if err := r.Commit(); !errors.Is(err, tiers.ErrInvalid) {
		t.Fatalf("second Commit: %v, want ErrInvalid", err)
	}
	r.Abort() // a no-op after Commit
	if got, gm, err := tr.Get(m.Key, nil); err != nil || gm != m || !bytes.Equal(got, b) {
		t.Fatalf("Get after Commit: %+v, %v", gm, err)
	}
	committed := tr.Stats()
	if committed.Blocks != 1 || committed.Used < int64(len(b)) || committed.Used > int64(len(b))+f.Overhead {
		t.Fatalf("after one Commit of %d bytes: %+v", len(b), committed)
	}

	m2, b2 := Block(1, 5000) // replaces the committed block
	r, err = rt.Reserve(m2)
	must(t, err)
	copy(r.Bytes(), b2)
	must(t, r.Commit())
	if got, gm, err := tr.Get(m.Key, nil); err != nil || gm != m2 || !bytes.Equal(got, b2) {
		t.Fatalf("Get after a replacing Commit: %+v, %v", gm, err)
	}
	before := tr.Stats()

	var held []tiers.Reservation // fill the tier with reservations
	for i := 2; ; i++ {
		m, _ := Block(index.Hash(i), limit)
		r, err := rt.Reserve(m)
		if errors.Is(err, tiers.ErrFull) {
			break
		}
		must(t, err)
		held = append(held, r)
		if i > 2*capacity/limit {
			t.Fatalf("%d reservations of %d bytes fit in %d bytes", len(held), limit, capacity)
		}
	}
	if len(held) == 0 {
		t.Fatal("no room for one reservation")
	}
	for _, r := range held {
		r.Abort()
	}
	if after := tr.Stats(); after != before {
		t.Fatalf("stats before the reservations %+v, after they were aborted %+v", before, after)
	}

	big := m
	big.Size = limit + 1
	var se *tiers.SizeError
	if _, err := rt.Reserve(big); !errors.Is(err, tiers.ErrTooLarge) || !errors.As(err, &se) {
		t.Fatalf("Reserve over the block limit: %v, want a *SizeError", err)
	}
	must(t, tr.Close())
	if _, err := rt.Reserve(m); !errors.Is(err, tiers.ErrClosed) {
		t.Fatalf("Reserve after Close: %v, want ErrClosed", err)
	}
}

// testInvalidator checks that an invalidated block, held or deleted
// before, is gone for good: MayResurrect says so, and a reopen does not
// bring it back.
func testInvalidator(t *testing.T, f Factory) {
	tr := f.open(t, 1<<20, 1<<16)
	inv := extra[tiers.Invalidator](t, tr)
	held, hb := Block(1, 3000)
	deleted, db := Block(2, 4000)
	kept, kb := Block(3, 5000)
	for _, p := range []struct {
		m index.Header
		b []byte
	}{{held, hb}, {deleted, db}, {kept, kb}} {
		must(t, tr.Put(p.m, p.b))
	}
	must(t, tr.Delete(deleted.Key))
	never := index.Key{NS: ns, Hash: 99}
	for _, k := range []index.Key{held.Key, deleted.Key, never} {
		must(t, inv.Invalidate(k))
		if inv.MayResurrect(k) {
			t.Fatalf("MayResurrect(%v) after Invalidate", k)
		}
		if _, _, err := tr.Get(k, nil); !errors.Is(err, tiers.ErrNotFound) {
			t.Fatalf("Get(%v) after Invalidate: %v, want ErrNotFound", k, err)
		}
	}
	if s := tr.Stats(); s.Blocks != 1 || s.Used < int64(len(kb)) || s.Used > int64(len(kb))+f.Overhead {
		t.Fatalf("after invalidating all but one %d-byte block: %+v", len(kb), s)
	}
	if f.Reopen != nil {
		tr = f.Reopen(t, tr)
		t.Cleanup(func() { _ = tr.Close() })
		inv = tr.(tiers.Invalidator)
		for _, k := range []index.Key{held.Key, deleted.Key} {
			if _, _, err := tr.Get(k, nil); !errors.Is(err, tiers.ErrNotFound) {
				t.Fatalf("invalidated block %v came back after a reopen: %v", k, err)
			}
		}
		if got, gm, err := tr.Get(kept.Key, nil); err != nil || gm != kept || !bytes.Equal(got, kb) {
			t.Fatalf("the block next to the invalidated ones after a reopen: %+v, %v", gm, err)
		}
	}
	must(t, tr.Close())
	if err := inv.Invalidate(kept.Key); !errors.Is(err, tiers.ErrClosed) {
		t.Fatalf("Invalidate after Close: %v, want ErrClosed", err)
	}
}

// testManyGetter checks that GetMany calls fn exactly once per key, one
// call at a time, with the bytes Get would return, before and after the
// tier flushes.
func testManyGetter(t *testing.T, f Factory) {
	tr := f.open(t, 4<<20, 1<<16)
	mg := extra[tiers.ManyGetter](t, tr)
	var keys []index.Key
	want := map[index.Key][]byte{}
	for i := 1; i <= 12; i++ {
		m, b := Block(index.Hash(i), 1000*i)
		must(t, tr.Put(m, b))
		keys = append(keys, m.Key)
		want[m.Key] = b
	}
	missing := index.Key{NS: ns, Hash: 99}
	keys = append(keys[:5], append([]index.Key{missing}, keys[5:]...)...)

	check := func(t *testing.T) {
		calls := make([]int, len(keys)) // not atomic: the race detector sees calls that overlap
		kept := make([][]byte, len(keys))
		must(t, mg.GetMany(context.Background(), keys, func(i int, v []byte, m index.Header, err error) {
			calls[i]++
			k := keys[i]
			if k == missing {
				if !errors.Is(err, tiers.ErrNotFound) {
					t.Errorf("missing block: %v, want ErrNotFound", err)
				}
				return
			}
			if err != nil || m.Key != k || !bytes.Equal(v, want[k]) || m.Sum != index.Checksum(want[k]) {
				t.Errorf("block %v: %d bytes, %+v, %v", k, len(v), m, err)
			}
			kept[i] = v
		}))
		for i, n := range calls {
			if n != 1 {
				t.Fatalf("fn called %d times for key %d", n, i)
			}
		}
		for i, v := range kept { // the values were the caller's to keep
			if k := keys[i]; k != missing && !bytes.Equal(v, want[k]) {
				t.Fatalf("block %v changed after GetMany returned", k)
			}
		}
	}
	t.Run("Buffered", check)
	if f.Flush != nil {
		f.Flush(t, tr)
		t.Run("Flushed", check)
	}
	t.Run("CancelledContext", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		calls := make([]int, len(keys))
		err := mg.GetMany(ctx, keys, func(i int, v []byte, m index.Header, err error) { calls[i]++ })
		if err != nil && !errors.Is(err, context.Canceled) {
			t.Fatalf("GetMany with a cancelled context: %v", err)
		}
		for i, n := range calls {
			if n > 1 {
				t.Fatalf("fn called %d times for key %d", n, i)
			}
		}
	})
	must(t, tr.Close())
	if err := mg.GetMany(context.Background(), keys, func(int, []byte, index.Header, error) {}); !errors.Is(err, tiers.ErrClosed) {
		t.Fatalf("GetMany after Close: %v, want ErrClosed", err)
	}
}

// testPooledGetter checks that GetPooled returns what Get does, with a
// reference the caller releases, before and after the tier flushes, and
// Get's errors: ErrNotFound for a block not stored, ErrClosed after Close.
func testPooledGetter(t *testing.T, f Factory) {
	tr := f.open(t, 4<<20, 1<<16)
	pg := extra[tiers.PooledGetter](t, tr)
	var blocks [][]byte
	for i := 1; i <= 4; i++ {
		m, b := Block(index.Hash(i), 1<<16/i)
		must(t, tr.Put(m, b))
		blocks = append(blocks, b)
	}
	check := func(t *testing.T) {
		for i, b := range blocks {
			k := index.Key{NS: ns, Hash: index.Hash(i + 1)}
			v, ref, m, err := pg.GetPooled(k)
			if err != nil || m.Key != k || m.Sum != index.Checksum(b) || !bytes.Equal(v, b) {
				t.Fatalf("block %v: %d bytes, %+v, %v", k, len(v), m, err)
			}
			ref.Release()
		}
	}
	t.Run("Buffered", check)
	if f.Flush != nil {
		f.Flush(t, tr)
		t.Run("Flushed", check)
	}
	if v, ref, _, err := pg.GetPooled(index.Key{NS: ns, Hash: 99}); !errors.Is(err, tiers.ErrNotFound) || v != nil || ref != nil {
		t.Fatalf("a block not stored: %d bytes, reference %v, %v; want ErrNotFound", len(v), ref != nil, err)
	}
	must(t, tr.Close())
	if _, _, _, err := pg.GetPooled(index.Key{NS: ns, Hash: 1}); !errors.Is(err, tiers.ErrClosed) {
		t.Fatalf("GetPooled after Close: %v, want ErrClosed", err)
	}
}

// testObjectLocator checks that a stored block is located at a range of
// its own, with its Meta, and that a block not stored is not found.
func testObjectLocator(t *testing.T, f Factory) {
	tr := f.open(t, 1<<20, 1<<16)
	ol := extra[tiers.ObjectLocator](t, tr)
	ctx := context.Background()
	if _, err := ol.LocateObject(ctx, index.Key{NS: ns, Hash: 99}); !errors.Is(err, tiers.ErrNotFound) {
		t.Fatalf("LocateObject of a missing block: %v, want ErrNotFound", err)
	}
	var metas []index.Header
	for i := 1; i <= 3; i++ {
		m, b := Block(index.Hash(i), 1000*i)
		must(t, tr.Put(m, b))
		metas = append(metas, m)
	}
	if f.Flush == nil {
		t.Skip("the factory cannot flush the tier: its blocks may not be stored yet")
	}
	f.Flush(t, tr)
	type span struct{ from, to int64 }
	seen := map[string][]span{}
	for _, m := range metas {
		r, err := ol.LocateObject(ctx, m.Key)
		must(t, err)
		if r.Meta != m || r.Bucket == "" || r.Object == "" || r.Offset < 0 {
			t.Fatalf("LocateObject(%v) = %+v, want the block's Meta %+v in a named object", m.Key, r, m)
		}
		s := span{r.Offset, r.Offset + int64(m.Size)}
		for _, o := range seen[r.Bucket+"/"+r.Object] {
			if s.from < o.to && o.from < s.to {
				t.Fatalf("block %v at [%d, %d) overlaps another at [%d, %d)", m.Key, s.from, s.to, o.from, o.to)
			}
		}
		seen[r.Bucket+"/"+r.Object] = append(seen[r.Bucket+"/"+r.Object], s)
	}
	must(t, tr.Delete(metas[0].Key))
	if _, err := ol.LocateObject(ctx, metas[0].Key); !errors.Is(err, tiers.ErrNotFound) {
		t.Fatalf("LocateObject of a deleted block: %v, want ErrNotFound", err)
	}
}

// testFileLocator checks that a large block is located in a file whose
// bytes at the extent's offset are the block's, with its Meta and a
// descriptor; that the extent keeps reading the block's bytes after a
// replacing Put or a Delete until Release; and that a block not stored is
// not found. A small block may be kept elsewhere than in a file (then
// ErrNotFound), or located like a large one.
func testFileLocator(t *testing.T, f Factory) {
	tr := f.open(t, 8<<20, 1<<20)
	fl := extra[tiers.FileLocator](t, tr)
	if _, err := fl.LocateFile(index.Key{NS: ns, Hash: 99}); !errors.Is(err, tiers.ErrNotFound) {
		t.Fatalf("LocateFile of a missing block: %v, want ErrNotFound", err)
	}
	read := func(t *testing.T, ext tiers.FileExtent) []byte {
		t.Helper()
		got := make([]byte, ext.Meta().Size)
		n, err := ext.File().ReadAt(got, ext.Offset())
		if n != len(got) {
			t.Fatalf("ReadAt of the extent: %d of %d bytes, %v", n, len(got), err)
		}
		return got
	}
	small, sb := Block(1, 100)
	must(t, tr.Put(small, sb))
	if ext, err := fl.LocateFile(small.Key); err == nil {
		if ext.Meta() != small || !bytes.Equal(read(t, ext), sb) {
			t.Fatalf("LocateFile of a small block: %+v and other bytes, want %+v", ext.Meta(), small)
		}
		must(t, ext.Release())
	} else if !errors.Is(err, tiers.ErrNotFound) {
		t.Fatalf("LocateFile of a small block: %v, want an extent or ErrNotFound", err)
	}

	m1, b1 := Block(2, 1<<20)
	m2, b2 := Block(3, 1<<20-1)
	must(t, tr.Put(m1, b1))
	must(t, tr.Put(m2, b2))
	if f.Flush != nil {
		f.Flush(t, tr)
	}
	e1, err := fl.LocateFile(m1.Key)
	must(t, err)
	e2, err := fl.LocateFile(m2.Key)
	must(t, err)
	for _, c := range []struct {
		ext tiers.FileExtent
		m   index.Header
		b   []byte
	}{{e1, m1, b1}, {e2, m2, b2}} {
		if c.ext.Meta() != c.m || c.ext.Offset() < 0 {
			t.Fatalf("LocateFile(%v): Meta %+v at offset %d, want %+v", c.m.Key, c.ext.Meta(), c.ext.Offset(), c.m)
		}
		if fd := c.ext.File().Fd(); fd == ^uintptr(0) {
			t.Fatalf("LocateFile(%v): the file has no descriptor", c.m.Key)
		}
		if !bytes.Equal(read(t, c.ext), c.b) {
			t.Fatalf("LocateFile(%v): the extent's bytes are not the block's", c.m.Key)
		}
	}

	m1b, b1b := Block(2, 1<<20-2) // the same key as m1, other bytes
	must(t, tr.Put(m1b, b1b))
	must(t, tr.Delete(m2.Key))
	if f.Flush != nil {
		f.Flush(t, tr) // would reclaim the old files' space
	}
	if !bytes.Equal(read(t, e1), b1) || !bytes.Equal(read(t, e2), b2) {
		t.Fatal("a replacing Put or a Delete changed the bytes of an extent not yet released")
	}
	must(t, e1.Release())
	must(t, e2.Release())
	if _, err := fl.LocateFile(m2.Key); !errors.Is(err, tiers.ErrNotFound) {
		t.Fatalf("LocateFile of a deleted block: %v, want ErrNotFound", err)
	}
	e3, err := fl.LocateFile(m1b.Key)
	must(t, err)
	if e3.Meta() != m1b || !bytes.Equal(read(t, e3), b1b) {
		t.Fatalf("LocateFile after a replacing Put: %+v, want the new block %+v", e3.Meta(), m1b)
	}
	must(t, e3.Release())
	must(t, tr.Close())
	if _, err := fl.LocateFile(m1b.Key); !errors.Is(err, tiers.ErrClosed) {
		t.Fatalf("LocateFile after Close: %v, want ErrClosed", err)
	}
}
