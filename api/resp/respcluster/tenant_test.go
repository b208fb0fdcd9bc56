package respcluster_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/kvstrata/kvstrata/api/resp"
	"github.com/kvstrata/kvstrata/api/resp/respcluster"
	"github.com/kvstrata/kvstrata/api/resp/resptest"
	"github.com/kvstrata/kvstrata/auth"
	"github.com/kvstrata/kvstrata/index"
)

// tenantMem keeps a MemStore per namespace, as respnode keeps a tenant's
// keys in a namespace of its own: auth.NamespaceOf the call's context.
type tenantMem struct {
	mu     sync.Mutex
	spaces map[index.NamespaceID]*resptest.MemStore
}

func (s *tenantMem) space(ctx context.Context) *resptest.MemStore {
	s.mu.Lock()
	defer s.mu.Unlock()
	ns := auth.NamespaceOf(ctx, index.RESPNamespace)
	m := s.spaces[ns]
	if m == nil {
		m = resptest.NewMemStore()
		s.spaces[ns] = m
	}
	return m
}

func (s *tenantMem) View(ctx context.Context, key string) ([]byte, func(), error) {
	return s.space(ctx).View(ctx, key)
}
func (s *tenantMem) Set(ctx context.Context, key string, v []byte) error {
	return s.space(ctx).Set(ctx, key, v)
}
func (s *tenantMem) Exists(ctx context.Context, key string) (bool, error) {
	return s.space(ctx).Exists(ctx, key)
}
func (s *tenantMem) Delete(ctx context.Context, key string) (bool, error) {
	return s.space(ctx).Delete(ctx, key)
}
func (s *tenantMem) Len(ctx context.Context) (int64, error)    { return s.space(ctx).Len(ctx) }
func (s *tenantMem) Info(ctx context.Context) []resp.InfoField { return nil }

// tenantDirectory lists, for a block, the nodes whose store holds its key
// in the block's namespace.
type tenantDirectory struct {
	locals map[index.NodeID]*tenantMem
	keys   map[index.Hash]string
	self   index.NodeID
}

func (d tenantDirectory) Holders(k index.Key) []respcluster.Holder {
	var out []respcluster.Holder
	for id, l := range d.locals {
		l.mu.Lock()
		m := l.spaces[k.NS]
		l.mu.Unlock()
		if m == nil || id == d.self {
			continue
		}
		if ok, _ := m.Exists(context.Background(), d.keys[k.Hash]); ok {
			out = append(out, respcluster.Holder{Node: id, Up: true})
		}
	}
	return out
}

func (d tenantDirectory) Members() ([]respcluster.Holder, index.NodeID) {
	var out []respcluster.Holder
	for id := range d.locals {
		out = append(out, respcluster.Holder{Node: id, Up: true})
	}
	return out, d.self
}

// A key written through one node for a tenant is read through another
// for that tenant only: the request between the nodes names the tenant,
// and a caller that is not a member cannot name another than its own.
func TestTheClusterKeyspaceKeepsTenantsApart(t *testing.T) {
	c := &cluster{t: t, addrs: map[index.NodeID]string{}, conns: map[index.NodeID]*grpc.ClientConn{}}
	c.peers = respcluster.NewGRPCPeers(c.conn)
	t.Cleanup(func() {
		for _, cc := range c.conns {
			cc.Close()
		}
	})
	locals := map[index.NodeID]*tenantMem{}
	keys := map[index.Hash]string{}
	for _, k := range []string{"prompt", "other"} {
		keys[index.RESPKey(k).Hash] = k
	}
	stores := map[index.NodeID]resp.Store{}
	for id := index.NodeID(1); id <= 2; id++ {
		locals[id] = &tenantMem{spaces: map[index.NamespaceID]*resptest.MemStore{}}
	}
	// Node 2's gRPC server authenticates its callers: a call that says it
	// is "bob" gets bob's identity, as an authenticating server gives a
	// tenant's token; others are members.
	for id := index.NodeID(1); id <= 2; id++ {
		g := grpc.NewServer(grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			return h(authenticated(ctx), req)
		}), grpc.StreamInterceptor(func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			return h(srv, &withContext{ss, authenticated(ss.Context())})
		}))
		respcluster.Register(g, locals[id])
		c.serve(id, g)
		st, err := respcluster.New(locals[id], tenantDirectory{locals, keys, id}, c.peers, &respcluster.Config{Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		stores[id] = st
	}
	bg := context.Background()
	acme := auth.NewContext(bg, auth.Identity{User: "alice", Tenant: "acme", Roles: auth.Roles(auth.Read) | auth.Roles(auth.Write)})
	globex := auth.NewContext(bg, bob)
	if err := stores[1].Set(acme, "prompt", []byte("acme's")); err != nil {
		t.Fatal(err)
	}
	v, release, err := stores[2].View(acme, "prompt")
	if err != nil || string(v) != "acme's" {
		t.Fatalf("acme's key through node 2: %q, %v", v, err)
	}
	release()
	for name, ctx := range map[string]context.Context{"globex": globex, "no identity": bg,
		"bob asking for acme": withBob(acme)} {
		if _, _, err := stores[2].View(ctx, "prompt"); !errors.Is(err, resp.ErrNotFound) {
			t.Errorf("%s: GET prompt through node 2: %v, want a miss", name, err)
		}
		if ok, err := stores[2].Exists(ctx, "prompt"); ok || err != nil {
			t.Errorf("%s: EXISTS prompt through node 2: %v, %v", name, ok, err)
		}
		if n, err := stores[2].Len(ctx); n != 0 || err != nil {
			t.Errorf("%s: DBSIZE through node 2: %d, %v", name, n, err)
		}
	}
	if n, err := stores[2].Len(acme); n != 1 || err != nil {
		t.Errorf("acme: DBSIZE through node 2: %d, %v", n, err)
	}
	// bob deleting through node 2 leaves acme's key.
	if ok, err := stores[2].Delete(globex, "prompt"); ok || err != nil {
		t.Errorf("globex DEL prompt: %v, %v", ok, err)
	}
	if ok, _ := locals[1].Exists(acme, "prompt"); !ok {
		t.Error("acme's key is gone")
	}
}

var bob = auth.Identity{User: "bob", Tenant: "globex", Roles: auth.Roles(auth.Read) | auth.Roles(auth.Write)}

// callerHeader says, in the tests, who calls: the stand-in for a token.
const callerHeader = "x-test-caller"

func withBob(ctx context.Context) context.Context {
	return metadata.AppendToOutgoingContext(ctx, callerHeader, "bob")
}

// authenticated is ctx with the caller's identity: bob's if it says so,
// else a member's.
func authenticated(ctx context.Context) context.Context {
	if v := metadata.ValueFromIncomingContext(ctx, callerHeader); len(v) == 1 && v[0] == "bob" {
		return auth.NewContext(ctx, bob)
	}
	return auth.NewContext(ctx, auth.MemberIdentity())
}

type withContext struct {
	grpc.ServerStream
	ctx context.Context
}

func (w *withContext) Context() context.Context { return w.ctx }
