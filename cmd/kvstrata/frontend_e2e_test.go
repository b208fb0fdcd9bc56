package main

import (
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	sdk "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/kvstrata/kvstrata/internal/freeport"
)

// End-to-end tests of `kvstrata frontend` with real processes: a cache
// node, sim workers and the frontend, driven by the official OpenAI Go SDK.

// startFrontendProcess starts `kvstrata frontend` over the workers and the
// cache node at cache, and waits until its /health answers.
func startFrontendProcess(t *testing.T, cache string, ws []*wproc, extra ...string) (*proc, string) {
	t.Helper()
	p := &proc{t: t, http: freeport.Addr(t)}
	p.args = []string{"frontend", "--listen", p.http, "--cache", cache, "--health-interval", "200ms"}
	for _, w := range ws {
		p.args = append(p.args, "--worker", fmt.Sprintf("%s,events=%s,replay=%s", w.url, w.events, w.replay))
	}
	p.args = append(p.args, extra...)
	p.launch()
	url := "http://" + p.http
	waitWorkerHealth(t, p, url)
	return p, url
}

func frontendSDK(url string) *sdk.Client {
	c := sdk.NewClient(option.WithBaseURL(url+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	return &c
}

// streamed is one streamed completion's outcome.
type streamed struct {
	text       string
	chunks     int
	finish     string
	completion int64
	err        error
}

// streamCompletion streams a completion of prompt through the SDK; first
// is closed (once) at its first chunk.
func streamCompletion(c *sdk.Client, prompt string, maxTokens int64, first func()) streamed {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s := c.Completions.NewStreaming(ctx, sdk.CompletionNewParams{
		Model:         "kvstrata-sim",
		Prompt:        sdk.CompletionNewParamsPromptUnion{OfString: sdk.String(prompt)},
		MaxTokens:     sdk.Int(maxTokens),
		StreamOptions: sdk.ChatCompletionStreamOptionsParam{IncludeUsage: sdk.Bool(true)},
	}, option.WithJSONSet("ignore_eos", true))
	var out streamed
	var text strings.Builder
	for s.Next() {
		ch := s.Current()
		if out.chunks == 0 && first != nil {
			first()
		}
		out.chunks++
		for _, c := range ch.Choices {
			text.WriteString(c.Text)
			if c.FinishReason != "" {
				out.finish = string(c.FinishReason)
			}
		}
		if ch.Usage.CompletionTokens > 0 {
			out.completion = ch.Usage.CompletionTokens
		}
	}
	out.text, out.err = text.String(), s.Err()
	return out
}

// TestFrontendStreamsAndSurvivesAKilledWorker: the SDK streams completions
// through the frontend from two sim workers; a worker killed with SIGKILL
// in the middle of 12 streaming requests costs none of them — each
// finishes with all its tokens, and the frontend counts the migrations.
func TestFrontendStreamsAndSurvivesAKilledWorker(t *testing.T) {
	node := startNode(t, t.TempDir())
	ws := []*wproc{startWorkerProcess(t, node.grpc), startWorkerProcess(t, node.grpc)}
	_, url := startFrontendProcess(t, node.grpc, ws)
	c := frontendSDK(url)

	one := streamCompletion(c, "Hello, frontend", 8, nil)
	if one.err != nil || one.finish != "length" || one.completion != 8 || one.chunks < 2 {
		t.Fatalf("a streamed completion: %+v; want 8 tokens over several chunks, finish length", one)
	}

	const n, maxTokens = 12, 300
	var started sync.WaitGroup
	started.Add(n)
	results := make([]streamed, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			var once sync.Once
			results[i] = streamCompletion(c, fmt.Sprintf("Request %d shares this long preamble about caches and tiers.", i), maxTokens,
				func() { once.Do(started.Done) })
		})
	}
	started.Wait() // every request is streaming
	ws[0].kill()
	wg.Wait()
	for i, r := range results {
		if r.err != nil || r.finish != "length" || r.completion != maxTokens {
			t.Errorf("request %d after the kill: finish %q, %d tokens, %v; want length, %d", i, r.finish, r.completion, r.err, maxTokens)
		}
	}
	metrics := scrapeWorker(t, url)
	if moved := workerMetricSum(metrics, "kvstrata_frontend_migrations_total"); moved < 1 {
		t.Errorf("the frontend counted %v migrations after a worker was killed mid-stream", moved)
	}
	if ok := workerMetricSum(metrics, "kvstrata_frontend_requests_total"); ok < n+1 {
		t.Errorf("the frontend counted %v requests, want %d", ok, n+1)
	}
}

// TestUpWithAFrontend: `up --frontend` runs a frontend in front of its
// workers; a streamed completion through it gets its tokens, and the
// frontend's decisions show on its /metrics.
func TestUpWithAFrontend(t *testing.T) {
	httpBase, eventsBase := freePortRun(t, 2), freePortRun(t, 4)
	fe := freeport.Addr(t)
	node := []string{freeport.Addr(t), freeport.Addr(t), freeport.Addr(t), freeport.Addr(t)}
	p := &proc{t: t, dir: t.TempDir()}
	p.args = []string{"up", "--workers", "2", "--http-port", strconv.Itoa(httpBase), "--kv-events-port", strconv.Itoa(eventsBase),
		"--frontend", fe, "--speedup", "20", "--num-gpu-blocks", "256", "--data-dir", p.dir, "--dram-capacity", "64MiB",
		"--ssd-capacity", "256MiB", "--listen-grpc", node[0], "--listen-data", node[1], "--listen-http", node[2],
		"--cluster-raft-addr", node[3], "--listen-resp", ""}
	p.launch()
	url := "http://" + fe
	waitWorkerHealth(t, p, url)
	res := streamCompletion(frontendSDK(url), "Hello through up's frontend", 6, nil)
	if res.err != nil || res.finish != "length" || res.completion != 6 {
		t.Fatalf("a streamed completion through up's frontend: %+v", res)
	}
	if n := workerMetricSum(scrapeWorker(t, url), "kvstrata_frontend_routing_decisions_total"); n != 1 {
		t.Errorf("the frontend counted %v routing decisions, want 1", n)
	}
	if !strings.Contains(p.log.String(), `msg="frontend serving"`) {
		t.Errorf("the log does not say the frontend serves:\n%s", p.log)
	}
}

func TestFrontendBadFlagsExitTwoWithEveryProblem(t *testing.T) {
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"frontend", "--policy", "best", "--worker", "http://127.0.0.1:1,color=red", "--worker", "ftp://x",
			"--queue-wait", "long", "--temperature", "-1"},
			[]string{`--policy "best"`, `unknown key "color"`, `worker URL "ftp://x" is not http://host:port`, `--queue-wait "long"`}},
		{[]string{"frontend"}, []string{"--worker: at least one is needed"}},
		{[]string{"frontend", "--worker", "http://127.0.0.1:1", "--model", "llama"}, []string{`Model "llama" is unknown`}},
		{[]string{"frontend", "extra"}, []string{"frontend takes no arguments"}},
	} {
		out, err := exec.Command(binary, c.args...).CombinedOutput()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 {
			t.Errorf("%v: exit %v, want status 2:\n%s", c.args, err, out)
			continue
		}
		for _, want := range c.want {
			if !strings.Contains(string(out), want) {
				t.Errorf("%v: the output does not say %q:\n%s", c.args, want, out)
			}
		}
	}
}
