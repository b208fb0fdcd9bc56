package raftstore

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"
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
		`level=INFO msg="raft: heartbeat timeout reached, starting election" raft.last-leader-addr="" raft.last-leader-id=""`,
		`level=WARN msg="raft: heartbeat timeout reached, starting election" raft.last-leader-addr=127.0.0.1:7072 raft.last-leader-id=2`,
		`level=ERROR msg="raft: failed to contact" raft.peer=3`,
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

// Raft's key-value pairs never repeat a key of the line: raft's "time"
// (how long a peer has not answered) is not the line's time, and a
// "component" raft might add is not the caller's.
func TestRaftLoggerKeysDoNotRepeatTheLines(t *testing.T) {
	var buf bytes.Buffer
	l := newRaftLogger(slog.New(slog.NewJSONHandler(&buf, nil)).With("component", "cluster"))
	l.With("component", "raft").Warn("failed to contact", "server-id", "3", "time", 503*time.Millisecond)
	var line struct {
		Time      string `json:"time"`
		Component string `json:"component"`
		Raft      struct {
			Component string        `json:"component"`
			ServerID  string        `json:"server-id"`
			Time      time.Duration `json:"time"`
		} `json:"raft"`
	}
	if err := json.Unmarshal(buf.Bytes(), &line); err != nil {
		t.Fatal(err)
	}
	if keys := jsonKeys(t, buf.Bytes()); !slices.Equal(keys, []string{"time", "level", "msg", "component", "raft"}) {
		t.Errorf("keys %v in %s", keys, buf.Bytes())
	}
	if line.Component != "cluster" || line.Raft.Component != "raft" || line.Raft.ServerID != "3" || line.Raft.Time != 503*time.Millisecond {
		t.Errorf("line %s decodes to %+v", buf.Bytes(), line)
	}
	if _, err := time.Parse(time.RFC3339Nano, line.Time); err != nil {
		t.Errorf("the line's time %q: %v", line.Time, err)
	}
}

// jsonKeys returns the keys of the JSON object doc, in order, as written:
// a key written twice is listed twice (encoding/json keeps only the last).
func jsonKeys(t *testing.T, doc []byte) []string {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(doc))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		t.Fatalf("%s is not an object: %v", doc, err)
	}
	var keys []string
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, k.(string))
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			t.Fatal(err)
		}
	}
	return keys
}
