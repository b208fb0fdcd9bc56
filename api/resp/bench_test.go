package resp_test

import (
	"bytes"
	"fmt"
	"strconv"
	"testing"

	"github.com/kvstrata/kvstrata/api/resp/resptest"
)

// The benchmarks run a Go client against the server over loopback, one
// command at a time, with an in-memory store: they measure the server's
// per-request cost and copy path. bench/resp-vs-redis.sh sets them next
// to redis-server with redis-benchmark.

var benchSizes = []int{64 << 10, 1 << 20}

func sizeName(n int) string {
	if n >= 1<<20 {
		return fmt.Sprintf("%dMiB", n>>20)
	}
	return fmt.Sprintf("%dKiB", n>>10)
}

// setCommand encodes SET key <n bytes> once, so the client's cost per
// request is one write.
func setCommand(key string, n int) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n", len(key), key, n)
	b.Write(bytes.Repeat([]byte{'x'}, n))
	b.WriteString("\r\n")
	return b.Bytes()
}

func BenchmarkSet(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(sizeName(n), func(b *testing.B) {
			_, addr := startServer(b, resptest.NewMemStore(), nil)
			c := dial(b, addr)
			req := setCommand("key", n)
			b.SetBytes(int64(n))
			b.ResetTimer()
			for b.Loop() {
				if _, err := c.nc.Write(req); err != nil {
					b.Fatal(err)
				}
				if line, err := c.br.ReadString('\n'); err != nil || line != "+OK\r\n" {
					b.Fatalf("SET: %q, %v", line, err)
				}
			}
		})
	}
}

func BenchmarkGet(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(sizeName(n), func(b *testing.B) {
			_, addr := startServer(b, resptest.NewMemStore(), nil)
			c := dial(b, addr)
			if _, err := c.nc.Write(setCommand("key", n)); err != nil {
				b.Fatal(err)
			}
			c.read()
			req := []byte("*2\r\n$3\r\nGET\r\n$3\r\nkey\r\n")
			buf := make([]byte, n+2)
			b.SetBytes(int64(n))
			b.ResetTimer()
			for b.Loop() {
				if _, err := c.nc.Write(req); err != nil {
					b.Fatal(err)
				}
				v, err := c.readBulkInto(buf)
				if err != nil || len(v) != n {
					b.Fatalf("GET: %d bytes, %v; want %s", len(v), err, strconv.Itoa(n))
				}
			}
		})
	}
}
