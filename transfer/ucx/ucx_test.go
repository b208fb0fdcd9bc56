//go:build ucx

package ucx_test

import (
	"context"
	"os/exec"
	"strings"
	"testing"

	"github.com/kvstrata/kvstrata/transfer"
	"github.com/kvstrata/kvstrata/transfer/transfertest"
	"github.com/kvstrata/kvstrata/transfer/ucx"
)

// tlsChoices are the UCX transport lists the suite runs over: shared
// memory (posix for messages; cma is left out by UCX when endpoints ask for
// peer-failure handling) and TCP.
var tlsChoices = []struct{ name, tls string }{
	{"sm", "posix,cma,self"},
	{"tcp", "tcp"},
}

func TestConformance(t *testing.T) {
	for _, c := range tlsChoices {
		t.Run(c.name, func(t *testing.T) {
			transfertest.Run(t, transfertest.Factory{
				New: func(t *testing.T, lim transfertest.Limits) transfer.Transport {
					return ucx.New(ucx.Options{TLS: c.tls, MaxBlockSize: lim.MaxBlockSize, MaxBlocks: lim.MaxBlocks, MaxConns: lim.MaxConns})
				},
			})
		})
	}
}

// TestGetAllocatesNothingPerBlock checks the hot path on both sides: a Get
// of 16 blocks costs a handful of allocations, however many blocks it has.
func TestGetAllocatesNothingPerBlock(t *testing.T) {
	h := transfertest.NewStatic(16, 64<<10)
	tr := ucx.New(ucx.Options{TLS: "posix,cma,self"})
	c := transfertest.Dial(t, tr, transfertest.Listen(t, tr, h).Addr())
	r := transfertest.NewSink(16, 64<<10)
	ctx := context.Background()
	allocs := testing.AllocsPerRun(50, func() {
		if err := c.Get(ctx, h.Keys, r); err != nil || r.Err != nil {
			t.Fatalf("Get: %v, %v", err, r.Err)
		}
	})
	if allocs > 12 {
		t.Errorf("a Get of 16 blocks allocates %.1f times, want at most 12", allocs)
	}
}

// The listener says whether the UCX in use moves GPU memory itself; where
// ucx_info lists no CUDA transport (Debian's build), blocks in GPU memory
// are staged through host memory, and the listener says so.
func TestTheListenerSaysHowGPUMemoryTravels(t *testing.T) {
	h := transfertest.NewStatic(1, 4096)
	tr := ucx.New(ucx.Options{TLS: "posix,cma,self"})
	l := transfertest.Listen(t, tr, h)
	got := l.(interface{ Describe() string }).Describe()
	out, _ := exec.Command("ucx_info", "-d").Output() // ucx-utils, where installed
	want := ucx.DeviceMemoryDetail(false)
	if strings.Contains(string(out), "cuda_copy") {
		want = ucx.DeviceMemoryDetail(true)
	}
	if !strings.Contains(got, want) {
		t.Fatalf("Describe: %q; want it to say %q", got, want)
	}
}
