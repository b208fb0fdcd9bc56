package main

import (
	"fmt"
	"testing"
	"time"
)

// TestFrontendDiscoversDisaggregatedWorkers: `kvstrata frontend
// --discover`, with no --worker, in front of a prefill and a decode worker
// that registered (`kvstrata worker --role prefill|decode --register`)
// serves disaggregated: a long prompt is prefilled on the prefill worker
// and decoded on the decode worker, token for token an aggregated
// worker's completion.
func TestFrontendDiscoversDisaggregatedWorkers(t *testing.T) {
	node := startNode(t, t.TempDir())
	agg := startTiny(t, "aggregated", node.grpc) // the reference, not registered
	reg := []string{"--model", "tiny", "--register", "--register-ttl", registryTTL.String()}
	pre := startWorkerProcess(t, node.grpc, append([]string{"--role", "prefill"}, reg...)...)
	dec := startWorkerProcess(t, node.grpc, append([]string{"--role", "decode"}, reg...)...)
	fe, url := startFrontendProcess(t, node.grpc, nil, "--model", "tiny", "--disagg-min-uncached-tokens", "32",
		"--discover", "--discover-interval", "200ms")
	eventually(t, 60*time.Second, "the frontend discovers both workers, healthy", func() bool {
		ph, _ := candidate(t, url, pre.url)
		dh, _ := candidate(t, url, dec.url)
		return ph && dh
	})

	const prompt = "Discovered disaggregated serving: the registry names a prefill worker and a decode " +
		"worker, and the frontend that lists it splits each long prompt between them, the blocks going " +
		"through kvstrata from the one to the other."
	got := streamCompletion(frontendSDK(url), "kvstrata-tiny", prompt, 12, nil)
	if got.err != nil || got.finish != "length" || got.completion != 12 {
		t.Fatalf("a long prompt streamed through the frontend: %+v\n%s", got, fe.log)
	}
	want := postCompletion(t, agg, fmt.Sprintf(`{"model": "kvstrata-tiny", "prompt": %q, "max_tokens": 12, "temperature": 0, "ignore_eos": true}`, prompt))
	if got.text != want.Choices[0].Text {
		t.Errorf("disaggregated: %q; the aggregated worker: %q", got.text, want.Choices[0].Text)
	}
	if n := routedRequests(scrapeWorker(t, url), "disaggregated"); n != 1 {
		t.Errorf("%v requests took the disaggregated route, want 1\n%s", n, fe.log)
	}
	if n := workerMetricSum(scrapeWorker(t, pre.url), "vllm:request_success_total"); n != 1 {
		t.Errorf("the prefill worker served %v requests, want the prompt's prefill", n)
	}
}
