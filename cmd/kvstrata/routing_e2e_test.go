package main

import (
	"context"
	"io"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	sdk "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/kvstrata/kvstrata/router/frontend"
	"github.com/kvstrata/kvstrata/router/policy"
)

// TestFrontendHasAFlagForEverySetting: every field of policy.Config and
// frontend.Config is a `kvstrata frontend` flag, or named here as set
// another way — so that a setting added later without its flag fails.
func TestFrontendHasAFlagForEverySetting(t *testing.T) {
	flags := newFrontendCommand(io.Discard).Flags()
	for _, c := range []struct {
		typ   reflect.Type
		flags map[string]string // field → flag, or "" for a field set otherwise
	}{
		{reflect.TypeFor[policy.Config](), map[string]string{
			"Policy": "policy", "BlockTokens": "", "BlockBytes": "", "Profile": "sim-profile",
			"Tiers": "tier-bandwidth,tier-latency", "OverlapWeight": "overlap-weight", "Temperature": "temperature",
			"TieBreak": "tie-break", "BusyBlockFraction": "busy-block-fraction", "BusyPrefillTokens": "busy-prefill-tokens",
			"Seed": "route-seed",
		}},
		{reflect.TypeFor[frontend.Config](), map[string]string{
			"Workers": "worker", "Namespace": "", "WorkerModel": "", "WorkerBlocks": "num-gpu-blocks", "Cache": "cache",
			"CacheTimeout": "cache-timeout", "Policy": "", "MaxMigrations": "max-migrations", "QueueSize": "queue-size",
			"QueueWait": "queue-wait", "HealthInterval": "health-interval", "HealthTimeout": "health-timeout",
			"ProbeMax": "probe-max", "StallTimeout": "stall-timeout", "StallLimit": "stall-limit",
			"Discover": "discover", "DiscoverInterval": "discover-interval", "EventsBind": "kv-events-bind",
			"DisaggMinUncached": "disagg-min-uncached-tokens",
			"Registerer":        "", "Logger": "",
		}},
	} {
		for f := range c.typ.Fields() {
			names, ok := c.flags[f.Name]
			if !ok {
				if f.IsExported() {
					t.Errorf("%s.%s has no flag of `kvstrata frontend` (or add it here as set otherwise)", c.typ, f.Name)
				}
				continue
			}
			for name := range strings.SplitSeq(names, ",") {
				if name != "" && flags.Lookup(name) == nil {
					t.Errorf("%s.%s: `kvstrata frontend` has no --%s", c.typ, f.Name, name)
				}
			}
		}
	}
	if def := newUpCommand(io.Discard).Flags().Lookup("frontend").DefValue; def != DefaultFrontendListen {
		t.Errorf("up's --frontend defaults to %q: up does not start the frontend by default", def)
	}
}

func TestFrontendRoutingFlagsBadValuesExitTwo(t *testing.T) {
	args := []string{"frontend", "--worker", "http://127.0.0.1:1", "--tie-break", "first", "--busy-block-fraction", "most",
		"--tier-bandwidth", "dram=fast,nvme=1GB", "--tier-latency", "s3=-1s", "--sim-profile", t.TempDir() + "/none.json",
		"--stall-limit", "long", "--probe-max", "-1s"}
	usageErrorSays(t, args, `--tie-break "first": want random or lowest-index`, `--busy-block-fraction "most"`,
		`dram: "fast" is not a positive size a second`, `unknown tier "nvme"`, `s3: "-1s" is not a positive duration`,
		"--sim-profile", `--stall-limit "long"`, "probe max is -1s")
}

// TestFrontendLeavesAStoppedWorker: a worker stopped with SIGSTOP in the
// middle of a stream (its connection open, nothing sent) is left once the
// stall bound passes: the stream, routed there by a request's round-robin
// override, completes from the other worker, the frontend counts a
// "stalled" migration and takes the stopped worker out of the candidates.
func TestFrontendLeavesAStoppedWorker(t *testing.T) {
	node := startNode(t, t.TempDir())
	ws := []*wproc{startWorkerProcess(t, node.grpc), startWorkerProcess(t, node.grpc)}
	_, url := startFrontendProcess(t, node.grpc, ws, "--stall-timeout", "2s")
	stopped := false
	t.Cleanup(func() {
		if stopped {
			ws[0].cmd.Process.Signal(syscall.SIGCONT)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	const maxTokens = 300
	// Round-robin's first choice is the first worker.
	s := frontendSDK(url).Completions.NewStreaming(ctx, sdk.CompletionNewParams{
		Model:         "kvstrata-sim",
		Prompt:        sdk.CompletionNewParamsPromptUnion{OfString: sdk.String("Hello, stalled worker")},
		MaxTokens:     sdk.Int(maxTokens),
		StreamOptions: sdk.ChatCompletionStreamOptionsParam{IncludeUsage: sdk.Bool(true)},
	}, option.WithJSONSet("ignore_eos", true), option.WithJSONSet("kvstrata", map[string]any{"policy": "round-robin"}))
	var finish string
	var tokens int64
	for s.Next() {
		ch := s.Current()
		if !stopped {
			if err := ws[0].cmd.Process.Signal(syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			stopped = true
		}
		for _, c := range ch.Choices {
			if c.FinishReason != "" {
				finish = string(c.FinishReason)
			}
		}
		tokens = max(tokens, ch.Usage.CompletionTokens)
	}
	if err := s.Err(); err != nil || finish != "length" || tokens != maxTokens {
		t.Fatalf("the stream ended with finish %q, %d tokens, %v; want length, %d", finish, tokens, err, maxTokens)
	}
	metrics := scrapeWorker(t, url)
	if n := workerMetricSum(metrics, `kvstrata_frontend_migrations_total{cause="stalled"}`); n != 1 {
		t.Errorf("the frontend counted %v stalled migrations, want 1", n)
	}
	healthy := regexp.MustCompile(`kvstrata_frontend_worker_healthy\{worker="` + regexp.QuoteMeta(ws[0].url) + `"\} (\S+)`).FindStringSubmatch(metrics)
	if healthy == nil {
		t.Fatalf("no health gauge of the stopped worker:\n%s", metrics)
	}
	if v, _ := strconv.ParseFloat(healthy[1], 64); v != 0 {
		t.Errorf("the stopped worker's health gauge is %v, want 0", v)
	}
}
