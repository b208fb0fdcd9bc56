package tcp

import (
	"sync"
	"time"
)

// cutGrace is how long a put must have been arriving, slower than
// Options.MinRate, before a listener short of room may cut its connection.
const cutGrace = time.Second

// pendingPuts bounds the room a listener's sessions hold reserved for
// blocks still arriving (Options.MaxPendingBytes). When a session needs
// room that is not there, the slowest holder is cut: stalled peers cannot
// keep the room from peers that send. Safe for concurrent use.
type pendingPuts struct {
	minRate float64

	mu      sync.Mutex
	limit   int64
	used    int64
	holders map[*session]int64
	waiters int
	freed   chan struct{} // closed, and replaced, when room comes back while someone waits
}

func newPendingPuts(o *Options) *pendingPuts {
	return &pendingPuts{minRate: float64(o.MinRate), limit: o.MaxPendingBytes,
		holders: map[*session]int64{}, freed: make(chan struct{})}
}

// acquire takes n bytes of room for s, cutting slow holders to make it,
// and waiting for it at most until deadline; it reports whether it got it.
func (p *pendingPuts) acquire(s *session, n int64, deadline time.Time) bool {
	for {
		now := time.Now()
		p.mu.Lock()
		if p.used+n <= p.limit {
			p.used += n
			p.holders[s] = n
			p.mu.Unlock()
			return true
		}
		if v := p.slowestLocked(s, now); v != nil {
			v.cut.Store(true)
			_ = v.c.Close() // its read fails; it gives its room back on the way out
		}
		freed := p.freed
		p.waiters++
		p.mu.Unlock()
		if !now.Before(deadline) {
			p.done()
			return false
		}
		// Wake when room comes back, or to look again for a holder that
		// has fallen behind meanwhile.
		t := time.NewTimer(min(time.Until(deadline), cutGrace/4))
		select {
		case <-freed:
		case <-t.C:
		}
		t.Stop()
		p.done()
	}
}

func (p *pendingPuts) done() {
	p.mu.Lock()
	p.waiters--
	p.mu.Unlock()
}

// release gives back the room s holds.
func (p *pendingPuts) release(s *session) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.used -= p.holders[s]
	delete(p.holders, s)
	if p.waiters > 0 {
		close(p.freed)
		p.freed = make(chan struct{})
	}
}

// slowestLocked returns the holder other than self whose request has been
// arriving for over cutGrace at the lowest rate under minRate, or nil.
func (p *pendingPuts) slowestLocked(self *session, now time.Time) *session {
	var slow *session
	slowest := p.minRate
	for s := range p.holders {
		if s == self || s.cut.Load() {
			continue
		}
		took := now.Sub(time.Unix(0, s.reqStart.Load()))
		if took < cutGrace {
			continue
		}
		if rate := float64(s.reqRead.Load()) / took.Seconds(); rate < slowest {
			slow, slowest = s, rate
		}
	}
	return slow
}
