package buildinfo

import (
	"runtime/debug"
	"testing"
	"time"
)

func TestFromBuildInfo(t *testing.T) {
	for _, c := range []struct {
		name string
		bi   debug.BuildInfo
		want Info
		line string
	}{{
		name: "a release",
		bi: debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v1.2.0"}, Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: "0123456789abcdef0123456789abcdef01234567"},
			{Key: "vcs.time", Value: "2026-12-01T10:00:00Z"}, {Key: "vcs.modified", Value: "false"}}},
		want: Info{Version: "v1.2.0", Commit: "0123456789abcdef0123456789abcdef01234567",
			CommitTime: time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC), GoVersion: "go1.26.8"},
		line: "v1.2.0 (commit 0123456789ab, 2026-12-01T10:00:00Z, go1.26.8)",
	}, {
		name: "a work tree with changes",
		bi: debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: "0123456789abcdef0123456789abcdef01234567"},
			{Key: "vcs.time", Value: "2026-12-01T10:00:00Z"}, {Key: "vcs.modified", Value: "true"}}},
		want: Info{Version: "dev", Commit: "0123456789abcdef0123456789abcdef01234567",
			CommitTime: time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC), Modified: true, GoVersion: "go1.26.8"},
		line: "dev (commit 0123456789ab, modified, 2026-12-01T10:00:00Z, go1.26.8)",
	}, {
		name: "no version control recorded",
		bi:   debug.BuildInfo{GoVersion: "go1.26.8"},
		want: Info{Version: "dev", GoVersion: "go1.26.8"},
		line: "dev (go1.26.8)",
	}} {
		got := FromBuildInfo(&c.bi)
		if got != c.want {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
		if s := got.String(); s != c.line {
			t.Errorf("%s: String() = %q, want %q", c.name, s, c.line)
		}
	}
}
