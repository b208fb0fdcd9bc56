package daemon_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kvstrata/kvstrata/api/daemon"
	"github.com/kvstrata/kvstrata/auth"
	"github.com/kvstrata/kvstrata/transfer/tcp"
)

// With auth.users-file, the node's Redis port wants AUTH; ReloadUsers
// (SIGHUP) puts a changed file in use and keeps the old one if the new
// one is broken.
func TestTheUsersFileGuardsTheRedisPortAndReloads(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	users := filepath.Join(dir, "users.toml")
	write := func(secret string) {
		h, err := auth.HashSecret(secret, auth.MinIterations)
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(users, fmt.Appendf(nil, "[[user]]\nname = \"alice\"\nsecret = %q\nroles = [\"read\", \"write\"]\ntenant = \"acme\"\n", h), 0o600)
	}
	write("first")
	cfg := newConfig(t, filepath.Join(dir, "data"), map[string]string{"auth-users-file": users})
	n, err := daemon.New(cfg, daemon.Options{Logger: quiet(), Version: "test", Transport: tcp.New(tcp.Options{})})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := n.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer n.Stop(ctx)
	addr := n.Addrs().RESP
	try := func(password string) error {
		c := redis.NewClient(&redis.Options{Addr: addr, Username: "alice", Password: password, Protocol: 2})
		defer c.Close()
		return c.Set(ctx, "k", "v", 0).Err()
	}
	anon := redis.NewClient(&redis.Options{Addr: addr, Protocol: 2})
	defer anon.Close()
	if err := anon.Get(ctx, "k").Err(); err == nil || !strings.HasPrefix(err.Error(), "NOAUTH") {
		t.Fatalf("GET without AUTH: %v", err)
	}
	if err := try("first"); err != nil {
		t.Fatal(err)
	}

	write("second")
	if err := n.ReloadUsers(); err != nil {
		t.Fatal(err)
	}
	if err := try("first"); err == nil || !strings.HasPrefix(err.Error(), "WRONGPASS") {
		t.Fatalf("the old password after a reload: %v", err)
	}
	if err := try("second"); err != nil {
		t.Fatal(err)
	}

	os.WriteFile(users, []byte("[[user]]\nname = \"alice\"\nroles = [\"nope\"]\n"), 0o600)
	if err := n.ReloadUsers(); err == nil || !strings.Contains(err.Error(), "unknown role nope") {
		t.Fatalf("reload of a broken file: %v", err)
	}
	if err := try("second"); err != nil {
		t.Fatalf("after a failed reload: %v", err)
	}
}
