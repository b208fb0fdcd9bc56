package auth

import (
	"errors"
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
// other (auth.cluster-token-file), read from its file again by Reload.
// The file holds one token a line: a member presents the first and
// accepts every one, so that a token is rotated without a pause by adding
// the new one second on every node, then moving it first, then removing
// the old one, with a reload after each step. Its String hides it. A
// ClusterToken is safe for concurrent use.
type ClusterToken struct {
	path string // "" for NewClusterToken's
	cur  atomic.Pointer[clusterSecrets]
}

type clusterSecrets struct {
	secrets []string // the first is presented
	sums    [][32]byte
}

// LoadClusterToken reads the cluster token file: each line, less
// surrounding white space, is a token of at least MinTokenLength
// characters; blank lines are skipped; there must be one.
func LoadClusterToken(path string) (*ClusterToken, error) {
	t := &ClusterToken{path: path}
	if err := t.Reload(); err != nil {
		return nil, err
	}
	return t, nil
}

// NewClusterToken makes a ClusterToken of one secret; its Reload does
// nothing.
func NewClusterToken(secret string) (*ClusterToken, error) {
	cs, err := newClusterSecrets([]string{secret})
	if err != nil {
		return nil, err
	}
	t := &ClusterToken{}
	t.cur.Store(cs)
	return t, nil
}

func newClusterSecrets(secrets []string) (*clusterSecrets, error) {
	if len(secrets) == 0 {
		return nil, errors.New("auth: the cluster token file holds no token (e.g. `openssl rand -hex 32`)")
	}
	cs := &clusterSecrets{secrets: secrets}
	for i, s := range secrets {
		if len(s) < MinTokenLength {
			return nil, fmt.Errorf("auth: cluster token %d is %d characters, want at least %d (e.g. `openssl rand -hex 32`)", i+1, len(s), MinTokenLength)
		}
		cs.sums = append(cs.sums, sumOf(s))
	}
	return cs, nil
}

// Reload reads the token file again (on SIGHUP). On an error the tokens
// in use stay, and the error says why.
func (t *ClusterToken) Reload() error {
	if t.path == "" {
		return nil
	}
	b, err := os.ReadFile(t.path)
	if err != nil {
		return fmt.Errorf("auth: read cluster token: %w", err)
	}
	var secrets []string
	for line := range strings.Lines(string(b)) {
		if s := strings.TrimSpace(line); s != "" {
			secrets = append(secrets, s)
		}
	}
	cs, err := newClusterSecrets(secrets)
	if err != nil {
		return fmt.Errorf("%w (in %s)", err, t.path)
	}
	t.cur.Store(cs)
	return nil
}

// Secret is the token this member presents to the others.
func (t *ClusterToken) Secret() string { return t.cur.Load().secrets[0] }

// Secrets are the tokens this member accepts, the one it presents first.
// The slice is not to be changed.
func (t *ClusterToken) Secrets() []string { return t.cur.Load().secrets }

// Check returns the cluster member identity if secret is one of the
// tokens accepted, in time that does not depend on how much of one
// matched.
func (t *ClusterToken) Check(secret string) (Identity, error) {
	got := sumOf(secret)
	ok := false
	for _, want := range t.cur.Load().sums {
		if equal(got[:], want[:]) {
			ok = true
		}
	}
	if !ok {
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
