package auth

import (
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/BurntSushi/toml"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/internal/units"
)

// Authenticator turns a credential into an Identity. Users and Holder are
// Authenticators; a front end keeps one and asks it for each connection
// or call. Every method answers ErrWrongPass for any credential it does
// not accept — an unknown user, a wrong secret, a disabled user — so the
// answer never says which.
type Authenticator interface {
	// Password checks a user's secret (RESP AUTH user secret, HELLO AUTH).
	Password(user, secret string) (Identity, error)
	// Token finds the user whose secret is the bearer token secret; only
	// users whose secret is a sha256$ hash can be found so.
	Token(secret string) (Identity, error)
	// Certificate finds the user a verified client certificate names (its
	// subject CN or a URI or DNS SAN, as the users file's certificate).
	Certificate(name string) (Identity, error)
}

var (
	_ Authenticator = (*Users)(nil)
	_ Authenticator = (*Holder)(nil)
)

// ErrUsersFile marks a users file that cannot be used; its text lists
// every problem found.
var ErrUsersFile = errors.New("auth: bad users file")

// Users is a loaded users file. It is safe for concurrent use; it never
// changes once loaded, but for its cache of verified secrets. Nothing it
// prints — errors, String — contains a secret or a hash.
type Users struct {
	byName  map[string]*user
	byToken map[[sha256.Size]byte]*user // users with a sha256$ secret
	byCert  map[string]*user
	tenants map[string]Tenant
	// decoy is checked for an unknown user, with the work factor of the
	// file's passwords, so that how long a refusal takes does not tell
	// whether the user exists.
	decoy hashed

	mu       sync.Mutex
	verified map[[sha256.Size]byte]Identity // sha256 of "kind\0user\0secret"
}

// maxVerified bounds the cache of verified secrets; past it, the cache
// starts over.
const maxVerified = 4096

// user is one [[user]] of the file.
type user struct {
	id      Identity
	secret  hashed
	enabled bool
}

// Tenant is a [tenant.NAME] table of the users file.
type Tenant struct {
	// Name is the tenant's name, as users name it.
	Name string
	// Tag is index.TagOf(Name): the mark of its namespaces.
	Tag index.TenantTag
	// Quota is the most bytes the tenant's blocks may hold in each kind of
	// tier; a tier kind left out is not limited.
	Quota map[index.TierKind]int64
}

// fileUser and fileTenant are the TOML forms.
type fileUser struct {
	Name        string   `toml:"name"`
	Secret      string   `toml:"secret"`
	Roles       []string `toml:"roles"`
	Tenant      string   `toml:"tenant"`
	Certificate string   `toml:"certificate"`
	Enabled     *bool    `toml:"enabled"`
	Member      bool     `toml:"member"`
}

type fileTenant struct {
	Quota map[string]string `toml:"quota"`
}

type usersFile struct {
	User   []fileUser            `toml:"user"`
	Tenant map[string]fileTenant `toml:"tenant"`
}

// Load reads the users file at path. It reports every problem of the file
// at once, in one error matching ErrUsersFile.
func Load(path string) (*Users, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("auth: read users file: %w", err)
	}
	u, err := Parse(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return u, nil
}

// Parse reads a users file's contents; see Load.
func Parse(data []byte) (*Users, error) {
	var f usersFile
	md, err := toml.Decode(string(data), &f)
	if err != nil {
		return nil, fmt.Errorf("%w: %s", ErrUsersFile, tomlError(err))
	}
	var probs []string
	bad := func(format string, args ...any) { probs = append(probs, fmt.Sprintf(format, args...)) }
	for _, k := range md.Undecoded() {
		bad("unknown setting %s", k)
	}
	u := &Users{byName: map[string]*user{}, byToken: map[[sha256.Size]byte]*user{}, byCert: map[string]*user{},
		tenants: map[string]Tenant{}, verified: map[[sha256.Size]byte]Identity{}}
	tenants := map[string]bool{}
	decoyIter := 0
	for i, fu := range f.User {
		where := fmt.Sprintf("user %d", i+1)
		if fu.Name != "" {
			where = fmt.Sprintf("user %q", fu.Name)
		}
		if err := checkName("name", fu.Name); err != nil {
			bad("%s: %v", where, err)
		}
		if _, dup := u.byName[fu.Name]; dup && fu.Name != "" {
			bad("%s: listed twice", where)
		}
		us := &user{id: Identity{User: fu.Name, Tenant: fu.Tenant, Member: fu.Member}, enabled: fu.Enabled == nil || *fu.Enabled}
		if fu.Tenant != "" {
			if err := checkName("tenant", fu.Tenant); err != nil {
				bad("%s: %v", where, err)
			}
			tenants[fu.Tenant] = true
		}
		if len(fu.Roles) == 0 {
			bad("%s: no roles (want some of read, write, operate, admin)", where)
		}
		for _, r := range fu.Roles {
			role, err := ParseRole(r)
			if err != nil {
				bad("%s: %v", where, err)
			}
			us.id.Roles |= Roles(role)
		}
		h, err := parseHash(fu.Secret)
		switch {
		case err != nil && fu.Secret == "" && fu.Certificate != "":
			// A certificate-only user: no secret matches.
		case err != nil:
			bad("%s: secret: %v", where, err)
		default:
			us.secret = h
			if h.iter == 0 {
				var sum [sha256.Size]byte
				copy(sum[:], h.sum)
				if other, dup := u.byToken[sum]; dup {
					bad("%s: same token as user %q", where, other.id.User)
				}
				u.byToken[sum] = us
			}
			decoyIter = max(decoyIter, h.iter)
		}
		if fu.Certificate != "" {
			if other, dup := u.byCert[fu.Certificate]; dup {
				bad("%s: certificate %q already names user %q", where, fu.Certificate, other.id.User)
			}
			u.byCert[fu.Certificate] = us
		}
		if fu.Name != "" {
			u.byName[fu.Name] = us
		}
	}
	for name, ft := range f.Tenant {
		if err := checkName("tenant", name); err != nil {
			bad("[tenant.%s]: %v", name, err)
			continue
		}
		tenants[name] = true
		t := Tenant{Name: name, Tag: index.TagOf(name), Quota: map[index.TierKind]int64{}}
		for kind, size := range ft.Quota {
			k, err := index.ParseTierKind(kind)
			if err != nil {
				bad("[tenant.%s] quota: unknown tier %q (want hbm, dram, ssd or s3)", name, kind)
				continue
			}
			n, err := units.ParseBytes(size)
			if err != nil {
				bad("[tenant.%s] quota.%s: %v", name, kind, err)
				continue
			}
			t.Quota[k] = n
		}
		u.tenants[name] = t
	}
	// Two tenants with one tag would count, and evict, each other's blocks.
	byTag := map[index.TenantTag]string{}
	names := make([]string, 0, len(tenants))
	for name := range tenants {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		tag := index.TagOf(name)
		if other, clash := byTag[tag]; clash {
			bad("tenants %q and %q share the namespace tag %d: rename one", other, name, tag)
		}
		byTag[tag] = name
		if _, ok := u.tenants[name]; !ok {
			u.tenants[name] = Tenant{Name: name, Tag: tag, Quota: map[index.TierKind]int64{}}
		}
	}
	if len(probs) > 0 {
		return nil, fmt.Errorf("%w: %s", ErrUsersFile, strings.Join(probs, "; "))
	}
	if decoyIter == 0 {
		decoyIter = MinIterations
	}
	u.decoy = hashed{iter: decoyIter, salt: make([]byte, saltLen), sum: make([]byte, keyLen)}
	return u, nil
}

// tomlError is the decoder's error without the file's text: a syntax
// error's context line could hold a secret.
func tomlError(err error) string {
	var pe toml.ParseError
	if errors.As(err, &pe) {
		return fmt.Sprintf("line %d: %s", pe.Position.Line, pe.Message)
	}
	// Type errors name keys and types, not values.
	return err.Error()
}

// checkName refuses names that would be ambiguous in logs, URLs
// (redis://user:secret@host) and metrics labels.
func checkName(what, s string) error {
	if s == "" {
		return fmt.Errorf("no %s", what)
	}
	if len(s) > 64 {
		return fmt.Errorf("%s is %d bytes, want at most 64", what, len(s))
	}
	for _, r := range s {
		if !('a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' || strings.ContainsRune("._-@", r)) {
			return fmt.Errorf("%s %q: want letters, digits and . _ - @ only", what, s)
		}
	}
	return nil
}

// String says how many users and tenants u has, never a secret.
func (u *Users) String() string {
	return fmt.Sprintf("auth.Users{%d users, %d tenants}", len(u.byName), len(u.tenants))
}

// Tenants returns the tenants the file names, with their quotas, sorted
// by name.
func (u *Users) Tenants() []Tenant {
	out := make([]Tenant, 0, len(u.tenants))
	for _, t := range u.tenants {
		out = append(out, t)
	}
	slices.SortFunc(out, func(a, b Tenant) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// Tenant returns the named tenant; ok is false if the file does not name it.
func (u *Users) Tenant(name string) (t Tenant, ok bool) {
	t, ok = u.tenants[name]
	return t, ok
}

// TenantOf returns the tenant whose tag is tag (index.NamespaceID.Tenant).
func (u *Users) TenantOf(tag index.TenantTag) (Tenant, bool) {
	for _, t := range u.tenants {
		if t.Tag == tag {
			return t, true
		}
	}
	return Tenant{}, false
}

// Password checks user's secret. The first check of a pair costs the
// hash's work (tens of milliseconds at DefaultIterations), the same for a
// user that does not exist; a pair checked before is remembered, and costs
// microseconds, until the file is reloaded.
func (u *Users) Password(name, secret string) (Identity, error) {
	ck := cacheKey("password", name, secret)
	if id, ok := u.remembered(ck); ok {
		return id, nil
	}
	us, known := u.byName[name]
	h := u.decoy
	if known && us.secret.sum != nil {
		h = us.secret
	}
	ok := h.check(secret)
	if h.iter == 0 {
		u.decoy.check(secret) // a token's user takes as long as any other
	}
	if !known || us.secret.sum == nil || !ok || !us.enabled {
		return Identity{}, ErrWrongPass
	}
	u.remember(ck, us.id)
	return us.id, nil
}

// Token finds the user whose sha256$ secret is secret's hash.
func (u *Users) Token(secret string) (Identity, error) {
	sum := sha256.Sum256([]byte(secret))
	us, ok := u.byToken[sum]
	if !ok || !us.enabled || subtle.ConstantTimeCompare(sum[:], us.secret.sum) != 1 {
		return Identity{}, ErrWrongPass
	}
	return us.id, nil
}

// Certificate finds the enabled user whose certificate is name.
func (u *Users) Certificate(name string) (Identity, error) {
	us, ok := u.byCert[name]
	if !ok || !us.enabled || name == "" {
		return Identity{}, ErrWrongPass
	}
	return us.id, nil
}

func cacheKey(kind, name, secret string) [sha256.Size]byte {
	d := sha256.New()
	d.Write([]byte(kind))
	d.Write([]byte{0})
	d.Write([]byte(name))
	d.Write([]byte{0})
	d.Write([]byte(secret))
	var k [sha256.Size]byte
	d.Sum(k[:0])
	return k
}

func (u *Users) remembered(k [sha256.Size]byte) (Identity, bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	id, ok := u.verified[k]
	return id, ok
}

func (u *Users) remember(k [sha256.Size]byte, id Identity) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.verified) >= maxVerified {
		clear(u.verified)
	}
	u.verified[k] = id
}
