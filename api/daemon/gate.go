package daemon

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"

	"google.golang.org/grpc"

	"github.com/kvstrata/kvstrata/api/gate"
	"github.com/kvstrata/kvstrata/auth"
)

// nodeAuth is who the node lets in: the members of its cluster (the
// cluster token) and the users of its users file.
type nodeAuth struct {
	users   gate.Authenticator // nil: no users file
	cluster interface {
		Check(secret string) (auth.Identity, error)
	} // nil: no cluster token
}

var _ gate.Authenticator = nodeAuth{}

func (a nodeAuth) Token(secret string) (auth.Identity, error) {
	if a.cluster != nil {
		if id, err := a.cluster.Check(secret); err == nil {
			return id, nil
		}
	}
	if a.users == nil {
		return auth.Identity{}, auth.ErrWrongPass
	}
	return a.users.Token(secret)
}

func (a nodeAuth) Certificate(name string) (auth.Identity, error) {
	if a.users == nil {
		return auth.Identity{}, auth.ErrWrongPass
	}
	return a.users.Certificate(name)
}

// peerDialOptions are what the node adds to its gRPC dials of the other
// members: the cluster token in use, when it has one.
func peerDialOptions(token *auth.ClusterToken) []grpc.DialOption {
	if token == nil {
		return nil
	}
	return []grpc.DialOption{grpc.WithPerRPCCredentials(gate.Bearer(token.Secret))}
}

// openGate makes the gate of the gRPC server and the data plane: nil
// without a users file (users nil), when the node authenticates no one.
// It returns the cluster token the node presents to the other members:
// cluster's, or without one, when the node authenticates, one of its own.
func openGate(cluster *auth.ClusterToken, users *auth.Holder) (a gate.Authenticator, token *auth.ClusterToken, err error) {
	var na nodeAuth
	if cluster != nil {
		na.cluster, token = cluster, cluster
	}
	if users != nil {
		na.users = users
		if na.cluster == nil {
			// The node's own calls to itself (its heartbeats to itself as
			// leader) need a member's credential too: without a token
			// file, one of its own that no other node knows. Other
			// members then need certificates the users file names.
			var b [32]byte
			_, _ = rand.Read(b[:])
			t, err := auth.NewClusterToken(hex.EncodeToString(b[:]))
			if err != nil {
				return nil, nil, err
			}
			na.cluster, token = t, t
		}
		a = na
	}
	return a, token, nil
}

// newGRPCServer is the node's gRPC server: behind the gate when a is set,
// then the metrics interceptors.
func newGRPCServer(a gate.Authenticator, opts ...grpc.ServerOption) *grpc.Server {
	if a != nil {
		opts = append(gate.New(a).ServerOptions(), opts...)
	}
	return grpc.NewServer(opts...)
}

// checkGate makes sure every method g serves is in the gate's table: one
// that is not would be refused to everyone.
func checkGate(g *grpc.Server) error {
	if missing := gate.Missing(g.GetServiceInfo()); len(missing) > 0 {
		return fmt.Errorf("daemon: gRPC methods without an entry in api/gate's Methods: %v", missing)
	}
	return nil
}
