// Command kvctl is the kvstrata operator CLI.
//
// This file wires the root command: the flags every subcommand shares, the
// subcommands, the lazy connection to a node, and how an error becomes a
// message and an exit status. Each subcommand lives in its own file (sim.go,
// stats.go, evict.go, …) as a newXxxCommand function taking the shared *app.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/kvstrata/kvstrata/api/client"
	"github.com/kvstrata/kvstrata/internal/buildinfo"
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

// app is what every subcommand shares: the persistent flags, where to read
// and write, and the connection to a node once one is made.
type app struct {
	output         outputFormat
	addr           string          // --addr: the node's gRPC address
	timeout        time.Duration   // --timeout: per call to a node
	token          string          // --token: the secret a node that authenticates wants
	tokenFile      string          // --token-file: a file holding it
	tlsOn          bool            // --tls: speak TLS to nodes (implied by the --tls-* flags)
	tlsFiles       client.TLSFiles // --tls-ca, --tls-cert, --tls-key, --tls-server-name
	stdin          io.Reader
	stdout, stderr io.Writer
	// interactive reports whether w is a terminal a person watches; progress
	// bars are drawn only then.
	interactive func(w io.Writer) bool
	// stdinTerminal reports whether stdin is a terminal a person types at;
	// broad evictions ask for confirmation there, and only there.
	stdinTerminal func() bool
	// getenv reads the environment (KVSTRATA_ADDR); nil means os.Getenv.
	getenv func(string) string

	clients []*client.Client // made by connect; closed when the command ends
}

// defaultAddr is the node address when neither --addr nor KVSTRATA_ADDR
// says one: the default of kvstrata serve --listen-grpc.
const defaultAddr = "127.0.0.1:7070"

// execute runs kvctl with args and returns its exit status. Errors are
// reported on stderr as one line, "kvctl: …", never with a stack trace.
func execute(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	a := &app{output: outputTable, stdin: os.Stdin, stdout: stdout, stderr: stderr, interactive: isTerminal,
		stdinTerminal: func() bool { return term.IsTerminal(int(os.Stdin.Fd())) }}
	return a.execute(ctx, args)
}

func (a *app) execute(ctx context.Context, args []string) int {
	root := a.newRootCommand()
	root.SetArgs(args)
	cmd, err := root.ExecuteContextC(ctx)
	for _, c := range a.clients {
		c.Close()
	}
	a.clients = nil
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

Commands that talk to a node connect to --addr (default $KVSTRATA_ADDR, else
` + defaultAddr + `), the node's gRPC address, when they run; --timeout bounds
each call to it. A node that authenticates its clients wants a token: --token,
else the file --token-file names, else $KVSTRATA_TOKEN.

Exit status: 0 on success; 1 when a command could not complete (a file is
missing or malformed, a node does not answer, a key is missing); 2 when the
command line is wrong (an unknown command, flag, policy or value), in which
case nothing ran.`,
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
		Version:           buildinfo.Read().String(),
	}
	root.SetVersionTemplate("kvctl {{.Version}}\n")
	root.SetOut(a.stdout)
	root.SetErr(a.stderr)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &usageError{err} })
	pf := root.PersistentFlags()
	pf.VarP(&a.output, "output", "o", "output format: table or json")
	addr := a.env("KVSTRATA_ADDR")
	if addr == "" {
		addr = defaultAddr
	}
	pf.StringVar(&a.addr, "addr", addr, "gRPC address of the node, host:port [KVSTRATA_ADDR]")
	pf.DurationVar(&a.timeout, "timeout", 10*time.Second, "how long each call to the node may take")
	pf.StringVar(&a.token, "token", "", "token to present to a node that authenticates its clients (visible to ps: prefer --token-file or KVSTRATA_TOKEN) [KVSTRATA_TOKEN]")
	pf.StringVar(&a.tokenFile, "token-file", "", "file holding the token")
	pf.BoolVar(&a.tlsOn, "tls", a.env("KVSTRATA_TLS") == "true" || a.env("KVSTRATA_TLS") == "1",
		"speak TLS to the node, verified with the system's roots unless --tls-ca says otherwise [KVSTRATA_TLS]")
	pf.StringVar(&a.tlsFiles.CAFile, "tls-ca", a.env("KVSTRATA_TLS_CA"), "PEM CA certificates the node's certificate must chain to; implies --tls [KVSTRATA_TLS_CA]")
	pf.StringVar(&a.tlsFiles.CertFile, "tls-cert", a.env("KVSTRATA_TLS_CERT"), "PEM client certificate, for nodes that ask for one; implies --tls [KVSTRATA_TLS_CERT]")
	pf.StringVar(&a.tlsFiles.KeyFile, "tls-key", a.env("KVSTRATA_TLS_KEY"), "PEM private key of --tls-cert [KVSTRATA_TLS_KEY]")
	pf.StringVar(&a.tlsFiles.ServerName, "tls-server-name", a.env("KVSTRATA_TLS_SERVER_NAME"),
		"name the node's certificate must hold, where it is not the host of --addr; implies --tls [KVSTRATA_TLS_SERVER_NAME]")

	root.AddCommand(a.newStatsCommand(), a.newEvictCommand(), a.newLookupCommand(), a.newWarmCommand(), a.newClusterCommand(),
		a.newPutCommand(), a.newGetCommand(), a.newBenchCommand(), a.newSimCommand(), a.newReplayCommand())
	root.AddCommand(a.newTraceCommand())
	root.AddCommand(a.newPredictCommand())
	root.AddCommand(a.newPlannerCommand())
	root.AddCommand(a.newVersionCommand(), a.newCompletionCommand())
	return root
}

func (a *app) env(key string) string {
	if a.getenv == nil {
		return os.Getenv(key)
	}
	return a.getenv(key)
}

// connect dials the node at --addr with opts (their Timeout is --timeout).
// Only commands that talk to a node call it, so the others run without one.
func (a *app) connect(ctx context.Context, opts client.Options) (*client.Client, error) {
	return a.connectTo(ctx, a.addr, opts)
}

// connectTo dials the node whose gRPC address is addr. A node that does not
// answer gives one line that names the address.
func (a *app) connectTo(ctx context.Context, addr string, opts client.Options) (*client.Client, error) {
	if a.timeout <= 0 {
		return nil, usageErrorf("--timeout is %v, must be positive", a.timeout)
	}
	opts.Timeout = a.timeout
	if opts.Token == "" && opts.TokenFile == "" {
		opts.Token, opts.TokenFile = a.token, a.tokenFile
		if a.token != "" && a.tokenFile != "" {
			return nil, usageErrorf("--token and --token-file both given; give one")
		}
		if opts.Token == "" && opts.TokenFile == "" {
			opts.Token = strings.TrimSpace(a.env(client.TokenEnv))
		}
	}
	if a.tlsOn || a.tlsFiles != (client.TLSFiles{}) {
		conf, err := client.TLSConfig(a.tlsFiles)
		if err != nil {
			return nil, usageErrorf("%v", err)
		}
		opts.TLS = conf
	}
	dctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	c, err := client.Dial(dctx, addr, opts)
	if err != nil {
		return nil, dialError(addr, a.timeout, err)
	}
	a.clients = append(a.clients, c)
	return c, nil
}

// dialError turns a failed dial into one line a person can act on.
func dialError(addr string, timeout time.Duration, err error) error {
	const hint = "is kvstrata serve running there? set --addr or KVSTRATA_ADDR"
	var ce *client.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("the node at %s did not answer within %v (%s)", addr, timeout, hint)
	case errors.Is(err, client.ErrUnauthenticated):
		return fmt.Errorf("the node at %s authenticates its clients: give a valid token with --token, --token-file or KVSTRATA_TOKEN", addr)
	case errors.Is(err, client.ErrUnavailable) && errors.As(err, &ce):
		// gRPC says: connection error: desc = "transport: Error while
		// dialing: dial tcp 127.0.0.1:7070: connect: connection refused";
		// the last part is the news.
		why := strings.Trim(ce.Msg, `"`)
		if i := strings.LastIndex(why, ": "); i >= 0 {
			why = why[i+2:]
		}
		return fmt.Errorf("the node at %s does not answer: %s (%s)", addr, why, hint)
	}
	return fmt.Errorf("the node at %s: %w", addr, err)
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
