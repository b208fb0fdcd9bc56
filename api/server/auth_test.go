package server_test

import (
	"context"
	"io"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/kvstrata/kvstrata/api/nodetest"
	pb "github.com/kvstrata/kvstrata/api/v1"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/tiers/tiertest"
)

// serveWithUsers starts a node that authenticates its callers with
// nodetest's users file.
func serveWithUsers(t *testing.T) pb.CacheClient {
	t.Helper()
	n := nodetest.Start(t, nodetest.Options{Auth: nodetest.Users(t)})
	cc, err := grpc.NewClient(n.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return pb.NewCacheClient(cc)
}

// as is ctx(t) carrying token as a bearer token.
func as(t *testing.T, token string) context.Context {
	return metadata.AppendToOutgoingContext(ctx(t), "authorization", "Bearer "+token)
}

// put stores blocks hashed 1…count under ns through the Put call.
func put(t *testing.T, c context.Context, api pb.CacheClient, ns index.NamespaceID, count int) []index.Key {
	t.Helper()
	stream, err := api.Put(c)
	if err != nil {
		t.Fatal(err)
	}
	var metas []*pb.BlockMeta
	var data [][]byte
	var keys []index.Key
	for i := range count {
		m, b := tiertest.Block(index.Hash(i+1), 1000)
		m.Key.NS = ns
		metas, data, keys = append(metas, pb.FromHeader(m)), append(data, b), append(keys, m.Key)
	}
	_ = stream.Send(&pb.PutRequest{Msg: &pb.PutRequest_Header{Header: &pb.PutHeader{Blocks: metas}}})
	for _, b := range data {
		_ = stream.Send(&pb.PutRequest{Msg: &pb.PutRequest_Data{Data: b}})
	}
	resp, err := stream.CloseAndRecv()
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range resp.Results {
		if r.Code != 0 {
			t.Fatalf("put block %d: %v", i, r)
		}
	}
	return keys
}

// get collects a Get's messages.
func get(t *testing.T, c context.Context, api pb.CacheClient, keys []index.Key) ([]*pb.GetResponse, error) {
	t.Helper()
	stream, err := api.Get(c, &pb.GetRequest{Keys: pb.FromKeys(keys)})
	if err != nil {
		return nil, err
	}
	var out []*pb.GetResponse
	for {
		m, err := stream.Recv()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		m.Data = nil
		out = append(out, m)
	}
}

// A caller that presents nothing, or a token the node does not know,
// learns one thing: to authenticate first.
func TestUnauthenticatedCallersLearnOnlyToAuthenticateFirst(t *testing.T) {
	api := serveWithUsers(t)
	for name, c := range map[string]context.Context{
		"no token":    ctx(t),
		"wrong token": as(t, "not-a-token-0123456789abcdef0123456789"),
	} {
		_, err := api.Info(c, &pb.InfoRequest{})
		if s, _ := status.FromError(err); s.Code() != codes.Unauthenticated || s.Message() != "authenticate first" {
			t.Errorf("%s: info: %v, want Unauthenticated saying only %q", name, err, "authenticate first")
		}
		_, err = get(t, c, api, []index.Key{{NS: 1, Hash: 1}})
		wantCode(t, name+": get", err, codes.Unauthenticated, "authenticate first")
		_, err = api.Evict(c, &pb.EvictRequest{All: true})
		wantCode(t, name+": evict", err, codes.Unauthenticated, "authenticate first")
	}
	_, err := api.Info(metadata.AppendToOutgoingContext(ctx(t), "authorization", "Basic xyz"), &pb.InfoRequest{})
	wantCode(t, "basic auth", err, codes.Unauthenticated, "authorization: Bearer <token>")
	if _, err := api.Info(as(t, nodetest.TokenReader), &pb.InfoRequest{}); err != nil {
		t.Errorf("info with a reader's token: %v", err)
	}
}

// Puts need write, evictions and warms operate: a reader cannot put, a
// writer cannot evict, an operator can.
func TestRolesDecideWhatACallerMayDo(t *testing.T) {
	api := serveWithUsers(t)
	stream, err := api.Put(as(t, nodetest.TokenReader))
	if err == nil {
		_, err = stream.CloseAndRecv()
	}
	wantCode(t, "put by a reader", err, codes.PermissionDenied, "write role")
	_, err = api.Evict(as(t, nodetest.TokenAlice), &pb.EvictRequest{All: true})
	wantCode(t, "evict all by a writer", err, codes.PermissionDenied, "operate role")
	ws, err := api.Warm(as(t, nodetest.TokenAlice), &pb.WarmRequest{})
	if err == nil {
		_, err = ws.Recv()
	}
	wantCode(t, "warm by a writer", err, codes.PermissionDenied, "operate role")
	if _, err := api.Evict(as(t, nodetest.TokenOperator), &pb.EvictRequest{All: true}); err != nil {
		t.Errorf("evict all by an operator: %v", err)
	}
}

// Tenant globex asking for tenant acme's blocks — the same namespace, the
// same hashes — gets exactly the answers of blocks never stored, on every
// call that names blocks; acme gets its blocks back under the keys it
// named, never the ones they are kept under.
func TestATenantCannotSeeAnothersBlocks(t *testing.T) {
	api := serveWithUsers(t)
	const ns = index.NamespaceID(0x51)
	alice, bob := as(t, nodetest.TokenAlice), as(t, nodetest.TokenBob)
	keys := put(t, alice, api, ns, 3)
	never := []index.Key{{NS: ns, Hash: 101}, {NS: ns, Hash: 102}, {NS: ns, Hash: 103}}
	hashes := []uint64{1, 2, 3}

	got, err := get(t, alice, api, keys)
	if err != nil || len(got) != 3 {
		t.Fatalf("acme's get: %v, %v", got, err)
	}
	for i, m := range got {
		if !m.Found || pb.ToKey(m.Meta.Key) != keys[i] {
			t.Errorf("acme's block %d: %v, want found under %v", i, m, keys[i])
		}
	}
	lk, err := api.Lookup(alice, &pb.LookupRequest{Namespace: uint64(ns), Hashes: hashes})
	if err != nil || lk.Blocks != 3 {
		t.Fatalf("acme's lookup: %v, %v", lk, err)
	}
	lo, err := api.LocateObjects(alice, &pb.LocateObjectsRequest{Keys: pb.FromKeys(keys)})
	if err != nil || pb.ToKey(lo.Blocks[0].Meta.Key) != keys[0] {
		t.Fatalf("acme's locate: %v, %v", lo, err)
	}

	// globex: every answer about acme's blocks is that of blocks never stored.
	neverHashes := []uint64{101, 102, 103}
	for _, c := range []struct {
		what       string
		seen, none func() (proto.Message, error)
	}{
		{"get", func() (proto.Message, error) {
			r, err := get(t, bob, api, keys)
			return &pb.GetRequest{}, wrapGet(r, err)
		},
			func() (proto.Message, error) {
				r, err := get(t, bob, api, never)
				return &pb.GetRequest{}, wrapGet(r, err)
			}},
		{"lookup", func() (proto.Message, error) {
			return api.Lookup(bob, &pb.LookupRequest{Namespace: uint64(ns), Hashes: hashes})
		}, func() (proto.Message, error) {
			return api.Lookup(bob, &pb.LookupRequest{Namespace: uint64(ns), Hashes: neverHashes})
		}},
		{"exists", func() (proto.Message, error) { return api.Exists(bob, &pb.ExistsRequest{Keys: pb.FromKeys(keys)}) },
			func() (proto.Message, error) { return api.Exists(bob, &pb.ExistsRequest{Keys: pb.FromKeys(never)}) }},
		{"locate", func() (proto.Message, error) {
			return api.LocateObjects(bob, &pb.LocateObjectsRequest{Keys: pb.FromKeys(keys)})
		}, func() (proto.Message, error) {
			return api.LocateObjects(bob, &pb.LocateObjectsRequest{Keys: pb.FromKeys(never)})
		}},
	} {
		seen, err1 := c.seen()
		none, err2 := c.none()
		if err1 != nil || err2 != nil || !proto.Equal(seen, none) {
			t.Errorf("globex's %s of acme's blocks: %v, %v; of blocks never stored: %v, %v", c.what, seen, err1, none, err2)
		}
	}
	bg, err := get(t, bob, api, keys)
	if err != nil || len(bg) != 3 || bg[0].Found {
		t.Errorf("globex's get of acme's blocks: %v, %v; want three misses", bg, err)
	}
}

// wrapGet makes a Get's answer comparable: its messages, as an error.
func wrapGet(r []*pb.GetResponse, err error) error {
	if err != nil {
		return err
	}
	for _, m := range r {
		if m.Found || m.Code != 0 {
			return status.Errorf(codes.AlreadyExists, "found %v", m)
		}
	}
	return nil
}

// An operator of a tenant evicts only its tenant's blocks, whatever it
// selects; an operator of none evicts every tenant's with --all.
func TestEvictionsStayWithinTheCallersTenant(t *testing.T) {
	api := serveWithUsers(t)
	const ns = index.NamespaceID(0x52)
	alice, bob := as(t, nodetest.TokenAlice), as(t, nodetest.TokenBob)
	aliceKeys := put(t, alice, api, ns, 2)
	put(t, bob, api, ns, 3) // the same keys, in globex

	bobops := as(t, nodetest.TokenBobOps)
	resp, err := api.Evict(bobops, &pb.EvictRequest{Keys: pb.FromKeys(aliceKeys[:1])})
	if err != nil || resp.Blocks != 1 || len(resp.Listed) != 1 || pb.ToKey(resp.Listed[0].Meta.Key) != aliceKeys[0] {
		t.Fatalf("globex evicts the key acme also stored: %v, %v; want globex's one copy, listed as named", resp, err)
	}
	resp, err = api.Evict(bobops, &pb.EvictRequest{All: true})
	if err != nil || resp.Blocks != 2 || len(resp.Listed) != 0 {
		t.Fatalf("globex evicts all: %v, %v; want its two other blocks, unlisted (it named none)", resp, err)
	}
	if ex, err := api.Exists(alice, &pb.ExistsRequest{Keys: pb.FromKeys(aliceKeys)}); err != nil || !ex.Exists[0] || !ex.Exists[1] {
		t.Fatalf("acme's blocks after globex evicted all of its own: %v, %v", ex, err)
	}
	resp, err = api.Evict(as(t, nodetest.TokenOperator), &pb.EvictRequest{All: true})
	if err != nil || resp.Blocks != 2 {
		t.Fatalf("an operator of no tenant evicts all: %v, %v; want acme's two", resp, err)
	}
}

// Lease ids count up; a tenant that guesses another's cannot end it.
func TestATenantCannotReleaseAnothersLease(t *testing.T) {
	api := serveWithUsers(t)
	alice, bob := as(t, nodetest.TokenAlice), as(t, nodetest.TokenBob)
	keys := put(t, alice, api, 0x53, 1)
	lease, err := api.Pin(alice, &pb.PinRequest{Keys: pb.FromKeys(keys), TtlMs: 60_000})
	if err != nil {
		t.Fatal(err)
	}
	_, err = api.Release(bob, &pb.ReleaseRequest{LeaseId: lease.LeaseId})
	wantCode(t, "globex releases acme's lease", err, codes.NotFound, "unknown lease")
	if _, err := api.Release(alice, &pb.ReleaseRequest{LeaseId: lease.LeaseId}); err != nil {
		t.Errorf("acme releases its lease: %v", err)
	}
}
