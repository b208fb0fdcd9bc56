package node

import (
	"fmt"
	"sync"
	"time"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/tiers"
	"github.com/kvstrata/kvstrata/transfer"
)

// Prefetch makes the data plane read a Get's slow blocks ahead: blocks
// whose fastest copy is not in the top tier (an SSD, an object store) are
// read by up to FetchConcurrency workers, at most PrefetchWindow blocks
// ahead of the one being sent, while blocks already in the top tier are
// opened in place when their turn comes. A long context restored from an
// object store thus streams back in order at the pace of parallel ranged
// reads, not of one read after another, and holds at most the window in
// memory.
func (d *dataHandler) Prefetch(keys []index.Key) transfer.Opener {
	p := &prefetch{d: d, keys: keys, slots: make([]slot, len(keys)),
		window: 2 * d.n.cfg.FetchConcurrency, sem: make(chan struct{}, d.n.cfg.FetchConcurrency)}
	top := d.n.h.Kinds()[0]
	for i, k := range keys {
		if _, kind, err := d.n.h.Stat(k); err != nil || kind != top {
			p.slots[i].done = make(chan struct{}) // fetched ahead (a miss may be found in a shared tier)
		}
	}
	p.mu.Lock()
	p.startLocked()
	p.mu.Unlock()
	return p
}

// prefetch is the Opener of one Get.
type prefetch struct {
	d      *dataHandler
	keys   []index.Key
	slots  []slot
	window int
	sem    chan struct{} // bounds the reads in flight

	mu      sync.Mutex
	next    int // the next block Open hands out
	started int // blocks before it are fetched or being fetched
	closed  bool
}

// slot is one block of the Get; done is nil for blocks opened in place.
type slot struct {
	done  chan struct{}
	view  tiers.View
	err   error
	start time.Time
	taken bool
}

// startLocked starts the fetches the window allows.
func (p *prefetch) startLocked() {
	for ; p.started < len(p.slots) && p.started < p.next+p.window; p.started++ {
		s := &p.slots[p.started]
		if s.done == nil {
			continue
		}
		s.start = time.Now()
		go p.fetch(p.started)
	}
}

func (p *prefetch) fetch(i int) {
	p.sem <- struct{}{}
	p.mu.Lock()
	closed := p.closed
	p.mu.Unlock()
	if closed { // the Get ended while this block waited for a worker
		<-p.sem
		close(p.slots[i].done)
		return
	}
	v, _, err := p.d.n.View(p.keys[i])
	<-p.sem
	p.mu.Lock()
	defer p.mu.Unlock()
	s := &p.slots[i]
	if p.closed && err == nil {
		_ = v.Release() // the Get ended before this block's turn
	} else {
		s.view, s.err = v, err
	}
	close(s.done)
}

// Open hands out the next block of the Get, waiting for its fetch.
func (p *prefetch) Open(key index.Key) (transfer.Header, []byte, func(), error) {
	p.mu.Lock()
	i := p.next
	if i >= len(p.keys) || p.keys[i] != key {
		p.mu.Unlock()
		return transfer.Header{}, nil, nil, fmt.Errorf("node: prefetched get opened %v out of order", key)
	}
	p.next++
	p.startLocked()
	s := &p.slots[i]
	p.mu.Unlock()
	if s.done == nil {
		return p.d.Open(key)
	}
	<-s.done
	p.mu.Lock()
	v, err := s.view, s.err
	s.taken = true
	p.mu.Unlock()
	if err != nil {
		return transfer.Header{}, nil, nil, dataError(err)
	}
	b := v.Bytes()
	return header(v.Meta()), b, func() {
		_ = v.Release()
		p.d.observe("out", len(b), s.start)
	}, nil
}

// Close lets go of blocks fetched but never opened.
func (p *prefetch) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for i := range p.slots {
		s := &p.slots[i]
		if s.done == nil || s.taken {
			continue
		}
		select {
		case <-s.done:
			if s.err == nil {
				_ = s.view.Release()
			}
		default: // still in flight: fetch releases it
		}
	}
}
