package client_test

import (
	"context"
	"fmt"
	"log"

	"github.com/kvstrata/kvstrata/api/client"
	"github.com/kvstrata/kvstrata/index"
)

// An engine names its blocks with the namespace's chained hashes, stores
// them after a prefill, and on the next request with the same prefix asks
// how much of it the cache holds and streams that part back.
func Example() {
	ctx := context.Background()
	ns := index.Namespace{Model: "Qwen/Qwen2.5-0.5B-Instruct", BlockTokens: 256,
		Layout: index.KVLayout{Layers: 24, KVHeads: 2, HeadDim: 64, DType: "bf16"}}
	tokens := make([]uint32, 1000)    // the prompt's token ids
	hashes := ns.Hashes(tokens)       // 3 full blocks; the last 232 tokens have no hash
	kv := make([][]byte, len(hashes)) // the KV bytes of each block, from the engine
	for i := range kv {
		kv[i] = make([]byte, ns.BlockBytes())
	}

	c, err := client.Dial(ctx, "127.0.0.1:7070", client.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	if err := c.Put(ctx, client.Chain(ns.ID(), hashes, kv)); err != nil {
		log.Fatal(err)
	}

	hit, err := c.Lookup(ctx, ns.ID(), hashes)
	if err != nil {
		log.Fatal(err)
	}
	keys := make([]index.Key, hit.Blocks)
	for i := range keys {
		keys[i] = index.Key{NS: ns.ID(), Hash: hashes[i]}
	}
	err = c.GetFunc(ctx, keys, client.GetOptions{StopAtMiss: true}, func(i int, r client.Result) error {
		fmt.Printf("block %d: %d bytes from %s\n", i, len(r.Data), r.Tier)
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
}
