// Package membership makes a cache node a member of a kvstrata cluster. It
// runs the node's Raft replica of the global block directory
// (raftstore), bootstraps or joins, publishes the node's tier changes to
// the directory in batches, forwards what only the leader may do to the
// leader over gRPC, heartbeats, and — on the leader — marks nodes that
// fall silent down and back up. It also serves the kvstrata.v1.Cluster
// service.
//
// Lookups are answered from the local replica: a follower's directory may
// trail the leader's by the events in flight (a few milliseconds on a
// LAN). That staleness is safe: a block the directory still lists costs a
// fetch that finds nothing and falls back to the next location, and a
// block not listed yet is a miss; checksums make sure no wrong bytes are
// ever used. A replica that knows no leader, has not heard from it for an
// election timeout, or is catching up (after a restart) may trail by much
// more: Freshness says so, lookup answers carry it, and the node is not
// ready (Ready) meanwhile.
//
// An Agent is safe for concurrent use.
package membership

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	pb "github.com/kvstrata/kvstrata/api/v1"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/raftstore"
)

// Config configures an Agent. Open copies it, fills zero fields with
// their defaults (EnsureDefaults), then checks it (Validate).
type Config struct {
	// ID is the node's id in the cluster, > 0. Required.
	ID index.NodeID
	// Name is the node's name in the member list.
	Name string
	// Dir holds raft's log and snapshots. Required.
	Dir string
	// RaftAddr is where the raft transport listens. Required.
	RaftAddr string
	// RaftAdvertise is the raft address peers dial and the member record
	// names, where it is not RaftAddr (a wildcard listen address, NAT).
	// Default RaftAddr.
	RaftAdvertise string
	// Bootstrap starts a new cluster of these voters when the replica has
	// no state. With neither Bootstrap nor Join, a node without state
	// bootstraps a cluster of itself.
	Bootstrap []raftstore.Peer
	// Join is the gRPC address of any member; a node without state asks
	// it to add this node.
	Join string
	// HeartbeatInterval is how often a node tells the leader it is alive.
	// The default is 500ms.
	HeartbeatInterval time.Duration
	// LivenessTimeout is how long a node may be silent before the leader
	// marks it down (its locations stop counting in lookups; object-store
	// locations stay). The default is 5s.
	LivenessTimeout time.Duration
	// SkipEntries lists raft log indices of entries of unknown types that
	// the replica applies as no-ops instead of stopping (see
	// raftstore.FSM.SkipEntries); every node must be given the same list.
	SkipEntries []uint64
	// ReconcileInterval is how often, on average, the node compares what
	// the directory lists at it with what it published, and corrects the
	// differences (see reconcile.go); a pass also follows every drop of
	// events. The default is 1m; negative turns reconciling off.
	ReconcileInterval time.Duration
	// EventQueueSize is the number of the node's changes waiting for the
	// directory beyond which new ones are dropped (and later reconciled).
	// The default is raftstore.DefaultQueueSize (262144).
	EventQueueSize int
	// RaftGuard, when set, secures the raft transport's connections (TLS,
	// proof of membership); nil leaves them plain.
	RaftGuard raftstore.ConnGuard
	// DialCredentials secure the node's gRPC dials of other members
	// (joining, forwarding to the leader). Default: plaintext.
	DialCredentials credentials.TransportCredentials
	// Logger receives the cluster's lines and raft's. The default is
	// slog.Default().
	Logger *slog.Logger
	// DialOptions are added to every gRPC dial of another member: the
	// cluster's credential (api/gate.Bearer of the cluster token).
	DialOptions []grpc.DialOption
}

// Defaults of Config.
const (
	DefaultHeartbeatInterval = 500 * time.Millisecond
	DefaultLivenessTimeout   = 5 * time.Second
	DefaultReconcileInterval = time.Minute
)

// EnsureDefaults sets c's zero fields to their defaults.
func (c *Config) EnsureDefaults() {
	if c.HeartbeatInterval == 0 {
		c.HeartbeatInterval = DefaultHeartbeatInterval
	}
	if c.LivenessTimeout == 0 {
		c.LivenessTimeout = DefaultLivenessTimeout
	}
	if c.ReconcileInterval == 0 {
		c.ReconcileInterval = DefaultReconcileInterval
	}
	if c.EventQueueSize == 0 {
		c.EventQueueSize = raftstore.DefaultQueueSize
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.DialCredentials == nil {
		c.DialCredentials = insecure.NewCredentials()
	}
	if c.RaftAdvertise == "" {
		c.RaftAdvertise = c.RaftAddr
	}
}

// Validate reports every problem with c in one error, naming each field.
// Call it after EnsureDefaults.
func (c *Config) Validate() error {
	var probs []string
	if c.ID == 0 {
		probs = append(probs, "ID is 0")
	}
	if c.Dir == "" {
		probs = append(probs, "Dir is empty")
	}
	if c.RaftAddr == "" {
		probs = append(probs, "RaftAddr is empty")
	}
	if c.HeartbeatInterval <= 0 {
		probs = append(probs, fmt.Sprintf("HeartbeatInterval %v is not positive", c.HeartbeatInterval))
	}
	if c.LivenessTimeout <= c.HeartbeatInterval {
		probs = append(probs, fmt.Sprintf("LivenessTimeout %v is not over HeartbeatInterval %v", c.LivenessTimeout, c.HeartbeatInterval))
	}
	if c.EventQueueSize < raftstore.DefaultMaxEvents {
		probs = append(probs, fmt.Sprintf("EventQueueSize %d is below a batch, %d", c.EventQueueSize, raftstore.DefaultMaxEvents))
	}
	if len(probs) == 0 {
		return nil
	}
	return fmt.Errorf("cluster: config: %s", strings.Join(probs, "; "))
}

// Agent is a node's membership of the cluster.
type Agent struct {
	cfg     Config
	rep     *raftstore.Replica
	batcher *raftstore.Batcher
	log     *slog.Logger

	mu    sync.Mutex
	self  raftstore.Member             // set by Start
	usage func() []raftstore.TierUsage // set by Start
	conns map[string]*grpc.ClientConn
	lead  leadership                 // the monitor's observations while leading
	caps  map[index.NodeID]time.Time // leader: last capacities proposed
	fresh freshTracker               // what Freshness compares the replica with
	// progress is, on the leader, the applied index each node last
	// reported in a heartbeat: it decides when a non-voter is promoted.
	progress map[index.NodeID]progress

	// started is closed by Start; registered is set once this node's
	// member record is committed as Start gave it.
	started    chan struct{}
	registered atomic.Bool

	// own mirrors the node's published changes for the reconcile pass
	// (nil while reconciling is off); reconciled counts the passes.
	own           *ownBlocks
	reconcileKick chan struct{}
	reconciled    ReconcileStats
	queueSize     int
	// unchanged counts the stores Publish left out: they would have
	// changed nothing in the directory.
	unchanged atomic.Uint64

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// Open starts the node's replica and its event batcher. Call Start once the
// node's addresses are known.
func Open(cfg Config) (*Agent, error) {
	cfg.EnsureDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	boot := cfg.Bootstrap
	if len(boot) == 0 && cfg.Join == "" {
		boot = []raftstore.Peer{{ID: cfg.ID, RaftAddr: cfg.RaftAdvertise}}
	}
	rep, err := raftstore.OpenReplica(raftstore.ReplicaConfig{ID: cfg.ID, Dir: cfg.Dir, RaftAddr: cfg.RaftAddr,
		Advertise: cfg.RaftAdvertise, Bootstrap: boot, SkipEntries: cfg.SkipEntries, Guard: cfg.RaftGuard, Logger: cfg.Logger})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &Agent{cfg: cfg, rep: rep, log: cfg.Logger, conns: map[string]*grpc.ClientConn{},
		caps: map[index.NodeID]time.Time{}, progress: map[index.NodeID]progress{}, started: make(chan struct{}),
		reconcileKick: make(chan struct{}, 1), queueSize: cfg.EventQueueSize, ctx: ctx, cancel: cancel}
	if cfg.ReconcileInterval > 0 {
		c.own = newOwnBlocks(cfg.ID)
	}
	c.batcher, err = raftstore.NewBatcher(raftstore.BatcherConfig{Propose: c.proposeEvents, Logger: cfg.Logger,
		ProposeTimeout: proposeTimeouts * c.forwardTimeout(), QueueSize: cfg.EventQueueSize})
	if err != nil {
		rep.Close()
		return nil, err
	}
	c.wg.Add(2)
	go c.followLeader()
	go c.every(freshTick, c.sampleFreshness)
	return c, nil
}

// forwardTimeout bounds one forward to the leader: a few election
// timeouts, the time a cluster takes to replace a leader that stopped
// answering. A forward is also cut short as soon as the leader changes.
func (c *Agent) forwardTimeout() time.Duration { return forwardElections * c.rep.ElectionTimeout() }

const (
	// forwardElections is forwardTimeout in election timeouts.
	forwardElections = 3
	// proposeTimeouts bounds a batch's proposal, forwards to successive
	// leaders included, in forwardTimeouts.
	proposeTimeouts = 2
)

// followLeader lets the batcher retry at once when the leader changes,
// rather than after its backoff.
func (c *Agent) followLeader() {
	defer c.wg.Done()
	for {
		select {
		case <-c.rep.LeaderChanged():
			c.batcher.RetryNow()
		case <-c.ctx.Done():
			return
		}
	}
}

// Publish queues one change of the node's tiers for the directory; it never
// blocks (a full queue drops and counts the change, and the reconcile pass
// that follows restores what the drop lost). The node's changes must all
// come through Publish, in the order they happen.
//
// A change that would leave the directory as it is goes no further: a
// block stored again at one of the node's own locations with the metadata
// the node last published for it (a key overwritten by a value of the same
// size), which the replica already lists there with that metadata. The
// replica lists only what is committed; the node's changes in flight end
// with the block stored there with that metadata (the mirror says so, and
// the batcher applies the node's last change last); only the node
// publishes its own locations: so the directory ends as the change would
// leave it. Another node's change of the block's metadata that the replica
// has not applied yet is ordered with this one by raft alone, either way.
// The mirror this needs is kept while reconciling is on; without it every
// change is queued.
func (c *Agent) Publish(ch index.Change) {
	if c.own == nil {
		c.batcher.Add(ch)
		return
	}
	c.own.mu.Lock()
	if c.own.repeatsLocked(ch) && c.rep.FSM.Directory().Lists(ch.Key, ch.Meta, ch.Loc) {
		c.own.mu.Unlock()
		c.unchanged.Add(1)
		return
	}
	c.own.applyLocked(ch)
	c.batcher.Add(ch)
	c.own.mu.Unlock()
}

// FSM is the node's replica of the directory and the cluster state.
func (c *Agent) FSM() *raftstore.FSM { return c.rep.FSM }

// Leader returns the leader's node id, or 0 while none is known.
func (c *Agent) Leader() index.NodeID { return c.rep.Leader() }

// Lookup answers a longest-prefix lookup across the cluster from the local
// replica, ignoring nodes marked down.
func (c *Agent) Lookup(ns index.NamespaceID, chain []index.Hash) index.Prefix {
	return c.rep.FSM.Lookup(ns, chain)
}

// Sync waits until every change published before the call is committed
// and applied to this node's replica, so that its lookups list them.
func (c *Agent) Sync(ctx context.Context) error {
	if err := c.batcher.Flush(ctx); err != nil {
		return err
	}
	idx := c.batcher.CommittedIndex()
	// A follower in touch with the leader applies its commits a moment
	// later; one that has not within forwardTimeout is cut off or far
	// behind, and says so rather than hold the caller to its deadline.
	// The FSM's own index, not raft's: raft counts an entry applied once
	// it has handed it to the FSM, a moment before the FSM has applied it.
	giveUp := time.Now().Add(c.forwardTimeout())
	for c.rep.FSM.AppliedIndex() < idx { // idx is a command: the FSM applies it
		if time.Now().After(giveUp) {
			return fmt.Errorf("cluster: sync: committed at index %d, but this replica applied only %d in %v: %w",
				idx, c.rep.FSM.AppliedIndex(), c.forwardTimeout(), ErrCatchingUp)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cluster: sync: waiting for the replica to apply index %d: %w", idx, ctx.Err())
		case <-time.After(time.Millisecond):
		}
	}
	return nil
}

// BatcherStats reports the publishing of the node's changes.
func (c *Agent) BatcherStats() raftstore.BatcherStats { return c.batcher.Stats() }

// Unchanged counts the stores Publish left out because the directory
// already listed them as they were: a block stored again where the node
// holds it, with the metadata last published.
func (c *Agent) Unchanged() uint64 { return c.unchanged.Load() }

// Start records the node's addresses: it joins through Config.Join when
// the replica has no cluster yet, keeps its member record current, and
// heartbeats, telling the leader the node's tier usage as usage reports
// it (nil: none).
func (c *Agent) Start(self raftstore.Member, usage func() []raftstore.TierUsage) error {
	self.ID, self.RaftAddr = c.cfg.ID, c.cfg.RaftAdvertise
	if self.Name == "" {
		self.Name = c.cfg.Name
	}
	c.mu.Lock()
	c.self, c.usage = self, usage
	c.mu.Unlock()
	close(c.started)
	if c.cfg.Join != "" {
		if err := c.join(); err != nil {
			return err
		}
	}
	c.wg.Add(2)
	go c.every(c.cfg.HeartbeatInterval, c.heartbeat)
	go c.every(c.cfg.HeartbeatInterval, c.monitorOnce)
	if c.own != nil {
		c.wg.Add(1)
		go c.reconcileLoop()
	}
	return nil
}

// join asks the cluster at Config.Join to add this node, retrying while no
// leader answers, unless the replica already belongs to a cluster.
func (c *Agent) join() error {
	if voters, err := c.rep.Voters(); err == nil && len(voters) > 0 {
		return nil // a restart: the replica has its cluster
	}
	conn, err := c.conn(c.cfg.Join)
	if err != nil {
		return err
	}
	req := &pb.JoinRequest{Member: memberToPB(c.self)}
	var last error
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(250 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(c.ctx, 5*time.Second)
		_, last = pb.NewClusterClient(conn).Join(ctx, req)
		cancel()
		if last == nil {
			c.log.Info("joined the cluster", "through", c.cfg.Join)
			return nil
		}
	}
	return fmt.Errorf("cluster: join through %s: %w", c.cfg.Join, last)
}

// proposeEvents is the batcher's ProposeFunc. Before the node's first
// batch of events it commits the node's member record (waiting for Start,
// which knows the node's addresses): the directory then never lists blocks
// of a node that clients cannot dial and the monitor cannot mark down,
// which it only does to members.
func (c *Agent) proposeEvents(ctx context.Context, data []byte) error {
	if !c.registered.Load() {
		select {
		case <-c.started:
		case <-ctx.Done():
			return fmt.Errorf("cluster: waiting for the node to start: %w", ctx.Err())
		}
		c.mu.Lock()
		self := c.self
		c.mu.Unlock()
		if err := c.propose(ctx, raftstore.EncodeMemberUpsert(self)); err != nil {
			return fmt.Errorf("cluster: registering node %d: %w", self.ID, err)
		}
		c.registered.Store(true)
	}
	return c.proposeIn(ctx, data, true)
}

// propose commits an entry: through raft on the leader, else forwarded to
// the leader, one proposal at a time so that entries keep their order.
// It follows the leader: a forward in flight when raft observes a new
// leader (or loses the old one) is abandoned and sent to the new one, and
// while no leader is known it waits for one, up to ctx's deadline. An
// entry may thus be committed twice; every entry the cluster proposes
// this way may (events, member records, capacities).
func (c *Agent) propose(ctx context.Context, data []byte) error { return c.proposeIn(ctx, data, false) }

// proposeIn is propose; pipelined says that the caller (the batcher) may
// have proposed later entries behind this one. On the leader the batcher
// hands several batches to raft at once, and when the leader is deposed
// they all fail together: were each then sent to the next leader on its
// own, they would race there, and a later batch could be committed before
// an earlier one, leaving, say, a block removed in the later batch listed
// by the earlier one for good. So a pipelined entry that fails on the
// leader returns the failure to the batcher, which waits for the others
// and proposes again from the first failed batch on, in order.
func (c *Agent) proposeIn(ctx context.Context, data []byte, pipelined bool) error {
	for {
		changed := c.rep.LeaderChanged()
		var err error
		if c.rep.IsLeader() {
			if err = c.rep.Propose(ctx, data); err != nil && pipelined {
				return err
			}
		} else {
			err = c.forward(ctx, changed, data)
		}
		if err == nil {
			return nil
		}
		if errors.Is(err, ErrNoLeader) {
			select { // wait for one
			case <-changed:
				continue
			case <-ctx.Done():
				return fmt.Errorf("%w: %w", err, ctx.Err())
			}
		}
		select {
		case <-changed:
			if ctx.Err() == nil {
				continue // ask the new leader at once
			}
		default:
		}
		return err
	}
}

// forward sends a proposal to the leader, for up to forwardTimeout, and
// abandons it when changed is closed.
func (c *Agent) forward(ctx context.Context, changed <-chan struct{}, data []byte) error {
	conn, err := c.leaderConn()
	if err != nil {
		return err
	}
	fctx, cancel := context.WithTimeout(ctx, c.forwardTimeout())
	defer cancel()
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-changed:
			cancel()
		case <-done:
		}
	}()
	fctx = metadata.AppendToOutgoingContext(fctx, proposerKey, strconv.FormatUint(uint64(c.cfg.ID), 10))
	resp, err := pb.NewClusterClient(conn).Propose(fctx, &pb.ProposeRequest{Entry: data})
	if err != nil {
		return fmt.Errorf("cluster: forwarding to the leader: %w", err)
	}
	raftstore.Committed(ctx, resp.Index)
	return nil
}

// proposerKey is the gRPC metadata key under which a forwarded proposal
// names the node that made it. The leader takes proposals from members of
// the raft configuration only (voters and the non-voters that are
// catching up), so that a node removed while it runs cannot put its
// blocks back into the directory (Remove dropped them, and a node that is
// no member is never marked down); and only the entries a member makes
// about itself (raftstore.CheckForwarded).
const proposerKey = "kvstrata-proposer"

// ErrNoLeader is returned while no leader (or its address) is known.
var ErrNoLeader = errors.New("cluster: no leader known")

// leaderConn returns a connection to the leader's gRPC endpoint.
func (c *Agent) leaderConn() (*grpc.ClientConn, error) {
	id := c.rep.Leader()
	if id == 0 {
		return nil, ErrNoLeader
	}
	m, ok := c.rep.FSM.Member(id)
	if !ok || m.GRPCAddr == "" {
		return nil, fmt.Errorf("%w (node %d has not registered its address)", ErrNoLeader, id)
	}
	return c.conn(m.GRPCAddr)
}

// conn returns a cached client connection to addr.
func (c *Agent) conn(addr string) (*grpc.ClientConn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cc := c.conns[addr]; cc != nil {
		return cc, nil
	}
	opts := append([]grpc.DialOption{grpc.WithTransportCredentials(c.cfg.DialCredentials)}, c.cfg.DialOptions...)
	cc, err := grpc.NewClient(addr, opts...)
	if err != nil {
		return nil, fmt.Errorf("cluster: dial %s: %w", addr, err)
	}
	c.conns[addr] = cc
	return cc, nil
}

// Close publishes what is queued (for up to a second), then leaves raft.
func (c *Agent) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	_ = c.batcher.Flush(ctx)
	cancel()
	c.cancel()
	c.wg.Wait()
	err := errors.Join(c.batcher.Close(), c.rep.Close())
	c.mu.Lock()
	for _, cc := range c.conns {
		cc.Close()
	}
	c.mu.Unlock()
	return err
}

// every calls fn every interval until the agent closes; the caller has
// added it to c.wg.
func (c *Agent) every(interval time.Duration, fn func()) {
	defer c.wg.Done()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-c.ctx.Done():
			return
		case <-t.C:
			fn()
		}
	}
}
