package resp

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

// Long values are sent from the store's memory, between the replies
// around them, and released only after they are written.
func TestWriterSendsViewsInPlaceAndReleasesAfterFlush(t *testing.T) {
	var out bytes.Buffer
	w := newWriter(&out, 4096)
	long := []byte(strings.Repeat("L", directMin))
	short := []byte("short")
	released := 0
	release := func() { released++ }

	w.simple("OK")
	w.view(long, release)
	w.array(2)
	w.view(short, release)
	w.null()
	w.view(long, release)
	w.int(-7)
	w.error("ERR line\r\nbreak")
	if released != 1 {
		t.Fatalf("%d releases before flush, want 1 (the short value, copied)", released)
	}
	if out.Len() != 0 {
		t.Fatal("wrote before flush")
	}
	if err := w.flush(); err != nil {
		t.Fatal(err)
	}
	want := "+OK\r\n$16384\r\n" + string(long) + "\r\n*2\r\n$5\r\nshort\r\n$-1\r\n$16384\r\n" + string(long) + "\r\n:-7\r\n-ERR line  break\r\n"
	if out.String() != want {
		t.Fatalf("wrote %.80q…, want %.80q…", out.String(), want)
	}
	if released != 3 {
		t.Fatalf("%d releases after flush, want 3", released)
	}
	if err := w.flush(); err != nil || out.Len() != len(want) {
		t.Fatalf("second flush: %v, %d bytes in all", err, out.Len())
	}
}

type failingWriter struct{}

func (failingWriter) Write(p []byte) (int, error) { return 0, errors.New("connection reset") }

// A failed write still releases the values, and the error sticks.
func TestWriterReleasesViewsWhenWriteFails(t *testing.T) {
	w := newWriter(failingWriter{}, 4096)
	released := 0
	w.view([]byte(strings.Repeat("L", directMin)), func() { released++ })
	if err := w.flush(); err == nil || released != 1 {
		t.Fatalf("flush: %v, %d releases; want an error and 1 release", err, released)
	}
	w.simple("OK")
	if err := w.flush(); err == nil {
		t.Fatal("error did not stick")
	}
}

func TestWriterIsFullPastItsLimits(t *testing.T) {
	w := newWriter(&bytes.Buffer{}, 4096)
	w.bulk(make([]byte, 4000))
	if w.full() {
		t.Fatal("full below the buffer size")
	}
	w.bulk(make([]byte, 100))
	if !w.full() {
		t.Fatal("not full past the buffer size")
	}
	w.flush()
	for range maxPendingDirect / directMin {
		w.view(make([]byte, directMin), nil)
	}
	if !w.full() {
		t.Fatal("not full with maxPendingDirect bytes of values queued")
	}
}
