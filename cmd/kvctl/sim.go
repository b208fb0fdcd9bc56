package main

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"

	"github.com/kvstrata/kvstrata/index"
	tierpolicy "github.com/kvstrata/kvstrata/tiers/policy"
	"github.com/kvstrata/kvstrata/tiers/sim"
)

// simFlags are the flags of kvctl sim, as typed.
type simFlags struct {
	policies      []string
	capacities    []string
	ssdCapacities []string
	admitMinSeen  int
	admitByFreq   bool
	ssdPolicy     string
	blockTokens   int
	parallel      int
}

var defaultCapacities = []string{"1e5", "1e6", "3e6", "1e7"}

func (a *app) newSimCommand() *cobra.Command {
	var f simFlags
	cmd := &cobra.Command{
		Use:   "sim TRACE",
		Short: "Replay a request trace through simulated caches and report hit rates",
		Long: `sim replays a request trace through a single cache tier for every
combination of eviction policy and capacity, and reports the share of input
tokens and of blocks that hit.

TRACE is a Mooncake JSONL trace: one JSON object a line with timestamp,
input_length, output_length and hash_ids (one id per block of the prompt,
naming the block with its whole prefix).

For each request, in file order, the hit is the number of leading blocks the
cache holds, up to the first it does not; token hits are min(hit blocks ×
block tokens, input_length). Then every block of the request is touched, or
inserted with evictions to make room, never evicting the request's own
blocks. The cache holds floor(capacity / block tokens) blocks.

Policies:
  lru     least recently used
  lfu     least frequently used with dynamic aging (LFU-DA)
  prefix  least recently used among blocks with no cached children, so a
          chain loses its leaves before its root
  s3fifo  S3-FIFO: a small probationary FIFO (5 %), a main FIFO with
          reinsertion of blocks used again, a ghost queue of evicted keys
  wtinylfu  W-TinyLFU: a window LRU (1 %, tuned by hill climbing), a
          segmented LRU main, and a frequency sketch admitting a window
          block only if used more often than main's next victim
  s3fifo-prefix  S3-FIFO that passes over blocks with cached children, so
          a chain loses its leaves before its root
  wtinylfu-prefix  W-TinyLFU whose window candidate and main victim are
          blocks with no cached children
  arc     ARC: an LRU of blocks used once and one of blocks used again,
          with ghost lists of evicted keys steering the split between them
  arc-prefix  ARC that passes over blocks with cached children
  lhd     least hit density: evicts, of 64 sampled blocks with no cached
          children, the one whose class (uses, depth in the chain, whether
          a block followed it) and age have shown the fewest hits per unit
          of time held; learned online from hits, evictions and ghosts
  belady  Belady's MIN, the offline optimum (it reads the trace's future);
          when it runs, each row shows how far the policy is below it

Capacities are token counts: 1000000, 1e6, 2.5e6, or with a decimal suffix
k, M, G (1M = 1e6 tokens, 500k = 5e5).

Multi-tier mode: with --ssd-capacity-tokens, each capacity is a DRAM tier
over an SSD tier of each SSD capacity, replayed through the node's real tier
hierarchy: DRAM victims are demoted to the SSD (if seen --admit-min-seen
times), SSD hits are promoted back with their SSD copy kept. Each row then
also shows the share of blocks each tier served. Belady runs as one tier of
DRAM + SSD capacity, the bound for the pair.

Table output goes to stdout, with a progress bar on stderr when stderr is a
terminal. Exit status: 0 on success, 1 when TRACE is missing or malformed
(the message names the line), 2 for a bad flag or value.`,
		Example: `  # Every policy at 1e5, 1e6, 3e6 and 1e7 tokens, as a table
  kvctl sim testdata/traces/conversation_trace.jsonl

  # LRU and prefix against the optimum at 1M and 10M tokens, as JSON
  kvctl sim trace.jsonl --policy lru,prefix,belady --capacity-tokens 1M,10M -o json

  # DRAM of 1M tokens over SSDs of 3M and 10M, SSD admission on second use
  kvctl sim trace.jsonl -p lru,prefix -c 1M --ssd-capacity-tokens 3M,10M --admit-min-seen 2

  # A trace recorded with 256-token blocks
  kvctl sim trace.jsonl --block-tokens 256 -c 500k,2M`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usageErrorf("sim takes one TRACE file, got %d arguments", len(args))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.runSim(cmd.Context(), args[0], f)
		},
	}
	fl := cmd.Flags()
	fl.StringSliceVarP(&f.policies, "policy", "p", slices.Clone(sim.Policies),
		"policies to replay, comma-separated: "+strings.Join(sim.Policies, ", "))
	fl.StringSliceVarP(&f.capacities, "capacity-tokens", "c", defaultCapacities,
		"cache capacities in tokens, comma-separated: 1000000, 1e6, 1M")
	fl.StringSliceVar(&f.ssdCapacities, "ssd-capacity-tokens", nil,
		"multi-tier mode: SSD capacities in tokens under each DRAM capacity")
	fl.IntVar(&f.admitMinSeen, "admit-min-seen", 1,
		"multi-tier mode: admit a DRAM victim to the SSD only if accessed this often (1: always)")
	fl.BoolVar(&f.admitByFreq, "admit-by-frequency", false,
		"multi-tier mode: admit a DRAM victim to a full SSD only if a frequency sketch saw it more often than the SSD's next victim (replaces --admit-min-seen)")
	fl.StringVar(&f.ssdPolicy, "ssd-policy", "",
		"multi-tier mode: the SSD's policy, one of "+strings.Join(tierpolicy.Names, ", ")+" (default: the same as --policy)")
	fl.IntVar(&f.blockTokens, "block-tokens", sim.DefaultBlockTokens,
		"tokens per block of the trace's hash ids")
	fl.IntVar(&f.parallel, "parallel", 0,
		"replays run at once (0: one per CPU)")
	return cmd
}

// simPlan is a checked sim command line.
type simPlan struct {
	policies      []string
	capacities    []int64
	ssdCapacities []int64
	admitMinSeen  int
	admitByFreq   bool
	ssdPolicy     string
	blockTokens   int
	parallel      int
}

// plan checks the flags and reports every problem at once as a usage
// error.
func (f simFlags) plan() (simPlan, error) {
	p := simPlan{blockTokens: f.blockTokens, parallel: f.parallel, admitMinSeen: f.admitMinSeen, admitByFreq: f.admitByFreq, ssdPolicy: f.ssdPolicy}
	var probs []string
	for _, name := range f.policies {
		name = strings.ToLower(strings.TrimSpace(name))
		switch {
		case !slices.Contains(sim.Policies, name):
			probs = append(probs, fmt.Sprintf("unknown policy %q (want %s)", name, strings.Join(sim.Policies, ", ")))
		case !slices.Contains(p.policies, name):
			p.policies = append(p.policies, name)
		}
	}
	if len(f.policies) == 0 {
		probs = append(probs, "no policy given")
	}
	if f.blockTokens < 1 || f.blockTokens > index.MaxBlockTokens {
		probs = append(probs, fmt.Sprintf("--block-tokens is %d, must be in [1, %d]", f.blockTokens, index.MaxBlockTokens))
	}
	for _, s := range f.capacities {
		n, err := parseTokenCount(s)
		switch {
		case err != nil:
			probs = append(probs, "--capacity-tokens: "+err.Error())
		case f.blockTokens >= 1 && n < int64(f.blockTokens):
			probs = append(probs, fmt.Sprintf("--capacity-tokens: %d tokens hold no block of %d tokens", n, f.blockTokens))
		case !slices.Contains(p.capacities, n):
			p.capacities = append(p.capacities, n)
		}
	}
	if len(f.capacities) == 0 {
		probs = append(probs, "no capacity given")
	}
	for _, s := range f.ssdCapacities {
		n, err := parseTokenCount(s)
		switch {
		case err != nil:
			probs = append(probs, "--ssd-capacity-tokens: "+err.Error())
		case f.blockTokens >= 1 && n < int64(f.blockTokens):
			probs = append(probs, fmt.Sprintf("--ssd-capacity-tokens: %d tokens hold no block of %d tokens", n, f.blockTokens))
		case !slices.Contains(p.ssdCapacities, n):
			p.ssdCapacities = append(p.ssdCapacities, n)
		}
	}
	if f.admitMinSeen < 1 || f.admitMinSeen > 15 {
		probs = append(probs, fmt.Sprintf("--admit-min-seen is %d, must be in [1, 15]", f.admitMinSeen))
	}
	if f.admitByFreq && f.admitMinSeen != 1 {
		probs = append(probs, "--admit-by-frequency and --admit-min-seen are two admission rules: give one")
	}
	if f.admitByFreq && len(f.ssdCapacities) == 0 {
		probs = append(probs, "--admit-by-frequency needs --ssd-capacity-tokens (multi-tier mode)")
	}
	if f.ssdPolicy != "" && !tierpolicy.Valid(f.ssdPolicy) {
		probs = append(probs, fmt.Sprintf("--ssd-policy %q is unknown (want one of %s)", f.ssdPolicy, strings.Join(tierpolicy.Names, ", ")))
	}
	if f.ssdPolicy != "" && len(f.ssdCapacities) == 0 {
		probs = append(probs, "--ssd-policy needs --ssd-capacity-tokens (multi-tier mode)")
	}
	if f.parallel < 0 {
		probs = append(probs, fmt.Sprintf("--parallel is %d, must be ≥ 0", f.parallel))
	}
	if len(probs) > 0 {
		return simPlan{}, usageErrorf("sim: %s", strings.Join(probs, "; "))
	}
	return p, nil
}

// simRow is one line of sim's output; the JSON form is part of kvctl's
// interface.
type simRow struct {
	Policy         string `json:"policy"`
	CapacityTokens int64  `json:"capacity_tokens"`
	// Multi-tier rows: the SSD under a DRAM of CapacityTokens, and what
	// each tier served.
	SSDCapacityTokens int64          `json:"ssd_capacity_tokens,omitempty"`
	AdmitMinSeen      int            `json:"admit_min_seen,omitempty"`
	AdmitByFrequency  bool           `json:"admit_by_frequency,omitempty"`
	Tiers             []simTierShare `json:"tiers,omitempty"`
	CapacityBlocks    int64          `json:"capacity_blocks"`
	BlockTokens       int            `json:"block_tokens"`
	TokenHitRate      float64        `json:"token_hit_rate"`
	BlockHitRate      float64        `json:"block_hit_rate"`
	// The gaps are Belady's hit rate minus this row's at the same
	// capacity; present only when belady ran.
	TokenGapToBelady *float64 `json:"token_gap_to_belady,omitempty"`
	BlockGapToBelady *float64 `json:"block_gap_to_belady,omitempty"`
	Requests         int      `json:"requests"`
	Blocks           int64    `json:"blocks"`
	HitBlocks        int64    `json:"hit_blocks"`
	InputTokens      int64    `json:"input_tokens"`
	HitTokens        int64    `json:"hit_tokens"`
	Inserted         int64    `json:"inserted"`
	Evicted          int64    `json:"evicted"`
	Rejected         int64    `json:"rejected"`
}

func (a *app) runSim(ctx context.Context, path string, f simFlags) error {
	p, err := f.plan()
	if err != nil {
		return err
	}
	w, err := sim.ReadWorkload(path, p.blockTokens)
	if err != nil {
		return err
	}
	grid := sim.Grid{Policies: p.policies, Tokens: p.capacities, SSDTokens: p.ssdCapacities, AdmitMinSeen: p.admitMinSeen,
		AdmitByFrequency: p.admitByFreq, SSDPolicy: p.ssdPolicy}
	specs := grid.Specs()

	opts := &sim.Options{Parallel: p.parallel}
	var bar *progressbar.ProgressBar
	if a.interactive(a.stderr) {
		bar = progressbar.NewOptions64(int64(len(specs))*w.Blocks(),
			progressbar.OptionSetWriter(a.stderr),
			progressbar.OptionSetDescription(fmt.Sprintf("replaying %d caches", len(specs))),
			progressbar.OptionShowCount(),
			progressbar.OptionSetItsString("blocks"),
			progressbar.OptionShowIts(),
			progressbar.OptionThrottle(100*time.Millisecond),
			progressbar.OptionClearOnFinish(),
		)
		opts.Progress = func(done, _ int64) { _ = bar.Set64(done) }
	}
	results, err := sim.Run(ctx, w, specs, opts)
	if bar != nil {
		_ = bar.Exit()
	}
	if err != nil {
		return err
	}

	rows := simRows(results, p.blockTokens)
	if a.output == outputJSON {
		return writeJSON(a.stdout, rows)
	}
	fmt.Fprintf(a.stdout, "%s: %d requests, %d block references (%d distinct) of %d tokens\n\n",
		filepath.Base(path), w.Requests(), w.Blocks(), w.DistinctBlocks(), w.BlockTokens())
	multi := len(p.ssdCapacities) > 0
	header := []string{"POLICY", "CAPACITY_TOKENS", "CAPACITY_BLOCKS", "TOKEN_HIT_RATE", "BLOCK_HIT_RATE"}
	if multi {
		header = []string{"POLICY", "DRAM_TOKENS", "SSD_TOKENS", "CAPACITY_BLOCKS", "TOKEN_HIT_RATE", "BLOCK_HIT_RATE", "DRAM_BLOCK_HITS", "SSD_BLOCK_HITS"}
	}
	withGap := grid.HasBelady()
	if withGap {
		header = append(header, "TOKEN_GAP_TO_BELADY", "BLOCK_GAP_TO_BELADY")
	}
	var cells [][]string
	for _, r := range rows {
		c := []string{r.Policy, fmt.Sprint(r.CapacityTokens), fmt.Sprint(r.CapacityBlocks), percent(r.TokenHitRate), percent(r.BlockHitRate)}
		if multi {
			shares := []string{"-", "-"}
			for i, t := range r.Tiers {
				shares[i] = percent(t.BlockHitRate)
			}
			ssd := "-"
			if r.SSDCapacityTokens > 0 {
				ssd = fmt.Sprint(r.SSDCapacityTokens)
			}
			c = append([]string{r.Policy, fmt.Sprint(r.CapacityTokens), ssd}, append(c[2:], shares...)...)
		}
		if withGap {
			if r.TokenGapToBelady != nil {
				c = append(c, points(*r.TokenGapToBelady), points(*r.BlockGapToBelady))
			} else {
				c = append(c, "-", "-")
			}
		}
		cells = append(cells, c)
	}
	return writeTable(a.stdout, header, cells)
}

// simTierShare is what one tier of a multi-tier replay served.
type simTierShare struct {
	Tier         string  `json:"tier"`
	HitBlocks    int64   `json:"hit_blocks"`
	BlockHitRate float64 `json:"block_hit_rate"`
	Demotions    int64   `json:"demotions"`
	Promotions   int64   `json:"promotions"`
}

// simRows turns results into output rows, with the gap to Belady at the
// same total capacity when Belady is among them.
func simRows(results []sim.Result, blockTokens int) []simRow {
	bounds := sim.BeladyBounds(results)
	rows := make([]simRow, len(results))
	for i, r := range results {
		var policy string
		var capacity int64
		switch s := r.Spec.(type) {
		case sim.SingleTier:
			policy, capacity = s.Policy, s.CapacityTokens
		case sim.MultiTier:
			policy, capacity = s.Policy, s.DRAMTokens
			rows[i].SSDCapacityTokens, rows[i].AdmitMinSeen = s.SSDTokens, max(s.AdmitMinSeen, 1)
			rows[i].AdmitByFrequency = s.AdmitByFrequency
			for _, t := range r.Tiers {
				rows[i].Tiers = append(rows[i].Tiers, simTierShare{Tier: t.Tier, HitBlocks: t.HitBlocks,
					BlockHitRate: t.BlockHitRate(r), Demotions: t.Demotions, Promotions: t.Promotions})
			}
		}
		rows[i] = simRow{
			SSDCapacityTokens: rows[i].SSDCapacityTokens,
			AdmitMinSeen:      rows[i].AdmitMinSeen,
			AdmitByFrequency:  rows[i].AdmitByFrequency,
			Tiers:             rows[i].Tiers,
			Policy:            policy,
			CapacityTokens:    capacity,
			CapacityBlocks:    r.CapacityBlocks,
			BlockTokens:       blockTokens,
			TokenHitRate:      r.TokenHitRate(),
			BlockHitRate:      r.BlockHitRate(),
			Requests:          r.Requests,
			Blocks:            r.Blocks,
			HitBlocks:         r.HitBlocks,
			InputTokens:       r.InputTokens,
			HitTokens:         r.HitTokens,
			Inserted:          r.Inserted,
			Evicted:           r.Evicted,
			Rejected:          r.Rejected,
		}
		if b := bounds[i]; b != nil {
			tg, bg := b.TokenHitRate()-r.TokenHitRate(), b.BlockHitRate()-r.BlockHitRate()
			rows[i].TokenGapToBelady, rows[i].BlockGapToBelady = &tg, &bg
		}
	}
	return rows
}
