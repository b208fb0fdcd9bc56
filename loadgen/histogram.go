package loadgen

import (
	"math/bits"
	"time"
)

// subBits sets the histogram's precision: every power of two above
// 2^subBits is split into 2^subBits buckets of equal width, so a recorded
// value and the bucket bound reported for it differ by less than 1/2^subBits
// of the value (0.8%).
const subBits = 7

const (
	subCount = 1 << subBits
	// buckets: the values below subCount, exactly, then subCount buckets
	// for each of the powers of two from 2^subBits to 2^63.
	buckets = subCount + (64-subBits)*subCount
)

// Histogram counts durations in log-linear buckets, in the manner of
// HdrHistogram: a fixed 58 KiB whatever it records, with quantiles good to
// 0.8%. The zero value is empty and ready to use.
//
// A Histogram is not safe for concurrent use: give each goroutine its own
// and Merge them once they are done. Its read methods are safe on a nil
// Histogram, which is empty.
type Histogram struct {
	counts   [buckets]uint64
	n        uint64
	sum      float64 // nanoseconds
	min, max time.Duration
}

// bucketOf returns the bucket that holds v nanoseconds (v ≥ 0).
func bucketOf(v uint64) int {
	if v < subCount {
		return int(v)
	}
	e := bits.Len64(v) - 1 // v is in [2^e, 2^(e+1)), e ≥ subBits
	shift := e - subBits
	sub := int(v>>shift) - subCount // in [0, subCount)
	return subCount + shift*subCount + sub
}

// bucketBounds returns the smallest and the largest value of bucket i.
func bucketBounds(i int) (lo, hi uint64) {
	if i < subCount {
		return uint64(i), uint64(i)
	}
	shift := (i - subCount) / subCount
	sub := uint64((i-subCount)%subCount) + subCount
	lo = sub << shift
	return lo, lo + (1 << shift) - 1
}

// Record adds one duration; a negative one counts as zero.
func (h *Histogram) Record(d time.Duration) {
	d = max(d, 0)
	h.counts[bucketOf(uint64(d))]++
	if h.n == 0 || d < h.min {
		h.min = d
	}
	h.max = max(h.max, d)
	h.n++
	h.sum += float64(d)
}

// Merge adds every value o recorded.
func (h *Histogram) Merge(o *Histogram) {
	if o.Count() == 0 {
		return
	}
	for i, c := range o.counts {
		h.counts[i] += c
	}
	if h.n == 0 || o.min < h.min {
		h.min = o.min
	}
	h.max = max(h.max, o.max)
	h.n += o.n
	h.sum += o.sum
}

// Count returns how many durations were recorded.
func (h *Histogram) Count() uint64 {
	if h == nil {
		return 0
	}
	return h.n
}

// Min returns the smallest duration recorded; 0 when empty.
func (h *Histogram) Min() time.Duration {
	if h == nil {
		return 0
	}
	return h.min
}

// Max returns the largest duration recorded; 0 when empty.
func (h *Histogram) Max() time.Duration {
	if h == nil {
		return 0
	}
	return h.max
}

// Mean returns the exact mean; 0 when empty.
func (h *Histogram) Mean() time.Duration {
	if h.Count() == 0 {
		return 0
	}
	return time.Duration(h.sum / float64(h.n))
}

// Quantile returns the duration that q of the recorded ones (0 ≤ q ≤ 1)
// do not exceed: the upper bound of the bucket that holds the value of
// rank ⌈q·n⌉, capped at Max, so it is never below the true quantile and at
// most 0.8% above it. Quantile(1) is Max; an empty histogram gives 0.
func (h *Histogram) Quantile(q float64) time.Duration {
	if h.Count() == 0 {
		return 0
	}
	q = min(max(q, 0), 1)
	rank := uint64(q * float64(h.n))
	if float64(rank) < q*float64(h.n) {
		rank++
	}
	rank = max(rank, 1)
	var seen uint64
	for i, c := range h.counts {
		if seen += c; seen >= rank {
			_, hi := bucketBounds(i)
			return min(time.Duration(hi), h.max)
		}
	}
	return h.max
}
