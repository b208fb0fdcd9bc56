package respcluster

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/kvstrata/kvstrata/api/resp"
	"github.com/kvstrata/kvstrata/index"
)

// SetWith stores value locally as opts say, with the condition and a kept
// deadline judged across the cluster, then deletes the other copies. The
// condition is atomic with the local store only: a write of the same key
// through another node at the same moment may race it.
func (k *KeyStore) SetWith(ctx context.Context, key string, value []byte, opts resp.SetOptions) (bool, error) {
	if opts.Cond != resp.SetAlways || opts.KeepTTL {
		// Held here, the local store decides, atomically; not here,
		// another node's copy decides.
		_, err := k.ks.Stat(ctx, key)
		if err != nil && !errors.Is(err, resp.ErrNotFound) {
			return false, err
		}
		if err != nil {
			there, err := k.remoteStat(ctx, key)
			switch {
			case errors.Is(err, resp.ErrNotFound):
			case err != nil:
				return false, err
			case opts.Cond == resp.SetIfAbsent:
				return false, nil
			default: // XX holds, or the deadline to keep is there
				if opts.Cond == resp.SetIfPresent {
					opts.Cond = resp.SetAlways
				}
				if opts.KeepTTL {
					opts.KeepTTL, opts.ExpireAt = false, there.ExpireAt
				}
			}
		}
	}
	stored, err := k.ks.SetWith(ctx, key, value, opts)
	if err != nil || !stored {
		return stored, err
	}
	return true, k.invalidate(ctx, key)
}

// SetIf is SetWith with SET … NX (exists false) or XX (exists true).
func (k *KeyStore) SetIf(ctx context.Context, key string, value []byte, exists bool) (bool, error) {
	cond := resp.SetIfAbsent
	if exists {
		cond = resp.SetIfPresent
	}
	return k.SetWith(ctx, key, value, resp.SetOptions{Cond: cond})
}

// Apply makes the writes locally, all or none, then deletes the other
// copies of every key written. Only the local part is atomic.
func (k *KeyStore) Apply(ctx context.Context, ws []resp.Write) error {
	if err := k.ks.Apply(ctx, ws); err != nil {
		return err
	}
	var failed error
	seen := make(map[string]bool, len(ws))
	for _, w := range ws {
		if seen[w.Key] {
			continue
		}
		seen[w.Key] = true
		if err := k.invalidate(ctx, w.Key); err != nil && failed == nil {
			failed = err
		}
	}
	return failed
}

// Stat describes the local value, or else a holder's.
func (k *KeyStore) Stat(ctx context.Context, key string) (resp.KeyInfo, error) {
	ki, err := k.ks.Stat(ctx, key)
	if err == nil || !errors.Is(err, resp.ErrNotFound) {
		return ki, err
	}
	ri, rerr := k.remoteStat(ctx, key)
	if errors.Is(rerr, resp.ErrNotFound) {
		return ki, err
	}
	return ri, rerr
}

// Expire sets the deadline of the local value. A key held only by other
// nodes is moved here first (read from a holder, stored locally with the
// new deadline, the other copies deleted), so that the deadline binds the
// only copy; a deadline already past deletes it everywhere.
func (k *KeyStore) Expire(ctx context.Context, key string, at time.Time) (time.Time, error) {
	old, err := k.ks.Expire(ctx, key, at)
	if err == nil || !errors.Is(err, resp.ErrNotFound) {
		return old, err
	}
	there, rerr := k.remoteStat(ctx, key)
	if rerr != nil {
		if errors.Is(rerr, resp.ErrNotFound) {
			return old, err
		}
		return time.Time{}, rerr
	}
	if !at.IsZero() && !at.After(time.Now()) {
		_, derr := k.deleteRemote(ctx, key)
		return there.ExpireAt, derr
	}
	v, rerr := k.remoteGet(ctx, key)
	if rerr != nil {
		if errors.Is(rerr, resp.ErrNotFound) { // deleted meanwhile
			return old, err
		}
		return time.Time{}, rerr
	}
	if _, serr := k.ks.SetWith(ctx, key, v, resp.SetOptions{ExpireAt: at}); serr != nil {
		return time.Time{}, serr
	}
	return there.ExpireAt, k.invalidate(ctx, key)
}

// errNoUpdate is Update's error over a local store without the power.
var errNoUpdate = errors.New("respcluster: the node's store cannot update a key in place")

// Update is an atomic read-modify-write of key (resp.Updater) on the
// local store. A key held only by other nodes is read from a holder
// first — one the directory lists, or else any member up, since a copy
// written through another node a moment ago may not be listed yet — its
// new value stored here, and the other copies deleted (as EXPIRE does);
// only the local part is atomic: a write of the key through another node
// at the same moment may race it.
func (k *KeyStore) Update(ctx context.Context, key string, fn func(old []byte, info resp.KeyInfo, found bool) (resp.Write, error)) error {
	u, ok := k.ks.(resp.Updater)
	if !ok {
		return errNoUpdate
	}
	var there []byte
	var thereInfo resp.KeyInfo
	var from index.NodeID
	if _, err := k.ks.Stat(ctx, key); errors.Is(err, resp.ErrNotFound) {
		node, ki, err := k.findAnywhere(ctx, key)
		if err == nil {
			there, err = k.peerGet(ctx, node, key)
		}
		switch {
		case err == nil:
			from, thereInfo = node, ki
		case !errors.Is(err, resp.ErrNotFound): // a holder did not answer
			return err
		}
	} else if err != nil {
		return err
	}
	err := u.Update(ctx, key, func(old []byte, info resp.KeyInfo, found bool) (resp.Write, error) {
		if !found && there != nil {
			old, info, found = there, thereInfo, true
		}
		return fn(old, info, found)
	})
	if err != nil {
		return err
	}
	if err := k.invalidate(ctx, key); err != nil {
		return err
	}
	if there == nil || slices.ContainsFunc(k.dir.Holders(blockOf(ctx, key)), func(h Holder) bool { return h.Node == from }) {
		return nil
	}
	// The copy read is not listed yet: the invalidation missed it.
	pctx, cancel := context.WithTimeout(ctx, k.cfg.PeerTimeout)
	defer cancel()
	if _, err := k.peers.Delete(pctx, from, key); err != nil {
		return k.peerFailed("delete", Holder{Node: from, Up: true}, key, err)
	}
	return nil
}
