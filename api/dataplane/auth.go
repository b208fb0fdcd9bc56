package dataplane

import (
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/kvstrata/kvstrata/api/gate"
	"github.com/kvstrata/kvstrata/auth"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/transfer"
)

var _ transfer.Authenticator = (*Handler)(nil)

// WithAuth returns d authenticating its clients with a: every connection
// must present a valid token (or a verified client certificate) in its
// hello, and is served bound to who it is — its tenant's namespaces, and
// only what its roles allow (get: read; put: write). A transport that
// carries no credentials (ucx) gets every block refused.
func (d *Handler) WithAuth(a gate.Authenticator) *Handler {
	c := *d
	c.auth = a
	return &c
}

// errCredentials refuses a block to a connection that did not authenticate.
var errCredentials = fmt.Errorf("%w: %s: this node authenticates its clients, and this transport carries no credentials",
	transfer.ErrRefused, gate.MsgAuthenticateFirst)

// Authenticate is the Handler that serves a connection whose client
// presented c: d itself when d does not authenticate.
func (d *Handler) Authenticate(c transfer.Credentials) (transfer.Handler, error) {
	if d.auth == nil {
		return d, nil
	}
	id, err := gate.Identify(d.auth, c.Token, c.TLS)
	if err != nil {
		return nil, errors.New(gate.MsgAuthenticateFirst)
	}
	return &bound{d: d, id: id, read: gate.Need{Role: auth.Read}.Allows(id) == nil,
		write: gate.Need{Role: auth.Write}.Allows(id) == nil}, nil
}

// bound serves one authenticated connection: every key its client names
// is bound to the client's tenant (auth.Identity.Namespace) before it
// reaches the node. The transport writes back the keys the client named,
// so the client never sees a bound one.
type bound struct {
	d           *Handler
	id          auth.Identity
	read, write bool
	last        atomic.Pointer[[2]index.NamespaceID] // the last namespace bound: a batch's keys share one
}

var (
	_ transfer.Handler    = (*bound)(nil)
	_ transfer.Prefetcher = (*bound)(nil)
)

func (b *bound) key(k index.Key) index.Key {
	if l := b.last.Load(); l != nil && l[0] == k.NS {
		return index.Key{NS: l[1], Hash: k.Hash}
	}
	ns := b.id.Namespace(k.NS)
	b.last.Store(&[2]index.NamespaceID{k.NS, ns})
	return index.Key{NS: ns, Hash: k.Hash}
}

func (b *bound) denied(role string) error {
	return fmt.Errorf("%w: %v: %s holds %q, and this needs %s", transfer.ErrRefused, auth.ErrDenied, b.id.User, b.id.Roles, role)
}

func (b *bound) Open(key index.Key) (index.Header, []byte, func(), error) {
	if !b.read {
		return index.Header{}, nil, nil, b.denied("read")
	}
	return b.d.open(b.key(key))
}

func (b *bound) Reserve(h index.Header) ([]byte, func(bool) error, error) {
	if !b.write {
		return nil, nil, b.denied("write")
	}
	h.Key = b.key(h.Key)
	return b.d.reserve(h)
}

func (b *bound) Prefetch(keys []index.Key) transfer.Opener {
	if !b.read {
		return refusing{b.denied("read")}
	}
	bk := make([]index.Key, len(keys))
	for i, k := range keys {
		bk[i] = b.key(k)
	}
	return &boundOpener{b: b, o: b.d.prefetch(bk)}
}

// boundOpener opens a Get's blocks by the keys its client named.
type boundOpener struct {
	b *bound
	o transfer.Opener
}

func (o *boundOpener) Open(key index.Key) (index.Header, []byte, func(), error) {
	return o.o.Open(o.b.key(key))
}

func (o *boundOpener) Close() { o.o.Close() }

// refusing refuses every block of a Get.
type refusing struct{ err error }

func (r refusing) Open(index.Key) (index.Header, []byte, func(), error) {
	return index.Header{}, nil, nil, r.err
}

func (refusing) Close() {}
