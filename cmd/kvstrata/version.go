package main

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/kvstrata/kvstrata/internal/buildinfo"
	"github.com/kvstrata/kvstrata/internal/completion"
)

// version is the version a node reports (NodeInfo, the build_info metric,
// its first log line): the main module's version from the build info, "dev"
// for a build from a work tree.
func version() string { return buildinfo.Read().Version }

// newVersionCommand is `kvstrata version`; kvstrata --version prints the
// same line.
func newVersionCommand(stdout io.Writer) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version, commit and commit time",
		Long: `version prints the version of this kvstrata build, the commit it was built
from (", modified" when the work tree had changes), that commit's time in
UTC and the Go version, as the Go toolchain recorded them in the binary
(go version -m shows the same). A build from a checkout is version "dev";
make build records the commit.`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usageError{fmt.Errorf("version takes no arguments, got %q", args)}
			}
			return nil
		},
		Run: func(*cobra.Command, []string) { fmt.Fprintln(stdout, "kvstrata", buildinfo.Read()) },
	}
}

// newCompletionCommand is `kvstrata completion bash|zsh|fish`.
func newCompletionCommand(stdout io.Writer) *cobra.Command {
	return completion.Command("kvstrata", stdout, func(err error) error { return usageError{err} })
}
