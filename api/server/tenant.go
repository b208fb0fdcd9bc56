package server

import (
	"context"

	pb "github.com/kvstrata/kvstrata/api/v1"
	"github.com/kvstrata/kvstrata/auth"
	"github.com/kvstrata/kvstrata/index"
)

// binding maps the namespaces a caller names to the ones its blocks are
// kept under, and back. A call that carries an identity (the node
// authenticates its callers: api/gate) is bound to the identity's tenant
// (auth.Identity.Namespace), so that a tenant reaches only its own blocks
// whatever namespaces it names; identities without a tenant (operators,
// members) share tenant tag 0. A call without one (a node without a users
// file) is not bound at all.
type binding struct {
	id    auth.Identity
	bound bool
	// last caches the last namespace bound: the keys of a batch nearly
	// always share one.
	lastNS, lastBound index.NamespaceID
	haveLast          bool
}

func bindingOf(ctx context.Context) *binding {
	id, ok := auth.FromContext(ctx)
	return &binding{id: id, bound: ok}
}

// ns is the namespace the caller's ns is kept under.
func (b *binding) ns(ns index.NamespaceID) index.NamespaceID {
	if !b.bound {
		return ns
	}
	if !b.haveLast || b.lastNS != ns {
		b.lastNS, b.lastBound, b.haveLast = ns, b.id.Namespace(ns), true
	}
	return b.lastBound
}

// owner is whom the caller's leases belong to: its tenant ("" when it
// has none, or the node authenticates no one).
func (b *binding) owner() string { return b.id.Tenant }

// key is the key the caller's k is kept under.
func (b *binding) key(k index.Key) index.Key { return index.Key{NS: b.ns(k.NS), Hash: k.Hash} }

// keys binds the keys of a request.
func (b *binding) keys(ks []*pb.BlockKey) []index.Key {
	out := pb.ToKeys(ks)
	if b.bound {
		for i, k := range out {
			out[i] = b.key(k)
		}
	}
	return out
}

// meta is m as the caller names it: with the key it asked for.
func meta(m index.Header, asked index.Key) *pb.BlockMeta {
	m.Key = asked
	return pb.FromHeader(m)
}
