package loadgen

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

func TestHistogramBucketsCoverEveryValueInOrder(t *testing.T) {
	values := []uint64{0, 1, 127, 128, 129, 255, 256, 257, 1000, 1 << 20, 1<<20 + 1, 1<<40 - 1, math.MaxInt64, math.MaxUint64}
	r := rand.New(rand.NewPCG(1, 2))
	for range 10000 {
		values = append(values, r.Uint64()>>r.IntN(64))
	}
	slices.Sort(values)
	prev := -1
	for _, v := range values {
		b := bucketOf(v)
		lo, hi := bucketBounds(b)
		if v < lo || v > hi {
			t.Fatalf("%d falls in bucket %d, which holds [%d, %d]", v, b, lo, hi)
		}
		if b < prev || b >= buckets {
			t.Fatalf("%d falls in bucket %d after bucket %d (of %d)", v, b, prev, buckets)
		}
		if width := hi - lo; v >= subCount && float64(width) > float64(lo)/subCount {
			t.Fatalf("bucket %d of %d is %d wide: over 1/%d of its values", b, v, width, subCount)
		}
		prev = b
	}
}

func TestHistogramQuantilesAreExactForSmallValues(t *testing.T) {
	var h Histogram
	for v := range 100 {
		h.Record(time.Duration(v + 1))
	}
	for _, c := range []struct {
		q    float64
		want time.Duration
	}{{0, 1}, {0.01, 1}, {0.5, 50}, {0.99, 99}, {0.999, 100}, {1, 100}} {
		if got := h.Quantile(c.q); got != c.want {
			t.Errorf("Quantile(%v) = %v, want %v", c.q, got, c.want)
		}
	}
	if h.Count() != 100 || h.Min() != 1 || h.Max() != 100 || h.Mean() != 50 {
		t.Errorf("count %d min %v max %v mean %v", h.Count(), h.Min(), h.Max(), h.Mean())
	}
}

func TestHistogramQuantilesAreWithinOnePercentAbove(t *testing.T) {
	// Latencies from 10µs to 1s, spread log-uniformly, in random order.
	r := rand.New(rand.NewPCG(3, 4))
	var h Histogram
	var exact []time.Duration
	for range 200000 {
		d := time.Duration(math.Exp(math.Log(10e3) + r.Float64()*(math.Log(1e9)-math.Log(10e3))))
		h.Record(d)
		exact = append(exact, d)
	}
	slices.Sort(exact)
	for _, q := range []float64{0.1, 0.5, 0.9, 0.99, 0.999, 0.9999} {
		want := exact[int(math.Ceil(q*float64(len(exact))))-1]
		got := h.Quantile(q)
		if got < want || float64(got) > float64(want)*(1+1.0/subCount) {
			t.Errorf("Quantile(%v) = %v, the exact one is %v: want it within +%.2f%%", q, got, want, 100.0/subCount)
		}
	}
	if h.Quantile(1) != exact[len(exact)-1] || h.Min() != exact[0] {
		t.Errorf("max %v min %v, want %v and %v", h.Quantile(1), h.Min(), exact[len(exact)-1], exact[0])
	}
}

func TestHistogramMergeEqualsRecordingIntoOne(t *testing.T) {
	var a, b, all Histogram
	for i := range 1000 {
		d := time.Duration(i*i) * time.Microsecond
		all.Record(d)
		if i%3 == 0 {
			a.Record(d)
		} else {
			b.Record(d)
		}
	}
	var merged Histogram
	merged.Merge(&a)
	merged.Merge(&Histogram{}) // an empty one changes nothing
	merged.Merge(&b)
	if merged != all {
		t.Fatalf("merged: n %d min %v max %v; recorded in one: n %d min %v max %v",
			merged.Count(), merged.Min(), merged.Max(), all.Count(), all.Min(), all.Max())
	}
}

func TestEmptyHistogramReportsZeros(t *testing.T) {
	var h Histogram
	if h.Quantile(0.5) != 0 || h.Max() != 0 || h.Mean() != 0 || h.Count() != 0 {
		t.Fatal("an empty histogram reports something")
	}
	var none *Histogram
	if none.Count() != 0 || none.Quantile(0.99) != 0 || none.Max() != 0 || none.Mean() != 0 {
		t.Fatal("a nil histogram reports something")
	}
	h.Merge(none)
	h.Record(-5)
	if h.Min() != 0 || h.Quantile(0.5) != 0 {
		t.Fatalf("a negative duration was not counted as zero: min %v", h.Min())
	}
}
