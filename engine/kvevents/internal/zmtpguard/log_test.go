package zmtpguard

import (
	"strings"
	"testing"
	"time"
)

// TestLoggerLimitsLines: within an interval, one line is written and the
// others are counted; the next line written says how many were left out.
func TestLoggerLimitsLines(t *testing.T) {
	var out strings.Builder
	l := Logger(&out, time.Hour)
	for range 1000 {
		l.Printf("could not open a ZMTP connection")
	}
	if got := out.String(); got != "zmq4: could not open a ZMTP connection\n" {
		t.Fatalf("wrote %q", got)
	}
	lw := l.Writer().(*limitedWriter)
	lw.mu.Lock()
	lw.last = time.Now().Add(-2 * time.Hour) // as if the interval had passed
	lw.mu.Unlock()
	l.Printf("again")
	if want := "zmq4: could not open a ZMTP connection\nzmq4: (999 lines left out since the last one)\nzmq4: again\n"; out.String() != want {
		t.Fatalf("wrote %q, want %q", out.String(), want)
	}
}
