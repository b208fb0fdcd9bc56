//go:build ucx

package ucx

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/kvstrata/kvstrata/transfer"
)

// ErrInvalidOptions marks Options that Validate rejects. A Transport made
// from invalid Options returns it, with every problem, from Listen and Dial.
var ErrInvalidOptions = errors.New("ucx: invalid options")

// Defaults and limits of Options.
const (
	DefaultMaxBlockSize     = 4 << 20
	DefaultMaxBlocks        = 1024
	DefaultMaxConns         = 1024
	DefaultChunkSize        = 256 << 10
	DefaultSendWindow       = 64 << 20
	DefaultBusyPoll         = 50 * time.Microsecond
	DefaultIdleTimeout      = 2 * time.Minute
	DefaultHandshakeTimeout = 10 * time.Second
	DefaultKeepAlive        = 15 * time.Second

	// MaxBlockSizeLimit is the largest MaxBlockSize allowed.
	MaxBlockSizeLimit = 1 << 30
	// MaxBlocksLimit is the largest MaxBlocks allowed: the most a tag's
	// block index holds.
	MaxBlocksLimit = 1 << 20
	// MinChunkSize is the smallest ChunkSize allowed.
	MinChunkSize = 4 << 10
	// MaxBusyPoll is the longest BusyPoll allowed.
	MaxBusyPoll = time.Second
)

// Options configures a Transport. The zero value of every field means its
// default, so Options{} is a working configuration.
type Options struct {
	// TLS lists the UCX transports to use, as UCX_TLS takes them:
	// "posix,cma,self" or "sm,self" (shared memory on one host), "tcp",
	// "rc,sm,self" (RDMA and shared memory), "^tcp" (all but tcp). The
	// default, "", leaves UCX its own choice, which honours the UCX_TLS
	// environment variable and is otherwise every transport the machine
	// has. It is set with ucp_config_modify, not through the environment.
	TLS string
	// NetDevices lists the network devices UCX may use, as
	// UCX_NET_DEVICES takes them: "eth0", "mlx5_0:1", "lo". The default,
	// "", leaves UCX its own choice (UCX_NET_DEVICES, else all).
	NetDevices string
	// Settings are further UCX settings, by name without the UCX_ prefix
	// ("RNDV_THRESH": "16k", "KEEPALIVE_INTERVAL": "5s"); `ucx_info -c`
	// lists them. They are applied last and override the transport's own
	// (MM_ERROR_HANDLING and RCACHE_ENABLE, see doc.go); use TLS and
	// NetDevices for those two.
	Settings map[string]string
	// MaxBlockSize is the largest block in bytes that a server accepts in a
	// Put and a client accepts in a Get response. At most
	// MaxBlockSizeLimit. The default is 4 MiB, the largest KV block engines
	// use.
	MaxBlockSize int
	// MaxBlocks is the most blocks one request may carry, Get or Put. A
	// server refuses a request over it as a whole. At most MaxBlocksLimit.
	// The default is 1024.
	MaxBlocks int
	// MaxConns is the most connections one Listener serves at once; a
	// connection over it is refused with a hello that says why. The default
	// is 1024.
	MaxConns int
	// ChunkSize cuts a block into tagged messages of this many bytes (at
	// most 256 per block), so that the receiver checksums one chunk while
	// the next is in flight. A server's value holds for both directions of
	// its connections. At least MinChunkSize; the default is 256 KiB.
	ChunkSize int
	// SendWindow is the most block bytes a server has in flight (opened,
	// pinned, offered to UCX) per connection while it answers a Get; it
	// always sends at least one block. The default is 64 MiB.
	SendWindow int
	// BusyPoll is how long a worker keeps polling UCX after its last
	// activity (a completion, a request handed to it) before it arms the
	// worker's event file descriptor and sleeps on it. Longer trades CPU
	// for latency; negative never polls. An idle worker sleeps. At most
	// MaxBusyPoll; the default is 50µs.
	BusyPoll time.Duration
	// IdleTimeout bounds how long a server waits on a peer: for its next
	// request and for each step of a request (payloads to arrive, blocks
	// to be fetched). A peer silent for longer is disconnected. The
	// default is 2 minutes.
	IdleTimeout time.Duration
	// HandshakeTimeout bounds the exchange of hellos (and worker
	// addresses) that opens a connection, on both sides (Dial also honours
	// its ctx). The default is 10 seconds.
	HandshakeTimeout time.Duration
	// KeepAlive is the TCP keep-alive period of every connection's
	// handshake socket, which stays open as the connection's liveness
	// signal; negative turns keep-alives off. The default is 15 seconds.
	KeepAlive time.Duration
}

// EnsureDefaults replaces the zero value of every field with its default. It
// leaves invalid values for Validate to report.
func (o *Options) EnsureDefaults() {
	set := func(p *int, v int) {
		if *p == 0 {
			*p = v
		}
	}
	setD := func(p *time.Duration, v time.Duration) {
		if *p == 0 {
			*p = v
		}
	}
	set(&o.MaxBlockSize, DefaultMaxBlockSize)
	set(&o.MaxBlocks, DefaultMaxBlocks)
	set(&o.MaxConns, DefaultMaxConns)
	set(&o.ChunkSize, DefaultChunkSize)
	set(&o.SendWindow, DefaultSendWindow)
	setD(&o.BusyPoll, DefaultBusyPoll)
	setD(&o.IdleTimeout, DefaultIdleTimeout)
	setD(&o.HandshakeTimeout, DefaultHandshakeTimeout)
	setD(&o.KeepAlive, DefaultKeepAlive)
}

var (
	tlsItem     = regexp.MustCompile(`^[a-z0-9_]+(:[a-z]+)?$`)
	deviceItem  = regexp.MustCompile(`^[A-Za-z0-9_.:-]+$`)
	settingName = regexp.MustCompile(`^[A-Z][A-Z0-9_]*$`)
)

// Validate reports every problem of o in one error that wraps
// ErrInvalidOptions. Call it after EnsureDefaults: zero values are reported
// as invalid.
func (o *Options) Validate() error {
	var problems []string
	bad := func(format string, args ...any) {
		problems = append(problems, fmt.Sprintf(format, args...))
	}
	if err := checkList(strings.TrimPrefix(o.TLS, "^"), tlsItem); err != "" {
		bad("TLS %q: %s; want a UCX_TLS list such as \"posix,cma,self\", \"sm,self\" or \"tcp\"", o.TLS, err)
	}
	if err := checkList(o.NetDevices, deviceItem); err != "" {
		bad("NetDevices %q: %s; want a UCX_NET_DEVICES list such as \"eth0\" or \"mlx5_0:1\"", o.NetDevices, err)
	}
	for _, name := range slices.Sorted(maps.Keys(o.Settings)) {
		switch {
		case !settingName.MatchString(name) || strings.HasPrefix(name, "UCX_"):
			bad("Settings: %q is not a UCX setting name (upper case, without the UCX_ prefix)", name)
		case name == "TLS" || name == "NET_DEVICES":
			bad("Settings: set %s through the Options field, not Settings", name)
		case strings.ContainsRune(o.Settings[name], 0):
			bad("Settings: the value of %s holds a NUL byte", name)
		}
	}
	if o.MaxBlockSize <= 0 || o.MaxBlockSize > MaxBlockSizeLimit {
		bad("MaxBlockSize is %d, want 1 to %d bytes", o.MaxBlockSize, MaxBlockSizeLimit)
	}
	if o.MaxBlocks <= 0 || o.MaxBlocks > MaxBlocksLimit {
		bad("MaxBlocks is %d, want 1 to %d", o.MaxBlocks, MaxBlocksLimit)
	}
	if o.MaxConns <= 0 || o.MaxConns > maxID/2 {
		bad("MaxConns is %d, want 1 to %d", o.MaxConns, maxID/2)
	}
	if o.ChunkSize < MinChunkSize || o.ChunkSize > MaxBlockSizeLimit {
		bad("ChunkSize is %d, want %d to %d bytes", o.ChunkSize, MinChunkSize, MaxBlockSizeLimit)
	}
	if o.SendWindow <= 0 {
		bad("SendWindow is %d, want > 0 bytes", o.SendWindow)
	}
	if o.BusyPoll > MaxBusyPoll {
		bad("BusyPoll is %v, want at most %v (or negative for none)", o.BusyPoll, MaxBusyPoll)
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
	if len(problems) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s", ErrInvalidOptions, strings.Join(problems, "; "))
}

// checkList checks a comma-separated list; "" is fine (the default).
func checkList(list string, item *regexp.Regexp) string {
	if list == "" {
		return ""
	}
	for _, it := range strings.Split(list, ",") {
		if !item.MatchString(it) {
			return fmt.Sprintf("%q is not a valid item", it)
		}
	}
	return ""
}

// settings returns what the transport sets with ucp_config_modify, in
// order; later entries win.
func (o *Options) settings() [][2]string {
	var s [][2]string
	if o.TLS != "" {
		s = append(s, [2]string{"TLS", o.TLS})
	}
	if o.NetDevices != "" {
		s = append(s, [2]string{"NET_DEVICES", o.NetDevices})
	}
	tls := o.TLS
	if tls == "" {
		tls = os.Getenv("UCX_TLS")
	}
	if mayUseSharedMemory(tls) {
		// Endpoints ask for peer-failure handling, which UCX 1.13 grants
		// its shared-memory transports only when this is on; without it
		// they are left out and shared-memory peers are unreachable.
		s = append(s, [2]string{"MM_ERROR_HANDLING", "y"})
	}
	// UCX's registration cache learns that memory went away through hooks
	// on libc's munmap and madvise, which the Go runtime bypasses with raw
	// system calls: a cached registration of freed Go memory could outlive
	// it. Register per operation instead (only RDMA transports register).
	s = append(s, [2]string{"RCACHE_ENABLE", "n"})
	for _, name := range slices.Sorted(maps.Keys(o.Settings)) {
		s = append(s, [2]string{name, o.Settings[name]})
	}
	return s
}

// mayUseSharedMemory says whether a UCX_TLS list can select a shared-memory
// transport.
func mayUseSharedMemory(tls string) bool {
	if tls == "" || strings.HasPrefix(tls, "^") {
		return true
	}
	for _, t := range strings.Split(tls, ",") {
		switch strings.SplitN(t, ":", 2)[0] {
		case "all", "sm", "shm", "mm", "posix", "sysv", "xpmem", "knem":
			return true
		}
	}
	return false
}

// Transport is the UCX backend of transfer.Transport. It holds no UCX
// resources itself: each Listener and each Conn owns one UCP context and
// one worker, made when it opens and freed when it closes.
type Transport struct {
	opts     Options
	err      error // from Validate; returned by Listen and Dial
	settings [][2]string
}

var _ transfer.Transport = (*Transport)(nil)

// New returns a UCX transport configured by opts (zero fields take their
// defaults). Invalid options make every Listen and Dial fail with an error
// that wraps ErrInvalidOptions and lists every problem.
func New(opts Options) *Transport {
	opts.Settings = maps.Clone(opts.Settings) // the caller's map stays the caller's
	opts.EnsureDefaults()
	return &Transport{opts: opts, err: opts.Validate(), settings: opts.settings()}
}

// Name returns "ucx".
func (t *Transport) Name() string { return "ucx" }

// Settings returns the UCX settings the transport applies to every context
// it makes, as "NAME=value" (without the UCX_ prefix), in order: for logs.
func (t *Transport) Settings() []string {
	out := make([]string, len(t.settings))
	for i, kv := range t.settings {
		out[i] = kv[0] + "=" + kv[1]
	}
	return out
}
