package respnode_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kvstrata/kvstrata/api/node"
	"github.com/kvstrata/kvstrata/api/nodetest"
	"github.com/kvstrata/kvstrata/api/resp"
	"github.com/kvstrata/kvstrata/api/resp/respnode"
	"github.com/kvstrata/kvstrata/auth"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/tiers"
)

// tenantsServer serves a node's keys over RESP with a users file of two
// tenants: alice of acme, bob of globex, each allowed to read, write and
// flush, and root, an admin of no tenant.
func tenantsServer(t *testing.T) (string, *nodetest.Node) {
	t.Helper()
	h := func(secret string) string {
		s, err := auth.HashSecret(secret, auth.MinIterations)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	users, err := auth.Parse(fmt.Appendf(nil, `
[[user]]
name = "alice"
secret = %q
roles = ["read", "write", "operate"]
tenant = "acme"

[[user]]
name = "bob"
secret = %q
roles = ["read", "write", "operate"]
tenant = "globex"

[[user]]
name = "root"
secret = %q
roles = ["admin"]
`, h("alice-pw"), h("bob-pw"), h("root-pw")))
	if err != nil {
		t.Fatal(err)
	}
	n := nodetest.Start(t, nodetest.Options{Limits: node.Config{MaxBlockSize: 64 << 10}, Inline: true})
	srv, err := resp.NewServer(respnode.New(n.Node), &resp.Config{Auth: users})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String(), n
}

func login(t *testing.T, addr, user string) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, Username: user, Password: user + "-pw", Protocol: 2, PoolSize: 1})
	t.Cleanup(func() { c.Close() })
	return c
}

// A tenant's keys are invisible to another: every command answers for a
// key of another tenant exactly what it answers for a key no one set.
func TestATenantCannotSeeAnothersKeys(t *testing.T) {
	addr, n := tenantsServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	alice, bob, root := login(t, addr, "alice"), login(t, addr, "bob"), login(t, addr, "root")
	big := bytes.Repeat([]byte("0123456789abcdef"), 12<<10) // 192 KiB: chunked over 64 KiB blocks
	if err := alice.Set(ctx, "prompt:42", "alice's", time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	if err := alice.Set(ctx, "big", big, 0).Err(); err != nil {
		t.Fatal(err)
	}

	// What bob sees of alice's key and of a key no one set.
	probe := func(key string) string {
		var out []string
		for _, args := range [][]any{
			{"GET", key}, {"EXISTS", key}, {"TYPE", key}, {"TTL", key}, {"PTTL", key}, {"STRLEN", key},
			{"MEMORY", "USAGE", key}, {"MGET", key, key}, {"GETDEL", key}, {"EXPIRE", key, 100}, {"PERSIST", key}, {"DEL", key},
			{"DBSIZE"}, {"SCAN", 0}, {"SCAN", 0, "MATCH", key}, {"KEYS", "*"},
		} {
			v, err := bob.Do(ctx, args...).Result()
			out = append(out, fmt.Sprintf("%v: %#v %v", args[0], v, err))
		}
		return fmt.Sprint(out)
	}
	for _, key := range []string{"prompt:42", "big"} {
		if got, want := probe(key), probe("never-set"); got != want {
			t.Errorf("bob's view of alice's %s:\n%s\nof a key no one set:\n%s", key, got, want)
		}
	}
	if err := bob.FlushDB(ctx).Err(); err != nil { // bob's keyspace only
		t.Fatal(err)
	}
	if err := bob.Set(ctx, "prompt:42", "bob's", 0).Err(); err != nil {
		t.Fatal(err)
	}
	// Root, of no tenant, is no exception: its keyspace is its own.
	if v, err := root.Exists(ctx, "prompt:42").Result(); err != nil || v != 0 {
		t.Errorf("root EXISTS prompt:42 = %v, %v", v, err)
	}
	if v, err := root.DBSize(ctx).Result(); err != nil || v != 0 {
		t.Errorf("root DBSIZE = %v, %v", v, err)
	}

	if v, err := alice.Get(ctx, "prompt:42").Result(); err != nil || v != "alice's" {
		t.Errorf("alice GET prompt:42 = %q, %v", v, err)
	}
	if v, err := alice.Get(ctx, "big").Bytes(); err != nil || !bytes.Equal(v, big) {
		t.Errorf("alice GET big: %d bytes, %v (bob's FLUSHDB must not touch its chunks)", len(v), err)
	}
	if v, err := bob.Get(ctx, "prompt:42").Result(); err != nil || v != "bob's" {
		t.Errorf("bob GET prompt:42 = %q, %v", v, err)
	}
	keys, err := alice.Keys(ctx, "*").Result()
	if err != nil || len(keys) != 2 {
		t.Errorf("alice KEYS * = %q, %v", keys, err)
	}
	if n, err := bob.DBSize(ctx).Result(); err != nil || n != 1 {
		t.Errorf("bob DBSIZE = %d, %v", n, err)
	}

	// Every block of a tenant, its chunks included, carries its tag, so
	// the tiers can count and evict it as the tenant's.
	count := map[index.TenantTag]int{}
	for _, b := range n.Node.Hierarchy().Blocks(func(tiers.BlockInfo) bool { return true }) {
		count[b.Key.NS.Tenant()]++
	}
	if count[index.TagOf("acme")] != 1+1+3 || count[index.TagOf("globex")] != 1 {
		t.Errorf("blocks by tenant tag: %v; want acme's 5 (a key, a manifest, 3 chunks) and globex's 1", count)
	}

	if err := alice.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if v, err := bob.Get(ctx, "prompt:42").Result(); err != nil || v != "bob's" {
		t.Errorf("after alice's FLUSHALL, bob GET prompt:42 = %q, %v", v, err)
	}
	if _, err := alice.Get(ctx, "big").Result(); !errors.Is(err, redis.Nil) {
		t.Errorf("after FLUSHALL alice GET big: %v", err)
	}
}

// Without an identity in the context (a server without a users file) the
// keys are where they always were: index.RESPNamespace.
func TestWithoutAnIdentityKeysStayInTheRESPNamespace(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	if err := s.Set(ctx, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	acme := auth.NewContext(ctx, auth.Identity{User: "alice", Tenant: "acme", Roles: auth.Roles(auth.Read)})
	if ok, _ := s.Exists(acme, "k"); ok {
		t.Fatal("a tenant sees the unauthenticated keyspace")
	}
	if ok, _ := s.Exists(ctx, "k"); !ok {
		t.Fatal("the key is gone")
	}
}
