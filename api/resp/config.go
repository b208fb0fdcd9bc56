package resp

import (
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"strings"
	"time"
)

// ErrInvalidConfig marks a Config that fails validation.
var ErrInvalidConfig = errors.New("resp: invalid config")

// Config configures a Server; the zero value of a field means its default.
// A nil *Config means all defaults.
type Config struct {
	// MaxClients is the most connections served at once. A connection over
	// it is answered "-ERR max number of clients reached" and closed. The
	// default is 10000, Redis's maxclients.
	MaxClients int
	// MaxBulkLen is the longest bulk string (one argument: a key or a SET
	// value) a client may send, in bytes. A command with a longer one is
	// read to its end and dropped, and answered "-ERR argument of … is over
	// the … limit on one value"; the connection goes on with the next
	// command. Keep it at or above the store's largest value, so that an
	// oversized SET gets the store's own "value too large" reply. The
	// default is 512 MiB, Redis's proto-max-bulk-len; at most 1 GiB.
	MaxBulkLen int64
	// MaxBulkLenSetting, if set, is how an operator sets MaxBulkLen (a
	// setting's name, "limits.max-value-size"), named in the reply to a
	// longer argument.
	MaxBulkLenSetting string
	// MaxArgs is the most arguments one command may have, its name
	// included. The default is 1048576, Redis's limit.
	MaxArgs int
	// MaxCommandBytes bounds the bytes of all arguments of one command
	// (MSET of many values, say), and with it the memory one connection
	// holds. A longer command is read to its end, dropped and answered
	// with an error, as an argument over MaxBulkLen is. The default is 128
	// MiB or MaxBulkLen if that is more; it must be at least MaxBulkLen.
	MaxCommandBytes int64
	// ReadBufferSize is each connection's read buffer in bytes. It is also
	// the longest inline command (a plain text line, as typed over telnet).
	// The buffer has a sixteenth more (at most 4 KiB) for the header of a
	// command whose value is ReadBufferSize long, so that such a command
	// arrives in one read. Arguments longer than 32 KiB (or half the
	// buffer, if that is less) bypass it: they are read straight into a
	// buffer of their own. The default is 64 KiB; at least 4 KiB.
	ReadBufferSize int
	// WriteBufferSize is how many bytes of replies a connection gathers
	// before it writes them, unless its input runs dry first. Values of 16
	// KiB or more are not copied into it: they are written from the
	// store's memory. The default is 64 KiB; at least 4 KiB.
	WriteBufferSize int
	// IdleTimeout closes a connection that sends nothing for this long
	// between commands. The default, 0, never does (Redis's timeout 0):
	// long-lived idle connections are welcome while there is room. When the
	// server is at MaxClients, a new connection instead displaces the
	// connection that has waited longest between commands, if it has waited
	// more than CommandTimeout; it must not be negative.
	IdleTimeout time.Duration
	// CommandTimeout and MinReadRate bound how long a command may take to
	// arrive once its first byte has: CommandTimeout plus one second for
	// every MinReadRate bytes of it received so far (Apache's
	// mod_reqtimeout rule), however often bytes trickle in. A connection
	// that misses it is answered "-ERR ... too slow" and closed. When the
	// server is at MaxClients, a new connection also displaces the
	// connection whose command has been arriving for more than a second at
	// the slowest rate under MinReadRate. The defaults are 10 seconds and
	// 1 MiB/s; neither may be negative.
	CommandTimeout time.Duration
	MinReadRate    int64
	// MaxPendingBytes bounds the memory all connections together hold for
	// commands not yet received whole. Memory for a long argument is taken
	// as its bytes arrive, not as its length is announced; a connection
	// holds its first 64 KiB outside this bound. One that needs more while
	// the bound is reached stops reading until memory is handed back, for
	// at most CommandTimeout, then is answered "-ERR ... busy" and closed.
	// While a long argument grows, its old and new buffers are both held,
	// so one command may hold up to MaxCommandBytes plus MaxBulkLen. The
	// default is that sum, or 256 MiB if that is more; it must be at least
	// that sum.
	MaxPendingBytes int64
	// Version is reported by INFO as kvstrata_version. The default is the
	// main module's version from the build info, else "dev".
	Version string
	// OnCommand, if set, is called after each known command has run (its
	// reply is buffered, maybe not yet written) with the command's name
	// ("get", or "client|setname" style for subcommands as the table names
	// them), how it ended ("ok", or the first word of its error reply in
	// lower case: "err", "oom", "tryagain", …) and when it started: the
	// hook for latency and error metrics. It runs on the connection's
	// goroutine and must be quick.
	OnCommand func(name, status string, start time.Time)
	// Auth, if set, makes clients authenticate (AUTH, HELLO … AUTH)
	// before anything else, checks each command against the roles of the
	// identity they authenticated as, and hands that identity to the
	// Store in the context of its calls (auth.go). The default, nil, is a
	// server without authentication: Redis without requirepass.
	Auth Authenticator
	// Logger receives accept errors. The default is slog.Default().
	Logger *slog.Logger
}

// Defaults of Config.
const (
	DefaultMaxClients      = 10000
	DefaultMaxBulkLen      = 512 << 20
	DefaultMaxArgs         = 1 << 20
	DefaultMaxCommandBytes = 128 << 20
	DefaultReadBufferSize  = 64 << 10
	DefaultWriteBufferSize = 64 << 10
	DefaultCommandTimeout  = 10 * time.Second
	DefaultMinReadRate     = 1 << 20
	DefaultMaxPendingBytes = 256 << 20

	maxBulkLenLimit = 1 << 30
	minBufferSize   = 4 << 10
)

// EnsureDefaults replaces the zero value of every field with its default.
// It leaves invalid values for Validate to report.
func (c *Config) EnsureDefaults() {
	if c.MaxClients == 0 {
		c.MaxClients = DefaultMaxClients
	}
	if c.MaxBulkLen == 0 {
		c.MaxBulkLen = DefaultMaxBulkLen
	}
	if c.MaxArgs == 0 {
		c.MaxArgs = DefaultMaxArgs
	}
	if c.MaxCommandBytes == 0 {
		c.MaxCommandBytes = max(DefaultMaxCommandBytes, c.MaxBulkLen)
	}
	if c.MaxPendingBytes == 0 {
		c.MaxPendingBytes = max(DefaultMaxPendingBytes, c.MaxCommandBytes+c.MaxBulkLen)
	}
	if c.CommandTimeout == 0 {
		c.CommandTimeout = DefaultCommandTimeout
	}
	if c.MinReadRate == 0 {
		c.MinReadRate = DefaultMinReadRate
	}
	if c.ReadBufferSize == 0 {
		c.ReadBufferSize = DefaultReadBufferSize
	}
	if c.WriteBufferSize == 0 {
		c.WriteBufferSize = DefaultWriteBufferSize
	}
	if c.Version == "" {
		c.Version = buildVersion()
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// Validate reports every problem of c in one error wrapping
// ErrInvalidConfig. Call it after EnsureDefaults: zero values are reported
// as invalid.
func (c *Config) Validate() error {
	var probs []string
	bad := func(format string, args ...any) {
		probs = append(probs, fmt.Sprintf(format, args...))
	}
	if c.MaxClients <= 0 {
		bad("max clients is %d, must be > 0", c.MaxClients)
	}
	if c.MaxBulkLen <= 0 || c.MaxBulkLen > maxBulkLenLimit {
		bad("max bulk length is %d, must be in [1, %d]", c.MaxBulkLen, maxBulkLenLimit)
	}
	if c.MaxArgs <= 0 {
		bad("max args is %d, must be > 0", c.MaxArgs)
	}
	if c.MaxCommandBytes < c.MaxBulkLen || c.MaxCommandBytes <= 0 {
		bad("max command bytes is %d, must be at least max bulk length (%d)", c.MaxCommandBytes, c.MaxBulkLen)
	}
	if c.MaxPendingBytes < c.MaxCommandBytes+c.MaxBulkLen {
		bad("max pending bytes is %d, must be at least max command bytes plus max bulk length (%d)", c.MaxPendingBytes, c.MaxCommandBytes+c.MaxBulkLen)
	}
	if c.CommandTimeout < 0 {
		bad("command timeout is %v, must not be negative", c.CommandTimeout)
	}
	if c.MinReadRate < 0 {
		bad("min read rate is %d, must not be negative", c.MinReadRate)
	}
	if c.ReadBufferSize < minBufferSize {
		bad("read buffer size is %d, must be at least %d", c.ReadBufferSize, minBufferSize)
	}
	if c.WriteBufferSize < minBufferSize {
		bad("write buffer size is %d, must be at least %d", c.WriteBufferSize, minBufferSize)
	}
	if c.IdleTimeout < 0 {
		bad("idle timeout is %v, must not be negative", c.IdleTimeout)
	}
	if strings.ContainsAny(c.Version, "\r\n") {
		bad("version %q contains a line break", c.Version)
	}
	if c.Logger == nil {
		bad("logger is nil")
	}
	if len(probs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s", ErrInvalidConfig, strings.Join(probs, "; "))
}

// buildVersion is the main module's version, or "dev" when the binary was
// not built from a tagged module (go run, go test).
func buildVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "dev"
}
