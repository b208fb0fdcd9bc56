package loadgen

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/kvstrata/kvstrata/api/client"
	"github.com/kvstrata/kvstrata/index"
)

// Target is one worker's handle on the system under load. Keys are numbers
// of the working set, 0 to Config.Keys-1; each target maps them to its own
// key space. A worker uses its Target from its own goroutine only.
type Target interface {
	// Put stores values[i] under keys[i].
	Put(ctx context.Context, keys []uint64, values [][]byte) error
	// Get fetches keys and calls fn for each in order: found is false for a
	// key the system lacks. value is valid only until fn returns. An error
	// from fn ends the call with it.
	Get(ctx context.Context, keys []uint64, fn func(i int, value []byte, found bool) error) error
	// Close releases what the target holds (not what it shares).
	Close() error
}

// Looker is a Target that can also answer a longest-prefix lookup of a
// chain of keys; only such targets run OpLookup.
type Looker interface {
	// Lookup returns how many leading keys of chain the system holds.
	Lookup(ctx context.Context, chain []uint64) (int, error)
}

// Dialer opens a Target for one worker.
type Dialer func(ctx context.Context) (Target, error)

// Kvstrata returns a Dialer of targets that share c, a client of a
// kvstrata node: key k is block {ns, KeyHash(k)}. The client's options pick
// the path (the data plane, or gRPC with NoDataPlane); give it a PoolSize
// of at least the concurrency so that no worker waits for a connection.
// Closing the targets leaves c open.
func Kvstrata(c *client.Client, ns index.NamespaceID) Dialer {
	return func(context.Context) (Target, error) {
		return &kvstrataTarget{c: c, ns: ns}, nil
	}
}

type kvstrataTarget struct {
	c      *client.Client
	ns     index.NamespaceID
	keys   []index.Key
	blocks []client.Block
	chain  []index.Hash
	buf    []byte // reused for every block a Get reads
}

var (
	_ Target = (*kvstrataTarget)(nil)
	_ Looker = (*kvstrataTarget)(nil)
)

func (t *kvstrataTarget) Put(ctx context.Context, keys []uint64, values [][]byte) error {
	t.blocks = t.blocks[:0]
	for i, k := range keys {
		t.blocks = append(t.blocks, client.Block{Key: t.key(k), Data: values[i]})
	}
	err := t.c.Put(ctx, t.blocks)
	clear(t.blocks) // keep no reference to the values
	return err
}

func (t *kvstrataTarget) Get(ctx context.Context, keys []uint64, fn func(int, []byte, bool) error) error {
	t.keys = t.keys[:0]
	for _, k := range keys {
		t.keys = append(t.keys, t.key(k))
	}
	// One buffer per target (per worker), reused for every block: fn only
	// reads it before the next block arrives.
	buffer := func(_, size int) []byte {
		if cap(t.buf) < size {
			t.buf = make([]byte, size)
		}
		return t.buf[:size]
	}
	return t.c.GetFunc(ctx, t.keys, client.GetOptions{Buffer: buffer}, func(i int, r client.Result) error {
		return fn(i, r.Data, r.Found)
	})
}

func (t *kvstrataTarget) Lookup(ctx context.Context, chain []uint64) (int, error) {
	t.chain = t.chain[:0]
	for _, k := range chain {
		t.chain = append(t.chain, index.Hash(KeyHash(k)))
	}
	r, err := t.c.Lookup(ctx, t.ns, t.chain)
	if err != nil {
		return 0, err
	}
	return int(r.Blocks), nil
}

func (t *kvstrataTarget) Close() error { return nil }

func (t *kvstrataTarget) key(k uint64) index.Key {
	return index.Key{NS: t.ns, Hash: index.Hash(KeyHash(k))}
}

// Redis returns a Dialer of targets that each hold their own connection to
// the Redis server at addr (host:port): key k is "kvbench:NS:k", NS the
// namespace in 16 hex digits, so runs in different namespaces do not mix.
// timeout bounds each command (0: 10 seconds).
func Redis(addr string, ns index.NamespaceID, timeout time.Duration) Dialer {
	prefix := "kvbench:" + ns.String() + ":"
	return func(ctx context.Context) (Target, error) {
		c, err := DialRedis(ctx, addr, timeout)
		if err != nil {
			return nil, err
		}
		return &redisTarget{c: c, prefix: prefix}, nil
	}
}

type redisTarget struct {
	c      *RedisConn
	prefix string
	key    []byte
	buf    []byte
}

var _ Target = (*redisTarget)(nil)

func (t *redisTarget) keyOf(k uint64) []byte {
	t.key = strconv.AppendUint(append(t.key[:0], t.prefix...), k, 10)
	return t.key
}

func (t *redisTarget) Put(ctx context.Context, keys []uint64, values [][]byte) error {
	for i, k := range keys {
		if err := t.c.Set(ctx, t.keyOf(k), values[i]); err != nil {
			return err
		}
	}
	return nil
}

func (t *redisTarget) Get(ctx context.Context, keys []uint64, fn func(int, []byte, bool) error) error {
	for i, k := range keys {
		v, found, err := t.c.Get(ctx, t.keyOf(k), t.buf)
		if err != nil {
			return err
		}
		if cap(v) > cap(t.buf) {
			t.buf = v[:0]
		}
		if err := fn(i, v, found); err != nil {
			return err
		}
	}
	return nil
}

func (t *redisTarget) Close() error { return t.c.Close() }

// KeyHash maps key number k of the working set to the 64-bit block hash a
// kvstrata target stores it under. It is a bijection (the splitmix64
// finaliser), so distinct keys never share a hash.
func KeyHash(k uint64) uint64 {
	z := k + 0x9e3779b97f4a7c15
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// Content is the deterministic value of every key of a run: key k's value
// is the window of Size bytes at an offset chosen by k in a doubled random
// pattern, so a value can be handed to a put without a copy and checked on
// a get with one memory comparison, and a value read back under the wrong
// key fails the comparison (unless both keys got the same offset, which
// only happens when there are more keys than Size).
type Content struct {
	size    int
	doubled []byte // the pattern twice
}

// NewContent returns the values of size bytes for seed.
func NewContent(size int, seed uint64) (*Content, error) {
	if size < 0 {
		return nil, fmt.Errorf("loadgen: value size %d is negative", size)
	}
	r := rand.New(rand.NewPCG(seed, 0x6b767374))
	half := make([]byte, size)
	for i := 0; i < size; i += 8 {
		v := r.Uint64()
		for j := 0; j < 8 && i+j < size; j++ {
			half[i+j] = byte(v >> (8 * j))
		}
	}
	return &Content{size: size, doubled: append(half, half...)}, nil
}

// Size returns the length of every value.
func (c *Content) Size() int { return c.size }

// Of returns key k's value. Callers must not modify it.
func (c *Content) Of(k uint64) []byte {
	if c.size == 0 {
		return c.doubled[:0:0]
	}
	off := int(KeyHash(k) % uint64(c.size))
	return c.doubled[off : off+c.size : off+c.size]
}
