//go:build cuda

package hbm

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/gpu/cuda/cudatest"
	"github.com/kvstrata/kvstrata/gpu/cufile/cufiletest"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/tiers"
	"github.com/kvstrata/kvstrata/tiers/dram"
	"github.com/kvstrata/kvstrata/tiers/policy"
	"github.com/kvstrata/kvstrata/tiers/tiertest"
)

// skip says why the tests cannot run (no driver to be had), skipCuFile
// why those of cuFile reads cannot (no cuFile library to be had).
var skip, skipCuFile string

func TestMain(m *testing.M) {
	dir, _ := os.MkdirTemp("", "hbmtest")
	how, err := cudatest.Setup(dir)
	if err != nil {
		skip = err.Error()
	} else {
		fmt.Println("hbm tests run on", how)
		if lib, err := cufiletest.Setup(dir); err != nil {
			skipCuFile = err.Error()
			fmt.Println("hbm tests of cuFile reads skipped:", skipCuFile)
		} else {
			fmt.Println("hbm tests of cuFile reads run on", lib)
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func open(tb testing.TB, cfg Config) *Tier {
	tb.Helper()
	if skip != "" {
		tb.Skip(skip)
	}
	tr, err := Open(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	return tr
}

var factory = tiertest.Factory{
	New: func(tb testing.TB, capacity, maxBlock int64) tiers.Tier {
		return open(tb, Config{Capacity: capacity, MaxBlockSize: maxBlock, PageSize: 4096})
	},
	Overhead:  4095,
	Unchecked: true, // device memory is trusted, as DRAM is
}

func TestConformance(t *testing.T) { tiertest.Run(t, factory) }

func TestBadConfigIsRefusedBeforeTheDeviceIsTouched(t *testing.T) {
	for _, cfg := range []Config{{}, {Capacity: 1 << 20, PageSize: 1000}, {Capacity: 1 << 20, MaxBlockSize: 2 << 20}, {Capacity: 1 << 20, Streams: -1}} {
		if _, err := Open(cfg); !errors.Is(err, tiers.ErrInvalidConfig) {
			t.Errorf("Open(%+v): %v; want ErrInvalidConfig", cfg, err)
		}
	}
}

func TestAPoolLargerThanTheDeviceIsRefused(t *testing.T) {
	if skip != "" {
		t.Skip(skip)
	}
	_, err := Open(Config{Capacity: 1 << 50, MaxBlockSize: 1 << 20})
	if !errors.Is(err, tiers.ErrInvalidConfig) {
		t.Fatalf("a 1 PiB pool: %v; want ErrInvalidConfig naming the free memory", err)
	}
}

// A device view's address stays the block's while it is held, even after
// the block is deleted and its room is wanted again.
func TestADeviceViewKeepsItsPagesUntilReleased(t *testing.T) {
	tr := open(t, Config{Capacity: 64 << 10, PageSize: 4096, MaxBlockSize: 64 << 10})
	defer tr.Close()
	m, v := tiertest.Block(1, 64<<10)
	if err := tr.Put(m, v); err != nil {
		t.Fatal(err)
	}
	dv, err := tr.DeviceView(m.Key, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if dv.Pointer() == 0 || dv.Meta().Key != m.Key {
		t.Fatalf("view at %#x of %v", dv.Pointer(), dv.Meta().Key)
	}
	if err := tr.Delete(m.Key); err != nil {
		t.Fatal(err)
	}
	m2, v2 := tiertest.Block(2, 64<<10)
	if err := tr.Put(m2, v2); !errors.Is(err, tiers.ErrFull) {
		t.Fatalf("a put while the only pages are viewed: %v; want ErrFull", err)
	}
	dv.Release()
	if err := tr.Put(m2, v2); err != nil {
		t.Fatalf("after the release: %v", err)
	}
}

// Above a DRAM tier in a hierarchy, the HBM tier pins DRAM's arena, and
// blocks demoted out of HBM and promoted back keep their bytes.
func TestBlocksMoveBetweenHBMAndPinnedDRAM(t *testing.T) {
	hb := open(t, Config{Capacity: 1 << 20, PageSize: 4096, MaxBlockSize: 256 << 10})
	d, err := dram.New(dram.Config{Capacity: 32 << 20, MaxBlockSize: 256 << 10})
	if err != nil {
		t.Fatal(err)
	}
	lru := func() policy.Policy { p, _ := policy.New("lru"); return p }
	h, err := tiers.New(tiers.Config{Node: 1, Inline: true, Levels: []tiers.LevelConfig{
		{Kind: index.TierHBM, Tier: hb, Policy: lru()},
		{Kind: index.TierDRAM, Tier: d, Policy: lru()},
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if got := hb.Detail()["pinned_host_bytes"]; got != int64(len(d.HostArena())) {
		t.Fatalf("pinned %d bytes of host memory; want DRAM's arena, %d", got, len(d.HostArena()))
	}
	want := map[index.Key][]byte{}
	for i := range 32 { // 8 MiB through a 1 MiB HBM tier
		m, v := tiertest.Block(index.Hash(i+1), 256<<10)
		if err := h.Put(m, v); err != nil {
			t.Fatal(err)
		}
		want[m.Key] = v
	}
	st := h.Stats()
	if st.Levels[0].Evictions == 0 || st.Levels[1].Blocks == 0 {
		t.Fatalf("nothing was demoted out of HBM: %+v", st.Levels)
	}
	for k, v := range want {
		got, _, _, err := h.Get(k, nil)
		if err != nil {
			t.Fatalf("%v: %v", k, err)
		}
		if !bytes.Equal(got, v) {
			t.Fatalf("%v came back different", k)
		}
	}
}
