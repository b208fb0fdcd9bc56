package disagg_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/api/client"
	pb "github.com/kvstrata/kvstrata/api/v1"
	"github.com/kvstrata/kvstrata/engine/sched"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/internal/freeport"
)

// decodeTokens is how many tokens the decode side generates.
const decodeTokens = 12

// decodeRequest is the decode side's request for p with params, as the
// aggregated worker's would be without them.
func decodeRequest(p []uint32, s sched.Sampling, params *sched.KVTransferParams) sched.Request {
	return sched.Request{ID: "decode", Prompt: p, MaxTokens: decodeTokens, Sampling: s, IgnoreEOS: true, Transfer: params}
}

// A prompt handed from a prefill worker to a decode worker through a cache
// node decodes, greedy or sampled with a seed, to exactly the aggregated
// worker's tokens, on and off block boundaries; the decode side onboards
// every block it may (all but the one holding the last prompt token) and
// computes only the rest. The params name the node that holds the blocks
// though the prefill request named none: the decode side must load them
// from there at once, not ask a directory that may not list them yet (a
// one-node Raft cluster lists a block only once its change commits).
func TestHandoffDecodesAsTheAggregatedWorker(t *testing.T) {
	cache := startCache(t)
	agg := newWorker(t, "")
	prefill := newWorker(t, cache)
	decode := newWorker(t, cache)
	bt := tinyConfig.BlockTokens
	seed := uint32(0)
	for _, n := range []int{5, 16, 17, 64, 150, 300} {
		for _, s := range []sched.Sampling{{}, {Temperature: 0.8, Seed: 7}} {
			seed++
			t.Run(fmt.Sprintf("%d tokens, temperature %v", n, s.Temperature), func(t *testing.T) {
				p := prompt(n, seed)
				want, wlast := agg.generate(t, decodeRequest(p, s, nil))
				params, first := handoff(t, prefill, p, "")
				if full := n / bt; len(params.BlockHashes) != full || full > 0 && params.CacheNode != cache {
					t.Fatalf("params %+v; want the prompt's %d full blocks at the prefill worker's node %s", params, full, cache)
				}
				if s.Temperature == 0 && first != want[0] {
					t.Errorf("the prefill side's token %d, the aggregated worker's first %d", first, want[0])
				}
				before := decode.Stats()
				got, last := decode.generate(t, decodeRequest(p, s, params))
				if last.Err != nil || !slices.Equal(got, want) {
					t.Fatalf("decode side: %v (err %v), the aggregated worker's %v", got, last.Err, want)
				}
				onboard := min(n/bt, (n-1)/bt) * bt // the block of the last token is computed
				if u := last.Usage; u.OnboardedTokens != onboard || u.CachedTokens != onboard || u.PromptTokens != n || u.CompletionTokens != wlast.Usage.CompletionTokens {
					t.Errorf("decode side's usage %+v, want %d tokens onboarded of %d", u, onboard, n)
				}
				after := decode.Stats()
				if on, re := after.OnboardedTokens-before.OnboardedTokens, after.RecomputedTokens-before.RecomputedTokens; on != uint64(onboard) || re != 0 {
					t.Errorf("decode side onboarded %d tokens and recomputed %d named ones, want %d and 0", on, re, onboard)
				}
			})
		}
	}
}

// Named blocks that are gone by the time the decode side asks (evicted
// in between, or on a node that is not there) are computed there, and the
// output is still the aggregated worker's: a hole in the middle stops the
// load at the hole, and none left leaves the whole prompt to compute.
func TestHandoffOfBlocksThatAreGoneIsRecomputed(t *testing.T) {
	cache := startCache(t)
	agg := newWorker(t, "")
	prefill := newWorker(t, cache)
	decode := newWorker(t, cache)
	c, err := client.Dial(context.Background(), cache, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	bt := tinyConfig.BlockTokens
	for i, tc := range []struct {
		name    string
		evict   func(ks []index.Key) []index.Key
		onboard int // blocks
	}{
		{"block 3 of 9", func(ks []index.Key) []index.Key { return ks[3:4] }, 3},
		{"every block", func(ks []index.Key) []index.Key { return ks }, 0},
		{"the node", nil, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := prompt(150, uint32(100+i)) // 9 full blocks
			want, _ := agg.generate(t, decodeRequest(p, sched.Sampling{}, nil))
			params, _ := handoff(t, prefill, p, "")
			ks := keys(t, params)
			if tc.evict == nil { // the params name a node that is not there
				params.CacheNode = freeport.Addr(t)
			} else {
				var sel []*pb.BlockKey
				for _, k := range tc.evict(ks) {
					sel = append(sel, &pb.BlockKey{Namespace: uint64(k.NS), Hash: uint64(k.Hash)})
				}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				if _, err := c.Evict(ctx, &pb.EvictRequest{Keys: sel}); err != nil {
					t.Fatal(err)
				}
				if h := held(t, cache, ks[:tc.onboard+1]); h != tc.onboard {
					t.Fatalf("after the eviction the node holds %d of the first %d blocks, want %d", h, tc.onboard+1, tc.onboard)
				}
			}
			before := decode.Stats()
			got, last := decode.generate(t, decodeRequest(p, sched.Sampling{}, params))
			if last.Err != nil || !slices.Equal(got, want) {
				t.Fatalf("decode side: %v (err %v), the aggregated worker's %v", got, last.Err, want)
			}
			if u := last.Usage; u.OnboardedTokens != tc.onboard*bt {
				t.Errorf("decode side's usage %+v, want %d tokens onboarded", u, tc.onboard*bt)
			}
			after := decode.Stats()
			if re := after.RecomputedTokens - before.RecomputedTokens; re != uint64((len(ks)-tc.onboard)*bt) {
				t.Errorf("decode side recomputed %d named tokens, want %d", re, (len(ks)-tc.onboard)*bt)
			}
		})
	}
}

// With two cache nodes, a prefill request naming the node nearest its
// decode worker (kvstrata_cache_node) has its blocks written there, not at
// the prefill worker's own node, and the decode worker, whose node that
// is, loads them from it. Without a name, the blocks stay at the prefill
// worker's node, the params say so, and a decode worker elsewhere loads
// them from there.
func TestHandoffThroughTheNodeTheRequestNames(t *testing.T) {
	near, far := startCache(t), startCache(t)
	agg := newWorker(t, "")
	prefill := newWorker(t, far)
	decode := newWorker(t, near)
	bt := tinyConfig.BlockTokens
	for i, tc := range []struct {
		name, node, at, not string
	}{
		{"named", near, near, far},
		{"not named", "", far, near},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := prompt(100, uint32(200+i)) // 6 full blocks
			want, _ := agg.generate(t, decodeRequest(p, sched.Sampling{}, nil))
			params, _ := handoff(t, prefill, p, tc.node)
			ks := keys(t, params)
			if params.CacheNode != tc.at {
				t.Errorf("params name node %q, want %s", params.CacheNode, tc.at)
			}
			if h, o := held(t, tc.at, ks), held(t, tc.not, ks); h != len(ks) || o != 0 {
				t.Fatalf("%s holds %d of the %d blocks, %s %d; want all and none", tc.at, h, len(ks), tc.not, o)
			}
			got, last := decode.generate(t, decodeRequest(p, sched.Sampling{}, params))
			if last.Err != nil || !slices.Equal(got, want) {
				t.Fatalf("decode side: %v (err %v), the aggregated worker's %v", got, last.Err, want)
			}
			if u := last.Usage; u.OnboardedTokens != len(ks)*bt {
				t.Errorf("decode side's usage %+v, want all %d named tokens onboarded", u, len(ks)*bt)
			}
		})
	}
}
