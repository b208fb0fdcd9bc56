package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/api/client"
	pb "github.com/kvstrata/kvstrata/api/v1"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/internal/history"
)

// The fault run: a three-node cluster of real processes under load (writers
// putting blocks and readers looking them up and fetching them, through
// random nodes) while a schedule of faults kills, pauses and cuts off
// nodes. Every operation goes into a history (internal/history) that is
// checked once the cluster has settled. docs/RELIABILITY.md keeps the
// figures. KVSTRATA_FAULTRUN=long runs a longer, seeded random schedule
// (KVSTRATA_FAULTRUN_SEED repeats one).

// faultClient is how the run's clients are configured: a call is tried
// again for as long as its deadline allows, so that one whose node is back
// before its deadline succeeds (a race-built node that reloads tens of
// thousands of SSD blocks takes longer than the default budget).
var faultClient = client.Options{RetryBudget: faultDeadline}

// The fault run's bounds: generous, and each with its reason.
const (
	// faultLiveness is the cluster's liveness timeout; pauses and
	// partitions last twice as long, so that the node is marked down.
	faultLiveness = 2 * time.Second
	// faultStaleness bounds how long after its acknowledgement a block
	// may be missing from a ready node's lookups (a replica trails the
	// leader by the batches in flight: milliseconds when idle).
	faultStaleness = 3 * time.Second
	// faultDurable is how long a block must have been listed in its
	// node's SSD tier to survive kill -9: the SSD's 1s flush interval,
	// plus the flush itself on a loaded machine.
	faultDurable = 2500 * time.Millisecond
	// faultAckedAgain bounds how long puts outside a fault wait to be
	// acknowledged again: an election (about a second) and a retry.
	faultAckedAgain = 6 * time.Second
	// faultDeadline is every call's deadline.
	faultDeadline = 10 * time.Second
	// faultBlockSize is the size of each block: with 4 MiB of DRAM a node
	// keeps about 120 of them in DRAM and demotes the rest to its SSD.
	faultBlockSize = 32 << 10
)

// faultStep is one fault of the schedule.
type faultStep struct {
	kind   history.FaultKind
	leader bool          // on the leader, else on a follower
	hold   time.Duration // how long the node stays killed, paused or cut off
}

func (s faultStep) String() string {
	who := "a follower"
	if s.leader {
		who = "the leader"
	}
	switch s.kind {
	case history.Kill:
		return "kill -9 " + who + " + restart"
	case history.Pause:
		return fmt.Sprintf("SIGSTOP %s for %v + SIGCONT", who, s.hold)
	default:
		return fmt.Sprintf("partition %s for %v + heal", who, s.hold)
	}
}

// faultSchedule is the default schedule, or with KVSTRATA_FAULTRUN=long a
// random one of 12 faults drawn from seed. Partitions need network
// namespaces.
func faultSchedule(long, partitions bool, seed uint64) []faultStep {
	hold := 2 * faultLiveness
	if !long {
		s := []faultStep{{history.Kill, false, 500 * time.Millisecond}, {history.Kill, true, 500 * time.Millisecond},
			{history.Pause, true, hold}}
		if partitions {
			s = append(s, faultStep{history.Partition, true, hold})
		}
		return s
	}
	rng := rand.New(rand.NewPCG(seed, seed))
	kinds := []history.FaultKind{history.Kill, history.Pause}
	if partitions {
		kinds = append(kinds, history.Partition)
	}
	var s []faultStep
	for range 12 {
		st := faultStep{kind: kinds[rng.IntN(len(kinds))], leader: rng.IntN(2) == 0,
			hold: hold + time.Duration(rng.IntN(3000))*time.Millisecond}
		if st.kind == history.Kill {
			st.hold = time.Duration(200+rng.IntN(2000)) * time.Millisecond
		}
		s = append(s, st)
	}
	return s
}

// faultRun is the cluster, its load and its history.
type faultRun struct {
	t     *testing.T
	nodes []*proc
	nn    *netnsNet // nil: no partitions
	h     *history.History
	seed  uint64
	rng   *rand.Rand // the schedule's choices

	mu      sync.Mutex
	acked   []heldKey                 // every acknowledged key, in order
	notSSD  map[index.Key]bool        // acknowledged keys not yet seen in their node's SSD
	clients map[[2]int]*client.Client // by worker and node index
}

// heldKey is a key and the node it was put on.
type heldKey struct {
	key    index.Key
	holder index.NodeID
}

func TestAFaultRunUnderLoadReadsNoWrongBytesAndLosesNothingPromised(t *testing.T) {
	long := os.Getenv("KVSTRATA_FAULTRUN") == "long"
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("KVSTRATA_FAULTRUN_SEED"); s != "" {
		var err error
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatalf("KVSTRATA_FAULTRUN_SEED=%q: %v", s, err)
		}
	}
	r := &faultRun{t: t, h: history.New(), seed: seed, rng: rand.New(rand.NewPCG(seed, 100)), notSSD: map[index.Key]bool{},
		clients: map[[2]int]*client.Client{}}
	hosts := loopback(3)
	if nn, err := newNetnsNet(t, 3); err == nil {
		r.nn, hosts = nn, nn.hosts()
	} else {
		t.Logf("no partitions in this run: %v", err)
	}
	r.nodes = startCluster(t, hosts, "--cluster-liveness-timeout", faultLiveness.String(), "--dram-capacity", "4MiB")
	schedule := faultSchedule(long, r.nn != nil, seed)
	t.Logf("fault run (seed %d): %v", seed, schedule)

	stop := make(chan struct{})
	var load, probes sync.WaitGroup
	// Two writers through random nodes, and one on each node: those keep
	// putting on the nodes outside a fault while the others wait on a
	// paused node.
	for w := range 2 + len(r.nodes) {
		node := w - 2 // -1: random
		load.Go(func() { r.write(w, node, stop) })
	}
	for w := range 2 {
		load.Go(func() { r.read(10+w, stop) })
	}
	stopProbes := make(chan struct{})
	probes.Go(func() { r.probeReadiness(stopProbes) })
	probes.Go(func() { r.probeLiveness(stopProbes) })
	probes.Go(func() { r.probeSSD(stopProbes) })
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
			load.Wait()
		}
		select {
		case <-stopProbes:
		default:
			close(stopProbes)
			probes.Wait()
		}
	}()

	eventually(t, 20*time.Second, "the writers get 100 keys acknowledged", func() bool { return r.ackedCount() >= 100 })
	for _, step := range schedule {
		r.inject(step)
		r.settle()
	}
	close(stop)
	load.Wait()
	settling := time.Now()
	var keys uint64
	r.await("every replica's directory is the same", func(resps []*pb.MembersResponse) bool {
		keys = resps[0].DirectoryKeys
		return !slices.ContainsFunc(resps, func(m *pb.MembersResponse) bool { return m.DirectoryDigest != resps[0].DirectoryDigest })
	})
	t.Logf("after the last fault every replica holds the same %d keys %v after the load stopped", keys, time.Since(settling).Round(time.Millisecond))
	r.checkSettled()
	close(stopProbes)
	probes.Wait()

	rep := history.Check(r.h, history.Bounds{Staleness: faultStaleness, Durable: faultDurable, Liveness: faultLiveness + 3*time.Second})
	r.report(rep)
}

// ackedCount is how many keys were acknowledged so far.
func (r *faultRun) ackedCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.acked)
}

// client returns worker w's client of node i (from 0), dialled at first
// use: each worker has its own connections.
func (r *faultRun) client(w, i int) (*client.Client, error) {
	r.mu.Lock()
	c := r.clients[[2]int{w, i}]
	r.mu.Unlock()
	if c != nil {
		return c, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), faultDeadline)
	defer cancel()
	c, err := client.Dial(ctx, r.nodes[i].grpc, faultClient)
	if err != nil {
		return nil, err
	}
	r.t.Cleanup(func() { c.Close() })
	r.mu.Lock()
	r.clients[[2]int{w, i}] = c
	r.mu.Unlock()
	return c, nil
}

// write puts batches of 4 new blocks through node (an index; -1: a random
// node each time), and syncs on the node after each: a put is
// acknowledged once a Sync on its node returns after it.
func (r *faultRun) write(w, node int, stop <-chan struct{}) {
	rng := rand.New(rand.NewPCG(r.seed, uint64(w)))
	pending := make([][]history.Op, len(r.nodes)) // put, not yet acknowledged, per node
	defer func() {
		for _, ops := range pending {
			r.h.Add(ops...)
		}
	}()
	for seq := 0; ; {
		select {
		case <-stop:
			return
		default:
		}
		i := node
		if i < 0 {
			i = rng.IntN(len(r.nodes))
		}
		holder := index.NodeID(i + 1)
		c, err := r.client(w, i)
		if err != nil {
			time.Sleep(50 * time.Millisecond)
			continue
		}
		var blocks []client.Block
		for range 4 {
			k := index.Key{NS: 1, Hash: index.Hash(uint64(w+1)<<32 | uint64(seq))}
			seq++
			blocks = append(blocks, client.Block{Key: k, Data: history.Content(k, faultBlockSize)})
		}
		start := time.Now()
		ctx, cancel := context.WithDeadline(context.Background(), start.Add(faultDeadline))
		err = c.Put(ctx, blocks)
		cancel()
		for bi, b := range blocks {
			op := history.Op{Kind: history.Put, Key: b.Key, Node: holder, Holder: holder, Start: start, End: time.Now(),
				Deadline: start.Add(faultDeadline), Result: history.Intact}
			if err != nil {
				op.Result, op.Err = history.Failed, err.Error()
				if be := (*client.BatchError)(nil); errors.As(err, &be) && be.Errs[bi] == nil {
					op.Result, op.Err = history.Intact, ""
				}
			}
			if op.Result == history.Failed {
				r.h.Add(op) // maybe stored, maybe not: never acknowledged
				continue
			}
			pending[i] = append(pending[i], op)
		}
		if err != nil {
			time.Sleep(50 * time.Millisecond)
		}
		if len(pending[i]) == 0 || syncNode(c, 3*time.Second) != nil {
			continue
		}
		acked := time.Now()
		r.mu.Lock()
		for j := range pending[i] {
			pending[i][j].Acked = acked
			r.acked = append(r.acked, heldKey{pending[i][j].Key, holder})
			r.notSSD[pending[i][j].Key] = true
		}
		r.mu.Unlock()
		r.h.Add(pending[i]...)
		pending[i] = nil
	}
}

// read looks acknowledged keys up through random nodes and fetches them
// through the cluster as that node sees it, half the time one of the 32
// acknowledged last.
func (r *faultRun) read(w int, stop <-chan struct{}) {
	rng := rand.New(rand.NewPCG(r.seed, uint64(w)))
	clusters := map[int]*client.ClusterClient{}
	defer func() {
		for _, cl := range clusters {
			cl.Close()
		}
	}()
	for {
		select {
		case <-stop:
			return
		case <-time.After(5 * time.Millisecond):
		}
		r.mu.Lock()
		n := len(r.acked)
		var k heldKey
		if n > 0 {
			if rng.IntN(2) == 0 {
				k = r.acked[n-1-rng.IntN(min(n, 32))]
			} else {
				k = r.acked[rng.IntN(n)]
			}
		}
		r.mu.Unlock()
		if n == 0 {
			continue
		}
		i := rng.IntN(len(r.nodes))
		c, err := r.client(w, i)
		if err != nil {
			time.Sleep(50 * time.Millisecond)
			continue
		}
		if clusters[i] == nil {
			clusters[i] = client.NewClusterClient(c, faultClient)
		}
		start := time.Now()
		op := history.Op{Kind: history.Read, Key: k.key, Node: index.NodeID(i + 1), Holder: k.holder, Start: start,
			Deadline: start.Add(faultDeadline)}
		ctx, cancel := context.WithDeadline(context.Background(), op.Deadline)
		lr, err := c.Lookup(ctx, k.key.NS, []index.Hash{k.key.Hash})
		var res []client.Result
		if err == nil {
			op.Listed = lr.Blocks == 1
			res, err = clusters[i].Get(ctx, []index.Key{k.key})
		}
		cancel()
		op.End = time.Now()
		switch {
		case err != nil:
			op.Result, op.Err = history.Failed, err.Error()
		default:
			op.Result = verdict(k.key, res[0])
		}
		r.h.Add(op)
	}
}

// verdict says whether a fetched block is key's.
func verdict(key index.Key, res client.Result) history.Result {
	switch {
	case !res.Found:
		return history.Missing
	case !bytes.Equal(res.Data, history.Content(key, faultBlockSize)):
		return history.Corrupt
	}
	return history.Intact
}

// every calls fn every d until stop is closed.
func every(d time.Duration, stop <-chan struct{}, fn func()) {
	for {
		fn()
		select {
		case <-stop:
			return
		case <-time.After(d):
		}
	}
}

// probeReadiness asks every node's /readyz every 100ms; no answer within
// 500ms is not ready.
func (r *faultRun) probeReadiness(stop <-chan struct{}) {
	hc := &http.Client{Timeout: 500 * time.Millisecond}
	every(100*time.Millisecond, stop, func() {
		var wg sync.WaitGroup
		for i, p := range r.nodes {
			wg.Go(func() {
				at := time.Now()
				resp, err := hc.Get("http://" + p.http + "/readyz")
				ready := err == nil && resp.StatusCode == http.StatusOK
				if err == nil {
					resp.Body.Close()
				}
				r.h.AddReadiness(history.Readiness{Node: index.NodeID(i + 1), At: at, Ready: ready})
			})
		}
		wg.Wait()
	})
}

// probeLiveness records every 250ms what each replica says of the
// cluster's leader and liveness.
func (r *faultRun) probeLiveness(stop <-chan struct{}) {
	every(250*time.Millisecond, stop, func() {
		var wg sync.WaitGroup
		for i := range r.nodes {
			wg.Go(func() {
				resp, err := r.members(100, i, 500*time.Millisecond)
				if err != nil {
					return
				}
				l := history.Liveness{From: index.NodeID(i + 1), At: time.Now(), Leader: index.NodeID(resp.LeaderId)}
				for _, m := range resp.Members {
					if !m.Up {
						l.Down = append(l.Down, index.NodeID(m.Id))
					}
				}
				r.h.AddLiveness(l)
			})
		}
		wg.Wait()
	})
}

// members asks node i (from 0) for the members, as worker w.
func (r *faultRun) members(w, i int, timeout time.Duration) (*pb.MembersResponse, error) {
	c, err := r.client(w, i)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return c.Members(ctx)
}

// probeSSD records, every 500ms, which acknowledged keys each node's
// replica lists in their node's SSD tier: what a kill -9 is promised to
// spare (a block the SSD holds stays there when it is promoted).
func (r *faultRun) probeSSD(stop <-chan struct{}) {
	every(500*time.Millisecond, stop, func() {
		r.mu.Lock()
		var keys []index.Key
		holder := map[index.Key]index.NodeID{}
		for _, k := range r.acked {
			if r.notSSD[k.key] {
				keys = append(keys, k.key)
				holder[k.key] = k.holder
			}
		}
		r.mu.Unlock()
		for i := range r.nodes {
			c, err := r.client(101, i)
			if err != nil {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			kls, err := c.Locate(ctx, keys)
			cancel()
			if err != nil {
				continue
			}
			at := time.Now()
			r.mu.Lock()
			for j, kl := range kls {
				if slices.ContainsFunc(kl.Locations, func(l *pb.TierBlocks) bool {
					return l.Tier == "ssd" && index.NodeID(l.NodeId) == holder[keys[j]]
				}) {
					r.h.SeenOnSSD(holder[keys[j]], keys[j], at)
					delete(r.notSSD, keys[j])
				}
			}
			r.mu.Unlock()
			return // one replica that answers is enough
		}
	})
}

// inject runs one fault of the schedule and records it with the leader's
// election and the directory's convergence.
func (r *faultRun) inject(step faultStep) {
	t := r.t
	leader, _ := r.agreedLeader()
	victim := leader
	if !step.leader {
		victim = index.NodeID(1 + (int(leader)+r.rng.IntN(2))%3) // one of the other two
	}
	p := r.nodes[victim-1]
	t.Logf("%v on node %d", step, victim)
	f := history.Fault{Name: fmt.Sprintf("%v (node %d)", step, victim), Kind: step.kind, Node: victim, WasLeader: victim == leader}
	elected := make(chan time.Duration, 1)
	f.Start = time.Now()
	if victim == leader {
		go func() { elected <- r.awaitElection(victim, f.Start) }()
	}
	switch step.kind {
	case history.Kill:
		p.kill()
		if victim == leader { // restarting before the election would let it win again
			f.Elected = <-elected
		}
		time.Sleep(step.hold)
		f.End = time.Now()
		p.launch()
	case history.Pause:
		if err := p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		time.Sleep(step.hold)
		f.End = time.Now()
		if err := p.cmd.Process.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
	case history.Partition:
		r.nn.isolate(int(victim))
		time.Sleep(step.hold)
		f.End = time.Now()
		r.nn.heal(int(victim))
	}
	r.awaitReady(p)
	f.Ready = time.Now()
	if victim == leader && f.Elected == 0 {
		f.Elected = <-elected
	}
	f.Converged = r.awaitConvergence(f.Ready)
	r.h.AddFault(f)
}

// faultReady bounds how long a node takes to report ready after a fault:
// a restart loads the SSD and waits up to 10s for its directory events to
// commit, and a node built with -race starts slowly on a loaded machine.
const faultReady = 60 * time.Second

// awaitReady waits until p reports ready, failing the test after
// faultReady.
func (r *faultRun) awaitReady(p *proc) {
	t := r.t
	t.Helper()
	hc := &http.Client{Timeout: time.Second}
	for deadline := time.Now().Add(faultReady); ; time.Sleep(50 * time.Millisecond) {
		resp, err := hc.Get("http://" + p.http + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		select {
		case err := <-p.exited:
			t.Fatalf("kvstrata exited while starting: %v\n%s", err, p.log)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("kvstrata not ready %v after a fault:\n%s", faultReady, p.log)
		}
	}
}

// awaitElection returns how long after start a node other than old first
// named a leader other than old; -1 if none did within 20s.
func (r *faultRun) awaitElection(old index.NodeID, start time.Time) time.Duration {
	for time.Since(start) < 20*time.Second {
		for i := range r.nodes {
			if index.NodeID(i+1) == old {
				continue
			}
			resp, err := r.members(102, i, 500*time.Millisecond)
			if err == nil && resp.LeaderId != 0 && index.NodeID(resp.LeaderId) != old {
				return time.Since(start)
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return -1
}

// answers asks every node for the members, through worker 103's clients;
// a node that does not answer within 2s has a nil response. It also
// returns what each said, for a failure's message.
func (r *faultRun) answers() ([]*pb.MembersResponse, []string) {
	resps, said := make([]*pb.MembersResponse, len(r.nodes)), make([]string, len(r.nodes))
	for i := range r.nodes {
		resp, err := r.members(103, i, 2*time.Second)
		if err != nil {
			said[i] = fmt.Sprintf("node %d: %v", i+1, err)
			continue
		}
		resps[i] = resp
		down := 0
		for _, m := range resp.Members {
			if !m.Up {
				down++
			}
		}
		said[i] = fmt.Sprintf("node %d: leader %d, applied %d, %d members down", i+1, resp.LeaderId, resp.AppliedIndex, down)
	}
	return resps, said
}

// await polls the members of every node until cond holds, failing the
// test after 30s with what each node last answered: after a fault a node
// may take seconds to answer, but not that long.
func (r *faultRun) await(what string, cond func([]*pb.MembersResponse) bool) {
	var said []string
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(25 * time.Millisecond) {
		var resps []*pb.MembersResponse
		resps, said = r.answers()
		if !slices.Contains(resps, nil) && cond(resps) {
			return
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("not within 30s: %s; the nodes said %q\n%s", what, said, r.tails())
		}
	}
}

// tails returns each node's readiness and the end of its log, for a
// failure's message.
func (r *faultRun) tails() string {
	hc := &http.Client{Timeout: 2 * time.Second}
	var b strings.Builder
	for i, p := range r.nodes {
		ready := "no answer"
		if resp, err := hc.Get("http://" + p.http + "/readyz"); err == nil {
			ready = resp.Status
			resp.Body.Close()
		}
		log := p.log.String()
		fmt.Fprintf(&b, "node %d: /readyz %s; log ends:\n%s\n", i+1, ready, log[max(0, len(log)-3000):])
	}
	return b.String()
}

// agreedLeader waits until every node names the same leader, and returns
// it with its applied index.
func (r *faultRun) agreedLeader() (leader index.NodeID, applied uint64) {
	r.await("the nodes agree on a leader", func(resps []*pb.MembersResponse) bool {
		leader = index.NodeID(resps[0].LeaderId)
		if leader == 0 || slices.ContainsFunc(resps, func(m *pb.MembersResponse) bool { return index.NodeID(m.LeaderId) != leader }) {
			return false
		}
		applied = resps[leader-1].AppliedIndex
		return true
	})
	return leader, applied
}

// awaitConvergence returns how long after from every replica had applied
// what the leader had applied once the nodes agreed on it again.
func (r *faultRun) awaitConvergence(from time.Time) time.Duration {
	_, target := r.agreedLeader()
	r.await("every replica applies what the leader had", func(resps []*pb.MembersResponse) bool {
		return !slices.ContainsFunc(resps, func(m *pb.MembersResponse) bool { return m.AppliedIndex < target })
	})
	return time.Since(from)
}

// settle waits until every node is ready and up in every replica's eyes
// and they agree on a leader, then lets the load run for a second.
func (r *faultRun) settle() {
	for _, p := range r.nodes {
		r.awaitReady(p)
	}
	r.agreedLeader()
	r.await("every replica shows every node up", func(resps []*pb.MembersResponse) bool {
		return !slices.ContainsFunc(resps, func(resp *pb.MembersResponse) bool {
			return slices.ContainsFunc(resp.Members, func(m *pb.Member) bool { return !m.Up })
		})
	})
	time.Sleep(time.Second)
}

// checkSettled asks every node's replica where each acknowledged key is,
// and each node it lists for the block.
func (r *faultRun) checkSettled() {
	t := r.t
	r.mu.Lock()
	acked := slices.Clone(r.acked)
	r.mu.Unlock()
	keys := make([]index.Key, len(acked))
	for i, k := range acked {
		keys[i] = k.key
	}
	listedBy := map[index.NodeID]map[index.Key][]index.NodeID{} // location: key: the nodes listing it there
	for i, p := range r.nodes {
		ctx, cancel := context.WithTimeout(context.Background(), faultDeadline)
		kls, err := p.api().Locate(ctx, keys)
		cancel()
		if err != nil {
			t.Fatalf("locate on node %d after settling: %v", i+1, err)
		}
		now := time.Now()
		for j, kl := range kls {
			op := history.Op{Kind: history.Read, Key: keys[j], Node: index.NodeID(i + 1), Holder: acked[j].holder,
				Start: now, End: now, Settled: true, Listed: len(kl.Locations) > 0, Result: history.Missing}
			if op.Listed {
				op.Result = history.Intact // what the fetches below find counts
			}
			r.h.Add(op)
			for _, l := range kl.Locations {
				loc := index.NodeID(l.NodeId)
				if listedBy[loc] == nil {
					listedBy[loc] = map[index.Key][]index.NodeID{}
				}
				if !slices.Contains(listedBy[loc][keys[j]], op.Node) {
					listedBy[loc][keys[j]] = append(listedBy[loc][keys[j]], op.Node)
				}
			}
		}
	}
	type listing struct {
		loc index.NodeID
		key index.Key
	}
	var unserved []listing
	for loc, byKey := range listedBy {
		var ks []index.Key
		for k := range byKey {
			ks = append(ks, k)
		}
		for from := 0; from < len(ks); from += 256 { // each call well within its deadline
			batch := ks[from:min(from+256, len(ks))]
			ctx, cancel := context.WithTimeout(context.Background(), faultDeadline)
			res, err := r.nodes[loc-1].api().Get(ctx, batch)
			cancel()
			if err != nil {
				t.Fatalf("get from node %d after settling: %v", loc, err)
			}
			now := time.Now()
			for j, k := range batch {
				if !res[j].Found {
					unserved = append(unserved, listing{loc, k})
				}
				for _, via := range byKey[k] {
					r.h.Add(history.Op{Kind: history.Fetch, Key: k, Node: loc, Via: via, Start: now, End: now, Settled: true,
						Result: verdict(k, res[j])})
				}
			}
		}
	}
	// What a second fetch of an unserved location finds tells a node that
	// missed a block it holds (found now) from a directory that lists a
	// block its node does not hold (still missing).
	for _, u := range unserved {
		ctx, cancel := context.WithTimeout(context.Background(), faultDeadline)
		res, err := r.nodes[u.loc-1].api().Get(ctx, []index.Key{u.key})
		cancel()
		again := "still not found"
		switch {
		case err != nil:
			again = err.Error()
		case res[0].Found:
			again = "found"
		}
		t.Logf("after settling, %v is listed at node %d, which did not serve it; fetched again: %s", u.key, u.loc, again)
	}
}

// report logs the run's figures and fails on what breaks a promise.
func (r *faultRun) report(rep history.Report) {
	t := r.t
	t.Logf("%d puts, %d acknowledged", rep.Puts, rep.Acked)
	for _, w := range rep.Windows {
		if w.Fault == nil {
			t.Logf("before the first fault: %v", w.Counts)
			continue
		}
		f := w.Fault
		elected := "kept its leader"
		if f.WasLeader {
			elected = fmt.Sprintf("new leader after %v", f.Elected.Round(time.Millisecond))
		}
		t.Logf("%s: %s, ready %v after it ended, directory converged %v after, puts on every other node acknowledged again %s: %v",
			f.Name, elected, f.Ready.Sub(f.End).Round(time.Millisecond), f.Converged.Round(time.Millisecond),
			ackedAgain(w.AckedAgain), w.Counts)
	}
	t.Logf("after settling: %v; %d phantom locations; %d acknowledged keys lost that were promised", rep.Settled, rep.Phantom, len(rep.Lost))

	for _, op := range rep.Corrupt {
		t.Errorf("corrupt: %v read through node %d (put on node %d) at %v", op.Key, op.Node, op.Holder, op.Start.Format(time.StampMilli))
	}
	if rep.Phantom > 0 || rep.Settled.Stale > 0 {
		t.Errorf("after settling, %d locations listed fetch nothing and %d keys are stale", rep.Phantom, rep.Settled.Stale)
	}
	for _, k := range rep.Lost {
		t.Errorf("lost: %v was acknowledged and its node was never killed, or it was in the SSD for %v before", k, faultDurable)
	}
	for _, ops := range []struct {
		name string
		ops  []history.Op
	}{
		{"stale reads on ready nodes", rep.Stale},
		{"calls failed though their node was ready before the deadline", rep.FailedInTime},
	} {
		if len(ops.ops) > 0 {
			op := ops.ops[0]
			t.Errorf("%s: %d, first: %v through node %d, put on node %d, %v–%v %s", ops.name, len(ops.ops),
				op.Key, op.Node, op.Holder, op.Start.Format(time.StampMilli), op.End.Format(time.StampMilli), op.Err)
		}
	}
	if len(rep.HealthyDown) > 0 {
		t.Errorf("healthy nodes marked down: %d, first: %s", len(rep.HealthyDown), rep.HealthyDown[0])
	}
	for _, w := range rep.Windows {
		if w.Fault != nil && (w.AckedAgain < 0 || w.AckedAgain > faultAckedAgain) {
			t.Errorf("%s: puts on every other node acknowledged again %s (bound %v)", w.Fault.Name, ackedAgain(w.AckedAgain), faultAckedAgain)
		}
	}
}

// ackedAgain says when puts were acknowledged again after a fault began.
func ackedAgain(d time.Duration) string {
	if d < 0 {
		return "only after the next fault began"
	}
	return "after " + d.Round(time.Millisecond).String()
}
