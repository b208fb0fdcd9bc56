package daemon_test

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/kvstrata/kvstrata/api/client"
	"github.com/kvstrata/kvstrata/api/daemon"
	"github.com/kvstrata/kvstrata/api/nodetest"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/transfer/tcp"
)

// A node that authenticates its clients keeps each tenant of the users
// file within its quotas, and names the tenants in the Stats reply and
// /metrics.
func TestTenantsQuotasAndNamesReachTheTiersStatsAndMetrics(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	users := usersFileWithTenants(t, dir, "\n[tenant.acme]\nquota = { dram = \"8KiB\", s3 = \"1TiB\" }\n\n[tenant.globex]\n")
	cfg := newConfig(t, dir, map[string]string{"auth-users-file": users})
	n, err := daemon.New(cfg, daemon.Options{Logger: quiet(), Version: "test", Transport: tcp.New(tcp.Options{})})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.SetTenants(map[string]map[string]int64{"acme": {"tape": 1}}); err == nil {
		t.Error("a quota on an unknown tier was taken")
	}
	if err := n.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Stop(context.Background()) })
	c, err := client.Dial(context.Background(), n.Addrs().GRPC, client.Options{Token: nodetest.TokenAlice})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ns := index.BindTenant("acme", 1) // alice names namespace 1; the node keeps it as acme's
	for i := range 3 {
		if err := c.Put(context.Background(), []client.Block{{Key: index.Key{NS: 1, Hash: index.Hash(i)}, Data: make([]byte, 4096)}}); err != nil {
			t.Fatal(err)
		}
	}
	st, err := c.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var dram string
	for _, tier := range st.Tiers {
		for _, u := range tier.Tenants {
			if tier.Tier == "dram" {
				dram = u.String()
			}
		}
	}
	tag := strconv.Itoa(int(ns.Tenant()))
	for _, want := range []string{"tenant_tag:" + tag, `tenant:"acme"`, "bytes:8192", "blocks:2", "quota_bytes:8192"} {
		if !strings.Contains(dram, want) {
			t.Errorf("dram's tenants in Stats: %s, want %s", dram, want)
		}
	}
	resp, err := http.Get("http://" + n.Addrs().HTTP + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`kvstrata_tenant_bytes{tenant="acme",tenant_tag="` + tag + `",tier="dram"} 8192`,
		`kvstrata_tenant_quota_bytes{tenant="acme",tenant_tag="` + tag + `",tier="dram"} 8192`,
	} {
		if !strings.Contains(string(body), want+"\n") {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

// usersFileWithTenants writes, in dir, the test users file with tenants
// (TOML tables) appended, and returns its path.
func usersFileWithTenants(t *testing.T, dir, tenants string) string {
	t.Helper()
	base, err := os.ReadFile(nodetest.UsersFile(t))
	if err != nil {
		t.Fatal(err)
	}
	users := filepath.Join(dir, "users.toml")
	if err := os.WriteFile(users, append(base, tenants...), 0o600); err != nil {
		t.Fatal(err)
	}
	return users
}
