package simulate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/kvstrata/kvstrata/replay"
	"github.com/kvstrata/kvstrata/router/policy"
	tierpolicy "github.com/kvstrata/kvstrata/tiers/policy"
	"github.com/kvstrata/kvstrata/trace"
)

// req is a trace request of input tokens over hash ids, at ms.
func req(ms int64, input, output int64, ids ...uint64) trace.Request {
	return trace.Request{Timestamp: ms, InputLength: input, OutputLength: output, HashIDs: ids}
}

// small is a config for crafted traces: small pools and a small cache, so
// that the runs take little time.
func small(policies ...policy.Policy) Config {
	return Config{Workers: 2, Policies: policies, PoolTokens: 16384, DRAMTokens: 1 << 16, SSDTokens: 1 << 18}
}

func runRows(t *testing.T, reqs []trace.Request, cfg Config) map[string]Row {
	t.Helper()
	rows, err := Run(context.Background(), reqs, cfg)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]Row{}
	for _, r := range rows {
		if r.Completed != len(reqs) || r.Failed != 0 {
			t.Fatalf("%s: %d of %d completed, %d failed (%v)", r.Router, r.Completed, len(reqs), r.Failed, r.FirstError)
		}
		key := r.Router
		if r.Cache == CacheNone {
			key += "/none"
		}
		out[key] = r
	}
	return out
}

// ids is n hash ids from first on.
func ids(first uint64, n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = first + uint64(i)
	}
	return out
}

func hits(r Row) int64 {
	var n int64
	for _, v := range r.HitTokensByTier {
		n += v
	}
	return n
}

// conversations is n conversations of turns requests each, interleaved a
// second apart: turn k of conversation c repeats its whole history, a
// prefix of 2 hash ids a turn, and adds one.
func conversations(n, turns int) []trace.Request {
	var reqs []trace.Request
	ms := int64(0)
	for k := range turns {
		for c := range n {
			var ids []uint64
			for j := 0; j <= 2*k+1; j++ {
				ids = append(ids, uint64(1000*(c+1)+j))
			}
			reqs = append(reqs, req(ms, int64(len(ids))*replay.BlockTokens, 8, ids...))
			ms += 1000
		}
	}
	return reqs
}

func TestTheSameSeedGivesTheSameRows(t *testing.T) {
	reqs := conversations(3, 4)
	cfg := small()
	cfg.Seed = 7
	cfg.Baselines = []policy.Policy{policy.Random, policy.KVHBM}
	var outs []string
	for range 2 {
		rows, err := Run(context.Background(), reqs, cfg)
		if err != nil {
			t.Fatal(err)
		}
		for i := range rows {
			rows[i].WallS = 0 // the only field measured in wall time
		}
		b, err := json.Marshal(rows)
		if err != nil {
			t.Fatal(err)
		}
		outs = append(outs, string(b))
	}
	if outs[0] != outs[1] {
		t.Fatalf("two runs with seed 7 differ:\n%s\n%s", outs[0], outs[1])
	}
	if n := strings.Count(outs[0], `"router"`); n != 7 {
		t.Fatalf("%d rows, want one per policy and one per baseline (7):\n%s", n, outs[0])
	}
	if n := strings.Count(outs[0], `"cache":"none"`); n != 2 {
		t.Fatalf("%d rows without the cache, want the 2 baselines:\n%s", n, outs[0])
	}
}

func TestKVTieredFindsThePrefixEveryRequestShares(t *testing.T) {
	// Ten requests a second apart, all starting with the same 4 hash ids
	// (2048 tokens), each with one block of its own.
	var reqs []trace.Request
	for i := range 10 {
		reqs = append(reqs, req(int64(i)*1000, 5*replay.BlockTokens, 4, 0, 1, 2, 3, uint64(100+i)))
	}
	r := runRows(t, reqs, small(policy.KVTiered))["kv-tiered"]
	if got, want := hits(r), int64(9*4*replay.BlockTokens); got < want {
		t.Fatalf("kv-tiered found %d prompt tokens cached (%v), want at least %d: the shared 2048 tokens of the 9 requests after the first",
			got, r.HitTokensByTier, want)
	}
	if r.PrefixHitRate <= 0.7 {
		t.Fatalf("prefix hit rate %v, want above 0.7 (36 of 50 blocks shared)", r.PrefixHitRate)
	}
}

func TestKVRoutersSendAConversationBackToTheWorkerHoldingIt(t *testing.T) {
	// Three conversations over two workers: round-robin sends each turn
	// to the other worker than the last, the KV-aware routers to the one
	// holding the history.
	rows := runRows(t, conversations(3, 4), small(policy.RoundRobin, policy.KVHBM, policy.KVTiered))
	rr, hbm, tiered := rows["round-robin"], rows["kv-hbm"], rows["kv-tiered"]
	if hbm.HitTokensByTier["hbm"] <= rr.HitTokensByTier["hbm"] {
		t.Errorf("kv-hbm found %d tokens in the pools, round-robin %d: want kv-hbm more", hbm.HitTokensByTier["hbm"], rr.HitTokensByTier["hbm"])
	}
	if tiered.HitTokensByTier["hbm"] <= rr.HitTokensByTier["hbm"] {
		t.Errorf("kv-tiered found %d tokens in the pools, round-robin %d: want kv-tiered more", tiered.HitTokensByTier["hbm"], rr.HitTokensByTier["hbm"])
	}
	if rr.HitTokensByTier["dram"] == 0 {
		t.Errorf("round-robin restored nothing from DRAM (%v): its workers should onboard the history the other one offloaded", rr.HitTokensByTier)
	}
	if tiered.TTFTMeanS >= rr.TTFTMeanS {
		t.Errorf("kv-tiered mean TTFT %v, round-robin %v: want kv-tiered lower", tiered.TTFTMeanS, rr.TTFTMeanS)
	}
}

func TestABaselineRunsWithoutTheCacheAndTheCacheBeatsIt(t *testing.T) {
	// Round-robin sends each turn of a conversation to the other worker
	// than the last: with the cache, that worker restores the history (the
	// prefix the turn shares with the one before) that the other one
	// offloaded; without it, it computes the history again. kv-tiered
	// sends the turn back to the worker holding it either way.
	cfg := small(policy.RoundRobin, policy.KVTiered)
	cfg.Baselines = []policy.Policy{policy.RoundRobin, policy.KVTiered}
	rows := runRows(t, conversations(3, 4), cfg)
	for _, name := range []string{"round-robin", "kv-tiered"} {
		with, without := rows[name], rows[name+"/none"]
		if with.Cache != CacheKVStrata || without.Cache != CacheNone {
			t.Fatalf("%s: cache %q and %q, want %q and %q", name, with.Cache, without.Cache, CacheKVStrata, CacheNone)
		}
		for _, tier := range []string{"dram", "ssd", "s3"} {
			if n, ok := without.HitTokensByTier[tier]; !ok || n != 0 {
				t.Errorf("%s without the cache: %s hit tokens %d (present %v), want 0", name, tier, n, ok)
			}
		}
		if without.OffloadedBlocks != 0 || without.CacheTimeouts != 0 {
			t.Errorf("%s without the cache offloaded %d blocks, timed out %d onboardings; want none", name, without.OffloadedBlocks, without.CacheTimeouts)
		}
	}
	rr, base := rows["round-robin"], rows["round-robin/none"]
	if hits(rr) <= hits(base) {
		t.Errorf("round-robin: %d prompt tokens not computed with the cache (%v), %d without (%v): want more with it",
			hits(rr), rr.HitTokensByTier, hits(base), base.HitTokensByTier)
	}
	if rr.HitTokensByTier["dram"] == 0 || rr.TTFTMeanS >= base.TTFTMeanS {
		t.Errorf("round-robin: mean TTFT %v with the cache (%d tokens from DRAM), %v without: want it lower with the cache",
			rr.TTFTMeanS, rr.HitTokensByTier["dram"], base.TTFTMeanS)
	}
}

func TestRowsCarryLatenciesAndCounts(t *testing.T) {
	reqs := []trace.Request{req(0, 600, 5, 1, 2), req(10, 300, 3, 3)}
	r := runRows(t, reqs, small(policy.LeastLoaded))["least-loaded"]
	if r.Requests != 2 || r.PromptTokens != 900 {
		t.Fatalf("row %+v, want 2 requests of 900 prompt tokens in all", r)
	}
	for name, v := range map[string]float64{"ttft_mean_s": r.TTFTMeanS, "ttft_p99_s": r.TTFTP99S, "itl_mean_s": r.ITLMeanS, "e2e_mean_s": r.E2EMeanS, "duration_s": r.DurationS} {
		if !(v > 0) {
			t.Errorf("%s is %v, want > 0", name, v)
		}
	}
	if r.E2EMeanS <= r.TTFTMeanS {
		t.Errorf("mean E2E %v is not after mean TTFT %v", r.E2EMeanS, r.TTFTMeanS)
	}
	for _, tier := range []string{"hbm", "dram", "ssd", "s3"} {
		if _, ok := r.HitTokensByTier[tier]; !ok {
			t.Errorf("hit_tokens_by_tier has no %s: %v", tier, r.HitTokensByTier)
		}
	}
}

func TestARequestLongerThanTheContextFailsAlone(t *testing.T) {
	reqs := []trace.Request{req(0, 600, 5, 1, 2), req(10, 20000, 3, ids(3, 40)...)}
	rows, err := Run(context.Background(), reqs, small(policy.Random))
	if err != nil {
		t.Fatal(err)
	}
	r := rows[0]
	if r.Completed != 1 || r.Failed != 1 || r.Errors["rejected"] != 1 || !strings.Contains(r.FirstError, "context length") {
		t.Fatalf("row %+v, want the 20000-token request rejected (the pool of 16384 tokens is the context) and the other completed", r)
	}
}

func TestBadInputIsAClearError(t *testing.T) {
	good := []trace.Request{req(0, 600, 5, 1, 2)}
	for _, c := range []struct {
		name string
		reqs []trace.Request
		cfg  Config
		is   error
		msg  string
	}{
		{"bad config, every problem at once", good, Config{Workers: -1, Speedup: -2, CachePolicy: "mru", Tiers: [3]TierModel{{Bandwidth: -1}}},
			ErrConfig, "workers is -1, must be in [1, 1024]; speedup is -2, must be in (0, 1e9]; cache policy \"mru\" is not one of lru, lfu, prefix, s3fifo, wtinylfu, s3fifo-prefix, wtinylfu-prefix, arc, arc-prefix, lhd; dram bandwidth is -1, must be > 0"},
		{"a policy twice", good, Config{Policies: []policy.Policy{policy.Random, policy.Random}}, ErrConfig, "policy random is given twice"},
		{"a baseline twice", good, Config{Baselines: []policy.Policy{policy.KVHBM, policy.Random, policy.KVHBM}}, ErrConfig, "baseline kv-hbm is given twice"},
		{"a pool of one block", good, Config{PoolTokens: 16}, ErrConfig, "pool tokens is 16, must hold at least two blocks"},
		{"too few hash ids", []trace.Request{req(0, 600, 5, 1, 2), req(5, 2000, 1, 1)}, Config{}, replay.ErrPrompt, "request 2: replay: bad request in trace: input_length 2000 needs 4 hash ids"},
		{"no output", []trace.Request{req(0, 600, 0, 1, 2)}, Config{}, replay.ErrPrompt, "request 1: replay: bad request in trace: output_length is 0"},
		{"out of time order", []trace.Request{req(5, 600, 5, 1, 2), req(0, 600, 5, 1, 2)}, Config{}, replay.ErrPrompt, "request 2's timestamp 0 is before request 1's 5"},
		{"empty", nil, Config{}, replay.ErrPrompt, "the trace has no requests"},
	} {
		t.Run(c.name, func(t *testing.T) {
			rows, err := Run(context.Background(), c.reqs, c.cfg)
			if !errors.Is(err, c.is) || !strings.Contains(err.Error(), c.msg) || rows != nil {
				t.Fatalf("Run: %v, %d rows; want an error matching %v that says %q", err, len(rows), c.is, c.msg)
			}
		})
	}
}

func TestACancelledRunStops(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := Run(ctx, conversations(2, 2), small(policy.Random))
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Run with a cancelled context: %v, want context.Canceled", err)
	}
}

func ExampleTierModel_Time() {
	dram := DefaultTiers()[0]
	// 750 blocks of 2 MiB (a 12,000-token prompt of Llama-3.1-8B) from DRAM.
	fmt.Println(dram.Time(750, 16*DefaultTokenBytes))
	// Output: 62.924559ms
}

// The simulated cache evicts as a node does: each tier by the node's
// default policy unless one policy is named for all.
func TestTheCacheTiersEvictAsTheNodesDo(t *testing.T) {
	for _, tc := range []struct {
		policy string
		want   []string
	}{
		{"", []string{tierpolicy.DefaultDRAM, tierpolicy.DefaultSSD, tierpolicy.DefaultS3}},
		{"arc", []string{"arc", "arc", "arc"}},
	} {
		cfg := Config{CachePolicy: tc.policy}
		cfg.EnsureDefaults()
		c, err := newCache(&cfg)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, l := range c.h.Stats().Levels {
			got = append(got, l.Policy)
		}
		c.close()
		if !slices.Equal(got, tc.want) {
			t.Errorf("cache policy %q: levels evict by %v, want %v", tc.policy, got, tc.want)
		}
	}
}
