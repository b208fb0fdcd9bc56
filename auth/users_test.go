package auth_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvstrata/kvstrata/auth"
	"github.com/kvstrata/kvstrata/index"
)

// hash is a quick hash for tests: the fewest iterations a file accepts.
func hash(t testing.TB, secret string) string {
	t.Helper()
	h, err := auth.HashSecret(secret, auth.MinIterations)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func token(t testing.TB, secret string) string {
	t.Helper()
	h, err := auth.HashToken(secret)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

const svcToken = "0123456789abcdef0123456789abcdef-svc"

func usersFile(t testing.TB) string {
	return fmt.Sprintf(`
[[user]]
name = "alice"
secret = %q
roles = ["read", "write"]
tenant = "acme"

[[user]]
name = "bob"
secret = %q
roles = ["read"]
tenant = "globex"
certificate = "spiffe://example.org/bob"

[[user]]
name = "svc"
secret = %q
roles = ["read", "write"]
tenant = "acme"

[[user]]
name = "ops"
secret = %q
roles = ["operate"]

[[user]]
name = "mallory"
secret = %q
roles = ["admin"]
enabled = false

[[user]]
name = "node-2"
certificate = "CN=node-2"
roles = ["read", "write", "operate"]
member = true

[tenant.acme]
quota = { dram = "8GiB", ssd = "100GiB", s3 = "1TiB" }
`, hash(t, "alice-pw"), hash(t, "bob-pw"), token(t, svcToken), hash(t, "ops-pw"), hash(t, "mallory-pw"))
}

func parse(t testing.TB, text string) *auth.Users {
	t.Helper()
	u, err := auth.Parse([]byte(text))
	if err != nil {
		t.Fatal(err)
	}
	return u
}

func TestPasswordsAuthenticateUsersWithTheirRolesAndTenant(t *testing.T) {
	u := parse(t, usersFile(t))
	id, err := u.Password("alice", "alice-pw")
	if err != nil {
		t.Fatal(err)
	}
	if id.User != "alice" || id.Tenant != "acme" || !id.Can(auth.Read) || !id.Can(auth.Write) || id.Can(auth.Operate) || id.Member {
		t.Fatalf("alice is %+v", id)
	}
	// Remembered: the same answer again (from the cache).
	if again, err := u.Password("alice", "alice-pw"); err != nil || again != id {
		t.Fatalf("second check: %+v, %v", again, err)
	}
	for _, c := range []struct{ user, secret string }{
		{"alice", "wrong"}, {"alice", ""}, {"nobody", "alice-pw"}, {"mallory", "mallory-pw"}, // disabled
		{"node-2", ""}, // a certificate-only user has no password
		{"svc", "not the token"},
	} {
		if _, err := u.Password(c.user, c.secret); !errors.Is(err, auth.ErrWrongPass) {
			t.Errorf("Password(%q, %q) = %v, want ErrWrongPass", c.user, c.secret, err)
		}
	}
	ops, err := u.Password("ops", "ops-pw")
	if err != nil || ops.Tenant != "" || !ops.Can(auth.Operate) || ops.Can(auth.Read) {
		t.Fatalf("ops is %+v, %v", ops, err)
	}
}

func TestTokensFindTheirUser(t *testing.T) {
	u := parse(t, usersFile(t))
	id, err := u.Token(svcToken)
	if err != nil || id.User != "svc" || id.Tenant != "acme" {
		t.Fatalf("Token = %+v, %v", id, err)
	}
	// A token is also the user's password.
	if id, err := u.Password("svc", svcToken); err != nil || id.User != "svc" {
		t.Fatalf("Password(svc, token) = %+v, %v", id, err)
	}
	// Only sha256$ secrets are tokens.
	for _, s := range []string{"alice-pw", "", svcToken + "x"} {
		if _, err := u.Token(s); !errors.Is(err, auth.ErrWrongPass) {
			t.Errorf("Token(%q) = %v, want ErrWrongPass", s, err)
		}
	}
}

func TestCertificatesNameUsers(t *testing.T) {
	u := parse(t, usersFile(t))
	id, err := u.Certificate("spiffe://example.org/bob")
	if err != nil || id.User != "bob" || id.Tenant != "globex" {
		t.Fatalf("Certificate = %+v, %v", id, err)
	}
	if id, err := u.Certificate("CN=node-2"); err != nil || !id.Member {
		t.Fatalf("node-2 = %+v, %v", id, err)
	}
	for _, n := range []string{"", "CN=bob", "spiffe://example.org/alice"} {
		if _, err := u.Certificate(n); !errors.Is(err, auth.ErrWrongPass) {
			t.Errorf("Certificate(%q) = %v, want ErrWrongPass", n, err)
		}
	}
}

func TestTenantsAndQuotas(t *testing.T) {
	u := parse(t, usersFile(t))
	var names []string
	for _, tn := range u.Tenants() {
		names = append(names, tn.Name)
	}
	if got := strings.Join(names, ","); got != "acme,globex" {
		t.Fatalf("tenants %s, want acme,globex (named by a table, or by a user)", got)
	}
	acme, ok := u.Tenant("acme")
	if !ok || acme.Tag != index.TagOf("acme") || acme.Quota[index.TierDRAM] != 8<<30 || acme.Quota[index.TierSSD] != 100<<30 ||
		acme.Quota[index.TierS3] != 1<<40 || len(acme.Quota) != 3 {
		t.Fatalf("acme = %+v", acme)
	}
	if g, ok := u.TenantOf(index.TagOf("globex")); !ok || g.Name != "globex" || len(g.Quota) != 0 {
		t.Fatalf("globex by tag = %+v, %v (no quota: not limited)", g, ok)
	}
}

func TestABadFileIsRefusedWithEveryProblem(t *testing.T) {
	text := fmt.Sprintf(`
[[user]]
name = "alice"
secret = "hunter2-plaintext"
roles = ["read", "superuser"]

[[user]]
name = "alice"
secret = %q
roles = ["read"]
tenant = "tenant-52"

[[user]]
name = "has space"
secret = %q
roles = []
tenant = "tenant-150"
colour = "blue"

[tenant.acme]
quota = { dram = "lots", tape = "1GiB" }
`, hash(t, "x"), "pbkdf2-sha256$10$AAAAAAAAAAAAAAAAAAAAAA$AAAAAAAAAAAAAAAAAAAAAA")
	_, err := auth.Parse([]byte(text))
	if !errors.Is(err, auth.ErrUsersFile) {
		t.Fatalf("err = %v, want ErrUsersFile", err)
	}
	msg := err.Error()
	for _, want := range []string{
		"unknown role superuser", "unknown hash format", `user "alice": listed twice`,
		`"has space": want letters`, "no roles", "iterations must be a number from 1000",
		`tenants "tenant-150" and "tenant-52" share the namespace tag`, "rename one",
		"unknown setting user.colour", `unknown tier "tape"`, `quota.dram: size "lots"`,
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("error lacks %q:\n%s", want, msg)
		}
	}
	if strings.Contains(msg, "hunter2") {
		t.Errorf("the error shows a secret:\n%s", msg)
	}
}

func TestErrorsNeverShowTheFilesText(t *testing.T) {
	_, err := auth.Parse([]byte("[[user]]\nname = \"a\"\nsecret = \"hunter2 \n"))
	if err == nil || strings.Contains(err.Error(), "hunter2") || !strings.Contains(err.Error(), "line 3") {
		t.Fatalf("err = %v: want the line, not the secret", err)
	}
}

func TestNothingPrintsASecretOrHash(t *testing.T) {
	u := parse(t, usersFile(t))
	dir := t.TempDir()
	path := filepath.Join(dir, "users.toml")
	os.WriteFile(path, []byte(usersFile(t)), 0o600)
	h, err := auth.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	ct, _ := auth.NewClusterToken(svcToken)
	for _, s := range []string{fmt.Sprint(u), fmt.Sprintf("%+v", u), fmt.Sprintf("%v", h), fmt.Sprint(ct), fmt.Sprintf("%+v %#v", ct, ct)} {
		if strings.Contains(s, "pbkdf2") || strings.Contains(s, "sha256") || strings.Contains(s, svcToken) {
			t.Errorf("printed %q", s)
		}
	}
}

func TestReloadPicksUpAChangedFileAndKeepsTheOldOnABrokenOne(t *testing.T) {
	path := filepath.Join(t.TempDir(), "users.toml")
	write := func(text string) {
		if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(fmt.Sprintf("[[user]]\nname = \"alice\"\nsecret = %q\nroles = [\"read\"]\n", hash(t, "old")))
	h, err := auth.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.Password("alice", "old"); err != nil {
		t.Fatal(err)
	}

	write(fmt.Sprintf("[[user]]\nname = \"alice\"\nsecret = %q\nroles = [\"read\", \"write\"]\n", hash(t, "new")))
	if err := h.Reload(); err != nil {
		t.Fatal(err)
	}
	if _, err := h.Password("alice", "old"); !errors.Is(err, auth.ErrWrongPass) {
		t.Fatalf("the old password after reload: %v, want ErrWrongPass (even though it was remembered)", err)
	}
	id, err := h.Password("alice", "new")
	if err != nil || !id.Can(auth.Write) {
		t.Fatalf("the new password: %+v, %v", id, err)
	}

	write("[[user]]\nname = \"alice\"\nroles = [\"rread\"]\n")
	err = h.Reload()
	if !errors.Is(err, auth.ErrUsersFile) || !strings.Contains(err.Error(), "previous one stays") {
		t.Fatalf("reload of a broken file: %v", err)
	}
	if _, err := h.Password("alice", "new"); err != nil {
		t.Fatalf("after a failed reload the old users must stay: %v", err)
	}

	os.Remove(path)
	if err := h.Reload(); err == nil {
		t.Fatal("reload of a missing file succeeded")
	}
	if _, err := h.Password("alice", "new"); err != nil {
		t.Fatalf("after a failed reload the old users must stay: %v", err)
	}
}

func TestHashSecret(t *testing.T) {
	h, err := auth.HashSecret("pw", 0)
	if err != nil || !strings.HasPrefix(h, fmt.Sprintf("pbkdf2-sha256$%d$", auth.DefaultIterations)) {
		t.Fatalf("HashSecret = %q, %v", h, err)
	}
	if hash(t, "pw") == hash(t, "pw") {
		t.Fatal("two hashes of one secret are equal: the salt is not random")
	}
	u := parse(t, fmt.Sprintf("[[user]]\nname = \"a\"\nsecret = %q\nroles = [\"read\"]\n", hash(t, "pw")))
	if _, err := u.Password("a", "pw"); err != nil {
		t.Fatal(err)
	}
	if _, err := auth.HashSecret("", 0); err == nil {
		t.Error("an empty secret was hashed")
	}
	if _, err := auth.HashSecret("pw", 10); err == nil {
		t.Error("10 iterations were accepted")
	}
	if _, err := auth.HashToken("short"); err == nil {
		t.Error("a short token was hashed")
	}
}

func TestClusterToken(t *testing.T) {
	path := filepath.Join(t.TempDir(), "token")
	os.WriteFile(path, []byte("  "+svcToken+"\n"), 0o600)
	ct, err := auth.LoadClusterToken(path)
	if err != nil {
		t.Fatal(err)
	}
	if ct.Secret() != svcToken {
		t.Fatal("the token is not trimmed")
	}
	id, err := ct.Check(svcToken)
	if err != nil || !id.Member || id.User != auth.ClusterUser || id.Tenant != "" {
		t.Fatalf("Check = %+v, %v", id, err)
	}
	if _, err := ct.Check(svcToken[:len(svcToken)-1]); !errors.Is(err, auth.ErrWrongPass) {
		t.Fatalf("a wrong token: %v", err)
	}
	os.WriteFile(path, []byte("short\n"), 0o600)
	if _, err := auth.LoadClusterToken(path); err == nil || strings.Contains(err.Error(), "short") && !strings.Contains(err.Error(), "characters") {
		t.Fatalf("a short token: %v", err)
	}
}

// A token is rotated by listing the new one after the old, then before
// it, then alone, with a reload after each step: both are accepted while
// listed, the first is presented, and a bad file changes nothing.
func TestClusterTokenRotation(t *testing.T) {
	const fresh = "fresh-token-0123456789abcdef0123456789"
	path := filepath.Join(t.TempDir(), "token")
	os.WriteFile(path, []byte(svcToken+"\n"), 0o600)
	ct, err := auth.LoadClusterToken(path)
	if err != nil {
		t.Fatal(err)
	}
	accepts := func(secret string) bool { _, err := ct.Check(secret); return err == nil }
	for _, step := range []struct {
		file           string
		presents       string
		old, new, fail bool
	}{
		{svcToken + "\n\n" + fresh + "\n", svcToken, true, true, false},
		{fresh + "\n" + svcToken + "\n", fresh, true, true, false},
		{"\n", fresh, true, true, true},                // no token: kept
		{fresh + "\nshort\n", fresh, true, true, true}, // a short one: kept
		{fresh + "\n", fresh, false, true, false},
	} {
		os.WriteFile(path, []byte(step.file), 0o600)
		if err := ct.Reload(); (err != nil) != step.fail {
			t.Fatalf("reload of %q: %v", step.file, err)
		}
		if ct.Secret() != step.presents || accepts(svcToken) != step.old || accepts(fresh) != step.new {
			t.Fatalf("after %q: presents the %d-character token, accepts old %v new %v", step.file, len(ct.Secret()), accepts(svcToken), accepts(fresh))
		}
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(usersFile(f)))
	f.Add([]byte("[[user]]\nname = \"a\"\nsecret = \"sha256$00\"\nroles = [\"read\"]\n"))
	f.Add([]byte("[tenant.x]\nquota = { dram = \"1GiB\" }\n"))
	f.Add([]byte("[[user]]\nname=\"a\"\nsecret=\"pbkdf2-sha256$1000$AAAAAAAAAAA$AAAAAAAAAAAAAAAAAAAAAA\"\nroles=[\"read\"]\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		u, err := auth.Parse(data)
		if err != nil {
			if !errors.Is(err, auth.ErrUsersFile) {
				t.Fatalf("error %v does not match ErrUsersFile", err)
			}
			return
		}
		// A file that loads answers without panicking, and refuses what
		// it does not know. (Password is left out: a fuzzed work factor
		// may make one check take minutes.)
		if _, err := u.Token("x"); !errors.Is(err, auth.ErrWrongPass) {
			t.Fatalf("unknown token: %v", err)
		}
		u.Certificate("x")
		_ = u.String()
		seen := map[index.TenantTag]string{}
		for _, tn := range u.Tenants() {
			if o, dup := seen[tn.Tag]; dup {
				t.Fatalf("tenants %s and %s share a tag", o, tn.Name)
			}
			seen[tn.Tag] = tn.Name
		}
	})
}
