package metrics

import (
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/tiers"
	"github.com/kvstrata/kvstrata/tiers/dram"
	"github.com/kvstrata/kvstrata/tiers/tiertest"
)

// tenantNode is a hierarchy with per-tenant accounting: tenant "a" holds
// three 4 KiB blocks under a 16 KiB DRAM quota, tenant "b" one, without.
func tenantNode(t *testing.T) *tiers.Hierarchy {
	t.Helper()
	tr, err := dram.New(dram.Config{Capacity: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	h, err := tiers.New(tiers.Config{Inline: true, Tenants: true, Levels: []tiers.LevelConfig{{Kind: index.TierDRAM, Tier: tr}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close() })
	if err := h.SetQuotas(tiers.Quotas{index.TagOf("a"): {index.TierDRAM: 16 << 10}}); err != nil {
		t.Fatal(err)
	}
	for i, tenant := range []string{"a", "a", "a", "b"} {
		m, b := tiertest.Block(index.Hash(i), 4096)
		m.Key.NS = index.BindTenant(tenant, 1)
		if err := h.Put(m, b); err != nil {
			t.Fatal(err)
		}
	}
	return h
}

// TestTenantUsageAndQuotasAreExported: each tenant's bytes and blocks per
// tier, and its quota where it has one, read back by Prometheus's own
// text parser, labelled by tag and, once the daemon names them, by name.
func TestTenantUsageAndQuotasAreExported(t *testing.T) {
	h := tenantNode(t)
	m := New(h.Stats, map[string]string{"version": "test"})
	a, b := index.TagOf("a"), index.TagOf("b")
	m.NameTenants(func(tag index.TenantTag) string {
		return map[index.TenantTag]string{a: "a", b: "b"}[tag]
	})
	body := scrape(t, m)
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("parse /metrics: %v\n%s", err, body)
	}
	type series struct{ name, tag, tenant, tier string }
	got := map[series]float64{}
	for _, name := range []string{"kvstrata_tenant_bytes", "kvstrata_tenant_blocks", "kvstrata_tenant_quota_bytes"} {
		f := families[name]
		if f == nil {
			t.Fatalf("/metrics has no %s", name)
		}
		if f.GetType().String() != "GAUGE" {
			t.Errorf("%s is a %v, want a gauge", name, f.GetType())
		}
		for _, mm := range f.GetMetric() {
			l := map[string]string{}
			for _, p := range mm.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			got[series{name, l["tenant_tag"], l["tenant"], l["tier"]}] = mm.GetGauge().GetValue()
		}
	}
	tag := func(t index.TenantTag) string { return strconv.Itoa(int(t)) }
	want := map[series]float64{
		{"kvstrata_tenant_bytes", tag(a), "a", "dram"}:       3 * 4096,
		{"kvstrata_tenant_blocks", tag(a), "a", "dram"}:      3,
		{"kvstrata_tenant_quota_bytes", tag(a), "a", "dram"}: 16 << 10,
		{"kvstrata_tenant_bytes", tag(b), "b", "dram"}:       4096,
		{"kvstrata_tenant_blocks", tag(b), "b", "dram"}:      1,
	}
	if len(got) != len(want) {
		t.Errorf("tenant series %v, want %v", got, want)
	}
	for s, v := range want {
		if got[s] != v {
			t.Errorf("%+v = %v, want %v", s, got[s], v)
		}
	}
	promtoolCheck(t, body)
}

// TestTenantsUnnamedWithoutAHook: without NameTenants the tag alone names
// a tenant; nothing per tenant is exported by a node that does not count
// tenants.
func TestTenantsUnnamedWithoutAHook(t *testing.T) {
	h := tenantNode(t)
	body := scrape(t, New(h.Stats, nil))
	want := `kvstrata_tenant_bytes{tenant="",tenant_tag="` + strconv.Itoa(int(index.TagOf("b"))) + `",tier="dram"} 4096`
	if !strings.Contains(body, want+"\n") {
		t.Errorf("/metrics lacks %s", want)
	}
	if body := scrape(t, newTest()); strings.Contains(body, "kvstrata_tenant_bytes{") {
		t.Errorf("a node without tenants exports tenant series:\n%s", body)
	}
}

func promtoolCheck(t *testing.T, body string) {
	t.Helper()
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool not installed (Debian package prometheus)")
	}
	cmd := exec.Command(promtool, "check", "metrics")
	cmd.Stdin = strings.NewReader(body)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("promtool check metrics: %v\n%s", err, out)
	}
}
