package transfertest

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/transfer"
)

// Memory is an in-memory transfer.Handler: a map of blocks, with hooks that
// inject the faults the suite needs. It serves stored bytes without copying
// them and counts pins and reservations, so that a test can check that a
// transport releases and commits every one. Safe for concurrent use.
type Memory struct {
	// OnOpen, if set, runs at the start of every Open, outside any lock.
	// It may block (a stalled server); an error it returns fails the block.
	OnOpen func(k index.Key) error
	// Tamper, if set, may replace the bytes Open serves for a block (a
	// server whose memory went bad); it must not modify data itself.
	Tamper func(k index.Key, data []byte) []byte
	// OnReserve, if set, runs at the start of every Reserve; an error it
	// returns refuses the block (a full store).
	OnReserve func(h index.Header) error

	mu     sync.Mutex
	blocks map[index.Key]transfer.Block

	pinned   atomic.Int64 // Opens not yet released
	reserved atomic.Int64 // Reserves not yet committed
	reserves atomic.Int64 // Reserves ever
	misuse   atomic.Int64 // releases and commits called twice
}

var _ transfer.Handler = (*Memory)(nil)

// NewMemory returns an empty Memory.
func NewMemory() *Memory {
	return &Memory{blocks: make(map[index.Key]transfer.Block)}
}

// Open serves a stored block's bytes, pinned until release.
func (m *Memory) Open(k index.Key) (index.Header, []byte, func(), error) {
	if m.OnOpen != nil {
		if err := m.OnOpen(k); err != nil {
			return index.Header{}, nil, nil, err
		}
	}
	m.mu.Lock()
	b, ok := m.blocks[k]
	m.mu.Unlock()
	if !ok {
		return index.Header{}, nil, nil, fmt.Errorf("memory: open %v: %w", k, transfer.ErrNotFound)
	}
	data := b.Data
	if m.Tamper != nil {
		data = m.Tamper(k, data)
	}
	m.pinned.Add(1)
	var once atomic.Bool
	release := func() {
		if !once.CompareAndSwap(false, true) {
			m.misuse.Add(1)
			return
		}
		m.pinned.Add(-1)
	}
	return b.Header, data, release, nil
}

// Reserve returns a fresh buffer for an incoming block; commit(true) stores
// it.
func (m *Memory) Reserve(h index.Header) ([]byte, func(bool) error, error) {
	m.reserves.Add(1)
	if m.OnReserve != nil {
		if err := m.OnReserve(h); err != nil {
			return nil, nil, err
		}
	}
	buf := make([]byte, h.Size)
	m.reserved.Add(1)
	var once atomic.Bool
	commit := func(ok bool) error {
		if !once.CompareAndSwap(false, true) {
			m.misuse.Add(1)
			return fmt.Errorf("memory: %v committed twice", h.Key)
		}
		m.reserved.Add(-1)
		if ok {
			m.Store(transfer.Block{Header: h, Data: buf})
		}
		return nil
	}
	return buf, commit, nil
}

// Store puts b in the map, replacing any block of its key; b.Data is kept,
// not copied, and must not be modified afterwards.
func (m *Memory) Store(b transfer.Block) {
	m.mu.Lock()
	m.blocks[b.Key] = b
	m.mu.Unlock()
}

// Block returns the stored block of key k.
func (m *Memory) Block(k index.Key) (transfer.Block, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	b, ok := m.blocks[k]
	return b, ok
}

// Len returns the number of blocks stored.
func (m *Memory) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.blocks)
}

// Pinned returns the number of opened blocks not yet released.
func (m *Memory) Pinned() int64 { return m.pinned.Load() }

// Reserved returns the number of reserved buffers not yet committed.
func (m *Memory) Reserved() int64 { return m.reserved.Load() }

// Reserves returns the number of Reserve calls so far.
func (m *Memory) Reserves() int64 { return m.reserves.Load() }

// Misuse returns how many times a release or commit was called again.
func (m *Memory) Misuse() int64 { return m.misuse.Load() }

// NS is the namespace of the blocks MakeBlock makes.
const NS index.NamespaceID = 0x6b7673 // "kvs"

// Key returns the key of hash h in namespace NS.
func Key(h index.Hash) index.Key { return index.Key{NS: NS, Hash: h} }

// MakeBlock makes a block of n deterministic pseudo-random bytes for hash h,
// with a correct Size and Sum; blocks after the first name h-1 as parent.
func MakeBlock(h index.Hash, n int) transfer.Block {
	var seed [32]byte
	binary.LittleEndian.PutUint64(seed[:], uint64(h))
	binary.LittleEndian.PutUint64(seed[8:], uint64(n))
	data := make([]byte, n)
	_, _ = rand.NewChaCha8(seed).Read(data)
	b := transfer.Block{Header: index.Header{Key: Key(h), Meta: index.Meta{Size: uint32(n)}, Sum: index.Checksum(data)}, Data: data}
	if h > 1 {
		b.Parent, b.HasParent = h-1, true
	}
	return b
}

// Collector is a transfer.Receiver that keeps what a Get delivered, in
// fresh buffers, and checks the Receiver contract as it goes: Buffer at most
// once per block and before its Done, Done exactly once per block, in order.
type Collector struct {
	Headers []index.Header
	Data    [][]byte // nil for a block that came without bytes
	Errs    []error
	// Buffered records which blocks Buffer was called for.
	Buffered []bool
	// Problems lists breaches of the Receiver contract.
	Problems []string

	next int // the block Done is due for
}

var _ transfer.Receiver = (*Collector)(nil)

// NewCollector returns a Collector for a Get of n keys.
func NewCollector(n int) *Collector {
	return &Collector{
		Headers:  make([]index.Header, n),
		Data:     make([][]byte, n),
		Errs:     make([]error, n),
		Buffered: make([]bool, n),
	}
}

// Buffer returns a fresh buffer of h.Size bytes for block i.
func (c *Collector) Buffer(i int, h index.Header) []byte {
	switch {
	case i < 0 || i >= len(c.Data):
		c.Problems = append(c.Problems, fmt.Sprintf("Buffer(%d) of a %d-block get", i, len(c.Data)))
		return make([]byte, h.Size)
	case i != c.next:
		c.Problems = append(c.Problems, fmt.Sprintf("Buffer(%d) while block %d is due", i, c.next))
	case c.Buffered[i]:
		c.Problems = append(c.Problems, fmt.Sprintf("Buffer(%d) called twice", i))
	}
	c.Buffered[i] = true
	c.Data[i] = make([]byte, h.Size)
	return c.Data[i]
}

// Done records block i's outcome.
func (c *Collector) Done(i int, h index.Header, err error) {
	if i != c.next || i >= len(c.Data) {
		c.Problems = append(c.Problems, fmt.Sprintf("Done(%d) while block %d is due", i, c.next))
		return
	}
	c.next++
	c.Headers[i], c.Errs[i] = h, err
	if err != nil {
		c.Data[i] = nil
	}
}

// Reported returns how many blocks got their Done.
func (c *Collector) Reported() int { return c.next }

// keysOf returns the keys of blocks.
func keysOf(blocks []transfer.Block) []index.Key {
	keys := make([]index.Key, len(blocks))
	for i, b := range blocks {
		keys[i] = b.Key
	}
	return keys
}

// flipped returns a copy of data with one bit changed.
func flipped(data []byte) []byte {
	c := slices.Clone(data)
	if len(c) > 0 {
		c[len(c)/2] ^= 0x10
	}
	return c
}
