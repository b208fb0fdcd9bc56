// Package buildinfo says which build of kvstrata is running: the module
// version, the commit, its time and whether the work tree had changes, as
// the Go toolchain records them in every binary it builds from a checkout
// (runtime/debug.ReadBuildInfo: the main module's version and the
// vcs.revision, vcs.time and vcs.modified settings). The Go toolchain
// records no build time, so that builds are reproducible; the commit's time
// dates a build instead. Everything here is safe for concurrent use.
package buildinfo

import (
	"fmt"
	"runtime/debug"
	"strings"
	"time"
)

// Info is what a binary knows of its own build.
type Info struct {
	// Version is the main module's version (v1.2.0, or a pseudo-version
	// for a commit between releases); "dev" for a build from a work tree,
	// which the toolchain marks "(devel)".
	Version string `json:"version"`
	// Commit is the full hash of the commit built; "" when the build
	// recorded none (go test, go build -buildvcs=false, a tree without git).
	Commit string `json:"commit,omitempty"`
	// CommitTime is when that commit was made; zero when not recorded.
	CommitTime time.Time `json:"commit_time,omitzero"`
	// Modified is true when the work tree had changes not committed.
	Modified bool `json:"modified"`
	// GoVersion is the toolchain that built the binary.
	GoVersion string `json:"go"`
}

// Read returns the running binary's Info.
func Read() Info {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return Info{Version: "dev"}
	}
	return FromBuildInfo(bi)
}

// FromBuildInfo returns the Info that bi records.
func FromBuildInfo(bi *debug.BuildInfo) Info {
	i := Info{Version: bi.Main.Version, GoVersion: bi.GoVersion}
	if i.Version == "" || i.Version == "(devel)" {
		i.Version = "dev"
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			i.Commit = s.Value
		case "vcs.time":
			i.CommitTime, _ = time.Parse(time.RFC3339, s.Value) // zero if malformed
		case "vcs.modified":
			i.Modified = s.Value == "true"
		}
	}
	return i
}

// String is the Info on one line, as `version` commands print it after
// the program's name: "v1.2.0 (commit 0123456789ab, 2026-12-01T10:00:00Z,
// go1.26.8)", with ", modified" after the commit when the tree had changes.
func (i Info) String() string {
	var b strings.Builder
	b.WriteString(i.Version)
	var more []string
	if i.Commit != "" {
		c := "commit " + i.Commit[:min(12, len(i.Commit))]
		if i.Modified {
			c += ", modified"
		}
		more = append(more, c)
	}
	if !i.CommitTime.IsZero() {
		more = append(more, i.CommitTime.UTC().Format(time.RFC3339))
	}
	if i.GoVersion != "" {
		more = append(more, i.GoVersion)
	}
	if len(more) > 0 {
		fmt.Fprintf(&b, " (%s)", strings.Join(more, ", "))
	}
	return b.String()
}
