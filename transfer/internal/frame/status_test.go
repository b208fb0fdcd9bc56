package frame

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/transfer"
)

func TestStatusCodes(t *testing.T) {
	// The codes are on the wire: doc.go of each backend lists them.
	for st, want := range []Status{StatusOK, StatusNotFound, StatusCorrupt, StatusRefused, StatusError, StatusFull, StatusUnavailable} {
		if Status(st) != want || !want.Known() {
			t.Errorf("status %d is %d (known %v)", st, want, want.Known())
		}
	}
	if numStatus.Known() {
		t.Errorf("status %d is known", numStatus)
	}
}

// TestStatusRoundTrip checks that a Handler's error comes out of a Conn
// as an error of the same kind: StatusOf on the server, BlockError on the
// client.
func TestStatusRoundTrip(t *testing.T) {
	k := index.Key{NS: 1, Hash: 2}
	for _, c := range []struct {
		err     error
		st      Status
		reserve Status
		want    error
	}{
		{fmt.Errorf("dram: %w", transfer.ErrNotFound), StatusNotFound, StatusError, transfer.ErrNotFound},
		{fmt.Errorf("ssd: %w", transfer.ErrCorrupt), StatusCorrupt, StatusCorrupt, transfer.ErrCorrupt},
		{fmt.Errorf("dram: tier full: %w", transfer.ErrFull), StatusFull, StatusFull, transfer.ErrFull},
		{fmt.Errorf("s3: store down: %w", transfer.ErrUnavailable), StatusUnavailable, StatusError, transfer.ErrUnavailable},
		{fmt.Errorf("node: block over the limit: %w", transfer.ErrRefused), StatusRefused, StatusRefused, transfer.ErrRefused},
		{errors.New("ssd: disk on fire"), StatusError, StatusError, transfer.ErrRemote},
	} {
		if st := StatusOf(c.err); st != c.st {
			t.Errorf("StatusOf(%v) = %d, want %d", c.err, st, c.st)
		}
		if st := ReserveStatus(c.err); st != c.reserve {
			t.Errorf("ReserveStatus(%v) = %d, want %d", c.err, st, c.reserve)
		}
		msg := Message(c.st, c.err)
		err := BlockError("tcp", "10.0.0.1:7", 3, k, c.st, []byte(msg))
		if !errors.Is(err, c.want) {
			t.Errorf("BlockError of %v = %v, want it to wrap %v", c.err, err, c.want)
		}
		if c.st == StatusNotFound {
			if msg != "" || err != transfer.ErrNotFound {
				t.Errorf("not found: msg %q, error %v; want none and ErrNotFound itself", msg, err)
			}
			continue
		}
		for _, part := range []string{"tcp: block 3 (" + k.String() + ") at 10.0.0.1:7: ", c.err.Error()} {
			if !strings.Contains(err.Error(), part) {
				t.Errorf("BlockError of %v = %q, want it to say %q", c.err, err, part)
			}
		}
	}
	if st := StatusOf(nil); st != StatusOK {
		t.Errorf("StatusOf(nil) = %d, want OK", st)
	}
	if msg := Message(StatusOK, nil); msg != "" {
		t.Errorf("Message(OK, nil) = %q", msg)
	}
	err := BlockError("ucx", "h:1", 0, k, StatusCorrupt, nil)
	if want := "ucx: block 0 (" + k.String() + ") at h:1: " + transfer.ErrCorrupt.Error(); err.Error() != want {
		t.Errorf("a corrupt block without a msg = %q, want %q", err, want)
	}
}

func TestClip(t *testing.T) {
	long := strings.Repeat("a", MaxMsg-1) + "é" // é is 2 bytes: cut in half
	for _, c := range []struct{ in, want string }{
		{"", ""},
		{"short", "short"},
		{"bad \xff byte", "bad ? byte"},
		{strings.Repeat("x", MaxMsg+10), strings.Repeat("x", MaxMsg)},
		{long, strings.Repeat("a", MaxMsg-1)},
		{strings.Repeat("é", MaxMsg), strings.Repeat("é", MaxMsg/2)},
	} {
		got := Clip(c.in)
		if got != c.want {
			t.Errorf("Clip(%.20q…) = %.20q… (%d bytes), want %d bytes", c.in, got, len(got), len(c.want))
		}
		if len(got) > MaxMsg || !utf8.ValidString(got) {
			t.Errorf("Clip(%.20q…) is %d bytes, valid UTF-8 %v", c.in, len(got), utf8.ValidString(got))
		}
	}
	if msg := Message(StatusError, errors.New(strings.Repeat("z", 2*MaxMsg))); len(msg) != MaxMsg {
		t.Errorf("Message of a long error is %d bytes, want %d", len(msg), MaxMsg)
	}
}
