package zmtpguard

import (
	"fmt"
	"io"
	"log"
	"sync"
	"time"
)

// Logger returns a logger for zmq4's sockets (zmq4.WithLogger) that writes
// to w (nil: the standard logger's writer) at most one line per interval, and says how many it left out. zmq4
// logs a line for every connection whose handshake fails; a peer that
// connects in a loop would otherwise fill the log.
func Logger(w io.Writer, interval time.Duration) *log.Logger {
	return log.New(&limitedWriter{w: w, interval: interval}, "zmq4: ", 0)
}

type limitedWriter struct {
	w        io.Writer
	interval time.Duration

	mu      sync.Mutex
	last    time.Time
	dropped int
}

// Write writes p, one line from log.Logger, unless a line was written less
// than an interval ago.
func (l *limitedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	if !l.last.IsZero() && now.Sub(l.last) < l.interval {
		l.dropped++
		return len(p), nil
	}
	l.last = now
	w := l.w
	if w == nil {
		w = log.Writer()
	}
	if l.dropped > 0 {
		fmt.Fprintf(w, "zmq4: (%d lines left out since the last one)\n", l.dropped)
		l.dropped = 0
	}
	return w.Write(p)
}
