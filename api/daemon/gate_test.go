package daemon_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/api/client"
	"github.com/kvstrata/kvstrata/api/daemon"
	"github.com/kvstrata/kvstrata/api/nodetest"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/transfer/tcp"
)

// tool finds a command in PATH or $(go env GOPATH)/bin; the test is
// skipped without it (CI installs grpcurl and grpc-health-probe).
func tool(t *testing.T, name string) string {
	t.Helper()
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	if out, err := exec.Command("go", "env", "GOPATH").Output(); err == nil {
		for _, dir := range filepath.SplitList(strings.TrimSpace(string(out))) {
			if p := filepath.Join(dir, "bin", name); exec.Command(p, "-version").Run() == nil {
				return p
			}
		}
	}
	t.Skipf("%s is not installed", name)
	return ""
}

const clusterToken = "cluster-0123456789abcdef0123456789abcdef"

// A node with a users file and a cluster token, driven by grpcurl: every
// call but the health check wants a token; reflection, the Cache
// service's calls and the operator's cluster calls want the right roles;
// the members' own calls (heartbeats, the Keyspace service) want the
// cluster token — an operator's is not enough.
func TestGrpcurlWithAndWithoutATokenOnANodeWithUsers(t *testing.T) {
	grpcurl, probe := tool(t, "grpcurl"), tool(t, "grpc-health-probe")
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "cluster.token")
	if err := os.WriteFile(tokenFile, []byte(clusterToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := newConfig(t, dir, map[string]string{"auth-users-file": nodetest.UsersFile(t), "auth-cluster-token-file": tokenFile})
	n, err := daemon.New(cfg, daemon.Options{Logger: quiet(), Transport: tcp.New(tcp.Options{})})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer n.Stop(context.Background())
	addr := n.Addrs().GRPC
	for deadline := time.Now().Add(20 * time.Second); n.Ready() != nil; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) { // its heartbeats to itself carry the cluster token
			t.Fatalf("not ready after 20s: %v", n.Ready())
		}
	}
	// The health service follows readiness at its next check (healthEvery).
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		out, err := exec.Command(probe, "-addr", addr).CombinedOutput()
		if err == nil && strings.Contains(string(out), "SERVING") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("grpc-health-probe without a token: %v\n%s", err, out)
		}
	}

	call := func(token, method, body string) (string, bool) {
		args := []string{"-plaintext", "-max-time", "10"}
		if token != "" {
			args = append(args, "-H", "authorization: Bearer "+token)
		}
		if body != "" {
			args = append(args, "-d", body)
		}
		args = append(args, addr)
		if method != "" {
			args = append(args, method)
		} else {
			args = append(args, "list")
		}
		out, err := exec.Command(grpcurl, args...).CombinedOutput()
		return string(out), err == nil
	}
	for _, c := range []struct {
		what, token, method, body string
		ok                        bool
		says                      string
	}{
		{"reflection without a token", "", "", "", false, "Unauthenticated"},
		{"reflection with a reader's token", nodetest.TokenReader, "", "", true, "kvstrata.v1.Cache"},
		{"info without a token", "", "kvstrata.v1.Cache/Info", "", false, "authenticate first"},
		{"info with a wrong token", "not-a-token-0123456789abcdef0123456789", "kvstrata.v1.Cache/Info", "", false, "authenticate first"},
		{"info with a token", nodetest.TokenReader, "kvstrata.v1.Cache/Info", "", true, "grpcAddr"},
		{"evict all by a writer", nodetest.TokenAlice, "kvstrata.v1.Cache/Evict", `{"all": true}`, false, "PermissionDenied"},
		{"evict all by an operator", nodetest.TokenOperator, "kvstrata.v1.Cache/Evict", `{"all": true, "dry_run": true}`, true, "{"},
		{"members by a reader", nodetest.TokenReader, "kvstrata.v1.Cluster/Members", "", true, "members"},
		{"remove by a writer", nodetest.TokenAlice, "kvstrata.v1.Cluster/Remove", `{"id": 9}`, false, "PermissionDenied"},
		{"a heartbeat by an operator", nodetest.TokenOperator, "kvstrata.v1.Cluster/Heartbeat", `{"id": 1}`, false, "only members of the cluster"},
		{"a heartbeat by a member", clusterToken, "kvstrata.v1.Cluster/Heartbeat", `{"id": 1}`, true, "{"},
		{"the keyspace by an operator", nodetest.TokenOperator, "kvstrata.v1.Keyspace/Len", "", false, "only members of the cluster"},
		{"the keyspace by a member", clusterToken, "kvstrata.v1.Keyspace/Len", "", true, "{"},
	} {
		out, ok := call(c.token, c.method, c.body)
		if ok != c.ok || !strings.Contains(out, c.says) {
			t.Errorf("%s: succeeded %v, want %v saying %q:\n%s", c.what, ok, c.ok, c.says, out)
		}
		if c.token == "" && !c.ok && strings.Contains(out, "kvstrata.v1") && c.method == "" {
			t.Errorf("%s: an unauthenticated caller learnt the services:\n%s", c.what, out)
		}
	}

	// The Cluster service's Locate binds keys to the caller's tenant too.
	ctx := context.Background()
	alice, err := client.Dial(ctx, addr, client.Options{Token: nodetest.TokenAlice})
	if err != nil {
		t.Fatal(err)
	}
	defer alice.Close()
	key := index.Key{NS: 0x54, Hash: 1}
	if err := alice.Put(ctx, []client.Block{{Key: key, Data: []byte("acme's block")}}); err != nil {
		t.Fatal(err)
	}
	if err := alice.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if ls, err := alice.Locate(ctx, []index.Key{key}); err != nil || len(ls[0].Locations) != 1 {
		t.Fatalf("acme locates its block: %v, %v", ls, err)
	}
	bob, err := client.Dial(ctx, addr, client.Options{Token: nodetest.TokenBob, NoDataPlane: true})
	if err != nil {
		t.Fatal(err)
	}
	defer bob.Close()
	if ls, err := bob.Locate(ctx, []index.Key{key}); err != nil || len(ls[0].Locations) != 0 {
		t.Errorf("globex locates acme's block: %v, %v; want nowhere", ls, err)
	}

	// A new cluster token and a reload (SIGHUP): the old token is refused,
	// the new one is a member's, and the node's own heartbeats to itself
	// carry the new one (it stays ready).
	const rotated = "rotated-0123456789abcdef0123456789abcdef"
	if err := os.WriteFile(tokenFile, []byte(rotated+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := n.Reload(); err != nil {
		t.Fatal(err)
	}
	if out, ok := call(clusterToken, "kvstrata.v1.Cluster/Heartbeat", `{"id": 1}`); ok {
		t.Errorf("a heartbeat with the token before the reload was let in:\n%s", out)
	}
	if out, ok := call(rotated, "kvstrata.v1.Cluster/Heartbeat", `{"id": 1}`); !ok {
		t.Errorf("a heartbeat with the reloaded token was refused:\n%s", out)
	}
	time.Sleep(2 * time.Second) // a few of its own heartbeats
	if err := n.Ready(); err != nil {
		t.Errorf("not ready after the token was reloaded: %v", err)
	}
}

// A lone node with a users file and no cluster token file becomes ready:
// its calls to itself carry a token of its own.
func TestALoneNodeWithUsersAndNoClusterTokenBecomesReady(t *testing.T) {
	dir := t.TempDir()
	cfg := newConfig(t, dir, map[string]string{"auth-users-file": nodetest.UsersFile(t)})
	n, err := daemon.New(cfg, daemon.Options{Logger: quiet(), Transport: tcp.New(tcp.Options{})})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer n.Stop(context.Background())
	for deadline := time.Now().Add(20 * time.Second); n.Ready() != nil; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("not ready after 20s: %v", n.Ready())
		}
	}
}
