package daemon

import (
	"log/slog"
	"slices"
	"time"

	"google.golang.org/grpc"

	"github.com/kvstrata/kvstrata/api/membership"
	"github.com/kvstrata/kvstrata/api/resp"
	"github.com/kvstrata/kvstrata/api/resp/respcluster"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/raftstore"
)

// keyspace is what the RESP server serves: the node's own keys (local),
// with the other nodes' behind them, found through the directory and read
// through their Keyspace service. A request to one other node waits at
// most a fifth of the command timeout (2 s by default), so that a hung
// holder leaves time to ask the next.
func keyspace(local resp.Store, cl *membership.Agent, self index.NodeID, commandTimeout time.Duration, log *slog.Logger) (resp.Store, error) {
	peerTimeout := respcluster.DefaultPeerTimeout
	if commandTimeout > 0 {
		peerTimeout = min(peerTimeout, max(commandTimeout/5, 10*time.Millisecond))
	}
	return respcluster.New(local, holders{fsm: cl.FSM(), self: self},
		respcluster.NewGRPCPeers(func(id index.NodeID) (grpc.ClientConnInterface, error) { return cl.NodeConn(id) }),
		&respcluster.Config{PeerTimeout: peerTimeout, Logger: log})
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
