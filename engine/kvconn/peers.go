package kvconn

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/kvstrata/kvstrata/api/client"
)

var (
	// ErrClosed is returned by a Conn's methods after Close.
	ErrClosed = errors.New("kvconn: closed")
	// ErrCacheDown is returned, with client.ErrUnavailable, by a call
	// that was not tried because the node was found unreachable a moment
	// ago (see Config.Backoff).
	ErrCacheDown = errors.New("kvconn: cache down")
)

// peers keeps one client per cache node address, dialled on first use and
// reused after: the worker's own node, and the nodes disaggregated
// requests name. A node that cannot be reached is dialled again at its
// next use, so a cache that comes up after the worker is found then.
//
// A node found unreachable, or silent past a Lookup's deadline, is not
// asked again for a backoff (Config.Backoff, doubled after each further
// failure up to Config.MaxBackoff): calls fail at once with ErrCacheDown
// meanwhile, so that a down cache costs the engine loop nothing but a
// recompute. Probes (the offloader's calls) go through regardless, and a
// success ends the backoff.
type peers struct {
	opts                client.Options
	backoff, maxBackoff time.Duration

	mu     sync.Mutex
	nodes  map[string]*peer
	closed bool
}

// peer is one address's client. dial is held while it is being dialled,
// so that callers wait for one dial (within their contexts) instead of
// making their own.
type peer struct {
	dial chan struct{}
	// Guarded by peers.mu:
	c         *client.Client // nil until dialled
	downUntil time.Time      // no call but probes before then
	wait      time.Duration  // the next backoff
}

func newPeers(cfg Config) *peers {
	return &peers{opts: cfg.Client, backoff: cfg.Backoff, maxBackoff: cfg.MaxBackoff, nodes: map[string]*peer{}}
}

// get returns the client of addr, dialling it within ctx if it has none.
// Unless probe, it fails at once while addr is backing off.
func (ps *peers) get(ctx context.Context, addr string, probe bool) (*client.Client, error) {
	ps.mu.Lock()
	if ps.closed {
		ps.mu.Unlock()
		return nil, ErrClosed
	}
	p := ps.nodes[addr]
	if p == nil {
		p = &peer{dial: make(chan struct{}, 1), wait: ps.backoff}
		ps.nodes[addr] = p
	}
	if left := time.Until(p.downUntil); !probe && left > 0 {
		ps.mu.Unlock()
		return nil, fmt.Errorf("%w: %s was unreachable; next try in %v: %w", ErrCacheDown, addr, left.Round(time.Millisecond), client.ErrUnavailable)
	}
	c := p.c
	ps.mu.Unlock()
	if c != nil {
		return c, nil
	}

	select {
	case p.dial <- struct{}{}:
		defer func() { <-p.dial }()
	case <-ctx.Done():
		return nil, fmt.Errorf("kvconn: dial %s: %w", addr, ctx.Err())
	}
	ps.mu.Lock()
	c = p.c // dialled while this call waited
	ps.mu.Unlock()
	if c != nil {
		return c, nil
	}
	c, err := client.Dial(ctx, addr, ps.opts)
	if err != nil {
		if ctx.Err() == nil || errors.Is(err, client.ErrUnavailable) {
			ps.down(addr)
		}
		return nil, fmt.Errorf("kvconn: dial %s: %w", addr, err)
	}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.closed {
		c.Close()
		return nil, ErrClosed
	}
	p.c = c
	return c, nil
}

// report takes the outcome of a call to addr: a node found unreachable
// backs off, one that answered does not.
func (ps *peers) report(addr string, err error) {
	switch {
	case err == nil:
		ps.mu.Lock()
		if p := ps.nodes[addr]; p != nil {
			p.downUntil, p.wait = time.Time{}, ps.backoff
		}
		ps.mu.Unlock()
	case errors.Is(err, client.ErrUnavailable) && !errors.Is(err, ErrCacheDown):
		ps.down(addr)
	}
}

// unanswered takes a Lookup of addr that failed: if ctx's deadline passed,
// the node did not answer a small question within the engine's time (a
// partition that drops packets, a hung process), which is as good as
// down to the engine, so it backs off as an unreachable node does; else
// every request would wait out its deadline for as long as the node is
// silent. A cancelled ctx (the request ended) says nothing of the node,
// and neither does a slow Load: a long prefix may take its time.
func (ps *peers) unanswered(ctx context.Context, addr string) {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		ps.down(addr)
	}
}

// down starts addr's next backoff.
func (ps *peers) down(addr string) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if p := ps.nodes[addr]; p != nil {
		p.downUntil = time.Now().Add(p.wait)
		p.wait = min(2*p.wait, ps.maxBackoff)
	}
}

// close closes every client; get fails with ErrClosed after.
func (ps *peers) close() error {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	ps.closed = true
	var errs []error
	for _, p := range ps.nodes {
		if p.c != nil {
			errs = append(errs, p.c.Close())
		}
	}
	return errors.Join(errs...)
}
