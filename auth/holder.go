package auth

import (
	"fmt"
	"os"
	"strings"
	"sync/atomic"
)

// Holder keeps the users file a node runs with and reloads it on demand
// (SIGHUP): a file that fails to load leaves the one in use in place. It
// is an Authenticator that always asks the users loaded last. Safe for
// concurrent use.
type Holder struct {
	path  string
	users atomic.Pointer[Users]
}

// Open loads the users file at path into a Holder.
func Open(path string) (*Holder, error) {
	u, err := Load(path)
	if err != nil {
		return nil, err
	}
	h := &Holder{path: path}
	h.users.Store(u)
	return h, nil
}

// NewHolder returns a Holder of users loaded elsewhere; its Reload reads
// path.
func NewHolder(path string, u *Users) *Holder {
	h := &Holder{path: path}
	h.users.Store(u)
	return h
}

// Users returns the users in use now.
func (h *Holder) Users() *Users { return h.users.Load() }

// Reload reads the file again and, if it loads, puts it in use: new
// connections and calls authenticate against it, and secrets verified
// under the old file are checked again. If it does not load, the old
// users stay and the error says why.
func (h *Holder) Reload() error {
	u, err := Load(h.path)
	if err != nil {
		return fmt.Errorf("users file not reloaded, the previous one stays in use: %w", err)
	}
	h.users.Store(u)
	return nil
}

// String names the file, never a secret.
func (h *Holder) String() string { return fmt.Sprintf("auth.Holder{%s: %v}", h.path, h.Users()) }

// Password is Users.Password of the users in use.
func (h *Holder) Password(user, secret string) (Identity, error) {
	return h.Users().Password(user, secret)
}

// Token is Users.Token of the users in use.
func (h *Holder) Token(secret string) (Identity, error) { return h.Users().Token(secret) }

// Certificate is Users.Certificate of the users in use.
func (h *Holder) Certificate(name string) (Identity, error) { return h.Users().Certificate(name) }

// ClusterUser is the User of the identity the cluster token proves.
const ClusterUser = "cluster"

// ClusterToken is the secret the members of a cluster present to each
// other (auth.cluster-token-file). Its String hides it.
type ClusterToken struct {
	secret string
	sum    [32]byte
}

// LoadClusterToken reads the cluster token file: its text, less
// surrounding white space, is the token, at least MinTokenLength
// characters.
func LoadClusterToken(path string) (*ClusterToken, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("auth: read cluster token: %w", err)
	}
	return NewClusterToken(strings.TrimSpace(string(b)))
}

// NewClusterToken makes a ClusterToken of secret.
func NewClusterToken(secret string) (*ClusterToken, error) {
	if len(secret) < MinTokenLength {
		return nil, fmt.Errorf("auth: the cluster token is %d characters, want at least %d (e.g. `openssl rand -hex 32`)", len(secret), MinTokenLength)
	}
	t := &ClusterToken{secret: secret}
	t.sum = sumOf(secret)
	return t, nil
}

// Secret is the token, for a member to present to the others.
func (t *ClusterToken) Secret() string { return t.secret }

// Check returns the cluster member identity if secret is the token, in
// time that does not depend on how much of it matched.
func (t *ClusterToken) Check(secret string) (Identity, error) {
	got := sumOf(secret)
	if !equal(got[:], t.sum[:]) {
		return Identity{}, ErrWrongPass
	}
	return MemberIdentity(), nil
}

// MemberIdentity is the identity of another member of the cluster: it
// holds no tenant, and reads, writes and operates as the cluster does.
func MemberIdentity() Identity {
	return Identity{User: ClusterUser, Roles: Roles(Read) | Roles(Write) | Roles(Operate), Member: true}
}

// String hides the token.
func (t *ClusterToken) String() string { return "auth.ClusterToken{redacted}" }

// GoString hides the token from %#v.
func (t *ClusterToken) GoString() string { return t.String() }
