package respnode

import (
	"context"

	"github.com/kvstrata/kvstrata/api/resp"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/tiers"
)

var _ resp.SetReserver = (*Store)(nil)

// ReserveSet reserves room in the fastest tier for the record of a plain
// SET of a value of size bytes under key (resp.SetReserver), its header
// written and hashed, so that the server reads the value from the socket
// straight into the record: one copy, hashed as it lands. The record's
// block is taken only at Commit (node.Node.ReserveRoom), so a client that
// sends its value slowly holds up no other writer of the key. A value
// kept in chunks is left to SetWith (ok false).
func (s *Store) ReserveSet(ctx context.Context, key string, size int) (resp.PendingSet, bool, error) {
	if int64(inlineLen(key, size)) > s.n.Config().MaxBlockSize {
		return nil, false, nil
	}
	k := keyOf(ctx, key)
	h := index.Header{Key: k}
	h.Size = uint32(inlineLen(key, size))
	r, err := s.n.ReserveRoom(h)
	if err != nil {
		return nil, false, respError(err)
	}
	p := &pendingSet{s: s, k: k, key: key, r: r}
	b := r.Bytes()
	p.value = putHeader(b, kindInline, key, 0)
	p.d.Reset()
	_, _ = p.d.Write(b[:len(b)-len(p.value)])
	return p, true, nil
}

// pendingSet is the record of a plain SET being filled (resp.PendingSet).
type pendingSet struct {
	s     *Store
	k     index.Key
	key   string
	r     *tiers.PutReservation
	value []byte // the record's body: the value's room
	d     index.Digest
}

func (p *pendingSet) Bytes() []byte { return p.value }

func (p *pendingSet) Filled(piece []byte) { _, _ = p.d.Write(piece) }

// Commit publishes the record under key's lock, as SetWith does with no
// options, then deletes the chunks of the value it replaced.
func (p *pendingSet) Commit() error {
	s := p.s
	p.r.SetSum(p.d.Sum64())
	defer s.lock(p.k).Unlock()
	old, ok, err := s.current(p.k, p.key, false)
	if err != nil {
		p.r.Abort()
		return err
	}
	st := &staged{k: p.k, res: p.r}
	if ok {
		st.old = &old
	}
	return st.commit(s)
}

func (p *pendingSet) Abort() { p.r.Abort() }
