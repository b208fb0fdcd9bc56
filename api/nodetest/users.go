package nodetest

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/kvstrata/kvstrata/auth"
)

// The tokens of the users UsersFile lists: two tenants with readers and
// writers, a reader of the first, an operator of the second, an operator
// and a member of no tenant.
const (
	TokenAlice    = "alice-0123456789abcdef0123456789abcdef"  // tenant acme: read, write
	TokenReader   = "reader-0123456789abcdef0123456789abcdef" // tenant acme: read
	TokenBob      = "bob-0123456789abcdef0123456789abcdef"    // tenant globex: read, write
	TokenBobOps   = "bobops-0123456789abcdef0123456789abcdef" // tenant globex: read, operate
	TokenOperator = "ops-0123456789abcdef0123456789abcdef"    // no tenant: read, operate
	TokenMember   = "member-0123456789abcdef0123456789abcdef" // a cluster member
)

// UsersFile writes a users file of the Token* users into a temporary
// directory and returns its path.
func UsersFile(t testing.TB) string {
	t.Helper()
	sum := func(token string) string {
		s := sha256.Sum256([]byte(token))
		return "sha256$" + hex.EncodeToString(s[:])
	}
	text := fmt.Sprintf(`
[[user]]
name = "alice"
secret = %q
roles = ["read", "write"]
tenant = "acme"

[[user]]
name = "reader"
secret = %q
roles = ["read"]
tenant = "acme"

[[user]]
name = "bob"
secret = %q
roles = ["read", "write"]
tenant = "globex"
certificate = "spiffe://example.org/bob"

[[user]]
name = "bobops"
secret = %q
roles = ["read", "operate"]
tenant = "globex"

[[user]]
name = "ops"
secret = %q
roles = ["read", "operate"]

[[user]]
name = "peer"
secret = %q
roles = ["read"]
member = true
`, sum(TokenAlice), sum(TokenReader), sum(TokenBob), sum(TokenBobOps), sum(TokenOperator), sum(TokenMember))
	path := filepath.Join(t.TempDir(), "users.toml")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// Users loads UsersFile's users, as a node with that users file does.
func Users(t testing.TB) *auth.Holder {
	t.Helper()
	h, err := auth.Open(UsersFile(t))
	if err != nil {
		t.Fatal(err)
	}
	return h
}
