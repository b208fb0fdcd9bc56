package respnode_test

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"testing"

	"github.com/kvstrata/kvstrata/api/nodetest"
	"github.com/kvstrata/kvstrata/api/resp"
	"github.com/kvstrata/kvstrata/api/resp/respnode"
)

// keyStoreOnly hides a Store's resp.SetReserver: the server then reads
// every value into a buffer of its own and copies it into the tier.
type keyStoreOnly struct{ resp.KeyStore }

// BenchmarkRESPSet sends SETs of one key over loopback from 8
// connections, as redis-benchmark -c 8 -t set does, to a server over a
// node's Store: with the value read straight into the DRAM reservation
// (reserved) and, for comparison, into the server's buffer first
// (buffered).
func BenchmarkRESPSet(b *testing.B) {
	for _, size := range []int{64 << 10, 1 << 20} {
		for _, c := range []struct {
			name  string
			store func(*respnode.Store) resp.Store
		}{
			{"buffered", func(s *respnode.Store) resp.Store { return keyStoreOnly{s} }},
			{"reserved", func(s *respnode.Store) resp.Store { return s }},
		} {
			b.Run(fmt.Sprintf("%dKiB/%s", size>>10, c.name), func(b *testing.B) {
				n := nodetest.Start(b, nodetest.Options{DRAMBytes: 256 << 20, SSDBytes: 256 << 20})
				addr := serve(b, c.store(respnode.New(n.Node)))
				var cmd bytes.Buffer
				fmt.Fprintf(&cmd, "*3\r\n$3\r\nSET\r\n$16\r\nkey:__rand_int__\r\n$%d\r\n", size)
				cmd.Write(bytes.Repeat([]byte{'x'}, size))
				cmd.WriteString("\r\n")
				req := cmd.Bytes()
				b.SetBytes(int64(size))
				b.SetParallelism(4) // 8 connections on 2 cores
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					nc, err := net.Dial("tcp", addr)
					if err != nil {
						b.Error(err)
						return
					}
					defer nc.Close()
					br := bufio.NewReader(nc)
					for pb.Next() {
						if _, err := nc.Write(req); err != nil {
							b.Error(err)
							return
						}
						if line, err := br.ReadString('\n'); err != nil || line != "+OK\r\n" {
							b.Errorf("SET: %q, %v", line, err)
							return
						}
					}
				})
			})
		}
	}
}

// serve serves store over RESP on a loopback port until the benchmark ends.
func serve(b *testing.B, store resp.Store) string {
	srv, err := resp.NewServer(store, nil)
	if err != nil {
		b.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go srv.Serve(ln)
	b.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}
