package sched

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/kvstrata/kvstrata/engine/model/sim"
)

// TestDisaggregatedPrefillThenDecode hands a prompt from a prefill worker
// to a decode worker through the cache, and checks the decode side
// onboards every named block and generates what an aggregated worker does.
func TestDisaggregatedPrefillThenDecode(t *testing.T) {
	conn := newMapConn()
	m := newSim(t)
	p := prompt(150, 7) // 9 full blocks and 6 tokens
	const node = "10.0.0.7:7400"

	prefill := newEngine(t, Config{Model: m, Connector: conn})
	toks, last := generate(t, prefill, Request{Prompt: p, MaxTokens: 1, Transfer: &KVTransferParams{DoRemoteDecode: true, CacheNode: node}})
	if last.Err != nil || last.Finish != FinishLength || len(toks) != 1 {
		t.Fatalf("prefill: tokens %v, finish %q, err %v", toks, last.Finish, last.Err)
	}
	tp := last.Transfer
	ns := m.Layout().Namespace
	hs := ns.Hashes(p)
	if tp == nil || !tp.DoRemotePrefill || tp.DoRemoteDecode || tp.Namespace != ns.ID().String() || tp.CacheNode != node || len(tp.BlockHashes) != len(hs) {
		t.Fatalf("prefill's kv_transfer_params %+v, want do_remote_prefill, namespace %v, %d blocks at %s", tp, ns.ID(), len(hs), node)
	}
	for i, h := range hs {
		if tp.BlockHashes[i] != h.String() {
			t.Errorf("block %d named %s, want %s", i, tp.BlockHashes[i], h)
		}
	}
	if len(conn.stores) != 1 || len(conn.stores[0]) != len(hs) || len(conn.offloads) != 0 {
		t.Fatalf("the prefill side made %d stores (%v) and %d offloads, want one store of %d blocks and no offload", len(conn.stores), conn.nodes, len(conn.offloads), len(hs))
	}
	for i, b := range conn.stores[0] {
		if b.Hash != hs[i] || !sim.VerifyBlock(ns.ID(), b.Hash, ns.Layout.Layers, b.Data) {
			t.Errorf("stored block %d is not the prompt's block %v with its KV", i, hs[i])
		}
	}
	if st := prefill.Stats(); st.Pool.Free != st.Pool.Blocks || st.StoredBlocks != uint64(len(hs)) {
		t.Errorf("the prefill side holds %d blocks, stored %d", st.Pool.Blocks-st.Pool.Free, st.StoredBlocks)
	}

	// The decode side: its own pool, the same cache.
	rec := &recorder{Model: newSim(t)}
	decode := newEngine(t, Config{Model: rec, Connector: conn})
	conn.set(func(c *mapConn) { c.lookups = 0 })
	dtp := *tp
	dtoks, dlast := generate(t, decode, Request{Prompt: p, MaxTokens: 20, Transfer: &dtp})
	if w := want(m, p, 20); !slices.Equal(dtoks, w) || dlast.Err != nil {
		t.Fatalf("decode side: %v (err %v), want the aggregated %v", dtoks, dlast.Err, w)
	}
	if dtoks[0] != toks[0] {
		t.Errorf("the decode side's first token %d differs from the prefill side's %d", dtoks[0], toks[0])
	}
	if u := dlast.Usage; u.OnboardedTokens != 144 {
		t.Errorf("decode side usage %+v, want the 144 tokens of 9 blocks onboarded", u)
	}
	if c := rec.calls[0]; c.decode || c.seqs[0].Cached != 144 {
		t.Errorf("the decode side's prefill starts at token %d, want 144 (only the 6-token remainder)", c.seqs[0].Cached)
	}
	rec.checkKV(t)
	if !slices.Contains(conn.nodes, "load:"+node) {
		t.Errorf("the decode side did not load from the named node: %v", conn.nodes)
	}
	if conn.lookups != 0 {
		t.Errorf("%d Lookups: the named blocks need none", conn.lookups)
	}
}

func TestRemotePrefillParamsMustNameThePromptsBlocks(t *testing.T) {
	m := newSim(t)
	e := newEngine(t, Config{Model: m, Connector: newMapConn()})
	p := prompt(40, 1) // 2 full blocks
	ns := m.Layout().Namespace
	hs := ns.Hashes(p)
	other := ns.Hashes(prompt(40, 2))
	for _, tc := range []struct {
		name string
		tp   KVTransferParams
		says string
	}{
		{"another prompt's block", KVTransferParams{Namespace: ns.ID().String(), BlockHashes: []string{hs[0].String(), other[1].String()}}, "block 1 is"},
		{"more blocks than the prompt", KVTransferParams{Namespace: ns.ID().String(), BlockHashes: []string{hs[0].String(), hs[1].String(), other[1].String()}}, "names 3 blocks"},
		{"another namespace", KVTransferParams{Namespace: "00000000000000ab", BlockHashes: []string{hs[0].String()}}, "namespace"},
		{"not hex", KVTransferParams{Namespace: ns.ID().String(), BlockHashes: []string{"xyz"}}, "block 0"},
		{"no namespace", KVTransferParams{BlockHashes: []string{hs[0].String()}}, "namespace"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.tp.DoRemotePrefill = true
			_, err := e.Generate(context.Background(), Request{Prompt: p, MaxTokens: 2, Transfer: &tc.tp})
			if !errors.Is(err, ErrBadRequest) || !strings.Contains(err.Error(), tc.says) {
				t.Errorf("error %v, want ErrBadRequest saying %q", err, tc.says)
			}
		})
	}
}

func TestDisaggregationWithoutACache(t *testing.T) {
	m := newSim(t)
	e := newEngine(t, Config{Model: m})
	p := prompt(40, 1)
	_, last := generate(t, e, Request{Prompt: p, MaxTokens: 1, Transfer: &KVTransferParams{DoRemoteDecode: true}})
	if last.Finish != FinishAbort || !errors.Is(last.Err, ErrTransfer) || last.Transfer != nil {
		t.Errorf("remote decode without a cache: finish %q err %v transfer %+v; want abort with ErrTransfer", last.Finish, last.Err, last.Transfer)
	}
	// The decode side (another worker, whose pool lacks the prompt)
	// recomputes what it cannot load.
	e = newEngine(t, Config{Model: m})
	ns := m.Layout().Namespace
	var names []string
	for _, h := range ns.Hashes(p) {
		names = append(names, h.String())
	}
	tp := &KVTransferParams{DoRemotePrefill: true, Namespace: ns.ID().String(), BlockHashes: names}
	toks, last := generate(t, e, Request{Prompt: p, MaxTokens: 5, Transfer: tp})
	if !slices.Equal(toks, want(m, p, 5)) || last.Err != nil {
		t.Errorf("remote prefill without a cache: %v (err %v), want the model's tokens", toks, last.Err)
	}
	if st := e.Stats(); st.RecomputedTokens != 32 || st.Pool.Free != st.Pool.Blocks {
		t.Errorf("recomputed %d tokens, want the 32 named; %d blocks held", st.RecomputedTokens, st.Pool.Blocks-st.Pool.Free)
	}
}

func TestAFailedStoreFailsTheRemoteDecodeRequest(t *testing.T) {
	conn := newMapConn()
	conn.storeErr = errInjected
	e := newEngine(t, Config{Model: newSim(t), Connector: conn})
	_, last := generate(t, e, Request{Prompt: prompt(40, 1), MaxTokens: 1, Transfer: &KVTransferParams{DoRemoteDecode: true, CacheNode: "n1"}})
	if last.Finish != FinishAbort || !errors.Is(last.Err, ErrTransfer) || !errors.Is(last.Err, errInjected) || !strings.Contains(last.Err.Error(), "n1") {
		t.Errorf("finish %q err %v; want abort with ErrTransfer wrapping the store's error and naming the node", last.Finish, last.Err)
	}
	if st := e.Stats(); st.CacheErrors != 1 || st.Pool.Free != st.Pool.Blocks {
		t.Errorf("%d cache errors, %d blocks held; want 1 and none", st.CacheErrors, st.Pool.Blocks-st.Pool.Free)
	}
}

// A prefill request that names no node has its blocks stored at the
// worker's own cache node, and its params name that node all the same:
// the decode side loads from it directly.
func TestRemoteDecodeParamsNameTheNodeStoredAt(t *testing.T) {
	conn := newMapConn()
	e := newEngine(t, Config{Model: newSim(t), Connector: conn})
	_, last := generate(t, e, Request{Prompt: prompt(40, 1), MaxTokens: 1, Transfer: &KVTransferParams{DoRemoteDecode: true}})
	if last.Err != nil || last.Transfer == nil || last.Transfer.CacheNode != mapConnNode {
		t.Fatalf("params %+v (err %v), want them to name the node the blocks went to, %s", last.Transfer, last.Err, mapConnNode)
	}
	if !slices.Equal(conn.nodes, []string{"store:"}) {
		t.Errorf("connector calls %v, want one Store at the worker's own node", conn.nodes)
	}
}
