package daemon

import (
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/kvstrata/kvstrata/api/membership"
	"github.com/kvstrata/kvstrata/api/resp"
	"github.com/kvstrata/kvstrata/api/resp/respcluster"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/raftstore"
)

// keyspace is what the RESP server serves: the node's own keys (local),
// with the other nodes' behind them, found through the directory and read
// through their Keyspace service. A request to one other node waits at
// most a fifth of the command timeout (2 s by default) for bytes, so that
// a hung holder leaves time to ask the next. Close the peers' connections
// once the RESP server has stopped.
func keyspace(local resp.Store, cl *membership.Agent, self index.NodeID, commandTimeout time.Duration, log *slog.Logger,
	creds credentials.TransportCredentials, dialOpts []grpc.DialOption) (resp.Store, *peerConns, error) {
	peerTimeout := respcluster.DefaultPeerTimeout
	if commandTimeout > 0 {
		peerTimeout = min(peerTimeout, max(commandTimeout/5, 10*time.Millisecond))
	}
	conns := &peerConns{fsm: cl.FSM(), creds: creds, conns: map[string]*grpc.ClientConn{}, dialOpts: dialOpts}
	st, err := respcluster.New(local, holders{fsm: cl.FSM(), self: self}, respcluster.NewGRPCPeers(conns.conn),
		&respcluster.Config{PeerTimeout: peerTimeout, Logger: log})
	return st, conns, err
}

// peerConns are the connections to the other nodes' gRPC endpoints that
// the keyspace reads values through, by address. Their flow-control
// windows are wider than gRPC's 64 KiB default, so that a value of
// megabytes streams without waiting for window updates.
type peerConns struct {
	fsm   *raftstore.FSM
	creds credentials.TransportCredentials // TLS towards the peers, or none
	mu    sync.Mutex
	conns map[string]*grpc.ClientConn
	// dialOpts are added to each dial: the cluster's credential.
	dialOpts []grpc.DialOption
}

func (p *peerConns) conn(id index.NodeID) (grpc.ClientConnInterface, error) {
	m, ok := p.fsm.Member(id)
	if !ok || m.GRPCAddr == "" {
		return nil, fmt.Errorf("node %d has no member record with a gRPC address", id)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if cc := p.conns[m.GRPCAddr]; cc != nil {
		return cc, nil
	}
	cc, err := grpc.NewClient(m.GRPCAddr, append([]grpc.DialOption{grpc.WithTransportCredentials(p.creds),
		grpc.WithInitialWindowSize(4 << 20), grpc.WithInitialConnWindowSize(16 << 20)}, p.dialOpts...)...)
	if err != nil {
		return nil, fmt.Errorf("dial node %d at %s: %w", id, m.GRPCAddr, err)
	}
	p.conns[m.GRPCAddr] = cc
	return cc, nil
}

// close closes every connection.
func (p *peerConns) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for addr, cc := range p.conns {
		cc.Close()
		delete(p.conns, addr)
	}
}

// holders reads the node's replica of the directory for respcluster.
type holders struct {
	fsm  *raftstore.FSM
	self index.NodeID
}

// Holders lists the other nodes that hold k, once each, those not marked
// down first, in the directory's order otherwise.
func (h holders) Holders(k index.Key) []respcluster.Holder {
	e, ok := h.fsm.Directory().Get(k)
	if !ok {
		return nil
	}
	var out []respcluster.Holder
	for _, l := range e.Locations {
		if l.Node == index.AnyNode || l.Node == h.self ||
			slices.ContainsFunc(out, func(o respcluster.Holder) bool { return o.Node == l.Node }) {
			continue
		}
		out = append(out, respcluster.Holder{Node: l.Node, Up: h.fsm.Alive(l.Node)})
	}
	slices.SortStableFunc(out, func(a, b respcluster.Holder) int {
		switch {
		case a.Up == b.Up:
			return 0
		case a.Up:
			return -1
		}
		return 1
	})
	return out
}

// Members lists every member of the cluster, with whether it is up, and
// this node's ID.
func (h holders) Members() ([]respcluster.Holder, index.NodeID) {
	ms := h.fsm.Members()
	out := make([]respcluster.Holder, 0, len(ms))
	for _, m := range ms {
		out = append(out, respcluster.Holder{Node: m.ID, Up: m.ID == h.self || h.fsm.Alive(m.ID)})
	}
	return out, h.self
}
