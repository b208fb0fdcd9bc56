package raftstore

import (
	"context"
	"fmt"
	"log/slog"
	"slices"

	"github.com/hashicorp/go-hclog"
)

// raftLogger carries hashicorp/raft's log into slog. Raft's warnings and
// errors stay warnings and errors, except the first election of a node
// that has never known a leader: every new or restarted cluster starts
// with one, so it is news, not a fault, and logs at info. Raft's info and
// debug lines (every state change) are dropped.
//
// Raft's own key-value pairs go in a group, "raft", so that none of its
// keys can repeat a key of the line: raft names some "time" (as slog names
// the line's time) and may name others as the caller's With did
// ("component"), and a JSON line with a key twice is one that many log
// pipelines read wrong or refuse.
type raftLogger struct {
	hclog.Logger // a null logger: whatever raftLogger does not override
	l            *slog.Logger
	args         []any // from With
}

func newRaftLogger(l *slog.Logger) hclog.Logger {
	return raftLogger{Logger: hclog.NewNullLogger(), l: l} // its lines start "raft: "
}

// firstElection is raft's message when a follower's heartbeat timer runs
// out; its last-leader-id is empty when the node has known no leader yet.
const firstElection = "heartbeat timeout reached, starting election"

// level is the slog level of one of raft's lines, or false to drop it.
func raftLevel(level hclog.Level, msg string, args []any) (slog.Level, bool) {
	switch {
	case level >= hclog.Error:
		return slog.LevelError, true
	case level < hclog.Warn:
		return 0, false
	case msg == firstElection && argValue(args, "last-leader-id") == "":
		return slog.LevelInfo, true
	}
	return slog.LevelWarn, true
}

// argValue returns the value of key in hclog's alternating key-value args.
func argValue(args []any, key string) string {
	for i := 0; i+1 < len(args); i += 2 {
		if fmt.Sprint(args[i]) == key {
			return fmt.Sprint(args[i+1])
		}
	}
	return ""
}

func (r raftLogger) Log(level hclog.Level, msg string, args ...any) {
	all := append(slices.Clip(r.args), args...)
	if lv, ok := raftLevel(level, msg, all); ok {
		if len(all) == 0 {
			r.l.Log(context.Background(), lv, "raft: "+msg)
			return
		}
		r.l.Log(context.Background(), lv, "raft: "+msg, slog.Group("raft", all...))
	}
}

func (r raftLogger) Warn(msg string, args ...any)  { r.Log(hclog.Warn, msg, args...) }
func (r raftLogger) Error(msg string, args ...any) { r.Log(hclog.Error, msg, args...) }
func (r raftLogger) IsWarn() bool                  { return true }
func (r raftLogger) IsError() bool                 { return true }
func (r raftLogger) GetLevel() hclog.Level         { return hclog.Warn }
func (r raftLogger) Named(string) hclog.Logger     { return r }
func (r raftLogger) ResetNamed(string) hclog.Logger {
	return r
}

func (r raftLogger) With(args ...any) hclog.Logger {
	r.args = append(slices.Clip(r.args), args...)
	return r
}
