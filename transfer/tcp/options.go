package tcp

import (
	"crypto/tls"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/kvstrata/kvstrata/transfer"
	"github.com/kvstrata/kvstrata/transfer/internal/frame"
)

// ErrInvalidOptions marks Options that Validate rejects. A Transport made
// from invalid Options returns it, with every problem, from Listen and Dial.
var ErrInvalidOptions = errors.New("tcp: invalid options")

// Defaults and limits of Options.
const (
	DefaultMaxBlockSize     = 4 << 20
	DefaultMaxBlocks        = 1024
	DefaultMaxConns         = 1024
	DefaultWriteBatch       = 256 << 10
	DefaultIdleTimeout      = 2 * time.Minute
	DefaultHandshakeTimeout = 10 * time.Second
	DefaultKeepAlive        = 15 * time.Second
	DefaultRequestTimeout   = 10 * time.Second
	DefaultMinRate          = 1 << 20
	DefaultMaxPendingBytes  = 1 << 30

	// MaxBlockSizeLimit is the largest MaxBlockSize allowed.
	MaxBlockSizeLimit = 1 << 30
	// MaxBlocksLimit is the largest MaxBlocks allowed.
	MaxBlocksLimit = 1 << 20
)

// Options configures a Transport. The zero value of every field means its
// default, so Options{} is a working configuration.
type Options struct {
	// MaxBlockSize is the largest block in bytes that a server accepts in a
	// Put and a client accepts in a Get response. At most MaxBlockSizeLimit.
	// The default is 4 MiB, the largest KV block engines use.
	MaxBlockSize int
	// MaxBlocks is the most blocks one request may carry, Get or Put. A
	// server refuses a request over it as a whole. At most MaxBlocksLimit.
	// The default is 1024: a 4 GiB put of the largest blocks.
	MaxBlocks int
	// MaxConns is the most connections one Listener serves at once; a
	// connection over it gets a hello that refuses it, and is closed. The
	// default is 1024.
	MaxConns int
	// ReadBufferSize and WriteBufferSize set the kernel's receive and send
	// buffers (SO_RCVBUF, SO_SNDBUF) of every connection, in bytes. The
	// default, 0, leaves them to the kernel's autotuning, which grows them
	// up to net.ipv4.tcp_rmem and tcp_wmem's maxima as a connection needs;
	// on Linux a fixed size turns autotuning off and is capped at
	// net.core.rmem_max and wmem_max, so set one only to bound memory.
	ReadBufferSize  int
	WriteBufferSize int
	// WriteBatch is the most bytes of small blocks a server gathers into one
	// writev: it holds the blocks it has opened until they reach it (or 32
	// blocks), then writes and releases them together. A block of at least
	// WriteBatch bytes goes out on its own. The default is 256 KiB.
	WriteBatch int
	// IdleTimeout bounds how long a server waits on a peer for its next
	// request and to take each write of a response. A peer silent for
	// longer is disconnected. The default is 2 minutes.
	IdleTimeout time.Duration
	// RequestTimeout and MinRate bound how long a request may take to
	// arrive once its header has: RequestTimeout plus one second for every
	// MinRate bytes of it received so far, however often bytes trickle in;
	// time the server spends waiting for room is not counted. A peer that
	// misses it is disconnected. The defaults are 10 seconds and 1 MiB/s.
	RequestTimeout time.Duration
	MinRate        int64
	// MaxPendingBytes bounds the room all connections together hold
	// reserved (Handler.Reserve) for blocks whose bytes are still arriving;
	// a block's room is reserved only once its first 64 KiB have arrived.
	// A put that would pass it first closes the connection whose put has
	// been arriving slowest, under MinRate, for over a second, else waits
	// for room until its RequestTimeout, after which its block is refused
	// as full. Set it to a share of the memory the Handler reserves from,
	// so that stalled peers cannot take all of it. The default is 1 GiB.
	MaxPendingBytes int64
	// HandshakeTimeout bounds the exchange of hellos that opens a
	// connection, on both sides (Dial also honours its ctx). The default is
	// 10 seconds.
	HandshakeTimeout time.Duration
	// KeepAlive is the TCP keep-alive period of every connection, which
	// notices a peer whose machine went away while a connection is idle or
	// waiting; negative turns keep-alives off. The default is 15 seconds.
	KeepAlive time.Duration
	// Token is the credential a client's hello carries, at most 512
	// bytes: what a server that authenticates its clients (its Handler is
	// a transfer.Authenticator) checks once per connection. Default
	// empty: none, and the hello is that of a client before tokens.
	Token string
	// ServerTLS, when set, makes a Listener speak TLS only, with this
	// config (a handshake bounded by HandshakeTimeout precedes the
	// hellos); nil: plain TCP.
	ServerTLS *tls.Config
	// ClientTLS, when set, makes Dial speak TLS, with the config it
	// returns for the address dialled; nil: plain TCP.
	ClientTLS func(addr string) *tls.Config
}

// EnsureDefaults replaces the zero value of every field with its default. It
// leaves invalid values for Validate to report.
func (o *Options) EnsureDefaults() {
	if o.MaxBlockSize == 0 {
		o.MaxBlockSize = DefaultMaxBlockSize
	}
	if o.MaxBlocks == 0 {
		o.MaxBlocks = DefaultMaxBlocks
	}
	if o.MaxConns == 0 {
		o.MaxConns = DefaultMaxConns
	}
	if o.WriteBatch == 0 {
		o.WriteBatch = DefaultWriteBatch
	}
	if o.IdleTimeout == 0 {
		o.IdleTimeout = DefaultIdleTimeout
	}
	if o.HandshakeTimeout == 0 {
		o.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if o.KeepAlive == 0 {
		o.KeepAlive = DefaultKeepAlive
	}
	if o.RequestTimeout == 0 {
		o.RequestTimeout = DefaultRequestTimeout
	}
	if o.MinRate == 0 {
		o.MinRate = DefaultMinRate
	}
	if o.MaxPendingBytes == 0 {
		o.MaxPendingBytes = max(DefaultMaxPendingBytes, int64(o.MaxBlockSize))
	}
}

// Validate reports every problem of o in one error that wraps
// ErrInvalidOptions. Call it after EnsureDefaults: zero values are reported
// as invalid.
func (o *Options) Validate() error {
	var problems []string
	bad := func(format string, args ...any) {
		problems = append(problems, fmt.Sprintf(format, args...))
	}
	if o.MaxBlockSize <= 0 || o.MaxBlockSize > MaxBlockSizeLimit {
		bad("MaxBlockSize is %d, want 1 to %d bytes", o.MaxBlockSize, MaxBlockSizeLimit)
	}
	if o.MaxBlocks <= 0 || o.MaxBlocks > MaxBlocksLimit {
		bad("MaxBlocks is %d, want 1 to %d", o.MaxBlocks, MaxBlocksLimit)
	}
	if o.MaxConns <= 0 {
		bad("MaxConns is %d, want > 0", o.MaxConns)
	}
	if o.ReadBufferSize < 0 {
		bad("ReadBufferSize is %d, want >= 0 (0 leaves it to the kernel)", o.ReadBufferSize)
	}
	if o.WriteBufferSize < 0 {
		bad("WriteBufferSize is %d, want >= 0 (0 leaves it to the kernel)", o.WriteBufferSize)
	}
	if o.WriteBatch <= 0 {
		bad("WriteBatch is %d, want > 0", o.WriteBatch)
	}
	if o.IdleTimeout <= 0 {
		bad("IdleTimeout is %v, want > 0", o.IdleTimeout)
	}
	if o.HandshakeTimeout <= 0 {
		bad("HandshakeTimeout is %v, want > 0", o.HandshakeTimeout)
	}
	if o.KeepAlive == 0 {
		bad("KeepAlive is 0, want > 0 (or negative for none)")
	}
	if o.RequestTimeout <= 0 {
		bad("RequestTimeout is %v, want > 0", o.RequestTimeout)
	}
	if o.MinRate <= 0 {
		bad("MinRate is %d, want > 0 bytes/s", o.MinRate)
	}
	if len(o.Token) > frame.MaxMsg {
		bad("Token is %d bytes, want at most %d", len(o.Token), frame.MaxMsg)
	}
	if o.MaxPendingBytes < int64(o.MaxBlockSize) {
		bad("MaxPendingBytes is %d, want at least MaxBlockSize (%d)", o.MaxPendingBytes, o.MaxBlockSize)
	}
	if len(problems) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s", ErrInvalidOptions, strings.Join(problems, "; "))
}

// Transport is the TCP backend of transfer.Transport.
type Transport struct {
	opts Options
	err  error // from Validate; returned by Listen and Dial
}

var _ transfer.Transport = (*Transport)(nil)

// New returns a TCP transport configured by opts (zero fields take their
// defaults). Invalid options make every Listen and Dial fail with an error
// that wraps ErrInvalidOptions and lists every problem.
func New(opts Options) transfer.Transport {
	opts.EnsureDefaults()
	return &Transport{opts: opts, err: opts.Validate()}
}

// Name returns "tcp".
func (t *Transport) Name() string { return "tcp" }
