// Package auth is who may do what on a node: the identities clients prove
// (a password, a bearer token, a client certificate), the roles they hold,
// and the tenant each belongs to. Front ends (RESP, gRPC, the data plane)
// authenticate a connection or a call into an Identity, put it in the
// request's context, and check its roles; a tenant's namespaces are bound
// to it with index.BindTenant, so the client never chooses them.
//
// The users file, its hashing of secrets and its reloading live here too;
// the front ends see only the small interfaces they consume.
package auth

import (
	"context"
	"errors"
	"strings"

	"github.com/kvstrata/kvstrata/index"
)

// Role is one thing an identity may do. Roles do not imply each other:
// a user who may write and read holds both.
type Role uint8

const (
	// Read: get, look up, list and test for blocks and keys.
	Read Role = 1 << iota
	// Write: put and delete blocks and keys.
	Write
	// Operate: evict, warm, flush, and change the cluster's membership.
	Operate
	// Admin: everything, and every tenant's blocks.
	Admin
)

// Roles is a set of roles.
type Roles uint8

// Has reports whether rs holds r; Admin holds every role.
func (rs Roles) Has(r Role) bool { return rs&Roles(r) != 0 || rs&Roles(Admin) != 0 }

var roleNames = []struct {
	r    Role
	name string
}{{Read, "read"}, {Write, "write"}, {Operate, "operate"}, {Admin, "admin"}}

// String lists rs as the users file writes them: "read,write".
func (rs Roles) String() string {
	var names []string
	for _, n := range roleNames {
		if rs&Roles(n.r) != 0 {
			names = append(names, n.name)
		}
	}
	return strings.Join(names, ",")
}

// ParseRole reads one role name.
func ParseRole(s string) (Role, error) {
	for _, n := range roleNames {
		if n.name == s {
			return n.r, nil
		}
	}
	return 0, errors.New("unknown role " + s + " (want read, write, operate or admin)")
}

// Identity is who a client proved to be.
type Identity struct {
	// User names the identity in logs and metrics; never a secret.
	User string
	// Tenant is the tenant the identity's blocks and keys belong to;
	// empty for identities that belong to none (operators, members).
	Tenant string
	// Roles are what the identity may do.
	Roles Roles
	// Member marks another node of the cluster (the cluster token or a
	// member certificate): it may use the raft transport, the Cluster
	// service and the peer data plane.
	Member bool
}

// Can reports whether id holds role r.
func (id Identity) Can(r Role) bool { return id.Roles.Has(r) }

// Namespace is the namespace id's blocks are kept under when it names ns.
func (id Identity) Namespace(ns index.NamespaceID) index.NamespaceID {
	return index.BindTenant(id.Tenant, ns)
}

// Errors a front end maps to its protocol's answer (RESP NOAUTH and
// WRONGPASS, gRPC Unauthenticated and PermissionDenied).
var (
	// ErrNoAuth: the client has not authenticated, and must.
	ErrNoAuth = errors.New("authentication required")
	// ErrWrongPass: the credentials are not valid. It never says which
	// part was wrong, nor whether the user exists.
	ErrWrongPass = errors.New("invalid username-password pair or user is disabled")
	// ErrDenied: the identity lacks the role the request needs.
	ErrDenied = errors.New("permission denied")
)

type ctxKey struct{}

// NewContext returns ctx carrying id.
func NewContext(ctx context.Context, id Identity) context.Context {
	return context.WithValue(ctx, ctxKey{}, id)
}

// FromContext returns the identity ctx carries, if any.
func FromContext(ctx context.Context) (Identity, bool) {
	id, ok := ctx.Value(ctxKey{}).(Identity)
	return id, ok
}
