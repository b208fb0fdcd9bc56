package tcp_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/transfer"
	"github.com/kvstrata/kvstrata/transfer/tcp"
	"github.com/kvstrata/kvstrata/transfer/transfertest"
)

func TestConformance(t *testing.T) {
	transfertest.Run(t, transfertest.Factory{
		New: func(t *testing.T, lim transfertest.Limits) transfer.Transport {
			return tcp.New(tcp.Options{MaxBlockSize: lim.MaxBlockSize, MaxBlocks: lim.MaxBlocks, MaxConns: lim.MaxConns})
		},
	})
}

func TestZeroOptionsAreTheDefaults(t *testing.T) {
	var o tcp.Options
	o.EnsureDefaults()
	if err := o.Validate(); err != nil {
		t.Fatalf("defaults do not validate: %v", err)
	}
	if o.MaxBlockSize != 4<<20 || o.MaxBlocks != 1024 || o.MaxConns != 1024 {
		t.Errorf("defaults = %+v, want 4 MiB blocks, 1024 blocks a request, 1024 connections", o)
	}
}

func TestValidateReportsEveryProblem(t *testing.T) {
	o := tcp.Options{MaxBlockSize: 2 << 30, MaxBlocks: -1, MaxConns: -5, ReadBufferSize: -1, IdleTimeout: -time.Second}
	o.EnsureDefaults()
	err := o.Validate()
	if !errors.Is(err, tcp.ErrInvalidOptions) {
		t.Fatalf("Validate = %v, want ErrInvalidOptions", err)
	}
	for _, field := range []string{"MaxBlockSize", "MaxBlocks", "MaxConns", "ReadBufferSize", "IdleTimeout"} {
		if !strings.Contains(err.Error(), field) {
			t.Errorf("%q does not name %s", err, field)
		}
	}
}

func TestInvalidOptionsFailListenAndDial(t *testing.T) {
	tr := tcp.New(tcp.Options{MaxBlocks: -1})
	if _, err := tr.Listen("127.0.0.1:0", transfertest.NewMemory()); !errors.Is(err, tcp.ErrInvalidOptions) {
		t.Errorf("Listen = %v, want ErrInvalidOptions", err)
	}
	if _, err := tr.Dial(context.Background(), "127.0.0.1:1"); !errors.Is(err, tcp.ErrInvalidOptions) {
		t.Errorf("Dial = %v, want ErrInvalidOptions", err)
	}
}

// TestGetAllocatesNothingPerBlock checks the hot path on both sides: a Get
// of 16 blocks costs a handful of allocations, however many blocks it has.
func TestGetAllocatesNothingPerBlock(t *testing.T) {
	h := transfertest.NewStatic(16, 64<<10)
	ln := transfertest.Listen(t, tcp.New(tcp.Options{}), h)
	c := transfertest.Dial(t, tcp.New(tcp.Options{}), ln.Addr())
	r := transfertest.NewSink(16, 64<<10)
	ctx := context.Background()
	allocs := testing.AllocsPerRun(50, func() {
		if err := c.Get(ctx, h.Keys, r); err != nil || r.Err != nil {
			t.Fatalf("Get: %v, %v", err, r.Err)
		}
	})
	if allocs > 4 {
		t.Errorf("a Get of 16 blocks allocates %.1f times, want at most 4", allocs)
	}
}
