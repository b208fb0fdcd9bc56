// Package bufpool lends large byte buffers for reads and takes them back
// once every holder is done with them, so that a stream of ranged reads
// (an object store's segments restored through the node) fills memory
// already in use instead of a fresh, zeroed allocation each time.
//
// A Buffer is reference counted: Get returns it with one reference, each
// further holder (a block sent on the data plane, the same block copied
// up into a faster tier) takes one with Retain, and each drops its own
// with Release. The bytes go back to the pool only when the last
// reference is released; a Release more than Retain panics. A reference
// never released only costs the pool that buffer: the garbage collector
// takes it.
//
// Inside test binaries (testing.Testing) a buffer is filled with a poison
// pattern when it goes back, and Get checks that the pattern is intact
// when it lends the buffer again: a holder that still read from a buffer
// after its last Release sees poison instead of its block (and fails its
// checksum), and one that wrote to it makes Get panic.
//
// The poison is written and checked at memory speed (copy and bytes.Equal
// by 64 KiB). Benchmarks, which measure what a server does with the pool,
// turn it off with NoPoison.
//
// A Pool and its Buffers are safe for concurrent use.
package bufpool

import (
	"bytes"
	"fmt"
	"math/bits"
	"sync"
	"sync/atomic"
	"testing"
)

// minClass is log2 of the smallest buffer the pool lends: 64 KiB.
const minClass = 16

// Poison is the byte a returned buffer is filled with in test binaries.
const Poison = 0xDB

// Pool keeps released buffers, by size class, up to a bound on the bytes
// it keeps idle. Classes step by an eighth of a power of two (3 MiB, 3.25
// MiB, 3.5 MiB, …), so a buffer wastes at most an eighth of its size, and
// reads of one block size share one class.
type Pool struct {
	maxIdle int64
	poison  bool

	mu   sync.Mutex
	free map[int][][]byte // by capacity
	idle int64

	gets, reused atomic.Int64
}

// New returns a pool that keeps at most maxIdle bytes of released buffers;
// more is left to the garbage collector.
func New(maxIdle int64) *Pool {
	return &Pool{maxIdle: maxIdle, poison: testing.Testing(), free: map[int][][]byte{}}
}

// NoPoison stops p poisoning the buffers it takes back, as outside test
// binaries: for benchmarks, which measure what a server does. It must be
// called before p lends its first buffer.
func (p *Pool) NoPoison() { p.poison = false }

// Buffer is a pooled buffer with a reference count. Its methods are safe
// on a nil *Buffer, which stands for memory no pool lent (they do
// nothing).
type Buffer struct {
	b    []byte
	refs atomic.Int32
	pool *Pool
}

// Get lends a buffer of n bytes (n > 0) holding one reference. Its
// contents are whatever they were: the caller overwrites them.
func (p *Pool) Get(n int) *Buffer {
	class := classOf(n)
	p.gets.Add(1)
	var b []byte
	p.mu.Lock()
	if list := p.free[class]; len(list) > 0 {
		b = list[len(list)-1]
		list[len(list)-1] = nil
		p.free[class] = list[:len(list)-1]
		p.idle -= int64(cap(b))
	}
	p.mu.Unlock()
	if b == nil {
		b = make([]byte, class)
	} else {
		p.reused.Add(1)
		if p.poison {
			checkPoison(b[:cap(b)])
		}
	}
	buf := &Buffer{b: b[:n], pool: p}
	buf.refs.Store(1)
	return buf
}

// put takes back a buffer no one holds.
func (p *Pool) put(b []byte) {
	b = b[:cap(b)]
	if p.poison {
		fillPoison(b)
	}
	class := cap(b)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.idle+int64(cap(b)) > p.maxIdle {
		return
	}
	p.free[class] = append(p.free[class], b)
	p.idle += int64(cap(b))
}

// classOf returns the capacity of the class of buffers of n bytes, n > 0.
func classOf(n int) int {
	if n <= 1<<minClass {
		return 1 << minClass
	}
	step := 1 << (bits.Len(uint(n-1)) - 4) // an eighth of the power of two below
	return (n + step - 1) / step * step
}

// Stats says how many buffers the pool lent and how many of them were
// reused rather than allocated, and how many bytes it keeps idle.
func (p *Pool) Stats() (gets, reused, idle int64) {
	p.mu.Lock()
	idle = p.idle
	p.mu.Unlock()
	return p.gets.Load(), p.reused.Load(), idle
}

// Bytes returns the buffer's bytes, valid while the caller holds a
// reference.
func (b *Buffer) Bytes() []byte {
	if b == nil {
		return nil
	}
	return b.b
}

// Retain takes one more reference, for another holder, and returns b.
func (b *Buffer) Retain() *Buffer {
	if b != nil && b.refs.Add(1) <= 1 {
		panic("bufpool: Retain of a released buffer")
	}
	return b
}

// Release drops one reference; the last one gives the bytes back to the
// pool, after which no holder may touch them.
func (b *Buffer) Release() {
	if b == nil {
		return
	}
	switch n := b.refs.Add(-1); {
	case n == 0:
		b.pool.put(b.b)
	case n < 0:
		panic(fmt.Sprintf("bufpool: Release of a buffer with no reference left (%d)", n))
	}
}

// checkPoison panics unless b holds only the poison pattern: someone wrote
// to it after its last Release.
func checkPoison(b []byte) {
	for off := 0; off < len(b); off += len(poisonBlock) {
		chunk := b[off:min(off+len(poisonBlock), len(b))]
		if bytes.Equal(chunk, poisonBlock[:len(chunk)]) {
			continue
		}
		for i, c := range chunk {
			if c != Poison {
				panic(fmt.Sprintf("bufpool: a buffer was written at byte %d after its last Release", off+i))
			}
		}
	}
}

// poisonBlock is the poison pattern that fillPoison and checkPoison copy
// and compare.
var poisonBlock = bytes.Repeat([]byte{Poison}, 64<<10)

// fillPoison fills b with the poison pattern.
func fillPoison(b []byte) {
	for off := 0; off < len(b); off += len(poisonBlock) {
		copy(b[off:], poisonBlock)
	}
}
