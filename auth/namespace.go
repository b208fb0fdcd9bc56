package auth

import (
	"context"

	"github.com/kvstrata/kvstrata/index"
)

// NamespaceOf is the namespace a request with ctx stores what it names ns
// under: ns itself when ctx carries no identity (a node that does not
// authenticate), else ns bound to the identity's tenant
// (Identity.Namespace) — for identities without a tenant too, whose
// namespaces carry tag 0. A store that takes its namespace from here
// keeps every tenant's blocks apart without trusting the client.
func NamespaceOf(ctx context.Context, ns index.NamespaceID) index.NamespaceID {
	if id, ok := FromContext(ctx); ok {
		return id.Namespace(ns)
	}
	return ns
}
