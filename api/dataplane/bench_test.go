package dataplane_test

import (
	"context"
	"testing"

	"github.com/kvstrata/kvstrata/api/nodetest"
	"github.com/kvstrata/kvstrata/transfer/transfertest"
)

// BenchmarkGetFromANode measures Gets of 16 blocks of 64 KiB from a node's
// data plane over loopback, without authentication and with a token (the
// connection authenticated once, every key bound to the tenant): the
// binding's cost per request.
func BenchmarkGetFromANode(b *testing.B) {
	for _, c := range []struct {
		name  string
		auth  bool
		token string
	}{{"auth=off", false, ""}, {"auth=token", true, nodetest.TokenAlice}} {
		b.Run(c.name, func(b *testing.B) {
			opts := nodetest.Options{DRAMBytes: 64 << 20}
			if c.auth {
				opts.Auth = nodetest.Users(b)
			}
			n := nodetest.Start(b, opts)
			t := &testing.T{}
			conn, err := dial(t, n, c.token)
			if err != nil {
				b.Fatal(err)
			}
			defer conn.Close()
			bs, keys := blocks(7, 16)
			for i := range bs {
				bs[i] = transfertest.MakeBlock(bs[i].Key.Hash, 64<<10)
				bs[i].Key.NS = 7
			}
			if _, err := conn.Put(context.Background(), bs); err != nil {
				b.Fatal(err)
			}
			col := transfertest.NewCollector(len(keys))
			b.SetBytes(16 * 64 << 10)
			b.ResetTimer()
			for range b.N {
				col = transfertest.NewCollector(len(keys))
				if err := conn.Get(context.Background(), keys, col); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			if col.Errs[15] != nil {
				b.Fatal(col.Errs[15])
			}
		})
	}
}
