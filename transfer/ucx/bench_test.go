//go:build ucx

package ucx_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/kvstrata/kvstrata/transfer/transfertest"
	"github.com/kvstrata/kvstrata/transfer/ucx"
)

// BenchmarkGet measures Get throughput between a listener and a client in
// one process (two UCX workers, as two nodes would have): batches of 16
// blocks of each size, over 1 and 4 connections, every block checked
// against its checksum, over each UCX_TLS choice. MB/s counts block bytes;
// compare it with ucx_perftest on the same transports
// (bench/ucx-vs-perftest.sh).
func BenchmarkGet(b *testing.B) {
	for _, c := range tlsChoices {
		for _, size := range []int{64 << 10, 1 << 20, 4 << 20} {
			for _, conns := range []int{1, 4} {
				name := fmt.Sprintf("tls=%s/size=%s/conns=%d", c.name, transfertest.SizeName(size), conns)
				b.Run(name, func(b *testing.B) { transfertest.BenchGet(b, ucx.New(ucx.Options{TLS: c.tls}), size, conns) })
			}
		}
	}
}

// BenchmarkGetLatency measures the round trip of a Get of one 64 KiB block
// over an idle connection and reports its median and 99th percentile, over
// each UCX_TLS choice.
func BenchmarkGetLatency(b *testing.B) {
	for _, c := range tlsChoices {
		b.Run("tls="+c.name, func(b *testing.B) { transfertest.BenchGetLatency(b, ucx.New(ucx.Options{TLS: c.tls})) })
	}
}

// BenchmarkDial measures opening and closing a connection: a UCP context
// and worker, the hellos, the endpoints.
func BenchmarkDial(b *testing.B) {
	for _, c := range tlsChoices {
		b.Run("tls="+c.name, func(b *testing.B) {
			tr := ucx.New(ucx.Options{TLS: c.tls})
			ln := transfertest.Listen(b, tr, transfertest.NewStatic(1, 1))
			for b.Loop() {
				conn, err := tr.Dial(context.Background(), ln.Addr())
				if err != nil {
					b.Fatal(err)
				}
				_ = conn.Close()
			}
		})
	}
}
