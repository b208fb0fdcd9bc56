package membership

import (
	"context"
	"fmt"
	"math/bits"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/kvstrata/kvstrata/index"
)

// The reconcile pass. The directory learns what a node holds only from the
// node's published changes, and a change can be lost: the batcher drops
// events while its queue is full, and a node shutting down discards what
// is not committed within a second. The directory then lists blocks the
// node no longer holds (phantoms: readers are sent to a miss) or misses
// blocks it holds (lost hits) until the block's next change.
//
// So the agent keeps what the node has published about its own locations
// (own: the node's tiers, as they told it, change by change), and a pass
// compares that with what the replica lists at the node, restating the
// node's truth about each key that differs. Restarts need no pass: a
// starting node publishes a drop of all its locations and then what its
// tiers loaded (api/daemon), unless those events are dropped too, which
// the pass after a drop repairs.
//
// A pass costs one scan of the replica, without holding any lock of the
// node's data path: it sums each hash range's listings of the node into a
// digest and compares it with own's digest of the range, kept as changes
// are published. Only ranges whose digests differ are compared key by key.
// Publishes are numbered, and the pass first syncs everything published
// up to its start: a key whose last change is older must be listed as own
// says, and one changed since (a publish in flight, a block moving between
// tiers) is left to the next pass, so nothing applied late is taken for a
// loss. A correction restates, under the lock
// that orders the node's publishes, every own location of the key — stored
// where own holds it, removed elsewhere — through the same batcher: it is
// applied after every change published before it and before every later
// one, so even a needless correction states the truth.

// reconcileBuckets is the number of hash ranges a pass digests.
const reconcileBuckets = 256

// maxCorrections bounds the keys one pass corrects; a pass that finds more
// corrects these and runs again soon.
const maxCorrections = 16384

// lockedKeys bounds the keys a pass compares and corrects in one hold of
// the lock that orders the node's publishes.
const lockedKeys = 256

// tierMask has bit k set for each index.TierKind k of the node's own
// locations of a key.
type tierMask uint8

func maskOf(self index.NodeID, locs []index.Location) tierMask {
	var m tierMask
	for _, l := range locs {
		if l.Node == self && l.Tier < 8 {
			m |= 1 << l.Tier
		}
	}
	return m
}

// ownBlock is what the node published last about one key of its own, and
// when: seq numbers the node's publishes. A key the node holds nowhere any
// more stays as a tombstone (tiers 0) until a pass has seen its removal
// applied.
type ownBlock struct {
	meta  index.Meta
	tiers tierMask
	seq   uint64
}

// ownBlocks mirrors the node's published changes of its own locations. Its
// mutex also orders the node's publishes: Publish adds to the batcher with
// it held, so a correction made under it lands between two changes.
type ownBlocks struct {
	self    index.NodeID
	mu      sync.Mutex
	buckets [reconcileBuckets]map[index.Key]ownBlock
	digest  [reconcileBuckets]uint64
	seq     uint64 // the last publish's number
	dropped uint64 // the number of the last drop of all the node's locations
}

func newOwnBlocks(self index.NodeID) *ownBlocks {
	o := &ownBlocks{self: self}
	for i := range o.buckets {
		o.buckets[i] = map[index.Key]ownBlock{}
	}
	return o
}

// applyLocked records ch if it concerns the node's own locations; the
// caller holds o.mu.
func (o *ownBlocks) applyLocked(ch index.Change) {
	if ch.Loc.Node != o.self || ch.Loc.Tier >= 8 {
		return
	}
	o.seq++
	if ch.Kind == index.ChangeNodeDropped {
		for i := range o.buckets {
			clear(o.buckets[i])
			o.digest[i] = 0
		}
		o.dropped = o.seq
		return
	}
	b := bucketOf(ch.Key)
	old := o.buckets[b][ch.Key]
	nb := old
	switch ch.Kind {
	case index.ChangeStored:
		nb.tiers |= 1 << ch.Loc.Tier
		nb.meta = ch.Meta
	case index.ChangeRemoved:
		nb.tiers &^= 1 << ch.Loc.Tier
	}
	nb.seq = o.seq
	o.digest[b] ^= blockDigest(ch.Key, old.tiers) ^ blockDigest(ch.Key, nb.tiers)
	o.buckets[b][ch.Key] = nb
}

// repeatsLocked reports whether ch stores a block at one of the node's own
// tiers where the node's last change of the block stored it, with the same
// metadata; the caller holds o.mu.
func (o *ownBlocks) repeatsLocked(ch index.Change) bool {
	if ch.Kind != index.ChangeStored || ch.Loc.Node != o.self || ch.Loc.Tier >= 8 {
		return false
	}
	ob, ok := o.buckets[bucketOf(ch.Key)][ch.Key]
	return ok && ob.tiers&(1<<ch.Loc.Tier) != 0 && ob.meta == ch.Meta
}

// lastLocked returns what the node published last about k, with its
// number; the caller holds o.mu.
func (o *ownBlocks) lastLocked(k index.Key) ownBlock {
	ob, ok := o.buckets[bucketOf(k)][k]
	if !ok {
		ob.seq = o.dropped // held nowhere since the last drop, at the latest
	}
	return ob
}

// bucketOf returns the hash range of k.
func bucketOf(k index.Key) int { return int(mix(uint64(k.Hash)^mix(uint64(k.NS))) >> 56) }

// blockDigest is a key's term of its range's digest: the ranges' digests
// are the XOR of their keys' terms; a key listed nowhere counts 0.
func blockDigest(k index.Key, m tierMask) uint64 {
	if m == 0 {
		return 0
	}
	return mix(uint64(k.Hash) ^ mix(uint64(k.NS)^uint64(m)<<56))
}

// mix is splitmix64's finalizer.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

// ReconcileStats counts what the node's reconcile passes did.
type ReconcileStats struct {
	Passes    uint64 // passes that compared (not those a failed Sync cut short)
	Corrected uint64 // keys whose listing of this node was restated
	Phantoms  uint64 // own locations listed that the node did not hold
	Missing   uint64 // own locations held that were not listed
}

// ReconcileStats reports the reconcile passes so far; zero while
// reconciling is off.
func (c *Agent) ReconcileStats() ReconcileStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.reconciled
}

// reconcile runs one pass: it compares the replica's listings of this node
// with what the node published, and corrects the keys that differ. It
// returns the number of keys corrected.
func (c *Agent) reconcile(ctx context.Context) (int, error) {
	if c.own == nil {
		return 0, nil
	}
	self := c.cfg.ID
	// Every change numbered up to settled is applied once Sync returns: a
	// key whose last change is older must be listed as own says, and one
	// changed since is left to the next pass.
	c.own.mu.Lock()
	settled := c.own.seq
	c.own.mu.Unlock()
	if err := c.Sync(ctx); err != nil {
		return 0, fmt.Errorf("cluster: reconcile: %w", err)
	}
	var listed [reconcileBuckets]uint64
	dir := c.rep.FSM.Directory()
	dir.Range(func(k index.Key, e index.Entry) bool {
		if m := maskOf(self, e.Locations); m != 0 {
			listed[bucketOf(k)] ^= blockDigest(k, m)
		}
		return true
	})
	var differ [reconcileBuckets]bool
	nDiffer := 0
	c.own.mu.Lock()
	for b := range listed {
		if listed[b] != c.own.digest[b] {
			differ[b] = true
			nDiffer++
		}
	}
	c.own.mu.Unlock()

	var phantoms, missing, n int
	more := false
	if nDiffer > 0 {
		// The differing ranges, key by key: what the replica lists there,
		// and what own holds.
		var suspects []index.Key
		dir.Range(func(k index.Key, e index.Entry) bool {
			if m := maskOf(self, e.Locations); m != 0 && differ[bucketOf(k)] {
				suspects = append(suspects, k)
			}
			return true
		})
		for b := range differ {
			if differ[b] {
				c.own.mu.Lock() // a range at a time: the node's publishes wait on it
				for k, ob := range c.own.buckets[b] {
					if ob.tiers != 0 {
						suspects = append(suspects, k)
					}
				}
				c.own.mu.Unlock()
			}
		}
		dir = c.rep.FSM.Directory() // (a snapshot restored meanwhile replaces it)
		held := 0                   // keys looked at since c.own.mu was taken
		c.own.mu.Lock()
		for _, k := range suspects {
			if held++; held == lockedKeys {
				// Let the node's publishes (its tiers wait on them) through.
				c.own.mu.Unlock()
				held = 0
				c.own.mu.Lock()
			}
			ob := c.own.lastLocked(k)
			if ob.seq > settled {
				continue // changed since: maybe not applied yet
			}
			var lm tierMask
			if e, ok := dir.Get(k); ok {
				lm = maskOf(self, e.Locations)
			}
			if lm == ob.tiers {
				continue // (a key both lists and own hold is a suspect twice)
			}
			if n == maxCorrections {
				more = true
				break
			}
			n++
			phantoms += bits.OnesCount8(uint8(lm &^ ob.tiers))
			missing += bits.OnesCount8(uint8(ob.tiers &^ lm))
			c.restateLocked(k, ob)
		}
		c.own.mu.Unlock()
	}
	// Tombstones whose removal is applied are of no more use.
	for b := range c.own.buckets {
		c.own.mu.Lock()
		for k, ob := range c.own.buckets[b] {
			if ob.tiers == 0 && ob.seq <= settled {
				delete(c.own.buckets[b], k)
			}
		}
		c.own.mu.Unlock()
	}
	c.countPass(n, phantoms, missing)
	if n > 0 {
		c.log.Info("reconciled the directory with the node's tiers", "keys", n, "phantoms", phantoms,
			"missing", missing, "ranges", nDiffer, "more", more)
	}
	if more {
		c.reconcileSoon()
	}
	return n, nil
}

// restateLocked publishes the node's truth about k, ob: stored at each
// tier of its own that holds k, removed at every other (listed or not: a
// removal lost in the queue may not be applied yet). The caller holds
// c.own.mu, which orders it with the node's changes.
func (c *Agent) restateLocked(k index.Key, ob ownBlock) {
	self := c.cfg.ID
	for t := index.TierHBM; t <= index.TierS3; t++ {
		loc := index.Location{Node: self, Tier: t}
		if ob.tiers&(1<<t) != 0 {
			c.batcher.Add(index.Change{Kind: index.ChangeStored, Key: k, Meta: ob.meta, Loc: loc})
		} else {
			c.batcher.Add(index.Change{Kind: index.ChangeRemoved, Key: k, Loc: loc})
		}
	}
	// The restated key is in flight like any changed key.
	c.own.seq++
	ob.seq = c.own.seq
	c.own.buckets[bucketOf(k)][k] = ob
}

func (c *Agent) countPass(keys, phantoms, missing int) {
	c.mu.Lock()
	c.reconciled.Passes++
	c.reconciled.Corrected += uint64(keys)
	c.reconciled.Phantoms += uint64(phantoms)
	c.reconciled.Missing += uint64(missing)
	c.mu.Unlock()
}

// reconcileSoon asks the reconcile loop for a pass at its next check.
func (c *Agent) reconcileSoon() {
	select {
	case c.reconcileKick <- struct{}{}:
	default:
	}
}

// reconcileLoop runs a pass every ReconcileInterval (jittered by ±25%, so
// that the nodes' passes spread out), and soon after the batcher drops
// events, once its queue has room again; a pass that fails (no leader) is
// tried again at the next check.
func (c *Agent) reconcileLoop() {
	defer c.wg.Done()
	interval := c.cfg.ReconcileInterval
	jittered := func() time.Duration { return interval*3/4 + rand.N(interval/2+1) }
	timer := time.NewTimer(jittered())
	defer timer.Stop()
	check := time.NewTicker(c.cfg.HeartbeatInterval)
	defer check.Stop()
	seen, pending := c.batcher.Stats().Dropped, false
	for {
		select {
		case <-c.ctx.Done():
			return
		case <-timer.C:
			pending = true
			timer.Reset(jittered())
		case <-c.reconcileKick:
			pending = true
		case <-check.C:
		}
		s := c.batcher.Stats()
		if s.Dropped != seen {
			if s.Queued > c.queueSize/2 {
				continue // still dropping, or about to: wait for room
			}
			pending = true
		}
		if !pending {
			continue
		}
		ctx, cancel := context.WithTimeout(c.ctx, 2*c.forwardTimeout())
		_, err := c.reconcile(ctx)
		cancel()
		if err != nil {
			if c.ctx.Err() == nil {
				c.log.Debug("reconcile pass put off", "err", err)
			}
			continue
		}
		seen, pending = s.Dropped, false
	}
}
