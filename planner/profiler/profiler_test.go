package profiler

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/engine/worker"
	"github.com/kvstrata/kvstrata/internal/freeport"
)

// startSim starts an in-process sim worker, no cache and no events, and
// returns its base URL.
func startSim(t *testing.T, speedup float64) string {
	t.Helper()
	w, err := worker.New(worker.Config{Listen: "127.0.0.1:0", Speedup: speedup, Blocks: 1024, TokenBytes: 4})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		w.Stop(ctx)
	})
	return "http://" + w.Addr()
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// TestRunSweepsEveryPointInBothPromptForms runs a small sweep of a fast
// sim worker with token-id prompts and with text prompts: every point is
// measured (the pool's size read from the worker's /metrics), the one
// that does not fit is skipped, and text prompts are sized by the
// server's own token count. Accuracy is the round trip's business
// (cmd/kvstrata); this checks the shape.
func TestRunSweepsEveryPointInBothPromptForms(t *testing.T) {
	url := startSim(t, 50)
	for _, form := range []string{PromptsTokens, PromptsText} {
		res, err := Run(context.Background(), Config{Target: url, Prompts: form, ISLs: []int{64, 256, 3000},
			Concurrency: []int{1, 2, 8}, Contexts: []int{1024, 4096}, OutputTokens: 12, Skip: 4, Reps: 1, Speedup: 50, Logger: quiet()})
		if err != nil {
			t.Fatalf("%s: %v", form, err)
		}
		p := res.Profile
		if p.Worker.KVTokens != 1024*16 || p.Worker.BlockTokens != 16 {
			t.Errorf("%s: worker %+v, want the 16384-token pool of /metrics", form, *p.Worker)
		}
		if len(p.Sweep.Prefill) != 3 || len(p.Sweep.Decode) != 5 || len(res.Skipped) != 1 {
			t.Errorf("%s: %d prefill, %d decode points, %d skipped; want 3, 5 and 8 × 4096", form, len(p.Sweep.Prefill), len(p.Sweep.Decode), len(res.Skipped))
		}
		if len(res.Checks) != 1 {
			t.Errorf("%s: %d checks, want the prompt longer than 2048", form, len(res.Checks))
		}
		if form == PromptsText {
			for _, pt := range p.Sweep.Prefill {
				if pt.ISL < 1 {
					t.Errorf("text prompt of %d tokens", pt.ISL)
				}
			}
		} else if p.Sweep.Prefill[0].ISL != 64 {
			t.Errorf("token prompts: first ISL %d, want 64", p.Sweep.Prefill[0].ISL)
		}
		if !strings.Contains(p.Source, url) || !strings.Contains(p.Source, form+" prompts") {
			t.Errorf("source %q does not say the target and the prompt form", p.Source)
		}
	}
}

func TestRunRefusesBadConfigAndAnAbsentServer(t *testing.T) {
	_, err := Run(context.Background(), Config{Target: "localhost:80", ISLs: []int{0}, Contexts: []int{10}, Speedup: -1})
	for _, want := range []string{`target "localhost:80"`, "ISLs has 0", "concurrency is empty", "contexts has 10", "speedup is -1"} {
		if !errors.Is(err, ErrBadConfig) || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v, want ErrBadConfig saying %q", err, want)
		}
	}
	_, err = Run(context.Background(), Config{Target: "http://" + freeport.Addr(t), ISLs: []int{128, 512}, Concurrency: []int{1},
		Contexts: []int{1024}, Logger: quiet()})
	if !errors.Is(err, ErrTarget) || !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("an absent server: %v, want ErrTarget, connection refused", err)
	}
}

// TestCacheConfigReadsVLLMsExposition: the pool's size from the labels
// vLLM exports, whatever others come with them.
func TestCacheConfigReadsVLLMsExposition(t *testing.T) {
	const vllm = `# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",calculate_kv_scales="False",cpu_offload_gb="0",enable_prefix_caching="True",engine="0",gpu_memory_utilization="0.9",is_attention_free="False",kv_sharing_fast_prefill="False",mamba_cache_dtype="auto",num_cpu_blocks="None",num_gpu_blocks="27280",num_gpu_blocks_override="None",prefix_caching_hash_algo="sha256",sliding_window="None",swap_space="4",swap_space_bytes="4.294967296e+09",note="a, b"} 1.0
`
	blocks, size, ok := cacheConfig([]byte("vllm:num_requests_running 0\n" + vllm))
	if !ok || blocks != 27280 || size != 16 {
		t.Errorf("cacheConfig = %d blocks of %d (%v), want 27280 of 16", blocks, size, ok)
	}
	if _, _, ok := cacheConfig([]byte("vllm:num_requests_running 0\n")); ok {
		t.Error("found a cache config in an exposition without one")
	}
}
