package bufpool

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
)

// mustPanic runs f and returns what it panicked with, failing the test
// when it did not.
func mustPanic(t *testing.T, f func()) (msg string) {
	t.Helper()
	defer func() {
		r := recover()
		if r == nil {
			t.Fatal("did not panic")
		}
		msg, _ = r.(string)
	}()
	f()
	return ""
}

func TestABufferGoesBackOnlyWithItsLastReference(t *testing.T) {
	p := New(1 << 30)
	b := p.Get(100 << 10)
	if len(b.Bytes()) != 100<<10 {
		t.Fatalf("Get(100 KiB) lent %d bytes", len(b.Bytes()))
	}
	copy(b.Bytes(), "block")
	b.Retain() // a second holder: the send, say, besides the promotion
	b.Release()
	if _, _, idle := p.Stats(); idle != 0 {
		t.Fatalf("%d bytes idle while a reference is still held", idle)
	}
	if !bytes.HasPrefix(b.Bytes(), []byte("block")) {
		t.Fatal("the bytes changed while a reference is still held")
	}
	b.Release()
	if _, _, idle := p.Stats(); idle != 104<<10 {
		t.Fatalf("%d bytes idle after the last release, want the buffer of its class, 104 KiB", idle)
	}
	c := p.Get(97 << 10)
	if gets, reused, idle := p.Stats(); gets != 2 || reused != 1 || idle != 0 {
		t.Fatalf("second Get: %d gets, %d reused, %d idle; want the released buffer again", gets, reused, idle)
	}
	if &c.Bytes()[0] != &b.b[0] {
		t.Fatal("a second Get of the same size class did not reuse the buffer")
	}
}

func TestReturnedBuffersArePoisonedInTests(t *testing.T) {
	p := New(1 << 30)
	b := p.Get(1 << 20)
	held := b.Bytes() // a holder that forgets it released
	copy(held, "block")
	b.Release()
	if held[0] != Poison || held[len(held)-1] != Poison {
		t.Fatal("a released buffer still holds its bytes: a reader after release would not notice")
	}
	held[10] = 'x' // a write after the last release
	msg := mustPanic(t, func() { p.Get(1 << 20) })
	if !strings.Contains(msg, "written at byte 10 after its last Release") {
		t.Fatalf("Get of a buffer written after release panicked with %q", msg)
	}
}

func TestReleasingMoreThanRetainedPanics(t *testing.T) {
	p := New(1 << 30)
	b := p.Get(10)
	b.Release()
	if msg := mustPanic(t, b.Release); !strings.Contains(msg, "no reference left") {
		t.Fatalf("second release: %q", msg)
	}
	if msg := mustPanic(t, func() { p.Get(10).Release(); b.Retain() }); !strings.Contains(msg, "Retain of a released buffer") {
		t.Fatalf("retain after release: %q", msg)
	}
}

func TestNilBufferIsMemoryNoPoolLent(t *testing.T) {
	var b *Buffer
	if b.Retain() != nil || b.Bytes() != nil {
		t.Fatal("nil buffer")
	}
	b.Release() // does nothing
}

func TestIdleBytesAreBounded(t *testing.T) {
	p := New(1 << 20)
	a, b := p.Get(1<<20), p.Get(1<<20)
	a.Release()
	b.Release() // over the bound: left to the garbage collector
	if _, _, idle := p.Stats(); idle != 1<<20 {
		t.Fatalf("%d bytes idle, want the 1 MiB bound", idle)
	}
}

func TestSizeClassesWasteAtMostAnEighth(t *testing.T) {
	for _, c := range []struct{ n, class int }{
		{1, 64 << 10}, {64 << 10, 64 << 10}, {64<<10 + 1, 72 << 10},
		{3 << 20, 3 << 20}, {3<<20 + 1, 3<<20 + 256<<10}, {48 << 20, 48 << 20}, {64 << 20, 64 << 20},
	} {
		if got := classOf(c.n); got != c.class {
			t.Errorf("class of %d bytes: %d, want %d", c.n, got, c.class)
		}
	}
	for n := 1; n < 1<<26; n = n*3/2 + 7 {
		if c := classOf(n); c < n || (n > 64<<10 && c-n > n/8) {
			t.Fatalf("class of %d bytes is %d", n, c)
		}
	}
}

func TestPoisonCheckFindsAWriteAnywhere(t *testing.T) {
	p := New(1 << 30)
	for _, at := range []int{0, 64<<10 - 1, 64 << 10, 3<<20 + 5, 4<<20 - 1} {
		b := p.Get(4 << 20)
		held := b.Bytes()
		b.Release()
		held[at] = 0
		msg := mustPanic(t, func() { p.Get(4 << 20) })
		if want := fmt.Sprintf("written at byte %d after", at); !strings.Contains(msg, want) {
			t.Fatalf("a write at byte %d: Get panicked with %q", at, msg)
		}
	}
}

func TestNoPoisonLeavesReleasedBuffersAlone(t *testing.T) {
	p := New(1 << 30)
	p.NoPoison()
	b := p.Get(1 << 20)
	held := b.Bytes()
	copy(held, "block")
	b.Release()
	held[10] = 'x'
	c := p.Get(1 << 20) // no check: does not panic
	if string(c.Bytes()[:5]) != "block" {
		t.Fatal("a pool without poison rewrote a released buffer")
	}
}
