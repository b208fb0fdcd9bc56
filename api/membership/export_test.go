package membership

import (
	"context"
	"fmt"
	"strconv"

	"github.com/hashicorp/raft"

	"github.com/kvstrata/kvstrata/index"
)

// HandLeadershipTo asks this node, the leader, to hand the leadership to
// node to: how a test deposes a leader that keeps running.
func (c *Agent) HandLeadershipTo(to index.NodeID) error {
	servers, err := c.rep.Servers()
	if err != nil {
		return err
	}
	for _, s := range servers {
		if s.ID == to {
			return c.rep.Raft.LeadershipTransferToServer(raft.ServerID(strconv.FormatUint(uint64(to), 10)), raft.ServerAddress(s.RaftAddr)).Error()
		}
	}
	return fmt.Errorf("node %d is not a server", to)
}

// LosePublish records ch as published without handing it to the batcher:
// a change the directory never hears of, as a dropped or discarded one.
func (c *Agent) LosePublish(ch index.Change) {
	c.own.mu.Lock()
	c.own.applyLocked(ch)
	c.own.mu.Unlock()
}

// Reconcile runs one reconcile pass now and returns the keys it corrected.
func (c *Agent) Reconcile(ctx context.Context) (int, error) { return c.reconcile(ctx) }
