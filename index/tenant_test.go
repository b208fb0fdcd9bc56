package index

import "testing"

func TestBoundNamespacesCarryTheirTenantAndNeverMeet(t *testing.T) {
	ns := NamespaceID(0x1234_5678_9abc_def0)
	a, b, none := BindTenant("acme", ns), BindTenant("globex", ns), BindTenant("", ns)
	if a == b || a == none || b == none {
		t.Fatalf("one namespace bound to three tenants gave %v %v %v; want three", a, b, none)
	}
	if a.Tenant() != TagOf("acme") || b.Tenant() != TagOf("globex") || none.Tenant() != 0 {
		t.Fatalf("tags %d %d %d; want %d %d 0", a.Tenant(), b.Tenant(), none.Tenant(), TagOf("acme"), TagOf("globex"))
	}
	if TagOf("acme") == 0 || TagOf("") != 0 {
		t.Fatal("only the empty tenant has tag 0")
	}
	if BindTenant("acme", ns) != a || BindTenant("acme", ns+1) == a {
		t.Fatal("binding is not a function of tenant and namespace")
	}
}
