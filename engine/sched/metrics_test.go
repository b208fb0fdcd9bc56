package sched

import (
	"errors"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// TestMetricsHaveVLLMsNames runs requests through an engine and reads its
// metrics back from a Prometheus registry under vLLM's names.
func TestMetricsHaveVLLMsNames(t *testing.T) {
	reg := prometheus.NewRegistry()
	p := prompt(100, 1)
	conn := warm(t, p, 1)
	conn.set(func(c *mapConn) { c.loadOnly = 3 })
	e := newEngine(t, Config{Model: newSim(t), Connector: conn, Registerer: reg, ModelName: "my-model"})
	generate(t, e, Request{Prompt: p, MaxTokens: 10}) // 48 tokens onboarded, 48 recomputed
	generate(t, e, Request{Prompt: p, MaxTokens: 10}) // 96 from the pool
	e.Stats()                                         // an iteration after the last request's end

	got := map[string]*dto.MetricFamily{}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		got[mf.GetName()] = mf
		for _, m := range mf.GetMetric() {
			if !hasLabel(m, "model_name", "my-model") {
				t.Errorf("%s has no model_name=my-model label", mf.GetName())
			}
		}
	}
	value := func(name string) float64 {
		mf := got[name]
		if mf == nil {
			t.Errorf("no metric %s", name)
			return -1
		}
		m := mf.GetMetric()[0]
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue()
		case m.Gauge != nil:
			return m.Gauge.GetValue()
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount())
		}
		return -1
	}
	for name, want := range map[string]float64{
		"vllm:num_requests_running":               0,
		"vllm:num_requests_waiting":               0,
		"vllm:kv_cache_usage_perc":                0,
		"vllm:prefix_cache_queries_total":         200,
		"vllm:prefix_cache_hits_total":            96,
		"vllm:prompt_tokens_total":                200,
		"vllm:generation_tokens_total":            20,
		"vllm:num_preemptions_total":              0,
		"vllm:time_to_first_token_seconds":        2,  // samples
		"vllm:inter_token_latency_seconds":        18, // samples
		"vllm:time_per_output_token_seconds":      18,
		"vllm:e2e_request_latency_seconds":        2,
		"vllm:request_queue_time_seconds":         2,
		"kvstrata_engine_onboarded_tokens_total":  48,
		"kvstrata_engine_recomputed_tokens_total": 48,
		"kvstrata_engine_cache_failures_total":    0,
	} {
		if v := value(name); v != want {
			t.Errorf("%s = %v, want %v", name, v, want)
		}
	}
	// request_success_total has one series per finished_reason.
	if mf := got["vllm:request_success_total"]; mf == nil || len(mf.GetMetric()) != 3 {
		t.Fatalf("vllm:request_success_total: %v, want stop, length and abort series", mf)
	}
	for _, m := range got["vllm:request_success_total"].GetMetric() {
		want := 0.0
		if hasLabel(m, "finished_reason", "length") {
			want = 2
		}
		if m.Counter.GetValue() != want {
			t.Errorf("request_success_total%v = %v, want %v", m.GetLabel(), m.Counter.GetValue(), want)
		}
	}
	// vLLM's buckets, e.g. time to first token's first and last.
	ttft := got["vllm:time_to_first_token_seconds"].GetMetric()[0].Histogram.GetBucket()
	if ttft[0].GetUpperBound() != 0.001 || ttft[len(ttft)-1].GetUpperBound() != 2560 {
		t.Errorf("time to first token buckets %v…%v, want vLLM's 0.001…2560", ttft[0].GetUpperBound(), ttft[len(ttft)-1].GetUpperBound())
	}
}

func TestTwoEnginesCannotShareARegistry(t *testing.T) {
	reg := prometheus.NewRegistry()
	newEngine(t, Config{Model: newSim(t), Registerer: reg})
	if _, err := New(Config{Model: newSim(t), Registerer: reg}); !errors.Is(err, ErrBadConfig) || !strings.Contains(err.Error(), "duplicate") {
		t.Errorf("a second engine on the same registry: %v, want a duplicate registration error", err)
	}
}

func hasLabel(m *dto.Metric, name, value string) bool {
	for _, l := range m.GetLabel() {
		if l.GetName() == name && l.GetValue() == value {
			return true
		}
	}
	return false
}
