package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/kvstrata/kvstrata/internal/buildinfo"
	"github.com/kvstrata/kvstrata/internal/completion"
)

// newVersionCommand is `kvctl version`: this build's version, commit and
// commit time, as the Go toolchain recorded them (kvctl --version prints
// the same line). It asks no node.
func (a *app) newVersionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print kvctl's version, commit and commit time",
		Long: `version prints the version of this kvctl build, the commit it was built
from (", modified" when the work tree had changes), that commit's time in
UTC and the Go version, as the Go toolchain recorded them in the binary. A
build from a checkout is version "dev". With -o json: version, commit,
commit_time, modified and go. It asks no node; kvctl stats shows a node's
version.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usageErrorf("version takes no arguments, got %q", args)
			}
			return nil
		},
		RunE: func(*cobra.Command, []string) error {
			info := buildinfo.Read()
			if a.output == outputJSON {
				return writeJSON(a.stdout, info)
			}
			_, err := fmt.Fprintln(a.stdout, "kvctl", info)
			return err
		},
	}
}

// newCompletionCommand is `kvctl completion bash|zsh|fish`.
func (a *app) newCompletionCommand() *cobra.Command {
	return completion.Command("kvctl", a.stdout, func(err error) error { return &usageError{err} })
}
