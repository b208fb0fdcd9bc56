// Package respcluster makes one Redis keyspace of a cluster's nodes: it
// wraps a node's own resp.Store so that a key stored through any node's
// RESP port is found through every node's, and EXISTS and DEL act on every
// copy the directory lists.
//
// Reads go to the local store first; on a miss they ask the nodes the
// directory lists as holding the key's block (index.RESPKey), those known
// up first, each for at most Config.PeerTimeout, and answer with the first
// value one returns. No copy is kept: a node serves only what was written
// through it, so an overwrite elsewhere can never leave it a stale value to
// serve. Writes store locally, then delete the copies the directory lists
// on other nodes (SET through node 2 of a key node 1 holds leaves the value
// on node 2 only). Peers are asked through Peers, which the daemon backs
// with the Keyspace gRPC service (Register): a node answers it from its own
// store alone, whatever that store's block format, so no request goes
// round the cluster.
//
// What is not atomic across nodes: two writes of one key through two nodes
// at once may both be deleted by each other's invalidation, or both kept
// (each reader then finds one); a holder unreachable during a write keeps
// its old copy (the write replies TRYAGAIN if the node was believed up);
// a node's copy that the directory does not list yet (its changes are
// published in batches, within milliseconds) escapes the invalidation —
// except in a read-modify-write (INCR, APPEND, GETSET, GETDEL…), which
// asks every member up for a key the directory lists nowhere, so that it
// continues from a value written through another node a moment ago
// instead of starting afresh beside it.
//
// SCAN, KEYS, DBSIZE and FLUSHDB/FLUSHALL walk every member in the order of
// their IDs (see KeyStore.Scan for the cursor); a member that does not
// answer within Config.PeerTimeout is skipped and logged.
//
// A Store is safe for concurrent use.
package respcluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/kvstrata/kvstrata/api/resp"
	"github.com/kvstrata/kvstrata/auth"
	"github.com/kvstrata/kvstrata/index"
)

// Holder is a node the directory lists as holding a key's block.
type Holder struct {
	Node index.NodeID
	Up   bool // not marked down by the cluster
}

// Directory says who else holds a key: the cluster's block directory as
// the Store reads it.
type Directory interface {
	// Holders returns the nodes other than this one (and other than the
	// cluster-wide object store, which the local store reads itself) that
	// the directory lists for block k, those up first.
	Holders(k index.Key) []Holder
	// Members lists every member of the cluster, this node included, and
	// says which is this node (SCAN, DBSIZE and FLUSHDB walk them all).
	Members() (members []Holder, self index.NodeID)
}

// Peers asks another node about its own value of a key. Errors match
// resp.ErrNotFound when the node holds no value; any other error means
// the node did not answer.
type Peers interface {
	// Get reads node's value of key, calling progress each time some of
	// its bytes arrive (the Store gives up on a holder that makes none
	// for Config.PeerTimeout).
	Get(ctx context.Context, node index.NodeID, key string, progress func()) ([]byte, error)
	Stat(ctx context.Context, node index.NodeID, key string) (resp.KeyInfo, error)
	Delete(ctx context.Context, node index.NodeID, key string) (bool, error)
	// Scan, Len and Flush are resp.KeyStore's Scan and Flush and
	// resp.Store's Len, run by node on its own keys.
	Scan(ctx context.Context, node index.NodeID, cursor uint64, count int) (keys []string, next uint64, err error)
	Len(ctx context.Context, node index.NodeID) (int64, error)
	Flush(ctx context.Context, node index.NodeID) (int64, error)
}

// Config configures a Store. A nil *Config means the defaults.
type Config struct {
	// PeerTimeout bounds each request to one other node — a value's
	// transfer, how long it may go without bytes arriving — so that a
	// dead or hung holder delays an answer by at most this much before
	// the next holder is asked, while a large value may take longer in
	// all. The default is DefaultPeerTimeout.
	PeerTimeout time.Duration
	// Logger receives failed requests to other nodes. The default is
	// slog.Default().
	Logger *slog.Logger
}

// DefaultPeerTimeout is Config.PeerTimeout's default.
const DefaultPeerTimeout = 2 * time.Second

// ErrBadConfig marks an invalid Config.
var ErrBadConfig = errors.New("respcluster: bad configuration")

// Store is the local store of a node with the rest of the cluster behind
// it (resp.Store).
type Store struct {
	local resp.Store
	dir   Directory
	peers Peers
	cfg   Config

	remoteGets, remoteHits, peerErrors, invalidated atomic.Int64
}

// KeyStore is a Store over a local resp.KeyStore: it has the same powers.
type KeyStore struct {
	*Store
	ks resp.KeyStore
}

// condStore is a Store over a local store that can SET … NX/XX atomically.
type condStore struct {
	*Store
	cs resp.ConditionalSetter
}

var (
	_ resp.Store             = (*Store)(nil)
	_ resp.KeyStore          = (*KeyStore)(nil)
	_ resp.Updater           = (*KeyStore)(nil)
	_ resp.ConditionalSetter = (*KeyStore)(nil)
	_ resp.ConditionalSetter = (*condStore)(nil)
)

// New wraps local with the holders dir lists, asked through peers. The
// result has local's powers: a *KeyStore when local is a resp.KeyStore,
// a resp.ConditionalSetter when local is one, a *Store otherwise.
func New(local resp.Store, dir Directory, peers Peers, cfg *Config) (resp.Store, error) {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.PeerTimeout < 0 {
		return nil, fmt.Errorf("%w: PeerTimeout is %v, want > 0 (or 0 for %v)", ErrBadConfig, c.PeerTimeout, DefaultPeerTimeout)
	}
	if c.PeerTimeout == 0 {
		c.PeerTimeout = DefaultPeerTimeout
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if local == nil || dir == nil || peers == nil {
		return nil, fmt.Errorf("%w: the local store, the directory and the peers are required", ErrBadConfig)
	}
	s := &Store{local: local, dir: dir, peers: peers, cfg: c}
	if ks, ok := local.(resp.KeyStore); ok {
		return &KeyStore{Store: s, ks: ks}, nil
	}
	if cs, ok := local.(resp.ConditionalSetter); ok {
		return &condStore{Store: s, cs: cs}, nil
	}
	return s, nil
}

// View returns the local value, or else the first value a holder returns.
func (s *Store) View(ctx context.Context, key string) ([]byte, func(), error) {
	v, release, err := s.local.View(ctx, key)
	if err == nil || !errors.Is(err, resp.ErrNotFound) && !errors.Is(err, resp.ErrUnavailable) {
		return v, release, err
	}
	rv, rerr := s.remoteGet(ctx, key)
	if rerr == nil {
		return rv, func() {}, nil
	}
	if errors.Is(rerr, resp.ErrNotFound) {
		return nil, nil, err // the local answer: a miss, or its own TRYAGAIN
	}
	return nil, nil, rerr
}

// remoteGet asks each holder in turn for key's value. It returns an error
// matching resp.ErrNotFound when every holder answered that it has none
// (or none is listed), one matching resp.ErrUnavailable when none
// returned the value and some did not answer.
func (s *Store) remoteGet(ctx context.Context, key string) ([]byte, error) {
	var failed error
	for _, h := range s.dir.Holders(blockOf(ctx, key)) {
		s.remoteGets.Add(1)
		v, err := s.peerGet(ctx, h.Node, key)
		switch {
		case err == nil:
			s.remoteHits.Add(1)
			return v, nil
		case errors.Is(err, resp.ErrNotFound):
		default:
			failed = s.peerFailed("get", h, key, err)
			if ctx.Err() != nil {
				return nil, failed
			}
		}
	}
	if failed != nil {
		return nil, failed
	}
	return nil, fmt.Errorf("key %q: %w", key, resp.ErrNotFound)
}

// peerGet reads node's value of key, giving up when the node goes
// PeerTimeout without sending bytes.
func (s *Store) peerGet(ctx context.Context, node index.NodeID, key string) ([]byte, error) {
	pctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stalled := fmt.Errorf("no bytes for %v: %w", s.cfg.PeerTimeout, context.DeadlineExceeded)
	t := time.AfterFunc(s.cfg.PeerTimeout, func() { cancel(stalled) })
	defer t.Stop()
	v, err := s.peers.Get(pctx, node, key, func() { t.Reset(s.cfg.PeerTimeout) })
	if err != nil && context.Cause(pctx) == stalled {
		err = fmt.Errorf("node %d: %w", node, stalled)
	}
	return v, err
}

// remoteStat is remoteGet for Stat.
func (s *Store) remoteStat(ctx context.Context, key string) (resp.KeyInfo, error) {
	_, ki, err := s.statHolders(ctx, key, s.dir.Holders(blockOf(ctx, key)))
	return ki, err
}

// statHolders asks each of hs in turn for key's description and returns
// the first holder that has it, with remoteGet's errors.
func (s *Store) statHolders(ctx context.Context, key string, hs []Holder) (index.NodeID, resp.KeyInfo, error) {
	var failed error
	for _, h := range hs {
		pctx, cancel := context.WithTimeout(ctx, s.cfg.PeerTimeout)
		ki, err := s.peers.Stat(pctx, h.Node, key)
		cancel()
		switch {
		case err == nil:
			return h.Node, ki, nil
		case errors.Is(err, resp.ErrNotFound):
		default:
			failed = s.peerFailed("stat", h, key, err)
			if ctx.Err() != nil {
				return 0, resp.KeyInfo{}, failed
			}
		}
	}
	if failed != nil {
		return 0, resp.KeyInfo{}, failed
	}
	return 0, resp.KeyInfo{}, fmt.Errorf("key %q: %w", key, resp.ErrNotFound)
}

// findAnywhere is remoteStat for a read-modify-write, which must not take
// a copy the directory does not list yet for a missing key: the holders
// the directory lists are asked first, then every other member up. It
// returns the node that has key.
func (s *Store) findAnywhere(ctx context.Context, key string) (index.NodeID, resp.KeyInfo, error) {
	listed := s.dir.Holders(blockOf(ctx, key))
	node, ki, err := s.statHolders(ctx, key, listed)
	if !errors.Is(err, resp.ErrNotFound) {
		return node, ki, err
	}
	members, self := s.members()
	rest := slices.DeleteFunc(members, func(m Holder) bool {
		return m.Node == self || !m.Up || slices.ContainsFunc(listed, func(h Holder) bool { return h.Node == m.Node })
	})
	node, ki, err = s.statHolders(ctx, key, rest)
	if err != nil && !errors.Is(err, resp.ErrNotFound) && ctx.Err() == nil {
		// A member no one lists that does not answer (logged) most
		// likely holds nothing: the sweep is a best effort for a copy
		// too fresh to be listed, and must not fail every update of a
		// new key while one member is hung.
		return 0, resp.KeyInfo{}, fmt.Errorf("key %q: %w", key, resp.ErrNotFound)
	}
	return node, ki, err
}

// peerFailed counts and logs a request to h that failed, and returns the
// error for the client: TRYAGAIN, naming the node.
func (s *Store) peerFailed(op string, h Holder, key string, err error) error {
	s.peerErrors.Add(1)
	s.cfg.Logger.Warn("keyspace: a holder did not answer", "op", op, "node", h.Node, "up", h.Up, "key", key, "err", err)
	// The text only: the cause must not make it match resp.ErrNotFound.
	return resp.Mark(fmt.Errorf("key %q is held by node %d, which did not answer: %s", key, h.Node, err.Error()), resp.ErrUnavailable)
}

// Set stores value locally, then deletes the other copies.
func (s *Store) Set(ctx context.Context, key string, value []byte) error {
	if err := s.local.Set(ctx, key, value); err != nil {
		return err
	}
	return s.invalidate(ctx, key)
}

// invalidate deletes key on every other holder. A holder believed up that
// does not answer makes it fail with resp.ErrUnavailable (the local write
// stands; repeating the command completes it); one marked down is only
// logged: it is unreachable, and its copy is documented to survive.
func (s *Store) invalidate(ctx context.Context, key string) error {
	_, err := s.deleteRemote(ctx, key)
	return err
}

// deleteRemote deletes key on every other holder and reports whether one
// held it.
func (s *Store) deleteRemote(ctx context.Context, key string) (bool, error) {
	var deleted bool
	var failed error
	for _, h := range s.dir.Holders(blockOf(ctx, key)) {
		pctx, cancel := context.WithTimeout(ctx, s.cfg.PeerTimeout)
		ok, err := s.peers.Delete(pctx, h.Node, key)
		cancel()
		if err != nil {
			if e := s.peerFailed("delete", h, key, err); h.Up && failed == nil {
				failed = e
			}
			continue
		}
		if ok {
			s.invalidated.Add(1)
			deleted = true
		}
	}
	return deleted, failed
}

// Exists reports whether this node or another holder has key.
func (s *Store) Exists(ctx context.Context, key string) (bool, error) {
	if ok, err := s.local.Exists(ctx, key); err != nil || ok {
		return ok, err
	}
	_, err := s.remoteStat(ctx, key)
	if errors.Is(err, resp.ErrNotFound) {
		return false, nil
	}
	return err == nil, err
}

// Delete removes key here and on every other holder.
func (s *Store) Delete(ctx context.Context, key string) (bool, error) {
	here, err := s.local.Delete(ctx, key)
	if err != nil {
		return false, err
	}
	there, err := s.deleteRemote(ctx, key)
	return here || there, err
}

// Info is the local store's fields and the keyspace's requests to other
// nodes, in section "cluster".
func (s *Store) Info(ctx context.Context) []resp.InfoField {
	out := s.local.Info(ctx)
	for _, f := range []struct {
		name string
		v    int64
	}{{"keyspace_remote_gets", s.remoteGets.Load()}, {"keyspace_remote_hits", s.remoteHits.Load()},
		{"keyspace_peer_errors", s.peerErrors.Load()}, {"keyspace_invalidated", s.invalidated.Load()}} {
		out = append(out, resp.InfoField{Section: "cluster", Name: f.name, Value: strconv.FormatInt(f.v, 10)})
	}
	return out
}

// SetIf is SET … NX (exists false) or XX (exists true) across the cluster.
func (c *condStore) SetIf(ctx context.Context, key string, value []byte, exists bool) (bool, error) {
	elsewhere, err := c.presentElsewhere(ctx, key)
	if err != nil {
		return false, err
	}
	var stored bool
	switch {
	case !exists && elsewhere: // NX, and another node has it
		return false, nil
	case exists && elsewhere: // XX, held elsewhere: whatever is here, replace it
		stored, err = true, c.local.Set(ctx, key, value)
	default:
		stored, err = c.cs.SetIf(ctx, key, value, exists)
	}
	if err != nil || !stored {
		return false, err
	}
	return true, c.invalidate(ctx, key)
}

// presentElsewhere reports whether a holder other than this node has key.
func (s *Store) presentElsewhere(ctx context.Context, key string) (bool, error) {
	_, err := s.remoteStat(ctx, key)
	if errors.Is(err, resp.ErrNotFound) {
		return false, nil
	}
	return err == nil, err
}

// blockOf is the block of key for a call with ctx: index.RESPKey's, in
// the namespace of the tenant ctx's identity belongs to, as the local
// store (respnode) keeps it.
func blockOf(ctx context.Context, key string) index.Key {
	return index.Key{NS: auth.NamespaceOf(ctx, index.RESPNamespace), Hash: index.RESPKey(key).Hash}
}
