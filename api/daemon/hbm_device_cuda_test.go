//go:build cuda

package daemon_test

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/kvstrata/kvstrata/api/client"
	"github.com/kvstrata/kvstrata/api/client/devmem"
	"github.com/kvstrata/kvstrata/gpu/cuda"
	"github.com/kvstrata/kvstrata/index"
)

// The Go client gets blocks held in a node's HBM tier straight into GPU
// memory it owns (GetOptions.Device), and the node's stats say how the
// bytes left the GPU.
func TestHBMBlocksIntoTheClientsDeviceMemory(t *testing.T) {
	c := hbmNode(t, "8MiB")

	var blocks []client.Block
	for i := range 4 {
		data := bytes.Repeat([]byte{byte(i + 1), byte(i * 3)}, 256<<10)
		blocks = append(blocks, client.Block{Key: index.Key{NS: 1, Hash: index.Hash(i + 1)}, Data: data})
	}
	if err := c.Put(context.Background(), blocks); err != nil {
		t.Fatal(err)
	}
	keys := make([]index.Key, len(blocks))
	for i, b := range blocks {
		keys[i] = b.Key
	}

	drv, err := cuda.Load()
	if err != nil {
		t.Fatal(err)
	}
	dev, err := drv.Open(0)
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	s, err := devmem.New(dev, 2, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ptrs := make([]cuda.DevPtr, len(blocks))
	for i, b := range blocks {
		if ptrs[i], err = dev.Alloc(int64(len(b.Data))); err != nil {
			t.Fatal(err)
		}
		defer dev.Free(ptrs[i])
	}
	opts := client.GetOptions{Device: func(i, size int) (client.DeviceDest, bool) { return s.Dest(ptrs[i], true), true }}
	err = c.GetFunc(context.Background(), keys, opts, func(i int, r client.Result) error {
		if !r.Found || !r.Device || r.Data != nil {
			t.Errorf("block %d: found %v, in device memory %v, %d bytes of Data", i, r.Found, r.Device, len(r.Data))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	st, err := dev.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for i, b := range blocks {
		got := make([]byte, len(b.Data))
		if err := st.DtoH(got, ptrs[i]); err != nil {
			t.Fatal(err)
		}
		if err := st.Sync(); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, b.Data) {
			t.Fatalf("block %d: the bytes in device memory differ from those put", i)
		}
	}
	if ss := s.Stats(); ss.Lent != 0 || ss.Staged != int64(len(blocks)*len(blocks[0].Data)) {
		t.Fatalf("stager %+v: want every byte staged through it and every buffer back", ss)
	}

	stats, err := c.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	d := stats.GetNode().GetTransportDetail()
	t.Log("transport detail:", d)
	if !strings.Contains(d, "device memory: staged through pinned host memory") || !strings.Contains(d, "device bytes sent: 0 direct") ||
		strings.Contains(d, "0 direct, 0 staged") {
		t.Fatalf("transport detail %q: want device memory staged, and the staged bytes counted", d)
	}
}
