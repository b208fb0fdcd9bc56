// Command breakeven measures, for prompts of several lengths, how long the
// tiny model (engine/model/tiny, default config, real float32 math) takes to
// prefill a prompt against how long restoring the same tokens' KV blocks
// from a kvstrata node takes from DRAM, from SSD and from the object store;
// and from that, per tier, the break-even prompt length: the shortest
// measured length from which restoring beats recomputing.
// bench/tiny-breakeven.sh starts the store and the node and runs it; see
// there.
//
// The prompt is o200k tokens of English text. Its longest length's full
// blocks are computed by tiny once and stored through the node as one
// chain (their parents set); a prompt of T tokens is that prompt's first
// T, whose KV is the first T/BlockTokens of those blocks (attention is
// causal). For each run and each length it times:
//
//   - prefill: Model.Prefill of the T tokens, nothing cached (what a
//     worker without the cache does; it includes sampling the next token,
//     one Vocab·Dim output projection, which a worker that restored the
//     whole prompt still computes for its last token);
//   - tail: the step a worker that restored the whole prompt still
//     computes: Prefill of the same T tokens with T-1 cached (the restored
//     blocks as Prefix), which recomputes the last token and samples the
//     next, as vLLM does on a full prefix hit;
//   - restore from each tier, as an engine restores on admission: Lookup
//     of the chain, then one GetFunc (StopAtMiss) of the blocks over the
//     data plane straight into one destination buffer. Before each, the
//     namespace's blocks are moved down (Evict with demote) until the tier
//     under test is the fastest holding them, and the Lookup's answer
//     confirms it. The restored bytes are compared with the computed ones.
//
// It prints the median of --runs runs of each, as a table or (-o json) as
// JSON, on stdout, and two break-even lengths per tier: restoring the KV
// against prefilling it (restore < prefill), and the time to the first
// token (restore + tail < prefill).
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvstrata/kvstrata/api/client"
	pb "github.com/kvstrata/kvstrata/api/v1"
	"github.com/kvstrata/kvstrata/engine/model"
	"github.com/kvstrata/kvstrata/engine/model/tiny"
	"github.com/kvstrata/kvstrata/engine/tokenizer"
	"github.com/kvstrata/kvstrata/index"
)

// tiers are the tiers restored from, fastest first.
var tiers = []string{"dram", "ssd", "s3"}

// row is one prompt length's medians.
type row struct {
	Tokens    int                `json:"tokens"`
	Blocks    int                `json:"blocks"`
	KVBytes   int                `json:"kv_bytes"`
	PrefillMS float64            `json:"prefill_ms"`
	TailMS    float64            `json:"tail_ms"`
	RestoreMS map[string]float64 `json:"restore_ms"`
	Speedup   map[string]float64 `json:"speedup"` // prefill time / restore time
}

// report is the JSON output.
type report struct {
	Model       string `json:"model"`
	Layers      int    `json:"layers"`
	Dim         int    `json:"dim"`
	KVHeads     int    `json:"kv_heads"`
	HeadDim     int    `json:"head_dim"`
	BlockTokens int    `json:"block_tokens"`
	Workers     int    `json:"workers"`
	Runs        int    `json:"runs"`
	Rows        []row  `json:"rows"`
	// Per tier, the shortest length from which restore < prefill, and
	// from which restore + tail < prefill; 0: not at the longest measured;
	// the shortest measured: at most that (it wins at every length).
	BreakEven     map[string]int `json:"break_even_tokens"`
	BreakEvenTTFT map[string]int `json:"break_even_ttft_tokens"`
}

func main() {
	addr := flag.String("addr", "127.0.0.1:7070", "gRPC address of the kvstrata node (with an s3 tier)")
	lengths := flag.String("tokens", "16,64,128,256,512,1024,2048,4096", "prompt lengths in tokens, multiples of the block size")
	runs := flag.Int("runs", 3, "runs of each measurement; the median is reported")
	workers := flag.Int("workers", 0, "goroutines tiny spreads a step over (0: GOMAXPROCS)")
	out := flag.String("o", "table", "output: table or json")
	flag.Parse()
	if err := run(*addr, *lengths, *runs, *workers, *out); err != nil {
		fmt.Fprintln(os.Stderr, "breakeven:", err)
		os.Exit(1)
	}
}

func run(addr, lengthList string, runs, workers int, out string) error {
	if out != "table" && out != "json" {
		return fmt.Errorf("-o is %q, want table or json", out)
	}
	if runs < 1 {
		return fmt.Errorf("--runs is %d, want at least 1", runs)
	}
	m, err := tiny.New(tiny.Config{Workers: workers})
	if err != nil {
		return err
	}
	cfg, lay := m.Config(), m.Layout()
	bt := cfg.BlockTokens
	var lengths []int
	for _, f := range strings.Split(lengthList, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 || n%bt != 0 || n > cfg.ContextLen {
			return fmt.Errorf("prompt length %q: want a multiple of %d in [%d, %d]", f, bt, bt, cfg.ContextLen)
		}
		lengths = append(lengths, n)
	}
	slices.Sort(lengths)
	toks, err := promptTokens(lengths[len(lengths)-1])
	if err != nil {
		return err
	}
	ctx := context.Background()

	// The longest prompt's blocks, computed once; every shorter prompt's
	// are its first ones.
	res, err := m.Prefill(ctx, []model.Seq{{Tokens: toks}})
	if err != nil {
		return err
	}
	ns := lay.Namespace.ID()
	hashes := lay.Namespace.Hashes(toks)
	bb := lay.BlockBytes()
	want := make([]byte, 0, len(hashes)*bb)
	data := make([][]byte, len(hashes))
	for i := range hashes {
		data[i] = bytes.Join(res.Blocks[0][i].Layers, nil)
		want = append(want, data[i]...)
	}
	c, err := client.Dial(ctx, addr, client.Options{Timeout: 2 * time.Minute})
	if err != nil {
		return err
	}
	defer c.Close()
	if err := c.Put(ctx, client.Chain(ns, hashes, data)); err != nil {
		return fmt.Errorf("put the prompt's blocks: %w", err)
	}
	fmt.Fprintf(os.Stderr, "tiny: %d layers, dim %d, %d KV heads of %d, o200k vocabulary; blocks of %d tokens, %d bytes; %d workers\n",
		cfg.Layers, cfg.Dim, cfg.KVHeads, cfg.HeadDim, bt, bb, cfg.Workers)

	prefill, tail := make([][]float64, len(lengths)), make([][]float64, len(lengths))
	restore := map[string][][]float64{}
	for _, tier := range tiers {
		restore[tier] = make([][]float64, len(lengths))
	}
	dst := make([]byte, len(want))
	for r := range runs {
		for i, n := range lengths {
			start := time.Now()
			if _, err := m.Prefill(ctx, []model.Seq{{Tokens: toks[:n]}}); err != nil {
				return err
			}
			prefill[i] = append(prefill[i], ms(time.Since(start)))
			start = time.Now()
			if _, err := m.Prefill(ctx, []model.Seq{{Tokens: toks[:n], Cached: n - 1, Prefix: res.Blocks[0][:n/bt]}}); err != nil {
				return err
			}
			tail[i] = append(tail[i], ms(time.Since(start)))
			blocks := hashes[:n/bt]
			for _, tier := range tiers {
				if err := fastestIn(ctx, c, ns, blocks, tier); err != nil {
					return err
				}
				clear(dst)
				took, err := restoreInto(ctx, c, ns, blocks, tier, dst[:len(blocks)*bb], bb)
				if err != nil {
					return fmt.Errorf("%d tokens from %s: %w", n, tier, err)
				}
				if !bytes.Equal(dst[:len(blocks)*bb], want[:len(blocks)*bb]) { // right, not just fast
					return fmt.Errorf("%d tokens from %s: the restored KV differs from the computed one", n, tier)
				}
				restore[tier][i] = append(restore[tier][i], ms(took))
			}
		}
		fmt.Fprintf(os.Stderr, "run %d of %d done\n", r+1, runs)
	}

	rep := report{Model: cfg.Model, Layers: cfg.Layers, Dim: cfg.Dim, KVHeads: cfg.KVHeads, HeadDim: cfg.HeadDim,
		BlockTokens: bt, Workers: cfg.Workers, Runs: runs, BreakEven: map[string]int{}, BreakEvenTTFT: map[string]int{}}
	for i, n := range lengths {
		rw := row{Tokens: n, Blocks: n / bt, KVBytes: n / bt * bb, PrefillMS: median(prefill[i]), TailMS: median(tail[i]),
			RestoreMS: map[string]float64{}, Speedup: map[string]float64{}}
		for _, tier := range tiers {
			rw.RestoreMS[tier] = median(restore[tier][i])
			rw.Speedup[tier] = rw.PrefillMS / rw.RestoreMS[tier]
		}
		rep.Rows = append(rep.Rows, rw)
	}
	for _, tier := range tiers {
		rep.BreakEven[tier] = breakEven(rep.Rows, func(r row) bool { return r.RestoreMS[tier] < r.PrefillMS })
		rep.BreakEvenTTFT[tier] = breakEven(rep.Rows, func(r row) bool { return r.RestoreMS[tier]+r.TailMS < r.PrefillMS })
	}
	if out == "json" {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	printTable(rep)
	return nil
}

// promptTokens is n o200k tokens of English text.
func promptTokens(n int) ([]uint32, error) {
	tok, err := tokenizer.O200k()
	if err != nil {
		return nil, err
	}
	const text = "The cache exists for inference workers. A prefill worker computes the keys and values of every " +
		"token of a prompt, layer by layer; the full blocks go to the cache, which keeps them in memory, moves " +
		"them to disk as they cool, and to the object store after that. A decode worker, or the same worker an " +
		"hour later, asks for the longest prefix the cache holds and computes only the rest. "
	var toks []uint32
	for i := 0; len(toks) < n; i++ {
		toks = append(toks, tok.Encode(fmt.Sprintf("Part %d. %s", i+1, text))...)
	}
	return toks[:n], nil
}

// fastestIn makes tier the fastest one holding every block of chain:
// copies above it are dropped (or moved down to it), then a warm copies up
// to it what only a slower tier holds; it waits until a lookup says so
// (and the object store has no upload pending), dropping again any copy a
// late promotion made above.
func fastestIn(ctx context.Context, c *client.Client, ns index.NamespaceID, chain []index.Hash, tier string) error {
	above := tiers[:slices.Index(tiers, tier)]
	demote := func() error {
		for _, t := range above {
			if _, err := c.Evict(ctx, &pb.EvictRequest{HasNamespace: true, Namespace: uint64(ns), Tier: t, Demote: true, MaxListed: 1}); err != nil {
				return fmt.Errorf("demote from %s: %w", t, err)
			}
		}
		return nil
	}
	if err := demote(); err != nil {
		return err
	}
	if tier != tiers[len(tiers)-1] {
		keys := make([]index.Key, len(chain))
		for i, h := range chain {
			keys[i] = index.Key{NS: ns, Hash: h}
		}
		if _, err := c.Warm(ctx, keys, tier, nil); err != nil {
			return fmt.Errorf("warm into %s: %w", tier, err)
		}
	}
	var last string
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		lr, err := c.Lookup(ctx, ns, chain)
		if err != nil {
			return err
		}
		held := heldByTier(lr)
		ok, clean := held[tier] == uint32(len(chain)), true
		for _, t := range above {
			clean = clean && held[t] == 0
		}
		if ok && clean && tier == "s3" {
			st, err := c.Stats(ctx)
			if err != nil {
				return err
			}
			ok = st.Tiers[len(st.Tiers)-1].Detail["pending_bytes"] == 0
		}
		if ok && clean {
			return nil
		}
		if !clean {
			if err := demote(); err != nil {
				return err
			}
		}
		last = fmt.Sprint(held)
	}
	return fmt.Errorf("the blocks are not in %s alone after a minute: leading blocks by tier %s (is the node started with an s3 tier?)", tier, last)
}

// heldByTier is how many leading blocks of a lookup's chain each tier
// holds.
func heldByTier(lr *pb.LookupResponse) map[string]uint32 {
	held := map[string]uint32{}
	for _, tb := range lr.Tiers {
		held[tb.Tier] = max(held[tb.Tier], tb.Blocks)
	}
	return held
}

var errShort = errors.New("the restore stopped short")

// restoreInto restores chain's blocks into dst as an engine does — a
// lookup, then one fetch of what it found straight into dst — and returns
// how long that took. The lookup must find every block, in tier.
func restoreInto(ctx context.Context, c *client.Client, ns index.NamespaceID, chain []index.Hash, tier string, dst []byte, bb int) (time.Duration, error) {
	start := time.Now()
	lr, err := c.Lookup(ctx, ns, chain)
	if err != nil {
		return 0, err
	}
	if held := heldByTier(lr); lr.Blocks != uint32(len(chain)) || held[tier] != uint32(len(chain)) {
		return 0, fmt.Errorf("%w: the lookup found %d of %d blocks, by tier %v", errShort, lr.Blocks, len(chain), held)
	}
	keys := make([]index.Key, lr.Blocks)
	for i := range keys {
		keys[i] = index.Key{NS: ns, Hash: chain[i]}
	}
	got := 0
	err = c.GetFunc(ctx, keys, client.GetOptions{StopAtMiss: true, Buffer: func(i, size int) []byte {
		if size != bb {
			return make([]byte, size) // refused below
		}
		return dst[i*bb : (i+1)*bb]
	}}, func(i int, r client.Result) error {
		chained := i == 0 && !r.HasParent || i > 0 && r.HasParent && r.Parent == chain[i-1]
		if !r.Found || len(r.Data) != bb || !chained {
			return fmt.Errorf("%w at block %d: found %v, %d bytes, chained %v, %v", errShort, i, r.Found, len(r.Data), chained, r.Err)
		}
		got++
		return nil
	})
	took := time.Since(start)
	if err == nil && got != len(keys) {
		err = fmt.Errorf("%w: %d of %d blocks", errShort, got, len(keys))
	}
	return took, err
}

// breakEven is the shortest length from which restoring wins at every
// longer length measured, or 0 if it does not at the longest.
func breakEven(rows []row, wins func(row) bool) int {
	at := 0
	for i := len(rows) - 1; i >= 0 && wins(rows[i]); i-- {
		at = rows[i].Tokens
	}
	return at
}

func printTable(rep report) {
	fmt.Printf("%7s %7s %10s %11s %8s %9s %9s %9s %8s %8s %8s\n", "TOKENS", "BLOCKS", "KV_BYTES", "PREFILL_MS", "TAIL_MS",
		"DRAM_MS", "SSD_MS", "S3_MS", "DRAM_x", "SSD_x", "S3_x")
	for _, r := range rep.Rows {
		fmt.Printf("%7d %7d %10d %11.2f %8.2f %9.2f %9.2f %9.2f %7.1fx %7.1fx %7.1fx\n", r.Tokens, r.Blocks, r.KVBytes, r.PrefillMS, r.TailMS,
			r.RestoreMS["dram"], r.RestoreMS["ssd"], r.RestoreMS["s3"], r.Speedup["dram"], r.Speedup["ssd"], r.Speedup["s3"])
	}
	fmt.Printf("(median of %d runs; x: prefill time / restore time; tail: the last token's step after a full restore)\n", rep.Runs)
	say := func(n int) string {
		switch {
		case n == 0:
			return fmt.Sprintf("never up to %d tokens", rep.Rows[len(rep.Rows)-1].Tokens)
		case n == rep.Rows[0].Tokens:
			return fmt.Sprintf("≤ %d tokens (every length measured)", n)
		}
		return fmt.Sprintf("from %d tokens", n)
	}
	for _, tier := range tiers {
		fmt.Printf("break-even %-4s: restore < prefill: %s; restore + tail < prefill: %s\n", tier,
			say(rep.BreakEven[tier]), say(rep.BreakEvenTTFT[tier]))
	}
}

func median(xs []float64) float64 {
	s := slices.Sorted(slices.Values(xs))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
