//go:build ucx

package ucx_test

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/transfer"
	"github.com/kvstrata/kvstrata/transfer/transfertest"
	"github.com/kvstrata/kvstrata/transfer/ucx"
)

// arena is a Handler whose blocks live in one mmap'd region outside the Go
// heap, as the DRAM tier's do: Open hands out slices of it, Reserve fills
// slices of it. It checks that the transport moves bytes straight to and
// from memory Go does not manage.
type arena struct {
	t    testing.TB
	mem  []byte
	mu   sync.Mutex
	next int
	hdrs map[index.Key]index.Header
	at   map[index.Key]int
}

func newArena(t testing.TB, size int) *arena {
	mem, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Fatalf("mmap: %v", err)
	}
	a := &arena{t: t, mem: mem, hdrs: make(map[index.Key]index.Header), at: make(map[index.Key]int)}
	t.Cleanup(func() { _ = unix.Munmap(mem) })
	return a
}

func (a *arena) Open(k index.Key) (index.Header, []byte, func(), error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	h, ok := a.hdrs[k]
	if !ok {
		return index.Header{}, nil, nil, transfer.ErrNotFound
	}
	off := a.at[k]
	return h, a.mem[off : off+int(h.Size) : off+int(h.Size)], func() {}, nil
}

func (a *arena) Reserve(h index.Header) ([]byte, func(bool) error, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.next+int(h.Size) > len(a.mem) {
		return nil, nil, fmt.Errorf("arena: full: %w", transfer.ErrFull)
	}
	off := a.next
	a.next += int(h.Size)
	return a.mem[off : off+int(h.Size) : off+int(h.Size)], func(ok bool) error {
		if ok {
			a.mu.Lock()
			a.hdrs[h.Key], a.at[h.Key] = h, off
			a.mu.Unlock()
		}
		return nil
	}, nil
}

// mappedCollector receives every block into an mmap'd buffer.
type mappedCollector struct {
	*transfertest.Collector
	mem  []byte
	next int
}

func (m *mappedCollector) Buffer(i int, h index.Header) []byte {
	_ = m.Collector.Buffer(i, h) // keep the contract checks
	b := m.mem[m.next : m.next+int(h.Size) : m.next+int(h.Size)]
	m.next += int(h.Size)
	m.Collector.Data[i] = b
	return b
}

func TestBlocksMoveBetweenMemoryOutsideTheGoHeap(t *testing.T) {
	for _, c := range tlsChoices {
		t.Run(c.name, func(t *testing.T) {
			a := newArena(t, 64<<20)
			tr := ucx.New(ucx.Options{TLS: c.tls})
			conn := transfertest.Dial(t, tr, transfertest.Listen(t, tr, a).Addr())
			sizes := []int{1, 4096, 100 << 10, 1<<20 + 17, 4 << 20, 0}
			blocks := make([]transfer.Block, len(sizes))
			keys := make([]index.Key, len(sizes))
			for i, n := range sizes {
				blocks[i] = transfertest.MakeBlock(index.Hash(i+1), n)
				keys[i] = blocks[i].Key
			}
			ctx := context.Background()
			errs, err := conn.Put(ctx, blocks)
			if err != nil {
				t.Fatalf("Put: %v", err)
			}
			for i, err := range errs {
				if err != nil {
					t.Fatalf("Put block %d: %v", i, err)
				}
			}
			dst := newArena(t, 16<<20)
			col := &mappedCollector{Collector: transfertest.NewCollector(len(keys)), mem: dst.mem}
			if err := conn.Get(ctx, keys, col); err != nil {
				t.Fatalf("Get: %v", err)
			}
			for _, p := range col.Problems {
				t.Errorf("Receiver contract: %s", p)
			}
			for i, b := range blocks {
				if col.Errs[i] != nil || !bytes.Equal(col.Data[i], b.Data) || col.Headers[i] != b.Header {
					t.Errorf("block %d (%d bytes): err %v, or bytes or header differ", i, len(b.Data), col.Errs[i])
				}
			}
		})
	}
}
