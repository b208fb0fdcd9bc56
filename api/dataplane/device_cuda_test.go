//go:build cuda

package dataplane

import (
	"bytes"
	"context"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/api/client/devmem"
	"github.com/kvstrata/kvstrata/api/node"
	"github.com/kvstrata/kvstrata/gpu/cuda"
	"github.com/kvstrata/kvstrata/gpu/cuda/cudatest"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/tiers"
	"github.com/kvstrata/kvstrata/tiers/dram"
	"github.com/kvstrata/kvstrata/tiers/hbm"
	"github.com/kvstrata/kvstrata/transfer"
	"github.com/kvstrata/kvstrata/transfer/tcp"
)

// Blocks held in a node's HBM tier reach a client's GPU memory over TCP,
// which moves host memory only: staged through the tier's pinned bounce
// buffers on the node and the client's on the way in.
func TestHBMBlocksReachDeviceMemoryOverTCP(t *testing.T) {
	testDeviceGets(t, tcp.New(tcp.Options{}), false)
}

var (
	cudaOnce sync.Once
	cudaHow  string
	cudaErr  error
)

// setupCUDA picks the driver once per test binary: the machine's, else
// the stand-in whose device memory is host memory.
func setupCUDA(t *testing.T) *cuda.Device {
	t.Helper()
	cudaOnce.Do(func() {
		dir, err := os.MkdirTemp("", "fakecuda")
		if err != nil {
			cudaErr = err
			return
		}
		cudaHow, cudaErr = cudatest.Setup(dir)
	})
	if cudaErr != nil {
		t.Skip(cudaErr)
	}
	t.Log("CUDA:", cudaHow)
	drv, err := cuda.Load()
	if err != nil {
		t.Fatal(err)
	}
	dev, err := drv.Open(0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	return dev
}

// hbmNode is a node whose hierarchy is an HBM tier over DRAM.
type hbmNode struct {
	h   *Handler
	n   *node.Node
	hbm *hbm.Tier
}

func newHBMNode(t *testing.T) *hbmNode {
	t.Helper()
	ht, err := hbm.Open(hbm.Config{Capacity: 8 << 20, PageSize: 64 << 10, MaxBlockSize: 1 << 20, Streams: 4})
	if err != nil {
		t.Fatal(err)
	}
	dt, err := dram.New(dram.Config{Capacity: 8 << 20, MaxBlockSize: 1 << 20})
	if err != nil {
		ht.Close()
		t.Fatal(err)
	}
	h, err := tiers.New(tiers.Config{Levels: []tiers.LevelConfig{{Kind: index.TierHBM, Tier: ht}, {Kind: index.TierDRAM, Tier: dt}}})
	if err != nil {
		t.Fatal(err)
	}
	n, err := node.New(h, node.Config{MaxBlockSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return &hbmNode{h: NewHandler(n, nil), n: n, hbm: ht}
}

// put stores blocks of the sizes given, with bytes of their own, and
// checks that they are in the HBM tier.
func (hn *hbmNode) put(t *testing.T, sizes ...int) ([]index.Key, [][]byte) {
	t.Helper()
	var keys []index.Key
	var data [][]byte
	for i, size := range sizes {
		b := make([]byte, size)
		for j := range b {
			b[j] = byte(i*31 + j*7 + j>>9)
		}
		k := index.Key{NS: 7, Hash: index.Hash(100 + i)}
		if err := hn.n.Put(index.Header{Key: k, Sum: index.Checksum(b), Meta: index.Meta{Size: uint32(size)}}, b); err != nil {
			t.Fatal(err)
		}
		if _, err := hn.hbm.Stat(k); err != nil {
			t.Fatalf("block %d is not in the HBM tier: %v", i, err)
		}
		keys, data = append(keys, k), append(data, b)
	}
	return keys, data
}

// bounceLent returns how many of the HBM tier's bounce buffers are lent out.
func (hn *hbmNode) bounceLent() int64 { return hn.hbm.Detail()["bounce_lent"] }

// waitBounces waits until the node has every bounce buffer back: a
// session that failed lets go of its blocks once UCX or the socket says
// the client is gone.
func (hn *hbmNode) waitBounces(t *testing.T) {
	t.Helper()
	if !hn.bouncesBackWithin(20 * time.Second) {
		t.Fatalf("the node still lends %d bounce buffers", hn.bounceLent())
	}
}

// bouncesBackWithin reports whether the node has every bounce buffer back
// within d.
func (hn *hbmNode) bouncesBackWithin(d time.Duration) bool {
	deadline := time.Now().Add(d)
	for hn.bounceLent() != 0 {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
	return true
}

// devReceiver receives every block into GPU memory of its own.
type devReceiver struct {
	s      *devmem.Stager
	ptrs   []cuda.DevPtr
	errs   []error
	done   []bool
	onDone func(i int)
}

func newDevReceiver(t *testing.T, dev *cuda.Device, s *devmem.Stager, sizes ...int) *devReceiver {
	t.Helper()
	r := &devReceiver{s: s, errs: make([]error, len(sizes)), done: make([]bool, len(sizes))}
	for _, size := range sizes {
		p, err := dev.Alloc(int64(size))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { dev.Free(p) })
		r.ptrs = append(r.ptrs, p)
	}
	return r
}

func (r *devReceiver) Buffer(i int, h index.Header) []byte {
	panic("Buffer called for a block DeviceBuffer took")
}

func (r *devReceiver) DeviceBuffer(i int, h index.Header) (transfer.DeviceTarget, bool) {
	return r.s.Dest(r.ptrs[i], true), true
}

func (r *devReceiver) Done(i int, h index.Header, err error) {
	r.errs[i], r.done[i] = err, true
	if r.onDone != nil {
		r.onDone(i)
	}
}

// armingReceiver fails the next CUDA copy once a block's header arrived.
type armingReceiver struct{ *devReceiver }

func (r armingReceiver) DeviceBuffer(i int, h index.Header) (transfer.DeviceTarget, bool) {
	cudatest.FailCopies(1)
	return r.devReceiver.DeviceBuffer(i, h)
}

// readBack copies n bytes of device memory at p into host memory.
func readBack(t *testing.T, dev *cuda.Device, p cuda.DevPtr, n int) []byte {
	t.Helper()
	st, err := dev.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	b := make([]byte, n)
	if err := st.DtoH(b, p); err != nil {
		t.Fatal(err)
	}
	if err := st.Sync(); err != nil {
		t.Fatal(err)
	}
	return b
}

// testDeviceGets runs the device-memory gets over tr: blocks in HBM into
// a client's GPU memory, a copy that fails on the node, one that fails on
// the client, and a client that goes away mid-get. parks says that tr may
// keep sends to a client that went away pending until its listener closes
// (UCX 1.13's flaw, in transfer/ucx's doc): the blocks they send, and
// their bounce buffers, come back then at the latest.
func testDeviceGets(t *testing.T, tr transfer.Transport, parks bool) {
	dev := setupCUDA(t)
	hn := newHBMNode(t)
	l, err := tr.Listen("127.0.0.1:0", hn.h)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	dial := func() transfer.Conn {
		c, err := tr.Dial(context.Background(), l.Addr())
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	sizes := []int{1 << 20, 4096, 300 << 10}
	keys, data := hn.put(t, sizes...)
	stager, err := devmem.New(dev, 2, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := stager.Close(); err != nil {
			t.Error(err)
		}
	}()

	t.Run("bytes", func(t *testing.T) {
		c := dial()
		defer c.Close()
		r := newDevReceiver(t, dev, stager, sizes...)
		if err := c.Get(context.Background(), keys, r); err != nil {
			t.Fatal(err)
		}
		for i := range keys {
			if !r.done[i] || r.errs[i] != nil {
				t.Fatalf("block %d: done %v, %v", i, r.done[i], r.errs[i])
			}
			if got := readBack(t, dev, r.ptrs[i], sizes[i]); !bytes.Equal(got, data[i]) {
				t.Fatalf("block %d: the bytes in device memory differ from those put", i)
			}
		}
		hn.waitBounces(t)
		if st := stager.Stats(); st.Lent != 0 || st.Staged+st.Direct < int64(sizes[0]+sizes[1]+sizes[2]) {
			t.Fatalf("client stager %+v", st)
		}
		direct, staged := hn.h.DeviceBytes()
		t.Logf("node: %d bytes direct, %d staged; %s", direct, staged, hn.h.DeviceDetail())
		if direct+staged < int64(sizes[0]+sizes[1]+sizes[2]) {
			t.Fatalf("node counted %d direct + %d staged bytes for %d sent", direct, staged, sizes[0]+sizes[1]+sizes[2])
		}
		if d := hn.hbm.Detail(); d["bounce_misses"] != 0 {
			t.Fatalf("hbm detail %v: a stage found the pool empty", d)
		}
	})

	t.Run("node copy fails", func(t *testing.T) {
		if !cudatest.FailCopies(1) {
			t.Skip("the machine's driver cannot be told to fail")
		}
		c := dial()
		defer c.Close()
		r := newDevReceiver(t, dev, stager, sizes[1])
		err := c.Get(context.Background(), keys[1:2], r)
		cudatest.FailCopies(0)
		if err != nil {
			t.Fatalf("the get failed as a whole: %v", err)
		}
		if !r.done[0] || r.errs[0] == nil || !strings.Contains(r.errs[0].Error(), "bounce buffer") {
			t.Fatalf("block: done %v, error %v; want the node's failed copy into a bounce buffer", r.done[0], r.errs[0])
		}
		t.Log("block error:", r.errs[0])
		hn.waitBounces(t)
		if st := stager.Stats(); st.Lent != 0 {
			t.Fatalf("client stager %+v", st)
		}
	})

	t.Run("client copy fails", func(t *testing.T) {
		if !cudatest.FailCopies(0) {
			t.Skip("the machine's driver cannot be told to fail")
		}
		c := dial()
		defer c.Close()
		// The node's copy out of HBM comes before the block's header
		// leaves; the client's copy into its device memory after the
		// header arrived: fail that one.
		r := newDevReceiver(t, dev, stager, sizes[1])
		rr := armingReceiver{r}
		err := c.Get(context.Background(), keys[1:2], rr)
		cudatest.FailCopies(0)
		if err != nil {
			t.Fatalf("the get failed as a whole: %v", err)
		}
		if !r.done[0] || r.errs[0] == nil || !strings.Contains(r.errs[0].Error(), "device") {
			t.Fatalf("block: done %v, error %v; want the client's failed copy to the device", r.done[0], r.errs[0])
		}
		t.Log("block error:", r.errs[0])
		hn.waitBounces(t)
		if st := stager.Stats(); st.Lent != 0 {
			t.Fatalf("client stager %+v", st)
		}
	})

	t.Run("client goes away", func(t *testing.T) {
		// A get of 32 MiB, far more than the socket and UCX buffer, that
		// its client abandons (its ctx ends, which closes the connection)
		// as soon as the first block is in.
		c := dial()
		defer c.Close()
		many := make([]index.Key, 32)
		msizes := make([]int, len(many))
		for i := range many {
			many[i], msizes[i] = keys[0], sizes[0]
		}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		r := newDevReceiver(t, dev, stager, msizes...)
		r.onDone = func(i int) {
			if i == 0 {
				cancel()
			}
		}
		err := c.Get(ctx, many, r)
		if err == nil {
			t.Fatal("a get whose client went away mid-way succeeded")
		}
		t.Log("get:", err)
		if !r.done[0] || r.done[len(many)-1] {
			t.Fatalf("blocks done: %v; want the first only, or a few", r.done)
		}
		if st := stager.Stats(); st.Lent != 0 {
			t.Fatalf("client stager %+v after the get", st)
		}
		if parks && !hn.bouncesBackWithin(5*time.Second) {
			t.Logf("%d bounce buffers still lent to sends UCX keeps pending; closing the listener", hn.bounceLent())
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
		}
		hn.waitBounces(t)
	})
}
