package membership

import (
	"fmt"

	"google.golang.org/grpc"

	"github.com/kvstrata/kvstrata/index"
)

// NodeConn returns a connection to member id's gRPC endpoint, as its
// member record names it; connections are cached by address and closed
// with the Agent.
func (c *Agent) NodeConn(id index.NodeID) (*grpc.ClientConn, error) {
	m, ok := c.rep.FSM.Member(id)
	if !ok || m.GRPCAddr == "" {
		return nil, fmt.Errorf("cluster: node %d has no member record with a gRPC address", id)
	}
	return c.conn(m.GRPCAddr)
}
