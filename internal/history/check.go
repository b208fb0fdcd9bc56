package history

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/kvstrata/kvstrata/index"
)

// Bounds are what Check holds the cluster to.
type Bounds struct {
	// Staleness is how long after its acknowledgement a block must be
	// listed by the lookups of every node that reports ready, as long as
	// the node holding it is up. A read that misses an older
	// acknowledged block on such a node is stale.
	Staleness time.Duration
	// Durable is how long a block must have been listed in its node's SSD
	// tier before a kill -9 of that node for the project to promise it
	// survives (the SSD's flush interval, plus the directory's lag).
	Durable time.Duration
	// Liveness is the liveness timeout plus the time a restarted or
	// healed node takes to be heard again: a node marked down with no
	// fault of its own within this long is a healthy node marked down.
	Liveness time.Duration
}

// Counts classify keys: each key counts once, in the worst class of its
// reads (corrupt, then stale, then missing, then intact). Keys whose every
// read failed are counted in no class.
type Counts struct {
	Keys, Intact, Stale, Missing, Corrupt int
	Reads, Failed                         int
}

func (c Counts) String() string {
	return fmt.Sprintf("%d keys, %d intact / %d stale / %d missing / %d corrupt (%d reads, %d failed)",
		c.Keys, c.Intact, c.Stale, c.Missing, c.Corrupt, c.Reads, c.Failed)
}

// Window is the reads from one fault's start to the next one's; the first
// window of a report is the one before the first fault.
type Window struct {
	Fault *Fault // nil: before the first fault
	// AckedAgain is how long after the fault began every other node had
	// a put acknowledged again; -1: one had none before the next fault.
	AckedAgain time.Duration
	Counts
}

// Report is what Check found.
type Report struct {
	Puts, Acked int
	Windows     []Window
	// Settled classifies every acknowledged key by the check after the
	// cluster settled: stale there means a replica does not list a block
	// another node serves, or lists a location that serves nothing.
	Settled Counts
	// Phantom counts the locations listed after settling that fetched
	// nothing.
	Phantom int
	// Lost are the acknowledged keys missing after settling that the
	// project promises to keep: those whose node was never killed after
	// the put, and those listed in its SSD tier at least Bounds.Durable
	// before every kill. Missing keys beyond these were in DRAM when
	// their node was killed.
	Lost []index.Key
	// Corrupt and Stale are the reads so classified; FailedInTime the
	// calls that failed although their node reported ready again before
	// the call's deadline.
	Corrupt, Stale, FailedInTime []Op
	// HealthyDown says when a replica that reported ready showed a node
	// down that had no fault of its own within Bounds.Liveness.
	HealthyDown []string
}

// checker holds a history sorted for Check.
type checker struct {
	b         Bounds
	ops       []Op
	faults    []Fault
	readiness map[index.NodeID][]Readiness
	liveness  []Liveness
	onSSD     map[nodeKey][]time.Time
	puts      map[index.Key]Op // the acknowledged puts
	nodes     []index.NodeID   // the nodes probed for readiness
}

// Check checks a finished history against b.
func Check(h *History, b Bounds) Report {
	h.mu.Lock()
	c := &checker{b: b, ops: slices.Clone(h.ops), faults: slices.Clone(h.faults), liveness: slices.Clone(h.liveness),
		onSSD: h.onSSD, readiness: map[index.NodeID][]Readiness{}, puts: map[index.Key]Op{}}
	for _, r := range h.readiness {
		c.readiness[r.Node] = append(c.readiness[r.Node], r)
	}
	h.mu.Unlock()
	for n, rs := range c.readiness {
		c.nodes = append(c.nodes, n)
		slices.SortFunc(rs, func(a, b Readiness) int { return a.At.Compare(b.At) })
	}
	slices.SortFunc(c.faults, func(a, b Fault) int { return a.Start.Compare(b.Start) })

	var r Report
	for _, op := range c.ops {
		if op.Kind == Put {
			r.Puts++
			if !op.Acked.IsZero() {
				r.Acked++
				c.puts[op.Key] = op
			}
		}
	}
	r.Windows = c.windows(&r)
	c.settled(&r)
	r.HealthyDown = c.healthyDown()
	return r
}

// class classifies a read made while faults came and went.
func (c *checker) class(op Op) Result {
	if op.Result == Missing && c.stale(op) {
		return stale
	}
	return op.Result
}

// stale is the class of a read that broke the staleness bound, beyond
// what a Result says.
const stale Result = 0

// stale reports whether a read that found nothing broke the staleness
// bound: the key was acknowledged more than Bounds.Staleness before,
// its holder had no fault from then to the read's end (and none ended
// within the bound before it), and the node asked was ready throughout.
func (c *checker) stale(op Op) bool {
	p, ok := c.puts[op.Key]
	if !ok || op.Listed || op.Start.Sub(p.Acked) <= c.b.Staleness || !c.readyThroughout(op.Node, op.Start, op.End) {
		return false
	}
	return !c.faultNear(p.Holder, p.Acked, op.End, c.b.Staleness)
}

// faultNear reports whether node had a fault during [from, to], or one
// that ended less than grace before from.
func (c *checker) faultNear(node index.NodeID, from, to time.Time, grace time.Duration) bool {
	return slices.ContainsFunc(c.faults, func(f Fault) bool {
		if f.Node != node {
			return false
		}
		end := f.Ready
		if end.IsZero() { // never ready again
			end = to
		}
		return !f.Start.After(to) && !end.Add(grace).Before(from)
	})
}

// readyThroughout reports whether node reported ready at the last probe
// before from, at every probe until to, and at the first probe after.
func (c *checker) readyThroughout(node index.NodeID, from, to time.Time) bool {
	rs := c.readiness[node]
	i, _ := slices.BinarySearchFunc(rs, from, func(r Readiness, t time.Time) int { return r.At.Compare(t) })
	if i == 0 {
		return false // not probed yet
	}
	for i--; i < len(rs); i++ {
		if !rs[i].Ready {
			return false
		}
		if rs[i].At.After(to) {
			return true
		}
	}
	return true
}

// readyBetween reports whether node reported ready at a probe in [from, to].
func (c *checker) readyBetween(node index.NodeID, from, to time.Time) bool {
	return slices.ContainsFunc(c.readiness[node], func(r Readiness) bool {
		return r.Ready && !r.At.Before(from) && !r.At.After(to)
	})
}

// windows classifies the reads made before the settled check, per fault.
func (c *checker) windows(r *Report) []Window {
	ws := []Window{{}}
	for i := range c.faults {
		ws = append(ws, Window{Fault: &c.faults[i], AckedAgain: c.ackedAgain(i)})
	}
	worst := make([]map[index.Key]Result, len(ws))
	for i := range worst {
		worst[i] = map[index.Key]Result{}
	}
	for _, op := range c.ops {
		if op.Settled || op.Kind == Fetch {
			continue
		}
		if op.Result == Failed && c.readyBetween(op.Node, op.End, op.Deadline) {
			r.FailedInTime = append(r.FailedInTime, op)
		}
		if op.Kind != Read {
			continue
		}
		w := 0
		for i, f := range c.faults {
			if !op.Start.Before(f.Start) {
				w = i + 1
			}
		}
		ws[w].Reads++
		cl := c.class(op)
		switch cl {
		case Failed:
			ws[w].Failed++
			continue
		case Corrupt:
			r.Corrupt = append(r.Corrupt, op)
		case stale:
			r.Stale = append(r.Stale, op)
		}
		if prev, ok := worst[w][op.Key]; !ok || rank(cl) > rank(prev) {
			worst[w][op.Key] = cl
		}
	}
	for i := range ws {
		ws[i].Counts = tally(ws[i].Counts, worst[i])
	}
	return ws
}

// ackedAgain returns how long after fault i began every node outside it
// had a put acknowledged again (the slowest node's wait), or -1 if one
// had none before the next fault.
func (c *checker) ackedAgain(i int) time.Duration {
	f := c.faults[i]
	first := map[index.NodeID]time.Duration{}
	for _, p := range c.puts {
		if !p.Acked.After(f.Start) || i+1 < len(c.faults) && p.Acked.After(c.faults[i+1].Start) {
			continue
		}
		if d, ok := first[p.Holder]; !ok || p.Acked.Sub(f.Start) < d {
			first[p.Holder] = p.Acked.Sub(f.Start)
		}
	}
	slowest := time.Duration(0)
	for _, n := range c.nodes {
		if n == f.Node {
			continue
		}
		d, ok := first[n]
		if !ok {
			return -1
		}
		slowest = max(slowest, d)
	}
	return slowest
}

// rank orders the classes of a key's reads, the worst highest.
func rank(r Result) int {
	return map[Result]int{Intact: 1, Missing: 2, stale: 3, Corrupt: 4}[r]
}

func tally(c Counts, worst map[index.Key]Result) Counts {
	for _, cl := range worst {
		c.Keys++
		switch cl {
		case Intact:
			c.Intact++
		case Missing:
			c.Missing++
		case stale:
			c.Stale++
		case Corrupt:
			c.Corrupt++
		}
	}
	return c
}

// settled classifies every acknowledged key by the settled check: the
// lookups of every node (Read) and a direct fetch of every location they
// listed (Fetch).
func (c *checker) settled(r *Report) {
	served := map[index.Key]bool{}
	for _, op := range c.ops {
		if op.Settled && op.Kind == Fetch && op.Result == Intact {
			served[op.Key] = true
		}
	}
	worst := map[index.Key]Result{}
	for k := range c.puts {
		worst[k] = Intact
		if !served[k] {
			worst[k] = Missing
		}
	}
	for _, op := range c.ops {
		if !op.Settled {
			continue
		}
		cl := Intact
		switch {
		case op.Result == Corrupt:
			cl = Corrupt
			r.Corrupt = append(r.Corrupt, op)
		case op.Result == Failed:
			r.Settled.Failed++
			continue
		case op.Kind == Fetch && op.Result == Missing:
			cl = stale
			r.Phantom++
		case op.Kind == Read && !op.Listed && served[op.Key]:
			cl = stale
			r.Stale = append(r.Stale, op)
		}
		r.Settled.Reads++
		if _, acked := worst[op.Key]; acked && rank(cl) > rank(worst[op.Key]) {
			worst[op.Key] = cl
		}
	}
	r.Settled = tally(r.Settled, worst)
	for k, cl := range worst {
		if cl == Missing && c.promised(c.puts[k]) {
			r.Lost = append(r.Lost, k)
		}
	}
	slices.SortFunc(r.Lost, func(a, b index.Key) int { return cmp.Compare(a.Hash, b.Hash) })
}

// promised reports whether the project promises to keep an acknowledged
// put: a kill -9 loses what the node held only in DRAM, so every kill of
// its node after the put must find it in the SSD tier for long enough.
func (c *checker) promised(p Op) bool {
	seen := c.onSSD[nodeKey{p.Holder, p.Key}]
	for _, f := range c.faults {
		if f.Kind != Kill || f.Node != p.Holder || f.Start.Before(p.Start) {
			continue
		}
		if !slices.ContainsFunc(seen, func(t time.Time) bool { return !t.After(f.Start.Add(-c.b.Durable)) }) {
			return false
		}
	}
	return true
}

// healthyDown lists, once per node and fault window, a replica showing a
// node down that had no fault within Bounds.Liveness.
func (c *checker) healthyDown() []string {
	var out []string
	said := map[[2]int]bool{}
	for _, l := range c.liveness {
		if !c.readyThroughout(l.From, l.At, l.At) {
			continue // a replica catching up shows the past, and says it is not current
		}
		for _, d := range l.Down {
			if c.faultNear(d, l.At, l.At, c.b.Liveness) {
				continue
			}
			w := 0
			for i, f := range c.faults {
				if !l.At.Before(f.Start) {
					w = i + 1
				}
			}
			if said[[2]int{int(d), w}] {
				continue
			}
			said[[2]int{int(d), w}] = true
			what := "before the first fault"
			if w > 0 {
				what = fmt.Sprintf("%v after %q began", l.At.Sub(c.faults[w-1].Start).Round(time.Millisecond), c.faults[w-1].Name)
			}
			out = append(out, fmt.Sprintf("node %d, with no fault of its own, shown down by node %d %s", d, l.From, what))
		}
	}
	return out
}
