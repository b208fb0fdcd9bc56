package index

import (
	"bytes"
	"fmt"
	"testing"
)

func TestCopySumCopiesAndHashesInOnePass(t *testing.T) {
	for _, n := range []int{0, 1, 31, sumPiece - 1, sumPiece, sumPiece + 1, 3*sumPiece + 17, 1 << 20} {
		src := make([]byte, n)
		for i := range src {
			src[i] = byte(i*7 + i>>9)
		}
		dst := make([]byte, n+5)
		d := NewDigest()
		_, _ = d.Write([]byte("header"))
		if got := CopySum(d, dst, src); got != n {
			t.Fatalf("%d bytes: copied %d", n, got)
		}
		if !bytes.Equal(dst[:n], src) || !bytes.Equal(dst[n:], make([]byte, 5)) {
			t.Fatalf("%d bytes: dst is not src followed by the untouched rest", n)
		}
		if want := Checksum(append([]byte("header"), src...)); d.Sum64() != want {
			t.Fatalf("%d bytes: sum %016x, want %016x", n, d.Sum64(), want)
		}
	}
}

func TestCopySumStopsAtTheShorterSlice(t *testing.T) {
	src := []byte("0123456789")
	dst := make([]byte, 4)
	d := NewDigest()
	if n := CopySum(d, dst, src); n != 4 || string(dst) != "0123" || d.Sum64() != Checksum([]byte("0123")) {
		t.Fatalf("copied %d: %q, sum %016x", n, dst, d.Sum64())
	}
}

// BenchmarkCopySum compares the fused pass with hashing and then copying,
// which reads the bytes twice.
func BenchmarkCopySum(b *testing.B) {
	for _, n := range []int{64 << 10, 1 << 20} {
		src, dst := make([]byte, n), make([]byte, n)
		b.Run(fmt.Sprintf("fused/%dKiB", n>>10), func(b *testing.B) {
			b.SetBytes(int64(n))
			d := NewDigest()
			for b.Loop() {
				d.Reset()
				CopySum(d, dst, src)
			}
		})
		b.Run(fmt.Sprintf("hash-then-copy/%dKiB", n>>10), func(b *testing.B) {
			b.SetBytes(int64(n))
			for b.Loop() {
				_ = Checksum(src)
				copy(dst, src)
			}
		})
	}
}
