// Package resp serves a Store over the Redis protocol (RESP2), so that
// existing Redis clients — redis-cli, redis-benchmark, LMCache's redis://
// and resp:// connectors, redis-py — read and write a kvstrata node with no
// new code. It speaks the string commands of Redis those clients use: GET,
// SET (NX, XX, EX, PX, EXAT, PXAT, KEEPTTL), MGET, MSET, EXISTS,
// DEL/UNLINK, MULTI/EXEC, SCAN, KEYS, EXPIRE, TTL, …, and the connection
// and introspection commands clients send on their own (PING, INFO,
// COMMAND, CLIENT, CONFIG GET, HELLO, …), and, with Config.Auth, AUTH and
// per-command roles as Redis 6's ACLs (auth.go). A deadline is a promise that the
// key is gone by then; the cache may evict it sooner. Most of the key
// commands beyond GET and SET need a Store that is a KeyStore.
//
// The package is independent of the rest of the node: it talks to it only
// through the Store interface it owns. Store errors become error replies a
// person can act on (see ErrTooLarge and ErrFull).
//
// A Server is safe for concurrent use; each connection is served by one
// goroutine, which reads commands, runs them against the Store in order and
// batches the replies of pipelined commands into few writes.
package resp

import (
	"context"
	"errors"
	"strings"
	"time"
)

// Store is what a Server serves. Implementations must be safe for
// concurrent use: every connection calls them from its own goroutine.
// Keys and values are opaque bytes; ctx is cancelled when the Server closes.
type Store interface {
	// View returns key's value, without copying where the store can. The
	// server calls release exactly once, after the bytes are written to the
	// socket; until then the store must keep them unchanged. A missing key
	// is an error matching ErrNotFound (release may then be nil).
	View(ctx context.Context, key string) (value []byte, release func(), err error)
	// Set stores value under key, replacing any value there. value is only
	// valid during the call: the store copies what it keeps.
	Set(ctx context.Context, key string, value []byte) error
	// Exists reports whether key holds a value.
	Exists(ctx context.Context, key string) (bool, error)
	// Delete removes key and reports whether it held a value.
	Delete(ctx context.Context, key string) (bool, error)
	// Len is the number of keys held (DBSIZE, INFO keyspace).
	Len(ctx context.Context) (int64, error)
	// Info returns the store's own lines for INFO: extra fields for the
	// server's sections (keyspace, memory) or fields of new ones (tiers).
	Info(ctx context.Context) []InfoField
}

// ConditionalSetter is an optional power of a Store. A Store that has it
// makes SET … NX and SET … XX atomic; without it the server checks with
// Exists and then calls Set, which another client may race.
type ConditionalSetter interface {
	// SetIf stores value under key only if key's presence equals exists
	// (false for NX, true for XX) and reports whether it stored.
	SetIf(ctx context.Context, key string, value []byte, exists bool) (stored bool, err error)
}

// SetReserver is an optional power of a Store: it reserves room for the
// value of a plain SET (SET key value, no options) before the value is
// read, so that the server reads the value from the socket straight into
// place rather than into a buffer of its own and then copying it. The
// server asks only for values longer than it copies out of its read
// buffer, outside MULTI, once the command may run.
type SetReserver interface {
	// ReserveSet returns room for a value of size bytes to be stored under
	// key as Set stores it. ok false (err nil) asks the server to read the
	// value itself and call SetWith or Set, as for a Store without this
	// power (a value the store keeps in pieces, say); so does an error,
	// which the store is expected to return again from that call.
	ReserveSet(ctx context.Context, key string, size int) (p PendingSet, ok bool, err error)
}

// PendingSet is room ReserveSet returned, for one value.
type PendingSet interface {
	// Bytes is the room; its length is the value's size. The server fills
	// it in order, from the first byte.
	Bytes() []byte
	// Filled is told each piece of Bytes() once it holds the value's
	// bytes, in order, so that the store can hash them while they are in
	// the CPU's cache.
	Filled(piece []byte)
	// Commit stores the value under the key, replacing any value there, as
	// Set does, once every byte is filled.
	Commit() error
	// Abort gives the room back, leaving the key as it was; after Commit
	// it does nothing.
	Abort()
}

// KeyStore is the rest of what the Redis commands need of a Store:
// expiry, all-or-nothing batches, key enumeration. A Store that lacks it
// serves only the commands Store covers.
type KeyStore interface {
	Store
	// SetWith stores value under key as opts say and reports whether it
	// stored (false only when opts.Cond did not hold). The check of the
	// condition and the store are atomic with respect to every other write
	// through the Store.
	SetWith(ctx context.Context, key string, value []byte, opts SetOptions) (stored bool, err error)
	// Apply makes every write of ws, or none: when it returns an error, no
	// key has changed. No other write through the Store interleaves with
	// them (MSET, EXEC). Later writes of the same key win.
	Apply(ctx context.Context, ws []Write) error
	// Stat describes key without reading its value; a missing (or expired)
	// key is an error matching ErrNotFound.
	Stat(ctx context.Context, key string) (KeyInfo, error)
	// Expire sets key's deadline (the zero time removes it: PERSIST) and
	// returns the deadline it had (zero if none). A missing key is an error
	// matching ErrNotFound. A deadline not after now deletes the key.
	Expire(ctx context.Context, key string, at time.Time) (old time.Time, err error)
	// Scan returns some keys from cursor on (0 starts) and the cursor to go
	// on from, 0 once every key has been returned. As Redis's SCAN: a key
	// present from the first call to the last is returned at least once;
	// count is a hint of how many keys to return.
	Scan(ctx context.Context, cursor uint64, count int) (keys []string, next uint64, err error)
	// Flush deletes every key and returns how many it deleted.
	Flush(ctx context.Context) (int64, error)
}

// Updater is an optional power of a KeyStore: an atomic read-modify-write
// of one key, which INCR, DECR, APPEND, GETSET and GETDEL need.
type Updater interface {
	// Update calls fn once with key's value and description (found false,
	// old nil, for a missing or expired key) and makes the write fn
	// returns (its Key is ignored), atomically with respect to every other
	// write of key through the Store. old is only valid during fn. An
	// error of fn changes nothing and is returned as it is.
	Update(ctx context.Context, key string, fn func(old []byte, info KeyInfo, found bool) (Write, error)) error
}

// SetCond is the condition of a SetWith on the key's presence.
type SetCond int

// The conditions of SetWith.
const (
	SetAlways    SetCond = iota
	SetIfAbsent          // NX
	SetIfPresent         // XX
)

// SetOptions qualify a SetWith.
type SetOptions struct {
	Cond SetCond
	// ExpireAt is when the key is to be gone: after it, reads miss. The
	// zero time sets no deadline (and removes one the old value had).
	ExpireAt time.Time
	// KeepTTL keeps the deadline of the value replaced; ExpireAt is then
	// zero.
	KeepTTL bool
}

// Write is one change of an Apply: store Value under Key with deadline
// ExpireAt (zero: none), or, with Delete, remove Key.
type Write struct {
	Key      string
	Value    []byte
	ExpireAt time.Time
	Delete   bool
}

// KeyInfo describes a stored key (TTL, STRLEN, MEMORY USAGE, TYPE).
type KeyInfo struct {
	Size      int64     // the value's length in bytes
	Footprint int64     // the bytes the store holds for it, key and headers included
	ExpireAt  time.Time // its deadline; zero if none
}

// InfoField is one "name:value" line of an INFO reply.
type InfoField struct {
	// Section is the lower-case section the line belongs to. Lines of the
	// server's own sections ("server", "clients", "memory", "stats",
	// "keyspace") are appended to them; others form new sections, in the
	// order they first appear, titled with Section capitalised ("tiers" →
	// "# Tiers").
	Section string
	Name    string // no ':' and no line breaks
	Value   string // no line breaks
}

// Errors a Store returns, matched with errors.Is; they decide the error
// reply. A Store may return them bare, wrap them (fmt.Errorf("…: %w",
// resp.ErrFull)) or tag an error of its own with Mark. The reply shows the
// error's text, so say what failed: "-ERR tiers: block is 5.0 MiB, over the
// 4.0 MiB limit".
var (
	// ErrNotFound marks a missing key: GET replies with a null bulk string.
	ErrNotFound = errors.New("resp: key not found")
	// ErrTooLarge marks a value over the store's size limit: "-ERR <text>".
	ErrTooLarge = errors.New("resp: value too large")
	// ErrFull marks a store with no room it can make (nothing evictable):
	// "-OOM <text>", the reply Redis gives over maxmemory.
	ErrFull = errors.New("resp: store full")
	// ErrUnavailable marks what the store cannot do now because a tier is
	// out of reach (an object store that is down): read a key it holds, or
	// replace one whose older copy is there. "-TRYAGAIN <text>", which a
	// client tells from a miss (a null reply) and may retry later.
	ErrUnavailable = errors.New("resp: value out of reach for now")
	// Any other error replies "-ERR <text>".
)

// Mark returns an error that reads as err and matches kind (ErrNotFound,
// ErrTooLarge, ErrFull or ErrUnavailable) as well as everything err matches. It lets a
// Store tag its own errors without changing their text:
//
//	if errors.Is(err, tiers.ErrTooLarge) {
//		return resp.Mark(err, resp.ErrTooLarge)
//	}
func Mark(err, kind error) error {
	if err == nil {
		return nil
	}
	return &marked{err: err, kind: kind}
}

type marked struct{ err, kind error }

func (m *marked) Error() string        { return m.err.Error() }
func (m *marked) Unwrap() error        { return m.err }
func (m *marked) Is(target error) bool { return target == m.kind }

// storeErrorReply is the error reply, without the leading '-', for an error
// a Store returned.
func storeErrorReply(err error) string {
	msg := err.Error()
	switch {
	case err == ErrFull:
		return "OOM the store is full and cannot make room for this value"
	case err == ErrTooLarge:
		return "ERR value is over the store's size limit"
	case errors.Is(err, ErrFull):
		return "OOM " + msg
	case errors.Is(err, ErrUnavailable):
		return "TRYAGAIN " + strings.TrimSpace(msg)
	case errors.Is(err, context.Canceled):
		return "ERR server is shutting down: " + msg
	default:
		return "ERR " + strings.TrimSpace(msg)
	}
}
