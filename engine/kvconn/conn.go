// Package kvconn is a worker's connector to the kvstrata cache, as vLLM's
// KV connector is to its KV store: it implements sched.Connector over
// api/client. Lookup asks the worker's cache node how many leading blocks
// of a prompt it can serve; Load fetches them, a prefix, straight from the
// socket into the engine's block memory, stopping at the first block that
// is missing or fails its checksum; Offload queues full blocks for a
// background goroutine that stores them in batches, within a bound on the
// bytes waiting; Store writes blocks through at once (disaggregated
// prefill). The cache is optional: every failure is counted, returned, and
// costs the engine a recompute, never a request.
//
// A Conn is safe for concurrent use.
package kvconn

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/kvstrata/kvstrata/api/client"
	"github.com/kvstrata/kvstrata/engine/sched"
	"github.com/kvstrata/kvstrata/index"
)

var _ sched.Connector = (*Conn)(nil)

// ErrBlockSize marks a cached block whose size is not the engine's block
// size (a cache shared with a differently configured model): Load stops
// there.
var ErrBlockSize = errors.New("kvconn: cached block size differs from the engine's")

// Conn is a worker's connection to kvstrata.
type Conn struct {
	cfg   Config
	m     *metrics
	peers *peers
	off   *offloader
	hints tierHints

	mu         sync.Mutex
	cluster    *client.ClusterClient // around the seed's client, once dialled, if in a cluster
	standalone bool                  // the seed is in no cluster

	closeOnce sync.Once
	closeErr  error
}

// New makes a Conn to the cache node at cfg.Addr and starts its offloader.
// It dials the node within ctx; a node that cannot be reached yet is not
// an error (the worker runs without its cache, and the Conn dials again on
// each use), only a Config that fails Validate or metrics that cannot be
// registered are.
func New(ctx context.Context, cfg Config) (*Conn, error) {
	cfg.EnsureDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	m := newMetrics(cfg.ModelName)
	if err := m.register(cfg.Registerer); err != nil {
		return nil, fmt.Errorf("kvconn: register metrics: %w", err)
	}
	c := &Conn{cfg: cfg, m: m, peers: newPeers(cfg)}
	if _, err := c.peers.get(ctx, cfg.Addr, true); err != nil {
		cfg.Logger.Warn("kvstrata cache not reachable yet; the worker recomputes until it is", "addr", cfg.Addr, "err", err)
	}
	c.off = newOffloader(c)
	return c, nil
}

// Lookup reports how many leading blocks of hashes the cache holds and can
// serve now: the longest prefix the node's answer says some reachable
// tier of some node holds. A cluster member that is not current may be
// stale; Load then finds the truth and stops at the first miss. A node
// that does not answer before ctx's deadline backs off as an unreachable
// one does (see peers.unanswered).
func (c *Conn) Lookup(ctx context.Context, ns index.NamespaceID, hashes []index.Hash) (int, error) {
	if len(hashes) == 0 {
		return 0, nil
	}
	seed, err := c.peers.get(ctx, c.cfg.Addr, false)
	if err != nil {
		c.peers.unanswered(ctx, c.cfg.Addr)
		c.m.errors.WithLabelValues(opLookup).Inc()
		return 0, err
	}
	resp, err := seed.Lookup(ctx, ns, hashes)
	c.peers.report(c.cfg.Addr, err)
	if err != nil {
		c.peers.unanswered(ctx, c.cfg.Addr)
		c.m.errors.WithLabelValues(opLookup).Inc()
		return 0, fmt.Errorf("kvconn: lookup: %w", err)
	}
	held := min(int(resp.GetBlocks()), len(hashes))
	runs := make([]tierRun, 0, len(resp.GetTiers()))
	for _, tb := range resp.GetTiers() {
		runs = append(runs, tierRun{tier: tb.GetTier(), blocks: int(tb.GetBlocks())})
	}
	c.hints.learn(ns, hashes[:held], runs)
	return held, nil
}

// errStop ends a Load's fetch at a block it will not use.
var errStop = errors.New("kvconn: stop")

// Load fetches the leading blocks of hashes, block i into dst(i), and
// returns how many leading blocks it put there intact. It stops at the
// first block the cache does not hold, cannot read now, or that fails its
// checksum on arrival (a corrupt block's bytes may be in its dst, but it
// and the blocks after it are not counted), or whose size is not
// len(dst(i)). The count is valid with or without an error; the error,
// when the load ended on a failure rather than a miss, says which
// (client.ErrCorrupt, client.ErrUnavailable, ErrBlockSize, ctx's error).
// dst may be called more than once for a block. With node set, the blocks
// are fetched from that node (one client per address, kept); without,
// from wherever in the cluster of the worker's node they are.
func (c *Conn) Load(ctx context.Context, node string, ns index.NamespaceID, hashes []index.Hash, dst func(i int) []byte) (int, error) {
	if len(hashes) == 0 {
		return 0, nil
	}
	start := time.Now()
	addr := node
	if addr == "" {
		addr = c.cfg.Addr
	}
	get, tierOf, err := c.source(ctx, node)
	if err != nil {
		c.m.errors.WithLabelValues(opLoad).Inc()
		return 0, err
	}
	keys := make([]index.Key, len(hashes))
	for i, h := range hashes {
		keys[i] = index.Key{NS: ns, Hash: h}
	}
	loaded := 0
	var scratch []byte
	buffer := func(i, size int) []byte {
		// Blocks past the end of the prefix (the data plane sends a
		// batch's blocks after a miss too) and blocks of the wrong size
		// are received, then refused, away from the engine's memory.
		if i == loaded {
			if d := dst(i); len(d) == size {
				return d
			}
		}
		if cap(scratch) < size {
			scratch = make([]byte, size)
		}
		return scratch[:size]
	}
	var stop error // why the fetch ended early, when the cache failed
	err = get(ctx, keys, client.GetOptions{StopAtMiss: true, Buffer: buffer}, func(i int, r client.Result) error {
		if i != loaded || !r.Found {
			stop = r.Err
			return errStop
		}
		d := dst(i)
		if len(r.Data) != len(d) {
			stop = fmt.Errorf("%w: block %d is %d bytes, the engine's are %d", ErrBlockSize, i, len(r.Data), len(d))
			return errStop
		}
		if len(d) > 0 && &r.Data[0] != &d[0] { // fetched into a buffer of its own (a fallback's)
			copy(d, r.Data)
		}
		c.m.onboard(tierOf(keys[i], r), len(d))
		loaded++
		return nil
	})
	if errors.Is(err, errStop) {
		err = stop
	}
	c.peers.report(addr, err)
	if loaded > 0 {
		c.m.onboardSeconds.Observe(time.Since(start).Seconds())
	}
	if err != nil {
		c.m.errors.WithLabelValues(opLoad).Inc()
		return loaded, fmt.Errorf("kvconn: load: %d of %d blocks loaded: %w", loaded, len(hashes), err)
	}
	return loaded, nil
}

// getFunc is client.GetFunc of a Client or a ClusterClient.
type getFunc func(ctx context.Context, keys []index.Key, opts client.GetOptions, fn func(int, client.Result) error) error

// source returns how to fetch blocks for a Load at node, and how to name
// the tier that served each: as the node said (gRPC), else as a recent
// Lookup said (the data plane does not say), else "remote" for a block
// from another node than the worker's own and "cache" for one from it.
func (c *Conn) source(ctx context.Context, node string) (getFunc, func(index.Key, client.Result) string, error) {
	if node != "" && node != c.cfg.Addr {
		cl, err := c.peers.get(ctx, node, false)
		if err != nil {
			return nil, nil, err
		}
		return cl.GetFunc, func(k index.Key, r client.Result) string { return c.tierName(k, r.Tier, "remote") }, nil
	}
	seed, err := c.peers.get(ctx, c.cfg.Addr, false)
	if err != nil {
		return nil, nil, err
	}
	if node != "" {
		return seed.GetFunc, func(k index.Key, r client.Result) string { return c.tierName(k, r.Tier, "cache") }, nil
	}
	get, err := c.fetcher(ctx, seed)
	if err != nil {
		return nil, nil, err
	}
	self := index.NodeID(seed.Info().GetNodeId())
	return get, func(k index.Key, r client.Result) string {
		if r.Node != index.AnyNode && r.Node != self {
			return c.tierName(k, r.Tier, "remote")
		}
		return c.tierName(k, r.Tier, "cache")
	}, nil
}

// tierName is the tier label of block k: tier, the one the node named;
// else the one a recent Lookup named; else unknown.
func (c *Conn) tierName(k index.Key, tier, unknown string) string {
	if tier != "" {
		return tier
	}
	if tier = c.hints.tier(k); tier != "" {
		return tier
	}
	return unknown
}

// fetcher returns how to fetch blocks wherever they are in the cluster
// of the worker's node: a cluster client seeded with seed, or seed itself
// when its node is in no cluster (found once, by asking it where a block
// is), which saves that question on every Load.
func (c *Conn) fetcher(ctx context.Context, seed *client.Client) (getFunc, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cluster != nil {
		return c.cluster.GetFunc, nil
	}
	if c.standalone {
		return seed.GetFunc, nil
	}
	_, err := seed.Locate(ctx, []index.Key{{}})
	var ce *client.Error
	switch {
	case errors.As(err, &ce) && ce.Code == codes.Unimplemented:
		c.standalone = true
		return seed.GetFunc, nil
	case err != nil:
		return nil, err
	}
	c.cluster = client.NewClusterClient(seed, c.cfg.Client)
	return c.cluster.GetFunc, nil
}

// Store stores blocks at node (the worker's own, Config.Addr, if empty)
// and returns the node's address once it has them all, or the error that
// kept some out (a *client.BatchError names them; client.ErrUnavailable,
// client.ErrFull, client.ErrInvalid, … match with errors.Is).
func (c *Conn) Store(ctx context.Context, node string, ns index.NamespaceID, blocks []sched.Block) (string, error) {
	if node == "" {
		node = c.cfg.Addr
	}
	err := c.put(ctx, node, false, ns, blocks)
	if err != nil {
		c.m.errors.WithLabelValues(opStore).Inc()
		return "", fmt.Errorf("kvconn: store %d blocks at %s: %w", len(blocks), node, err)
	}
	return node, nil
}

// put stores blocks at addr and counts what was stored; a probe goes to a
// node that is backing off.
func (c *Conn) put(ctx context.Context, addr string, probe bool, ns index.NamespaceID, blocks []sched.Block) error {
	if len(blocks) == 0 {
		return nil
	}
	cl, err := c.peers.get(ctx, addr, probe)
	if err != nil {
		return err
	}
	out := make([]client.Block, len(blocks))
	for i, b := range blocks {
		out[i] = client.Block{Key: index.Key{NS: ns, Hash: b.Hash}, Parent: b.Parent, HasParent: b.HasParent, Data: b.Data}
	}
	err = cl.Put(ctx, out)
	c.peers.report(addr, err)
	var be *client.BatchError
	stored, bytes := 0, 0
	for i, b := range blocks {
		if err == nil || errors.As(err, &be) && be.Errs[i] == nil {
			stored, bytes = stored+1, bytes+len(b.Data)
		}
	}
	c.m.offloaded(stored, bytes)
	return err
}

// Close offloads what is queued, for up to Config.CloseTimeout, drops the
// rest (counted) and closes every connection.
func (c *Conn) Close() error {
	c.closeOnce.Do(func() {
		c.off.close(c.cfg.CloseTimeout)
		c.mu.Lock()
		cluster := c.cluster
		c.mu.Unlock()
		var errs []error
		if cluster != nil {
			errs = append(errs, cluster.Close())
		}
		errs = append(errs, c.peers.close())
		c.closeErr = errors.Join(errs...)
	})
	return c.closeErr
}
