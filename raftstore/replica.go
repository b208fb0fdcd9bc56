package raftstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/raft"

	"github.com/kvstrata/kvstrata/index"
)

// ErrNotLeader is returned by a Replica's leader-only calls on a follower.
var ErrNotLeader = errors.New("raftstore: not the leader")

// Peer is a voter of the initial cluster.
type Peer struct {
	ID       index.NodeID
	RaftAddr string
}

// ReplicaConfig configures a Replica. OpenReplica copies it, fills zero
// fields with their defaults (EnsureDefaults), then checks it (Validate).
type ReplicaConfig struct {
	ID       index.NodeID // > 0; required
	Dir      string       // the log store and snapshots; created if missing; required
	RaftAddr string       // where the raft transport listens; required
	// Advertise is the host:port peers dial, where it is not RaftAddr (a
	// wildcard listen address, NAT). It must resolve, at start, to an
	// address that is not a wildcard. Default RaftAddr.
	Advertise string
	// Bootstrap, when the replica has no state yet, starts a cluster with
	// these voters (this node among them). A replica with state ignores
	// it; one without state and without Bootstrap waits to be added.
	Bootstrap []Peer
	// HeartbeatTimeout and ElectionTimeout are raft's; the defaults, 500ms
	// and 1s, suit a LAN and elect a new leader within a few seconds.
	HeartbeatTimeout, ElectionTimeout time.Duration
	// SnapshotThreshold is how many entries raft lets pile up before it
	// snapshots. The default is 8192.
	SnapshotThreshold uint64
	// SkipEntries lists log indices of entries of unknown types that the
	// FSM applies as no-ops instead of stopping the node (see
	// FSM.SkipEntries). Every node of the cluster must be given the same
	// list. Empty by default.
	SkipEntries []uint64
	// Guard, when set, secures every connection of the raft transport
	// (TLS, proof of membership); nil leaves them plain TCP.
	Guard ConnGuard
	// Logger receives the replica's lines and raft's (see raftLogger).
	// The default is slog.Default().
	Logger *slog.Logger
}

// Replica is one node's raft: the FSM, its Pebble log, file snapshots and a
// TCP transport.
type Replica struct {
	Raft      *raft.Raft
	FSM       *FSM
	id        index.NodeID
	store     *LogStore
	transport *raft.NetworkTransport
	election  time.Duration

	// observer feeds watchLeader raft's leader observations; changed is
	// closed, and replaced, on every change of leader.
	observer *raft.Observer
	obs      chan raft.Observation
	quit     chan struct{}
	done     chan struct{}
	mu       sync.Mutex
	changed  chan struct{}
}

// Defaults of ReplicaConfig.
const (
	DefaultHeartbeatTimeout  = 500 * time.Millisecond
	DefaultElectionTimeout   = time.Second
	DefaultSnapshotThreshold = 8192
)

// EnsureDefaults sets c's zero fields to their defaults.
func (c *ReplicaConfig) EnsureDefaults() {
	if c.HeartbeatTimeout == 0 {
		c.HeartbeatTimeout = DefaultHeartbeatTimeout
	}
	if c.ElectionTimeout == 0 {
		c.ElectionTimeout = DefaultElectionTimeout
	}
	if c.SnapshotThreshold == 0 {
		c.SnapshotThreshold = DefaultSnapshotThreshold
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// Validate reports every problem with c in one error, naming each field.
// Call it after EnsureDefaults.
func (c *ReplicaConfig) Validate() error {
	var errs []error
	if c.ID == 0 {
		errs = append(errs, errors.New("ID is 0"))
	}
	if c.Dir == "" {
		errs = append(errs, errors.New("Dir is empty"))
	}
	if c.RaftAddr == "" {
		errs = append(errs, errors.New("RaftAddr is empty"))
	}
	if c.HeartbeatTimeout <= 0 || c.ElectionTimeout <= 0 {
		errs = append(errs, fmt.Errorf("HeartbeatTimeout %v and ElectionTimeout %v must be positive", c.HeartbeatTimeout, c.ElectionTimeout))
	}
	return errors.Join(errs...)
}

// OpenReplica starts the node's raft, bootstrapping a new cluster when
// asked and the replica has no state.
func OpenReplica(cfg ReplicaConfig) (*Replica, error) {
	cfg.EnsureDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("raftstore: replica config: %w", err)
	}
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("raftstore: %w", err)
	}
	rc := raft.DefaultConfig()
	rc.LocalID = serverID(cfg.ID)
	rc.HeartbeatTimeout, rc.LeaderLeaseTimeout = cfg.HeartbeatTimeout, cfg.HeartbeatTimeout
	rc.ElectionTimeout = cfg.ElectionTimeout
	rc.SnapshotThreshold = cfg.SnapshotThreshold
	rc.Logger = newRaftLogger(cfg.Logger)

	store, err := Open(filepath.Join(cfg.Dir, "log"), &Options{Logger: cfg.Logger})
	if err != nil {
		return nil, err
	}
	logs, err := raft.NewLogCache(512, store)
	if err != nil {
		store.Close()
		return nil, err
	}
	snaps, err := raft.NewFileSnapshotStoreWithLogger(filepath.Join(cfg.Dir, "snapshots"), 2, rc.Logger)
	if err != nil {
		store.Close()
		return nil, fmt.Errorf("raftstore: snapshots: %w", err)
	}
	// Raft tells peers the advertised address as an IP address (it leads
	// to the leader's); the cluster's configuration keeps it as given.
	advertise := cmp.Or(cfg.Advertise, cfg.RaftAddr)
	addr, err := net.ResolveTCPAddr("tcp", advertise)
	if err != nil {
		store.Close()
		return nil, fmt.Errorf("raftstore: raft address %s: %w", advertise, err)
	}
	if addr.IP == nil || addr.IP.IsUnspecified() {
		store.Close()
		return nil, fmt.Errorf("raftstore: raft address %s names every address of the host, which peers cannot dial: give an Advertise address", advertise)
	}
	transport, err := newTransport(cfg, addr, rc)
	if err != nil {
		store.Close()
		return nil, err
	}
	fsm := NewFSM()
	fsm.log = cfg.Logger
	fsm.SkipEntries(cfg.SkipEntries...)
	hasState, err := raft.HasExistingState(logs, store, snaps)
	if err != nil {
		transport.Close()
		store.Close()
		return nil, fmt.Errorf("raftstore: %w", err)
	}
	if !hasState && len(cfg.Bootstrap) > 0 {
		var servers []raft.Server
		for _, p := range cfg.Bootstrap {
			servers = append(servers, raft.Server{ID: serverID(p.ID), Address: raft.ServerAddress(p.RaftAddr)})
		}
		if err := raft.BootstrapCluster(rc, logs, store, snaps, transport, raft.Configuration{Servers: servers}); err != nil {
			transport.Close()
			store.Close()
			return nil, fmt.Errorf("raftstore: bootstrap: %w", err)
		}
	}
	r, err := raft.NewRaft(rc, fsm, logs, store, snaps, transport)
	if err != nil {
		transport.Close()
		store.Close()
		return nil, fmt.Errorf("raftstore: %w", err)
	}
	rep := &Replica{Raft: r, FSM: fsm, id: cfg.ID, store: store, transport: transport, election: rc.ElectionTimeout,
		obs: make(chan raft.Observation, 64), quit: make(chan struct{}), done: make(chan struct{}), changed: make(chan struct{})}
	rep.observer = raft.NewObserver(rep.obs, false, func(o *raft.Observation) bool {
		_, ok := o.Data.(raft.LeaderObservation)
		return ok
	})
	r.RegisterObserver(rep.observer)
	go rep.watchLeader()
	return rep, nil
}

// newTransport opens raft's TCP transport on cfg.RaftAddr, guarded by
// cfg.Guard when set.
func newTransport(cfg ReplicaConfig, advertise *net.TCPAddr, rc *raft.Config) (*raft.NetworkTransport, error) {
	if cfg.Guard == nil {
		t, err := raft.NewTCPTransportWithLogger(cfg.RaftAddr, advertise, 8, 10*time.Second, rc.Logger)
		if err != nil {
			return nil, fmt.Errorf("raftstore: listen %s: %w", cfg.RaftAddr, err)
		}
		return t, nil
	}
	ln, err := net.Listen("tcp", cfg.RaftAddr)
	if err != nil {
		return nil, fmt.Errorf("raftstore: listen %s: %w", cfg.RaftAddr, err)
	}
	stream := &guardedStream{Listener: ln, advertise: advertise, guard: cfg.Guard}
	return raft.NewNetworkTransportWithLogger(stream, 8, 10*time.Second, rc.Logger), nil
}

// watchLeader turns raft's leader observations into LeaderChanged's
// broadcasts.
func (r *Replica) watchLeader() {
	defer close(r.done)
	for {
		select {
		case <-r.obs:
		case <-r.quit:
			return
		}
		r.mu.Lock()
		close(r.changed)
		r.changed = make(chan struct{})
		r.mu.Unlock()
	}
}

// LeaderChanged returns a channel that is closed when the leader this
// replica knows changes next (to another node, or to none), as raft
// observes it. Take a new channel after each change.
func (r *Replica) LeaderChanged() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.changed
}

// ElectionTimeout is raft's election timeout: a leader that falls silent
// is replaced within a few of them.
func (r *Replica) ElectionTimeout() time.Duration { return r.election }

// CaughtUp reports whether the FSM has applied every committed entry up
// to index target: its own applied index is there, or every entry after it
// up to target is one raft does not hand the FSM (a new leader's no-op).
func (r *Replica) CaughtUp(target uint64) bool {
	applied := r.FSM.AppliedIndex()
	if applied >= target {
		return true
	}
	if r.Raft.AppliedIndex() < target {
		return false
	}
	for i := target; i > applied; i-- {
		var l raft.Log
		if err := r.store.GetLog(i, &l); err != nil || l.Type == raft.LogCommand || l.Type == raft.LogConfiguration {
			return false
		}
	}
	return true
}

// Term returns the current raft term.
func (r *Replica) Term() uint64 { return r.Raft.CurrentTerm() }

func serverID(id index.NodeID) raft.ServerID {
	return raft.ServerID(strconv.FormatUint(uint64(id), 10))
}

// ParseServerID is the inverse of the raft server ids the replica uses.
func ParseServerID(id raft.ServerID) (index.NodeID, bool) {
	n, err := strconv.ParseUint(string(id), 10, 32)
	return index.NodeID(n), err == nil && n > 0
}

// IsLeader reports whether this replica leads.
func (r *Replica) IsLeader() bool { return r.Raft.State() == raft.Leader }

// Leader returns the leader's node id, or 0 when none is known.
func (r *Replica) Leader() index.NodeID {
	_, id := r.Raft.LeaderWithID()
	n, _ := ParseServerID(id)
	return n
}

// Propose commits data (an encoded entry) through raft: the leader's
// ProposeFunc.
func (r *Replica) Propose(ctx context.Context, data []byte) error {
	if !r.IsLeader() {
		return ErrNotLeader
	}
	return RaftPropose(r.Raft)(ctx, data)
}

// AddVoter adds a node to the cluster's voters, or makes a non-voter one
// (leader only). A voter counts in every quorum from then on: add one that
// has caught up (see AddNonvoter), or one that cannot be reached may cost
// the cluster its quorum.
func (r *Replica) AddVoter(id index.NodeID, raftAddr string, timeout time.Duration) error {
	if err := r.Raft.AddVoter(serverID(id), raft.ServerAddress(raftAddr), 0, timeout).Error(); err != nil {
		if errors.Is(err, raft.ErrNotLeader) {
			return ErrNotLeader
		}
		return fmt.Errorf("raftstore: add voter %d: %w", id, err)
	}
	return nil
}

// AddNonvoter adds a node that receives the log but does not vote (leader
// only); a node that is a voter already stays one. Its quorum is that of
// the voters before, whether or not the node can be reached.
func (r *Replica) AddNonvoter(id index.NodeID, raftAddr string, timeout time.Duration) error {
	if err := r.Raft.AddNonvoter(serverID(id), raft.ServerAddress(raftAddr), 0, timeout).Error(); err != nil {
		if errors.Is(err, raft.ErrNotLeader) {
			return ErrNotLeader
		}
		return fmt.Errorf("raftstore: add non-voter %d: %w", id, err)
	}
	return nil
}

// RemoveServer removes a node from the cluster (leader only).
func (r *Replica) RemoveServer(id index.NodeID, timeout time.Duration) error {
	if err := r.Raft.RemoveServer(serverID(id), 0, timeout).Error(); err != nil {
		if errors.Is(err, raft.ErrNotLeader) {
			return ErrNotLeader
		}
		return fmt.Errorf("raftstore: remove %d: %w", id, err)
	}
	return nil
}

// Server is a node of the raft configuration.
type Server struct {
	Peer
	Voter bool // else a non-voter, which receives the log but does not vote
}

// Servers returns the nodes of the current configuration, voters and
// non-voters.
func (r *Replica) Servers() ([]Server, error) {
	f := r.Raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return nil, err
	}
	var out []Server
	for _, s := range f.Configuration().Servers {
		if id, ok := ParseServerID(s.ID); ok {
			out = append(out, Server{Peer: Peer{ID: id, RaftAddr: string(s.Address)}, Voter: s.Suffrage == raft.Voter})
		}
	}
	return out, nil
}

// Voters returns the ids and raft addresses of the current configuration's
// voters.
func (r *Replica) Voters() ([]Peer, error) {
	servers, err := r.Servers()
	var out []Peer
	for _, s := range servers {
		if s.Voter {
			out = append(out, s.Peer)
		}
	}
	return out, err
}

// Close shuts raft down and closes the log store.
func (r *Replica) Close() error {
	err := r.Raft.Shutdown().Error()
	r.Raft.DeregisterObserver(r.observer)
	close(r.quit)
	<-r.done
	return errors.Join(err, r.transport.Close(), r.store.Close())
}
