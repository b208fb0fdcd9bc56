package tcp_test

import (
	"fmt"
	"testing"

	"github.com/kvstrata/kvstrata/transfer/tcp"
	"github.com/kvstrata/kvstrata/transfer/transfertest"
)

// BenchmarkGet measures Get throughput over loopback: batches of 16 blocks
// of each size, over 1 and over 4 connections in parallel, every block
// checked against its checksum. MB/s counts block bytes; compare it with
// iperf3 on loopback (bench/transfer-vs-iperf3.sh).
func BenchmarkGet(b *testing.B) {
	for _, size := range []int{64 << 10, 1 << 20, 4 << 20} {
		for _, conns := range []int{1, 4} {
			name := fmt.Sprintf("size=%s/conns=%d", transfertest.SizeName(size), conns)
			b.Run(name, func(b *testing.B) { transfertest.BenchGet(b, tcp.New(tcp.Options{}), size, conns) })
		}
	}
}

// BenchmarkPut measures Put throughput over loopback: batches of 16 blocks
// of each size into a handler that keeps nothing, each block hashed as it
// arrives and checked against its checksum.
func BenchmarkPut(b *testing.B) {
	for _, size := range []int{64 << 10, 1 << 20, 4 << 20} {
		for _, conns := range []int{1, 4} {
			name := fmt.Sprintf("size=%s/conns=%d", transfertest.SizeName(size), conns)
			b.Run(name, func(b *testing.B) { transfertest.BenchPut(b, tcp.New(tcp.Options{}), size, conns) })
		}
	}
}

// BenchmarkGetLatency measures the round trip of a Get of one 64 KiB block
// over an idle connection and reports its median and 99th percentile.
func BenchmarkGetLatency(b *testing.B) {
	transfertest.BenchGetLatency(b, tcp.New(tcp.Options{}))
}
