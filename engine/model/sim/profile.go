package sim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strings"
	"time"
)

// Profile is how long a model's steps take: the file a profiler writes, the
// sim model replays and the planner reads. Its JSON form, version 2:
//
//	{
//	  "version": 2,
//	  "source": "kvstrata profile http://127.0.0.1:8000 2026-12-02T04:00:00Z",
//	  "prefill": {"points": [[128, 18.4], [512, 24.4], [2048, 49.3]]},
//	  "decode":  {"poly": [5.74, 54.01, -25.74], "per_seq_ms": 0.01, "min_ms": 1},
//	  "worker":  {"kv_tokens": 65536, "block_tokens": 16, "max_num_seqs": 256, "max_num_batched_tokens": 2048},
//	  "sweep": {
//	    "prefill": [{"isl": 8192, "ttft_ms": 198.2}],
//	    "decode":  [{"concurrency": 8, "context": 4096, "itl_ms": 12.4}]
//	  }
//	}
//
// "prefill" gives a prefill step's milliseconds as a function of x = the
// batch's new (uncached) tokens; "decode" gives a decode step's
// milliseconds as a function of x = p, the active KV fraction (the batch's
// KV tokens / the model's KV capacity, in [0, 1]). Each is a Curve; both
// are required.
//
// "worker" (optional) is the worker the profile was measured on: its KV
// pool in tokens, its block size, and its batch limits (WorkerLimits); p
// above is a fraction of its kv_tokens. "sweep" (optional) is the raw
// measurements the curves were fitted to (Sweep): time to first token
// against input length at batch 1, and inter-token latency against
// concurrency and context length. The sim engine ignores both; the
// planner sizes workers by "worker"; plots are drawn from "sweep".
//
// Version 1 (the version 0 or no version is read as) is the same without
// "worker" and "sweep": a version-1 file with either is an error, as is a
// version this reader does not know. Unknown fields are errors, so a
// misspelt field is not silently ignored.
type Profile struct {
	// Version is the format's version: 1 or 2 (0 is read as 1).
	Version int `json:"version,omitempty"`
	// Source says where the numbers come from: a paper, a profiler run.
	Source  string `json:"source,omitempty"`
	Prefill Curve  `json:"prefill"`
	Decode  Curve  `json:"decode"`
	// Worker is the worker the profile was measured on (version 2); nil:
	// unknown, the reader takes its own limits.
	Worker *WorkerLimits `json:"worker,omitempty"`
	// Sweep is the measurements the curves were fitted to (version 2).
	Sweep *Sweep `json:"sweep,omitempty"`
}

// Sweep is a profiler's raw measurements, kept beside the curves fitted
// to them so that they can be drawn, checked and fitted again.
type Sweep struct {
	// Prefill is time to first token against input length, one request
	// at a time, nothing cached.
	Prefill []PrefillPoint `json:"prefill,omitempty"`
	// Decode is inter-token latency against concurrency and context.
	Decode []DecodePoint `json:"decode,omitempty"`
}

// PrefillPoint is one prompt length's time to first token: ttft_ms
// milliseconds for a prompt of isl tokens, at batch 1.
type PrefillPoint struct {
	ISL    int     `json:"isl"`
	TTFTMs float64 `json:"ttft_ms"`
}

// DecodePoint is the mean time between two tokens, itl_ms milliseconds,
// of concurrency sequences decoding together with context tokens of
// context each (prompt and output so far, on average over the measured
// tokens).
type DecodePoint struct {
	Concurrency int     `json:"concurrency"`
	Context     int     `json:"context"`
	ITLMs       float64 `json:"itl_ms"`
}

// Curve is a step time in milliseconds as a function of x and the batch
// size b:
//
//	ms = max(f(x) + per_seq_ms·b, min_ms, 0)
//
// f is either a polynomial, "poly": [c0, c1, c2, …] meaning
// c0 + c1·x + c2·x² + …, or a table, "points": [[x, ms], …] with x strictly
// increasing, interpolated linearly between points and extended linearly
// past either end along the nearest segment. Exactly one of the two is
// given. A time longer than MaxStep is read as MaxStep.
type Curve struct {
	Poly     []float64    `json:"poly,omitempty"`
	Points   [][2]float64 `json:"points,omitempty"`
	PerSeqMs float64      `json:"per_seq_ms,omitempty"`
	MinMs    float64      `json:"min_ms,omitempty"`
}

// WorkerLimits are the batch limits and KV pool a profile was measured
// with, which the planner and the configurator size workers by. A zero
// field is unknown: the reader takes its own default.
type WorkerLimits struct {
	KVTokens            int `json:"kv_tokens,omitempty"`
	BlockTokens         int `json:"block_tokens,omitempty"`
	MaxNumSeqs          int `json:"max_num_seqs,omitempty"`
	MaxNumBatchedTokens int `json:"max_num_batched_tokens,omitempty"`
}

// MaxStep is the longest step a curve yields, so that a wild profile
// cannot overflow a time.Duration.
const MaxStep = time.Hour

// MaxPolyDegree is the highest degree of a polynomial curve.
const MaxPolyDegree = 8

// ErrBadProfile marks a profile that cannot be read or fails Validate.
var ErrBadProfile = errors.New("sim: bad profile")

// DefaultProfile is the polynomial NVIDIA Dynamo's mocker publishes for its
// simulated engine (see the package doc).
func DefaultProfile() Profile {
	return Profile{
		Version: 1,
		Source:  "NVIDIA Dynamo mocker, default performance model: prefill ms = 4.209989e-7·T² + 1.518344e-2·T + 16.50142; decode ms = -25.74·p² + 54.01·p + 5.74, at least 1 ms",
		Prefill: Curve{Poly: []float64{16.50142, 1.518344e-2, 4.209989e-7}},
		Decode:  Curve{Poly: []float64{5.74, 54.01, -25.74}, MinMs: 1},
	}
}

// At is the curve's time for x with a batch of b sequences.
func (c Curve) At(x float64, b int) time.Duration {
	ms := c.f(x) + c.PerSeqMs*float64(b)
	ms = max(ms, c.MinMs, 0)
	if math.IsNaN(ms) || ms >= float64(MaxStep/time.Millisecond) {
		return MaxStep
	}
	return time.Duration(ms * float64(time.Millisecond))
}

func (c Curve) f(x float64) float64 {
	if len(c.Poly) > 0 {
		var y float64
		for i := len(c.Poly) - 1; i >= 0; i-- {
			y = y*x + c.Poly[i]
		}
		return y
	}
	p := c.Points
	// The segment to interpolate on, or to extend when x is outside.
	i, _ := slices.BinarySearchFunc(p, x, func(pt [2]float64, x float64) int {
		switch {
		case pt[0] < x:
			return -1
		case pt[0] > x:
			return 1
		}
		return 0
	})
	i = min(max(i, 1), len(p)-1)
	a, b := p[i-1], p[i]
	return a[1] + (x-a[0])*(b[1]-a[1])/(b[0]-a[0])
}

// Validate reports every problem of p, each naming its field, in one error
// wrapping ErrBadProfile, or nil.
func (p Profile) Validate() error {
	var probs []string
	switch p.Version {
	case 0, 1:
		if p.Worker != nil {
			probs = append(probs, "worker is a version 2 field, the profile says version 1")
		}
		if p.Sweep != nil {
			probs = append(probs, "sweep is a version 2 field, the profile says version 1")
		}
	case 2:
	default:
		probs = append(probs, fmt.Sprintf("version is %d, this reader knows 1 and 2", p.Version))
	}
	probs = p.Prefill.check("prefill", probs)
	probs = p.Decode.check("decode", probs)
	if p.Worker != nil {
		probs = p.Worker.check(probs)
	}
	if p.Sweep != nil {
		probs = p.Sweep.check(probs)
	}
	if len(probs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s", ErrBadProfile, strings.Join(probs, "; "))
}

func (c Curve) check(name string, probs []string) []string {
	bad := func(f string, args ...any) { probs = append(probs, name+"."+fmt.Sprintf(f, args...)) }
	switch {
	case len(c.Poly) > 0 && len(c.Points) > 0:
		bad("poly and %s.points are both given, give one", name)
	case len(c.Poly) == 0 && len(c.Points) == 0:
		bad("poly or %s.points is required", name)
	case len(c.Poly) > MaxPolyDegree+1:
		bad("poly has %d coefficients, at most %d", len(c.Poly), MaxPolyDegree+1)
	case len(c.Points) == 1:
		bad("points has 1 point, needs at least 2")
	}
	for i, v := range c.Poly {
		if !finite(v) {
			bad("poly[%d] is %v, must be finite", i, v)
		}
	}
	for i, pt := range c.Points {
		switch {
		case !finite(pt[0]) || !finite(pt[1]):
			bad("points[%d] is %v, must be finite", i, pt)
		case pt[1] < 0:
			bad("points[%d] has %v ms, must be ≥ 0", i, pt[1])
		case i > 0 && pt[0] <= c.Points[i-1][0]:
			bad("points[%d] has x %v, must be greater than the point before's %v", i, pt[0], c.Points[i-1][0])
		}
	}
	if !finite(c.PerSeqMs) || c.PerSeqMs < 0 {
		bad("per_seq_ms is %v, must be ≥ 0", c.PerSeqMs)
	}
	if !finite(c.MinMs) || c.MinMs < 0 {
		bad("min_ms is %v, must be ≥ 0", c.MinMs)
	}
	return probs
}

func (w WorkerLimits) check(probs []string) []string {
	bad := func(f string, args ...any) { probs = append(probs, "worker."+fmt.Sprintf(f, args...)) }
	for _, f := range []struct {
		name string
		v    int
	}{{"kv_tokens", w.KVTokens}, {"block_tokens", w.BlockTokens}, {"max_num_seqs", w.MaxNumSeqs}, {"max_num_batched_tokens", w.MaxNumBatchedTokens}} {
		if f.v < 0 {
			bad("%s is %d, must be ≥ 1 (or left out: unknown)", f.name, f.v)
		}
	}
	if w.MaxNumSeqs > 0 && w.MaxNumBatchedTokens > 0 && w.MaxNumBatchedTokens < w.MaxNumSeqs {
		bad("max_num_batched_tokens is %d, must be ≥ max_num_seqs (%d)", w.MaxNumBatchedTokens, w.MaxNumSeqs)
	}
	return probs
}

func (s Sweep) check(probs []string) []string {
	bad := func(f string, args ...any) { probs = append(probs, "sweep."+fmt.Sprintf(f, args...)) }
	for i, pt := range s.Prefill {
		if pt.ISL < 1 {
			bad("prefill[%d].isl is %d, must be ≥ 1", i, pt.ISL)
		}
		if !finite(pt.TTFTMs) || pt.TTFTMs <= 0 {
			bad("prefill[%d].ttft_ms is %v, must be > 0", i, pt.TTFTMs)
		}
	}
	for i, pt := range s.Decode {
		if pt.Concurrency < 1 {
			bad("decode[%d].concurrency is %d, must be ≥ 1", i, pt.Concurrency)
		}
		if pt.Context < 1 {
			bad("decode[%d].context is %d, must be ≥ 1", i, pt.Context)
		}
		if !finite(pt.ITLMs) || pt.ITLMs <= 0 {
			bad("decode[%d].itl_ms is %v, must be > 0", i, pt.ITLMs)
		}
	}
	return probs
}

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

// ParseProfile reads a profile's JSON and validates it; errors wrap
// ErrBadProfile and name the field at fault.
func ParseProfile(data []byte) (Profile, error) {
	var p Profile
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return Profile{}, fmt.Errorf("%w: %s is a JSON %s, want %s", ErrBadProfile, te.Field, te.Value, te.Type)
		}
		return Profile{}, fmt.Errorf("%w: %w", ErrBadProfile, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return Profile{}, fmt.Errorf("%w: data after the profile's object", ErrBadProfile)
	}
	if err := p.Validate(); err != nil {
		return Profile{}, err
	}
	if p.Version == 0 {
		p.Version = 1
	}
	return p, nil
}

// ReadProfile reads and validates the profile file at path.
func ReadProfile(path string) (Profile, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Profile{}, fmt.Errorf("sim: read profile: %w", err)
	}
	p, err := ParseProfile(data)
	if err != nil {
		return Profile{}, fmt.Errorf("%s: %w", path, err)
	}
	return p, nil
}

// Marshal is p's JSON, indented, as ParseProfile reads it.
func (p Profile) Marshal() ([]byte, error) {
	b, err := json.MarshalIndent(p, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}
