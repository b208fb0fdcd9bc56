package respcluster

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/kvstrata/kvstrata/api/resp"
	"github.com/kvstrata/kvstrata/index"
)

// The commands that walk the whole keyspace — SCAN, KEYS, DBSIZE, FLUSHDB,
// FLUSHALL — ask every member in turn, this node included, each on its
// own keys.

// memberCursorBits is how much of a SCAN cursor a member's own cursor
// may use; the bits above hold the member's ID.
const memberCursorBits = 32

// ErrCursor marks a SCAN cursor the keyspace cannot have returned, or a
// member's cursor too large to fit in one.
var ErrCursor = errors.New("respcluster: bad scan cursor")

// members lists the members in the order of their IDs, this node
// included, and says which is this node.
func (s *Store) members() ([]Holder, index.NodeID) {
	ms, self := s.dir.Members()
	ms = slices.Clone(ms)
	if !slices.ContainsFunc(ms, func(h Holder) bool { return h.Node == self }) {
		ms = append(ms, Holder{Node: self, Up: true})
	}
	slices.SortFunc(ms, func(a, b Holder) int { return cmpNode(a.Node, b.Node) })
	return slices.CompactFunc(ms, func(a, b Holder) bool { return a.Node == b.Node }), self
}

func cmpNode(a, b index.NodeID) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// memberSkipped logs a member left out of a walk of the keyspace.
func (s *Store) memberSkipped(op string, m Holder, err error) {
	s.peerErrors.Add(1)
	s.cfg.Logger.Warn("keyspace: a member did not answer; its keys are left out", "op", op, "node", m.Node, "up", m.Up, "err", err)
}

// Scan walks every member's keys, the members in the order of their IDs
// (resp.KeyStore). The cursor holds the member's ID in its top 32 bits and
// the member's own cursor in the low 32, so it stays valid on any node and
// across connections; a member's store must keep its cursors below 2^32
// (respnode's and resptest.MemStore's do), a larger one is an error
// matching ErrCursor. A page holds keys of one member only, and may be
// empty while the cursor goes on.
//
// As Redis's SCAN, a key present on one member for the whole walk is
// returned, with these exceptions: a member that does not answer within
// Config.PeerTimeout is skipped (and logged): its keys are out of reach
// for reads too; a member that joins during the walk with an ID below the
// one being walked is not visited (its keys were written after the walk
// began); a key rewritten through another node during the walk moves to
// that node and may be missed. A key held by two members at once (two
// writes racing) may be returned twice, which SCAN's contract allows.
func (k *KeyStore) Scan(ctx context.Context, cursor uint64, count int) ([]string, uint64, error) {
	at, mc := index.NodeID(cursor>>memberCursorBits), cursor&(1<<memberCursorBits-1)
	members, self := k.members()
	for i, m := range members {
		if m.Node < at {
			continue
		}
		if m.Node > at { // the member resumed from has left: start the next
			mc = 0
		}
		keys, next, err := k.memberScan(ctx, m, m.Node == self, mc, count)
		if err != nil {
			if errors.Is(err, ErrCursor) || ctx.Err() != nil {
				return nil, 0, err
			}
			k.memberSkipped("scan", m, err)
			mc = 0
			continue
		}
		switch {
		case next != 0:
			next |= uint64(m.Node) << memberCursorBits
		case i+1 < len(members):
			next = uint64(members[i+1].Node) << memberCursorBits
		}
		return keys, next, nil
	}
	return nil, 0, nil
}

// memberScan is one page of member m's Scan.
func (k *KeyStore) memberScan(ctx context.Context, m Holder, local bool, cursor uint64, count int) ([]string, uint64, error) {
	var keys []string
	var next uint64
	var err error
	if local {
		keys, next, err = k.ks.Scan(ctx, cursor, count)
	} else {
		pctx, cancel := context.WithTimeout(ctx, k.cfg.PeerTimeout)
		keys, next, err = k.peers.Scan(pctx, m.Node, cursor, count)
		cancel()
	}
	if err == nil && next >= 1<<memberCursorBits {
		return nil, 0, fmt.Errorf("%w: node %d's cursor %d is over %d bits", ErrCursor, m.Node, next, memberCursorBits)
	}
	return keys, next, err
}

// Len counts every member's keys (DBSIZE, INFO keyspace), leaving out
// those of a member that does not answer (logged). A key held by two
// members at once (two writes racing) counts twice.
func (s *Store) Len(ctx context.Context) (int64, error) {
	members, self := s.members()
	var total int64
	for _, m := range members {
		var n int64
		var err error
		if m.Node == self {
			n, err = s.local.Len(ctx)
		} else {
			pctx, cancel := context.WithTimeout(ctx, s.cfg.PeerTimeout)
			n, err = s.peers.Len(pctx, m.Node)
			cancel()
		}
		if err != nil {
			if m.Node == self || ctx.Err() != nil {
				return 0, err
			}
			s.memberSkipped("len", m, err)
			continue
		}
		total += n
	}
	return total, nil
}

// Flush deletes every member's keys, the members at once, and counts them
// (FLUSHDB, FLUSHALL). A member believed up that does not answer within
// ten times Config.PeerTimeout (a flush of many keys takes a while) makes it fail with resp.ErrUnavailable (the others
// are flushed; repeating the command completes it); one marked down is
// only logged: its keys come back if it returns.
func (k *KeyStore) Flush(ctx context.Context) (int64, error) {
	members, self := k.members()
	var (
		mu     sync.Mutex
		total  int64
		failed error
		wg     sync.WaitGroup
	)
	for _, m := range members {
		wg.Go(func() {
			var n int64
			var err error
			if m.Node == self {
				n, err = k.ks.Flush(ctx)
			} else {
				pctx, cancel := context.WithTimeout(ctx, 10*k.cfg.PeerTimeout)
				n, err = k.peers.Flush(pctx, m.Node)
				cancel()
				if err != nil {
					k.memberSkipped("flush", m, err)
					if m.Up {
						err = resp.Mark(fmt.Errorf("node %d did not flush: %s", m.Node, err.Error()), resp.ErrUnavailable)
					} else {
						err = nil
					}
				}
			}
			mu.Lock()
			defer mu.Unlock()
			total += n
			if err != nil && failed == nil {
				failed = err
			}
		})
	}
	wg.Wait()
	return total, failed
}
