// Command kvstrata is the kvstrata daemon. `kvstrata serve` runs a cache
// node: DRAM and SSD tiers behind a gRPC control plane, a data plane for
// block bytes, a Redis-protocol endpoint, and Prometheus metrics.
// `kvstrata worker` runs an inference worker that uses a cache node and
// looks like vLLM from outside; `kvstrata up` runs a cache node, N
// workers and the frontend in one process, a whole single-machine
// deployment.
//
// main only wires: configuration is package config, the node is put
// together by api/daemon from the packages api/... and tiers/..., a worker
// by engine/worker, and internal/lifecycle runs them as parts of one
// process; serve.go, worker.go and up.go hand the one to the other.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/kvstrata/kvstrata/config"
	"github.com/kvstrata/kvstrata/internal/buildinfo"
)

// Exit statuses.
const (
	exitOK      = 0
	exitFailure = 1 // a node or worker failed to start or to run
	exitUsage   = 2 // the command line or the configuration is wrong
)

// reloadSignals delivers SIGHUP to the running parts (lifecycle's
// Config.Reload); nil when not run from main.
var reloadSignals <-chan os.Signal

func main() {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	reloadSignals = hup
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := execute(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// execute runs the command line args and returns the exit status.
func execute(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	root := &cobra.Command{
		Use:           "kvstrata",
		Short:         "A distributed KV-cache tiering service for LLM inference",
		SilenceErrors: true,
		SilenceUsage:  true,
		Long: `kvstrata keeps the attention KV blocks of LLM prompts in a hierarchy of
tiers (DRAM, local SSD) and hands them back to inference engines faster than
they can be recomputed.

serve runs a cache node, worker an inference worker that uses one, up both
in one process.

Exit status: 0 on success, 1 when a node or worker fails, 2 for a bad
command line or configuration (nothing was started).`,
		CompletionOptions: cobra.CompletionOptions{DisableDefaultCmd: true},
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	root.AddCommand(newServeCommand(stdout, stderr), newWorkerCommand(stderr), newUpCommand(stderr), newFrontendCommand(stderr), newProfileCommand(stdout, stderr), newPlannerCommand(stderr), newVersionCommand(stdout))
	root.AddCommand(newConfigureCommand(stdout))
	root.AddCommand(newHashSecretCommand(os.Stdin, stdout, stderr))
	root.AddCommand(newCompletionCommand(stdout))
	root.Version = buildinfo.Read().String()
	root.SetVersionTemplate("kvstrata {{.Version}}\n")
	root.SetArgs(args)
	if err := root.ExecuteContext(ctx); err != nil {
		fmt.Fprintf(stderr, "kvstrata: %v\n", err)
		var ue usageError
		var ce *config.Error
		if errors.As(err, &ue) || errors.As(err, &ce) {
			return exitUsage
		}
		return exitFailure
	}
	return exitOK
}

// usageError marks a wrong command line.
type usageError struct{ error }

func (e usageError) Unwrap() error { return e.error }
