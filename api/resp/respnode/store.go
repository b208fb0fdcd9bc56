// Package respnode serves a cache node's blocks to Redis clients: it is
// the resp.Store of an api/node.Node. Values go through the same tiers,
// limits and checksums as every other block; key k is block
// {index.RESPNamespace, xxhash64(k)}, stored with k in front of its value.
//
// A Store is safe for concurrent use.
package respnode

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"sync"

	"github.com/kvstrata/kvstrata/api/node"
	"github.com/kvstrata/kvstrata/api/resp"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/internal/units"
	"github.com/kvstrata/kvstrata/tiers"
)

// respHeader is the length prefix of the key stored in front of each value:
// a read checks the key, so two keys whose hashes collide read as missing,
// never as each other's value.
const respHeader = 4

// Store serves a node's blocks to Redis clients (resp.Store). Give a node
// one Store: its locks make SET … NX and SET … XX atomic among the writes
// that go through it.
type Store struct {
	n *node.Node
	h *tiers.Hierarchy

	// locks serialise the writes of one key (by its hash).
	locks [64]sync.Mutex
}

var (
	_ resp.Store             = (*Store)(nil)
	_ resp.ConditionalSetter = (*Store)(nil)
)

// New returns n as a resp.Store.
func New(n *node.Node) *Store { return &Store{n: n, h: n.Hierarchy()} }

// View returns the value in place (no copy from DRAM).
func (s *Store) View(_ context.Context, key string) ([]byte, func(), error) {
	v, _, err := s.n.View(index.RESPKey(key))
	if err != nil {
		return nil, nil, respError(err)
	}
	b := v.Bytes()
	if len(b) < respHeader {
		v.Release()
		return nil, nil, fmt.Errorf("key %q: %w", key, resp.ErrNotFound)
	}
	kl := int(binary.LittleEndian.Uint32(b))
	if kl != len(key) || len(b) < respHeader+kl || string(b[respHeader:respHeader+kl]) != key {
		v.Release()
		return nil, nil, fmt.Errorf("key %q: %w", key, resp.ErrNotFound)
	}
	return b[respHeader+kl:], func() { _ = v.Release() }, nil
}

// lock holds the write lock of key's block.
func (s *Store) lock(k index.Key) func() {
	mu := &s.locks[uint64(k.Hash)%uint64(len(s.locks))]
	mu.Lock()
	return mu.Unlock
}

// Set stores value, copying it once, straight into the fastest tier.
func (s *Store) Set(_ context.Context, key string, value []byte) error {
	if err := s.checkSize(key, value); err != nil {
		return err
	}
	k := index.RESPKey(key)
	defer s.lock(k)()
	return s.set(k, key, value)
}

// SetIf stores value only if key's presence equals exists (SET … NX: false,
// SET … XX: true). The check and the store are atomic with respect to every
// other write through the Redis protocol — the only writers of its keys.
// An eviction may still remove the key between them; for XX that is the
// same as the eviction coming just after the SET.
func (s *Store) SetIf(ctx context.Context, key string, value []byte, exists bool) (bool, error) {
	if err := s.checkSize(key, value); err != nil {
		return false, err
	}
	k := index.RESPKey(key)
	defer s.lock(k)()
	if has, err := s.Exists(ctx, key); err != nil || has != exists {
		return false, err
	}
	return true, s.set(k, key, value)
}

func (s *Store) checkSize(key string, value []byte) error {
	size := respHeader + len(key) + len(value)
	if int64(size) > s.n.Config().MaxBlockSize {
		return resp.Mark(&node.LimitError{Msg: fmt.Sprintf("value of %s with its key is over the %s limit (limits.max-block-size)",
			units.FormatBytes(int64(size)), units.FormatBytes(s.n.Config().MaxBlockSize))}, resp.ErrTooLarge)
	}
	return nil
}

// set stores key's value as block k, of a size checkSize accepted.
func (s *Store) set(k index.Key, key string, value []byte) error {
	var hdr [respHeader]byte
	binary.LittleEndian.PutUint32(hdr[:], uint32(len(key)))
	d := index.NewDigest()
	_, _ = d.Write(hdr[:])
	_, _ = d.WriteString(key)
	_, _ = d.Write(value)
	m := index.Header{Key: k, Sum: d.Sum64()}
	m.Size = uint32(respHeader + len(key) + len(value))
	r, err := s.n.Reserve(m)
	if err != nil {
		return respError(err)
	}
	b := r.Bytes()
	copy(b, hdr[:])
	copy(b[respHeader:], key)
	copy(b[respHeader+len(key):], value)
	return respError(r.Commit())
}

// Exists reports whether some tier holds key's block. It trusts the 64-bit
// hash (a collision, about 1 in 10^19 per pair of keys, would read as
// present); GET checks the stored key.
func (s *Store) Exists(_ context.Context, key string) (bool, error) {
	_, _, err := s.h.Find(index.RESPKey(key))
	if errors.Is(err, tiers.ErrNotFound) {
		return false, nil
	}
	return err == nil, respError(err)
}

// Delete removes key from every tier.
func (s *Store) Delete(_ context.Context, key string) (bool, error) {
	k := index.RESPKey(key)
	defer s.lock(k)()
	err := s.h.Delete(k)
	if errors.Is(err, tiers.ErrNotFound) {
		return false, nil
	}
	return err == nil, respError(err)
}

// Len counts the keys stored through the Redis protocol. It walks the
// node's block table, so it costs time in the number of blocks.
func (s *Store) Len(context.Context) (int64, error) {
	return int64(len(s.h.Blocks(func(b tiers.BlockInfo) bool { return b.Key.NS == index.RESPNamespace }))), nil
}

// Info adds the tiers to INFO.
func (s *Store) Info(context.Context) []resp.InfoField {
	hs := s.h.Stats()
	var out []resp.InfoField
	for _, l := range hs.Levels {
		t := l.Kind.String()
		for _, f := range []struct {
			name string
			v    int64
		}{{"capacity_bytes", l.Capacity}, {"used_bytes", l.Used}, {"blocks", l.Blocks}, {"hits", l.Hits},
			{"evictions", l.Evictions}, {"demotions", l.Demotions}, {"promotions", l.Promotions}} {
			out = append(out, resp.InfoField{Section: "tiers", Name: t + "_" + f.name, Value: strconv.FormatInt(f.v, 10)})
		}
	}
	if len(hs.Levels) > 0 {
		out = append(out, resp.InfoField{Section: "memory", Name: "used_memory", Value: strconv.FormatInt(hs.Levels[0].Used, 10)},
			resp.InfoField{Section: "memory", Name: "maxmemory", Value: strconv.FormatInt(hs.Levels[0].Capacity, 10)})
	}
	return out
}

// respError tags the node's errors for the RESP server's replies.
func respError(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, tiers.ErrNotFound):
		return resp.Mark(err, resp.ErrNotFound)
	case errors.Is(err, tiers.ErrTooLarge), errors.Is(err, node.ErrLimit):
		return resp.Mark(err, resp.ErrTooLarge)
	case errors.Is(err, tiers.ErrFull), errors.Is(err, tiers.ErrNoSpace):
		return resp.Mark(err, resp.ErrFull)
	case errors.Is(err, tiers.ErrUnavailable):
		return resp.Mark(err, resp.ErrUnavailable)
	}
	return err
}
