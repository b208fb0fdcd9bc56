package kvconn

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvstrata/kvstrata/api/client"
	"github.com/kvstrata/kvstrata/api/nodetest"
	"github.com/kvstrata/kvstrata/index"
)

// BenchmarkLoad onboards a prompt of 16 blocks of 2 MiB (a block of 16
// tokens of a Llama-3-8B-shaped model: 32 layers, K and V, 8 KV heads of
// 128 bf16) from an in-process node over the TCP data plane, three ways
// side by side: Conn.Load into the engine's buffers, client.GetFunc into
// the same buffers (the floor: what the connector wraps), and a plain
// client.GetFunc into buffers of its own.
func BenchmarkLoad(b *testing.B) {
	const (
		blocks = 16
		size   = 2 << 20
	)
	n := nodetest.Start(b, nodetest.Options{DRAMBytes: 2 * blocks * size})
	ctx := context.Background()
	cl, err := client.Dial(ctx, n.Addr, client.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	ns := index.NamespaceID(1)
	hashes := make([]index.Hash, blocks)
	data := make([][]byte, blocks)
	keys := make([]index.Key, blocks)
	for i := range hashes {
		hashes[i], keys[i] = index.Hash(i+1), index.Key{NS: ns, Hash: index.Hash(i + 1)}
		data[i] = make([]byte, size)
		for j := range data[i] {
			data[i][j] = byte(i + j*3)
		}
	}
	if err := cl.Put(ctx, client.Chain(ns, hashes, data)); err != nil {
		b.Fatal(err)
	}
	c, err := New(ctx, Config{Addr: n.Addr, Registerer: prometheus.NewRegistry()})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	dst := make([][]byte, blocks)
	for i := range dst {
		dst[i] = make([]byte, size)
	}

	run := func(b *testing.B, load func() int) {
		b.ResetTimer()
		for b.Loop() {
			if got := load(); got != blocks {
				b.Fatalf("loaded %d of %d blocks", got, blocks)
			}
		}
		b.ReportMetric(float64(blocks*size)*float64(b.N)/b.Elapsed().Seconds()/1e6, "MB/s")
	}
	b.Run("kvconn-load", func(b *testing.B) {
		run(b, func() int {
			got, err := c.Load(ctx, "", ns, hashes, func(i int) []byte { return dst[i] })
			if err != nil {
				b.Fatal(err)
			}
			return got
		})
	})
	getFunc := func(b *testing.B, opts client.GetOptions) func() int {
		return func() int {
			got := 0
			err := cl.GetFunc(ctx, keys, opts, func(i int, r client.Result) error {
				if r.Found {
					got++
				}
				return nil
			})
			if err != nil {
				b.Fatal(err)
			}
			return got
		}
	}
	b.Run("client-getfunc-into-buffers", func(b *testing.B) {
		run(b, getFunc(b, client.GetOptions{StopAtMiss: true, Buffer: func(i, _ int) []byte { return dst[i] }}))
	})
	b.Run("client-getfunc-own-buffers", func(b *testing.B) {
		run(b, getFunc(b, client.GetOptions{StopAtMiss: true}))
	})
}
