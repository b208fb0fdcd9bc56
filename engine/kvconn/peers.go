package kvconn

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/kvstrata/kvstrata/api/client"
)

// ErrClosed is returned by a Conn's methods after Close.
var ErrClosed = errors.New("kvconn: closed")

// peers keeps one client per cache node address, dialled on first use and
// reused after: the worker's own node, and the nodes disaggregated
// requests name. A node that cannot be reached is dialled again at its
// next use, so a cache that comes up after the worker is found then.
type peers struct {
	opts client.Options

	mu     sync.Mutex
	nodes  map[string]*peer
	closed bool
}

// peer is one address's client. dial is held while it is being dialled,
// so that callers wait for one dial (within their contexts) instead of
// making their own.
type peer struct {
	dial chan struct{}
	c    *client.Client // guarded by peers.mu; nil until dialled
}

func newPeers(opts client.Options) *peers {
	return &peers{opts: opts, nodes: map[string]*peer{}}
}

// get returns the client of addr, dialling it within ctx if it has none.
func (ps *peers) get(ctx context.Context, addr string) (*client.Client, error) {
	ps.mu.Lock()
	if ps.closed {
		ps.mu.Unlock()
		return nil, ErrClosed
	}
	p := ps.nodes[addr]
	if p == nil {
		p = &peer{dial: make(chan struct{}, 1)}
		ps.nodes[addr] = p
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
