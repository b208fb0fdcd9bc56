package client

import (
	"context"
	"errors"
	"sync"

	"github.com/kvstrata/kvstrata/transfer"
)

// pool keeps idle data-plane connections to one node. A connection that
// failed is closed, never returned.
type pool struct {
	t    transfer.Transport
	addr string
	idle chan transfer.Conn

	mu     sync.Mutex
	closed bool
}

func newPool(t transfer.Transport, addr string, size int) *pool {
	return &pool{t: t, addr: addr, idle: make(chan transfer.Conn, size)}
}

// with runs fn on a pooled connection, dialling one if none is idle.
func (p *pool) with(ctx context.Context, fn func(transfer.Conn) error) error {
	var c transfer.Conn
	select {
	case c = <-p.idle:
	default:
		var err error
		if c, err = p.t.Dial(ctx, p.addr); err != nil {
			return err
		}
	}
	err := fn(c)
	if err != nil {
		c.Close()
		if errors.Is(err, transfer.ErrClosed) && ctx.Err() == nil {
			// The node closed this one, so it most likely closed the
			// idle ones too (it restarted): let a retry dial afresh.
			p.drain()
		}
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return c.Close()
	}
	select {
	case p.idle <- c:
	default:
		c.Close()
	}
	return nil
}

func (p *pool) close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.drain()
}

// drain closes the idle connections.
func (p *pool) drain() {
	for {
		select {
		case c := <-p.idle:
			c.Close()
		default:
			return
		}
	}
}
