// Package transfer is the data plane: it moves block bytes between a node and
// its clients and peers, from a tier's memory to the wire and from the wire
// straight into the destination buffer, with no per-block protobuf copy.
//
// A Transport has one server side (Listen, serving a Handler) and one client
// side (Dial, giving a Conn). Backends live in subpackages: tcp (pure Go, the
// default) and ucx (cgo, build tag ucx). Every backend passes the suite in
// transfer/transfertest.
package transfer

import (
	"context"
	"crypto/tls"
	"errors"

	"github.com/kvstrata/kvstrata/index"
)

// Errors a Conn reports per block or per call; test with errors.Is.
var (
	ErrNotFound = errors.New("transfer: block not found")
	// ErrCorrupt marks bytes that arrived but failed their checksum.
	ErrCorrupt = errors.New("transfer: block failed its checksum")
	// ErrRefused marks a request the server refused as a whole (over a
	// limit, malformed); nothing of it was applied. Reported for one block,
	// it marks a block the Handler refused as breaking its limits or
	// contract: sent again unchanged, it is refused again.
	ErrRefused = errors.New("transfer: request refused")
	ErrClosed  = errors.New("transfer: connection closed")
	// ErrFull marks a block the server had no room for.
	ErrFull = errors.New("transfer: no room for the block")
	// ErrRemote marks an error the server's Handler reported for one block
	// (a disk error, say); the error's message holds the server's.
	ErrRemote = errors.New("transfer: server error")
	// ErrUnavailable marks what cannot be had now but may be later: a Dial
	// that found no node to talk to (nothing listening, unreachable, gone
	// during the hellos) or a node that turned the connection away (at its
	// connection limit); reported for one block, a block the server holds
	// but cannot read now (in a tier out of reach, an object store that is
	// down) — not a miss.
	ErrUnavailable = errors.New("transfer: unavailable for now")
	// ErrUnauthenticated marks a Dial the server turned away because the
	// client presented no credential, or one that is not valid; the server
	// says nothing more than "authenticate first".
	ErrUnauthenticated = errors.New("transfer: the node wants a valid credential")
)

// Handler is what a server serves: a node's storage, adapted. A server calls
// it from many connections at once, so it must be safe for concurrent use.
type Handler interface {
	// Open returns a block's header and its bytes, pinned (not copied where
	// the storage allows) until release is called. The transport calls
	// release exactly once when err is nil, and ignores h, data and release
	// otherwise. A missing block is reported as ErrNotFound.
	Open(key index.Key) (h index.Header, data []byte, release func(), err error)
	// Reserve returns a buffer of h.Size bytes for an incoming block; the
	// transport fills it and calls commit(true) once the bytes match h.Sum,
	// commit(false) otherwise, exactly once either way. An error refuses
	// the block (and commit is not called); wrap ErrFull for a lack of
	// room, ErrRefused for a block that breaks the Handler's limits.
	Reserve(h index.Header) (buf []byte, commit func(ok bool) error, err error)
}

// Credentials are what a client presented when it connected.
type Credentials struct {
	// Token is the secret the client's hello carried; empty when none.
	Token string
	// TLS is the connection's TLS state; nil on a plain connection.
	TLS *tls.ConnectionState
}

// Authenticator is an optional power of a Handler: a server whose Handler
// has it calls Authenticate once per connection, after the hellos and
// before any request, and serves the connection's requests with the
// Handler it returns (bound to who the client is: its blocks, its
// rights), so that nothing is checked per request. An error turns the
// connection away with ErrUnauthenticated. A transport that cannot carry
// credentials never calls it: the Handler itself must then refuse what
// needs them.
type Authenticator interface {
	Authenticate(c Credentials) (Handler, error)
}

// Prefetcher is an optional power of a Handler. Told every key of a Get
// before the first Open, it may start reading slow blocks (from an object
// store, say) in parallel; the transport then opens the Get's blocks in
// order through the returned Opener and closes it when the Get is done, so
// blocks stream back in order as they arrive.
type Prefetcher interface {
	Prefetch(keys []index.Key) Opener
}

// Opener opens, one after another in request order, the blocks of one Get
// a Prefetcher was told about; Open has Handler.Open's contract.
type Opener interface {
	Open(key index.Key) (h index.Header, data []byte, release func(), err error)
	// Close ends the Get: blocks fetched but never opened are let go.
	Close()
}

// DeviceBlock is a block whose bytes lie in GPU memory, as a SourceOpener
// hands it out.
type DeviceBlock struct {
	// Ptr is the block's device address (a CUdeviceptr), valid until the
	// open's release; Device is the ordinal of the GPU holding it.
	Ptr    uint64
	Device int
	// Stage copies the block into host memory (by DMA into a pinned bounce
	// buffer where the Handler has one) and returns its bytes and done,
	// which gives the buffer back once they are sent; the transport calls
	// done exactly once when err is nil, and before the open's release.
	Stage func() (data []byte, done func(), err error)
}

// SourceOpener is an optional power of a Handler and of an Opener: a
// block held in GPU memory may be opened in place. OpenSource is Open,
// except that for such a block it returns dev in place of data: a
// transport that can send from device memory (UCX built with CUDA) sends
// from dev.Ptr, any other stages it with dev.Stage. Open itself hands the
// same block out staged, so a transport that knows nothing of device
// memory still serves it.
type SourceOpener interface {
	OpenSource(key index.Key) (h index.Header, data []byte, dev *DeviceBlock, release func(), err error)
}

// Receiver takes the blocks of a Get as they arrive, in request order. For
// each block i the transport calls Buffer at most once (only for a block
// that arrives with bytes) and then Done exactly once, from the goroutine
// that called Get. When a Get fails as a whole, the blocks it had not
// reported yet get no Done.
type Receiver interface {
	// Buffer returns where block i goes: len(buf) must be h.Size.
	Buffer(i int, h index.Header) []byte
	// Done reports block i: err is nil (its buffer holds verified bytes),
	// ErrNotFound, ErrUnavailable, ErrCorrupt, or another error from the
	// server.
	Done(i int, h index.Header, err error)
}

// DeviceTarget is where a DeviceReceiver wants a block: GPU memory the
// caller owns.
type DeviceTarget struct {
	// Ptr is the device address (a CUdeviceptr) of h.Size bytes the block
	// goes to; Device is the ordinal of its GPU.
	Ptr    uint64
	Device int
	// Bounce lends a host buffer of n bytes (pinned, where the caller has a
	// pool of them) for a transport that receives through host memory;
	// Unstage copies data, the block's verified bytes in that buffer, to
	// Ptr, and returns once they are there; the transport then calls done,
	// which gives the buffer back, exactly once whatever happened.
	Bounce  func(n int) (buf []byte, done func(), err error)
	Unstage func(data []byte) error
	// Verify, where not nil, checks the h.Size bytes at Ptr against h.Sum
	// after a transport received them straight into device memory, where
	// it cannot hash them itself; nil trusts the transport's delivery.
	Verify func(h index.Header) error
}

// DeviceReceiver is an optional power of a Receiver: blocks it asks for in
// device memory go straight there where the transport can receive into
// device memory (UCX built with CUDA), else through a bounce buffer and a
// copy to the device (see Staged). Buffer is not called for a block whose
// DeviceBuffer says ok; Done reports it as for any other block.
type DeviceReceiver interface {
	Receiver
	DeviceBuffer(i int, h index.Header) (t DeviceTarget, ok bool)
}

// Block is one block to put.
type Block struct {
	index.Header
	Data []byte
}

// Conn is a client connection to one node. A Conn carries one request at a
// time; pool Conns for concurrency. Every call honours ctx's deadline and
// cancellation; a connection that failed mid-request is closed and must be
// redialled: its later calls return an error wrapping ErrClosed.
type Conn interface {
	// Get fetches keys, calling r for each in order. It returns an error
	// only when the request as a whole failed.
	Get(ctx context.Context, keys []index.Key, r Receiver) error
	// Put stores blocks and returns one error per block (nil if stored).
	// Each block's Size must be len(Data) and its Sum the xxhash64 of Data;
	// a block whose bytes do not match its Sum is reported ErrCorrupt.
	// A request refused as a whole returns ErrRefused and stores nothing.
	Put(ctx context.Context, blocks []Block) ([]error, error)
	Close() error
}

// Listener is a serving endpoint.
type Listener interface {
	Addr() string
	// Close stops accepting, closes the live connections and waits for the
	// Handler calls in flight to return.
	Close() error
}

// Drainer is an optional power of a Listener: Shutdown stops accepting,
// closes idle connections, lets each request in flight finish (then closes
// its connection), and returns once all are done — or, when ctx ends first,
// closes what is left and returns ctx's error.
type Drainer interface {
	Shutdown(ctx context.Context) error
}

// Transport is one data-plane backend.
type Transport interface {
	Name() string
	Listen(addr string, h Handler) (Listener, error)
	Dial(ctx context.Context, addr string) (Conn, error)
}
