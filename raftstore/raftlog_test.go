package raftstore

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

// Raft's warnings reach slog as warnings, except the first election of a
// node that has known no leader, which is how every cluster starts.
func TestRaftLoggerLevels(t *testing.T) {
	var buf bytes.Buffer
	l := newRaftLogger(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})))
	l.Info("entering follower state")
	l.Warn(firstElection, "last-leader-addr", "", "last-leader-id", "")
	l.Warn(firstElection, "last-leader-addr", "127.0.0.1:7072", "last-leader-id", "2")
	l.With("peer", "3").Error("failed to contact")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	want := []string{
		`level=INFO msg="raft: heartbeat timeout reached, starting election" last-leader-addr="" last-leader-id=""`,
		`level=WARN msg="raft: heartbeat timeout reached, starting election" last-leader-addr=127.0.0.1:7072 last-leader-id=2`,
		`level=ERROR msg="raft: failed to contact" peer=3`,
	}
	if len(lines) != len(want) {
		t.Fatalf("got %d lines, want %d:\n%s", len(lines), len(want), buf.String())
	}
	for i, w := range want {
		if !strings.HasSuffix(lines[i], w) {
			t.Errorf("line %d:\n got %s\nwant …%s", i, lines[i], w)
		}
	}
}
