// Command kvctl is the kvstrata operator CLI.
//
// This file wires the root command: the flags every subcommand shares, the
// subcommands, and how an error becomes a message and an exit status.
// Each subcommand lives in its own file (sim.go, …) as a newXxxCommand
// function taking the shared *app.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"

	"github.com/spf13/cobra"
	"golang.org/x/term"
)

// Exit statuses.
const (
	exitOK      = 0
	exitFailure = 1 // the command line was fine, running it failed
	exitUsage   = 2 // the command line was wrong: nothing was run
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	code := execute(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// app is what every subcommand shares: the persistent flags and where to
// write.
type app struct {
	output         outputFormat
	stdout, stderr io.Writer
	// interactive reports whether w is a terminal a person watches; progress
	// bars are drawn only then.
	interactive func(w io.Writer) bool
}

// execute runs kvctl with args and returns its exit status. Errors are
// reported on stderr as one line, "kvctl: …", never with a stack trace.
func execute(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	a := &app{output: outputTable, stdout: stdout, stderr: stderr, interactive: isTerminal}
	return a.execute(ctx, args)
}

func (a *app) execute(ctx context.Context, args []string) int {
	root := a.newRootCommand()
	root.SetArgs(args)
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return exitOK
	}
	fmt.Fprintf(a.stderr, "kvctl: %v\n", err)
	if errors.As(err, new(*usageError)) {
		fmt.Fprintf(a.stderr, "Run '%s --help' for usage.\n", cmd.CommandPath())
		return exitUsage
	}
	return exitFailure
}

func (a *app) newRootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:   "kvctl",
		Short: "Operate and measure a kvstrata KV-cache cluster",
		Long: `kvctl operates a kvstrata KV-cache cluster and measures its policies.

Exit status: 0 on success; 1 when a command could not complete (a file is
missing or malformed, a node does not answer); 2 when the command line is
wrong (an unknown command, flag, policy or value), in which case nothing ran.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usageErrorf("unknown command %q for %q", args[0], cmd.CommandPath())
			}
			return nil
		},
		RunE:              func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
		SilenceErrors:     true, // execute reports them
		SilenceUsage:      true,
		CompletionOptions: cobra.CompletionOptions{DisableDefaultCmd: true},
	}
	root.SetOut(a.stdout)
	root.SetErr(a.stderr)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &usageError{err} })
	root.PersistentFlags().VarP(&a.output, "output", "o", "output format: table or json")

	root.AddCommand(a.newSimCommand())
	return root
}

// usageError marks a wrong command line; it makes exit status 2.
type usageError struct{ err error }

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

func usageErrorf(format string, args ...any) error {
	return &usageError{fmt.Errorf(format, args...)}
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}
