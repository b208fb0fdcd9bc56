package main

import (
	"context"
	"fmt"
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
func streamCompletion(c *sdk.Client, model, prompt string, maxTokens int64, first func()) streamed {
	ctx, cancel := context.WithTimeout(context.Background(), 240*time.Second) // tiny under -race on a loaded CPU is slow: 20 requests on one worker after the kill
	defer cancel()
	s := c.Completions.NewStreaming(ctx, sdk.CompletionNewParams{
		Model:         sdk.CompletionNewParamsModel(model),
		Prompt:        sdk.CompletionNewParamsPromptUnion{OfString: sdk.String(prompt)},
		MaxTokens:     sdk.Int(maxTokens),
		Temperature:   sdk.Float(0),
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
// through the frontend from two workers; a worker killed with SIGKILL in
// the middle of 20 streaming requests costs none of them — each finishes
// with all its tokens, the frontend counts the migrations, and with tiny
// (greedy) every completion is the text of an undisturbed run.
func TestFrontendStreamsAndSurvivesAKilledWorker(t *testing.T) {
	for _, c := range []struct {
		backend   string
		maxTokens int64
	}{{"sim", 300}, {"tiny", 12}} {
		t.Run(c.backend, func(t *testing.T) {
			model := "kvstrata-" + c.backend
			node := startNode(t, t.TempDir())
			flags := []string{"--model", c.backend}
			ws := []*wproc{startWorkerProcess(t, node.grpc, flags...), startWorkerProcess(t, node.grpc, flags...)}
			_, url := startFrontendProcess(t, node.grpc, ws, flags...)
			cl := frontendSDK(url)

			one := streamCompletion(cl, model, "Hello, frontend", 8, nil)
			if one.err != nil || one.finish != "length" || one.completion != 8 || one.chunks < 2 {
				t.Fatalf("a streamed completion: %+v; want 8 tokens over several chunks, finish length", one)
			}

			const n = 20
			prompt := func(i int) string {
				return fmt.Sprintf("Request %d shares this long preamble about caches, tiers and routers.", i)
			}
			run := func(kill func()) []streamed {
				var started sync.WaitGroup
				started.Add(n)
				results := make([]streamed, n)
				var wg sync.WaitGroup
				for i := range n {
					wg.Go(func() {
						var once sync.Once
						results[i] = streamCompletion(cl, model, prompt(i), c.maxTokens, func() { once.Do(started.Done) })
					})
				}
				started.Wait() // every request is streaming
				if kill != nil {
					kill()
				}
				wg.Wait()
				return results
			}
			var undisturbed []streamed
			if c.backend == "tiny" {
				undisturbed = run(nil)
			}
			results := run(ws[0].kill)
			for i, r := range results {
				if r.err != nil || r.finish != "length" || r.completion != c.maxTokens {
					t.Errorf("request %d after the kill: finish %q, %d tokens, %v; want length, %d", i, r.finish, r.completion, r.err, c.maxTokens)
				}
				if undisturbed != nil && r.text != undisturbed[i].text {
					t.Errorf("request %d after the kill answered %q; undisturbed, %q", i, r.text, undisturbed[i].text)
				}
			}
			metrics := scrapeWorker(t, url)
			if moved := workerMetricSum(metrics, "kvstrata_frontend_migrations_total"); moved < 1 {
				t.Errorf("the frontend counted %v migrations after a worker was killed mid-stream", moved)
			}
		})
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
	res := streamCompletion(frontendSDK(url), "kvstrata-sim", "Hello through up's frontend", 6, nil)
	if res.err != nil || res.finish != "length" || res.completion != 6 {
		t.Fatalf("a streamed completion through up's frontend: %+v", res)
	}
	body := scrapeWorker(t, url)
	if n := workerMetricSum(body, "kvstrata_frontend_routing_decisions_total"); n != 1 {
		t.Errorf("the frontend counted %v routing decisions, want 1", n)
	}
	promtoolCheckWorker(t, body) // the frontend's exposition, read by Prometheus's own parser and linter
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
		usageErrorSays(t, c.args, c.want...)
	}
}
