package policy

// Sequence is a request routed to a worker, active from Choose until Done:
// its predicted prefill tokens count in the worker's load until
// FirstToken, the blocks its prompt adds to the pool until Done. Its methods are safe for
// concurrent use, idempotent, and do nothing on a nil Sequence.
type Sequence struct {
	r       *Router
	worker  string
	prefill float64
	blocks  int
	state   uint8 // seqPrefill, seqDecode, seqDone
}

const (
	seqPrefill uint8 = iota
	seqDecode
	seqDone
)

// Worker is the worker the sequence was routed to.
func (s *Sequence) Worker() string {
	if s == nil {
		return ""
	}
	return s.worker
}

// start records a new sequence on worker; r.mu is held.
func (r *Router) start(worker string, prefill float64, blocks int) *Sequence {
	l := r.loads[worker]
	if l == nil {
		l = new(Load)
		r.loads[worker] = l
	}
	l.PrefillTokens += prefill
	l.Blocks += blocks
	l.Prefilling++
	return &Sequence{r: r, worker: worker, prefill: prefill, blocks: blocks}
}

// FirstToken moves the sequence from its worker's prefill load to its
// decode load: the prompt is computed.
func (s *Sequence) FirstToken() {
	if s == nil {
		return
	}
	s.r.mu.Lock()
	defer s.r.mu.Unlock()
	if s.state != seqPrefill {
		return
	}
	s.state = seqDecode
	l := s.r.loads[s.worker]
	l.PrefillTokens -= s.prefill
	if l.Prefilling--; l.Prefilling == 0 {
		l.PrefillTokens = 0 // no rounding left behind
	}
	l.Decoding++
}

// Done removes the sequence from its worker's load: it completed, was
// cancelled or failed.
func (s *Sequence) Done() {
	if s == nil {
		return
	}
	s.r.mu.Lock()
	defer s.r.mu.Unlock()
	if s.state == seqDone {
		return
	}
	l := s.r.loads[s.worker]
	if s.state == seqPrefill {
		l.PrefillTokens -= s.prefill
		if l.Prefilling--; l.Prefilling == 0 {
			l.PrefillTokens = 0
		}
	} else {
		l.Decoding--
	}
	s.state = seqDone
	l.Blocks -= s.blocks
	if l.Prefilling == 0 && l.Decoding == 0 {
		delete(s.r.loads, s.worker)
	}
}

// Load is the load the Router tracks for worker: its active sequences.
func (r *Router) Load(worker string) Load {
	r.mu.Lock()
	defer r.mu.Unlock()
	if l := r.loads[worker]; l != nil {
		return *l
	}
	return Load{}
}
