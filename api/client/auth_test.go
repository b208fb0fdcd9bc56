package client_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/kvstrata/kvstrata/api/client"
	"github.com/kvstrata/kvstrata/api/nodetest"
	pb "github.com/kvstrata/kvstrata/api/v1"
	"github.com/kvstrata/kvstrata/index"
)

// A node that authenticates turns a client without a valid token away at
// Dial with ErrUnauthenticated; with one — from Options.Token, a token
// file or KVSTRATA_TOKEN — blocks go both ways, on both paths, and each
// tenant reads only its own.
func TestTheClientPresentsItsToken(t *testing.T) {
	srv := nodetest.Start(t, nodetest.Options{Auth: nodetest.Users(t)})
	t.Setenv(client.TokenEnv, "")
	ctx := context.Background()
	for _, token := range []string{"", "not-a-token-0123456789abcdef0123456789"} {
		if _, err := client.Dial(ctx, srv.Addr, client.Options{Token: token, MaxRetries: -1}); !errors.Is(err, client.ErrUnauthenticated) {
			t.Errorf("dial with token %q: %v, want ErrUnauthenticated", token, err)
		}
	}
	file := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(file, []byte(nodetest.TokenAlice+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, p := range paths {
		t.Run(p.name, func(t *testing.T) {
			opts := p.opts
			opts.TokenFile = file
			alice := dial(t, srv.Addr, opts)
			hashes, blocks := chain(3, 4096)
			if err := alice.Put(ctx, blocks); err != nil {
				t.Fatal(err)
			}
			keys := make([]index.Key, len(hashes))
			for i, h := range hashes {
				keys[i] = index.Key{NS: 42, Hash: h}
			}
			if rs, err := alice.Get(ctx, keys); err != nil || !rs[0].Found {
				t.Fatalf("acme gets its blocks: %v, %v", rs, err)
			}
			opts = p.opts
			opts.Token = nodetest.TokenBob
			if rs, err := dial(t, srv.Addr, opts).Get(ctx, keys); err != nil || rs[0].Found {
				t.Errorf("globex gets acme's blocks: %v, %v; want misses", rs, err)
			}
			if _, err := alice.Evict(ctx, &pb.EvictRequest{All: true}); !errors.Is(err, client.ErrDenied) {
				t.Errorf("a writer evicts: %v, want ErrDenied", err)
			}
		})
	}
	t.Setenv(client.TokenEnv, nodetest.TokenReader)
	if _, err := dial(t, srv.Addr, client.Options{}).Lookup(ctx, 42, nil); err != nil {
		t.Errorf("a lookup with the token of KVSTRATA_TOKEN: %v", err)
	}
}
