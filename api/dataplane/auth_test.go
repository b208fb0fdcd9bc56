package dataplane_test

import (
	"context"
	"errors"
	"testing"

	"github.com/kvstrata/kvstrata/api/dataplane"
	"github.com/kvstrata/kvstrata/api/nodetest"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/transfer"
	"github.com/kvstrata/kvstrata/transfer/tcp"
	"github.com/kvstrata/kvstrata/transfer/transfertest"
)

// dial opens a data-plane connection to n presenting token.
func dial(t *testing.T, n *nodetest.Node, token string) (transfer.Conn, error) {
	t.Helper()
	c, err := tcp.New(tcp.Options{Token: token}).Dial(context.Background(), n.DataAddr)
	if err == nil {
		t.Cleanup(func() { c.Close() })
	}
	return c, err
}

// blocks are count blocks hashed 1…count in namespace ns.
func blocks(ns index.NamespaceID, count int) ([]transfer.Block, []index.Key) {
	var bs []transfer.Block
	var keys []index.Key
	for i := range count {
		b := transfertest.MakeBlock(index.Hash(i+1), 4096)
		b.Key.NS = ns
		bs, keys = append(bs, b), append(keys, b.Key)
	}
	return bs, keys
}

func getAll(t *testing.T, c transfer.Conn, keys []index.Key) *transfertest.Collector {
	t.Helper()
	col := transfertest.NewCollector(len(keys))
	if err := c.Get(context.Background(), keys, col); err != nil {
		t.Fatal(err)
	}
	return col
}

// A node with a users file serves its data plane only to connections
// whose hello carries a valid token; the others are turned away at once
// with ErrUnauthenticated, told only to authenticate first.
func TestTheDataPlaneWantsAValidToken(t *testing.T) {
	n := nodetest.Start(t, nodetest.Options{Auth: nodetest.Users(t)})
	for _, token := range []string{"", "not-a-token-0123456789abcdef0123456789"} {
		if _, err := dial(t, n, token); !errors.Is(err, transfer.ErrUnauthenticated) {
			t.Errorf("dial with token %q: %v, want ErrUnauthenticated", token, err)
		}
	}
	c, err := dial(t, n, nodetest.TokenAlice)
	if err != nil {
		t.Fatal(err)
	}
	bs, keys := blocks(7, 2)
	if errs, err := c.Put(context.Background(), bs); err != nil || errs[0] != nil || errs[1] != nil {
		t.Fatalf("acme's put: %v, %v", errs, err)
	}
	if col := getAll(t, c, keys); col.Errs[0] != nil || col.Headers[0].Key != keys[0] {
		t.Errorf("acme's get: %v, header %v; want its block under the key it named", col.Errs, col.Headers[0])
	}
	// A reader may get, not put.
	r, err := dial(t, n, nodetest.TokenReader)
	if err != nil {
		t.Fatal(err)
	}
	more, _ := blocks(8, 1)
	if errs, err := r.Put(context.Background(), more); err != nil || !errors.Is(errs[0], transfer.ErrRefused) {
		t.Errorf("a reader's put: %v, %v; want the block refused", errs, err)
	}
}

// Tenant globex asking the data plane for tenant acme's blocks — same
// namespace, same hashes — gets exactly what it gets for blocks never
// stored.
func TestTheDataPlaneKeepsTenantsApart(t *testing.T) {
	n := nodetest.Start(t, nodetest.Options{Auth: nodetest.Users(t)})
	alice, err := dial(t, n, nodetest.TokenAlice)
	if err != nil {
		t.Fatal(err)
	}
	bs, keys := blocks(7, 3)
	if _, err := alice.Put(context.Background(), bs); err != nil {
		t.Fatal(err)
	}
	bob, err := dial(t, n, nodetest.TokenBob)
	if err != nil {
		t.Fatal(err)
	}
	seen := getAll(t, bob, keys)
	never := getAll(t, bob, []index.Key{{NS: 7, Hash: 101}, {NS: 7, Hash: 102}, {NS: 7, Hash: 103}})
	for i := range keys {
		if !errors.Is(seen.Errs[i], transfer.ErrNotFound) || seen.Errs[i].Error() != never.Errs[i].Error() {
			t.Errorf("globex's get of acme's block %d: %v; of a block never stored: %v", i, seen.Errs[i], never.Errs[i])
		}
	}
}

// A transport that carries no credentials (ucx) reaches a handler that
// authenticates only through Open and Reserve: both refuse.
func TestWithoutCredentialsEveryBlockIsRefused(t *testing.T) {
	n := nodetest.Start(t, nodetest.Options{})
	h := dataplane.NewHandler(n.Node, nil).WithAuth(nodetest.Users(t))
	if _, _, _, err := h.Open(index.Key{NS: 1, Hash: 1}); !errors.Is(err, transfer.ErrRefused) {
		t.Errorf("open: %v", err)
	}
	b := transfertest.MakeBlock(1, 10)
	if _, _, err := h.Reserve(b.Header); !errors.Is(err, transfer.ErrRefused) {
		t.Errorf("reserve: %v", err)
	}
}
