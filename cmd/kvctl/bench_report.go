package main

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/kvstrata/kvstrata/loadgen"
)

// benchOutput is bench's JSON document, part of kvctl's interface. Rates
// are per second; MB and GB are 10^6 and 10^9 bytes.
type benchOutput struct {
	Target      string      `json:"target"`
	Path        string      `json:"path"` // how bytes travel: "tcp" (data plane), "grpc" or "resp"
	Op          string      `json:"op"`
	GetRatio    *float64    `json:"get_ratio,omitempty"`
	ValueSize   int         `json:"value_size"`
	Keys        int         `json:"keys"`
	Batch       int         `json:"batch"`
	Concurrency int         `json:"concurrency"`
	Namespace   string      `json:"namespace"`
	Populate    *benchPhase `json:"populate,omitempty"`
	Run         benchPhase  `json:"run"`
}

type benchPhase struct {
	Requests       int64        `json:"requests"`
	Ops            int64        `json:"ops"` // values moved, or keys found by lookups
	Bytes          int64        `json:"bytes"`
	Seconds        float64      `json:"seconds"`
	RequestsPerSec float64      `json:"requests_per_sec"`
	OpsPerSec      float64      `json:"ops_per_sec"`
	MBPerSec       float64      `json:"mb_per_sec"`
	GBPerSec       float64      `json:"gb_per_sec"`
	LatencyNs      latencyStats `json:"latency_ns"` // of the requests that succeeded
	Errors         int64        `json:"errors"`     // failed requests and wrong values
	Mismatches     int64        `json:"mismatches"` // wrong values alone
	Misses         int64        `json:"misses"`     // keys not found
	FirstError     string       `json:"first_error,omitempty"`
	// GetLatencyNs is LatencyNs of the gets alone, in a mixed run.
	GetLatencyNs *latencyStats `json:"get_latency_ns,omitempty"`
}

type latencyStats struct {
	Count uint64 `json:"count"`
	Mean  int64  `json:"mean"`
	P50   int64  `json:"p50"`
	P99   int64  `json:"p99"`
	P999  int64  `json:"p999"`
	Max   int64  `json:"max"`
}

func newBenchOutput(p benchPlan, path string, rep *loadgen.Report) benchOutput {
	out := benchOutput{Target: p.scheme + "://" + p.hostport, Path: path, Op: string(p.cfg.Op), ValueSize: p.cfg.ValueSize,
		Keys: p.cfg.Keys, Batch: p.cfg.Batch, Concurrency: p.cfg.Concurrency, Namespace: p.ns.String(),
		Run: newBenchPhase(&rep.Run)}
	if p.cfg.Op == loadgen.OpMixed {
		out.GetRatio = &p.cfg.GetRatio
		if rep.Run.GetLatency != nil {
			gets := newLatencyStats(rep.Run.GetLatency)
			out.Run.GetLatencyNs = &gets
		}
	}
	if rep.Populate != nil {
		ph := newBenchPhase(rep.Populate)
		out.Populate = &ph
	}
	return out
}

func newBenchPhase(r *loadgen.Result) benchPhase {
	ph := benchPhase{Requests: r.Requests, Ops: r.Blocks, Bytes: r.Bytes, Seconds: r.Elapsed.Seconds(),
		RequestsPerSec: r.RequestsPerSec(), OpsPerSec: r.OpsPerSec(), MBPerSec: r.BytesPerSec() / 1e6, GBPerSec: r.BytesPerSec() / 1e9,
		Errors: r.Errors, Mismatches: r.Mismatches, Misses: r.Misses}
	if r.FirstError != nil {
		ph.FirstError = r.FirstError.Error()
	}
	ph.LatencyNs = newLatencyStats(r.Latency)
	return ph
}

func newLatencyStats(h *loadgen.Histogram) latencyStats {
	return latencyStats{Count: h.Count(), Mean: int64(h.Mean()), P50: int64(h.Quantile(0.5)), P99: int64(h.Quantile(0.99)),
		P999: int64(h.Quantile(0.999)), Max: int64(h.Max())}
}

func (o *benchOutput) phases() []*benchPhase {
	if o.Populate == nil {
		return []*benchPhase{&o.Run}
	}
	return []*benchPhase{o.Populate, &o.Run}
}

func (o *benchOutput) errors() (n int64) {
	for _, ph := range o.phases() {
		n += ph.Errors
	}
	return n
}

func (o *benchOutput) mismatches() (n int64) {
	for _, ph := range o.phases() {
		n += ph.Mismatches
	}
	return n
}

// writeBench writes the run's description, a table with a row per phase,
// and what went wrong, if anything did.
func (a *app) writeBench(o benchOutput) error {
	path := map[string]string{"grpc": "over gRPC", "resp": "over RESP2"}[o.Path]
	if path == "" {
		path = "over the data plane (" + o.Path + ")"
	}
	op := o.Op
	if o.GetRatio != nil {
		op = fmt.Sprintf("mixed (%s gets)", percent(*o.GetRatio))
	}
	fmt.Fprintf(a.stdout, "%s %s: %s of %s values, %s keys in namespace %s, batch %d, concurrency %d\n\n",
		o.Target, path, op, formatBytes(o.ValueSize), thousands(o.Keys), o.Namespace, o.Batch, o.Concurrency)
	header := []string{"PHASE", "REQUESTS", "OPS", "BYTES", "SECONDS", "OPS/S", "MB/S", "GB/S",
		"P50", "P99", "P999", "MAX", "ERRORS"}
	var rows [][]string
	names := []string{"run"}
	if o.Populate != nil {
		names = []string{"populate", "run"}
	}
	for i, ph := range o.phases() {
		lat := func(ns int64) string {
			if ph.LatencyNs.Count == 0 {
				return "-"
			}
			return formatLatency(time.Duration(ns))
		}
		rows = append(rows, []string{names[i], thousands(ph.Requests), thousands(ph.Ops), formatBytes(ph.Bytes),
			strconv.FormatFloat(ph.Seconds, 'f', 2, 64), strconv.FormatFloat(ph.OpsPerSec, 'f', 0, 64),
			strconv.FormatFloat(ph.MBPerSec, 'f', 1, 64), strconv.FormatFloat(ph.GBPerSec, 'f', 2, 64),
			lat(ph.LatencyNs.P50), lat(ph.LatencyNs.P99), lat(ph.LatencyNs.P999), lat(ph.LatencyNs.Max),
			thousands(ph.Errors)})
	}
	if g := o.Run.GetLatencyNs; g != nil && g.Count > 0 {
		// A mixed run's gets alone: their latency apart from the puts'.
		rows = append(rows, []string{"run gets", thousands(int64(g.Count)), "-", "-", "-", "-", "-", "-",
			formatLatency(time.Duration(g.P50)), formatLatency(time.Duration(g.P99)), formatLatency(time.Duration(g.P999)),
			formatLatency(time.Duration(g.Max)), "-"})
	}
	if err := writeTable(a.stdout, header, rows); err != nil {
		return err
	}
	var notes []string
	for i, ph := range o.phases() {
		if ph.Misses > 0 {
			notes = append(notes, fmt.Sprintf("%s: %s keys not found (evicted? the working set may be over the target's capacity)",
				names[i], thousands(ph.Misses)))
		}
		if ph.Errors > 0 {
			notes = append(notes, fmt.Sprintf("%s: %s errors, %s of them wrong values; first: %s",
				names[i], thousands(ph.Errors), thousands(ph.Mismatches), ph.FirstError))
		}
	}
	if len(notes) > 0 {
		fmt.Fprintf(a.stdout, "\n%s\n", strings.Join(notes, "\n"))
	}
	return nil
}
