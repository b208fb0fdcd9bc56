package daemon

import (
	"crypto/tls"
	"fmt"
	"net"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvstrata/kvstrata/auth"
	"github.com/kvstrata/kvstrata/config"
	"github.com/kvstrata/kvstrata/internal/grpctls"
	"github.com/kvstrata/kvstrata/internal/peerauth"
	"github.com/kvstrata/kvstrata/internal/tlsfiles"
	"github.com/kvstrata/kvstrata/raftstore"
)

// LoadTLS reads the node's TLS files (tls.*), nil when tls.cert-file is
// not set. The binary loads them once and hands the same Files to the
// data-plane transport it builds and to the Node (Options.TLS), so that
// the node's Reload reaches both.
func LoadTLS(cfg config.Config) (*tlsfiles.Files, error) {
	if cfg.TLS.CertFile == "" {
		return nil, nil
	}
	auth, err := tlsfiles.ParseClientAuth(cfg.TLS.ClientAuth)
	if err != nil {
		return nil, fmt.Errorf("tls.client-auth %w", err)
	}
	return tlsfiles.Load(tlsfiles.Paths{CertFile: cfg.TLS.CertFile, KeyFile: cfg.TLS.KeyFile, CAFile: cfg.TLS.CAFile}, auth)
}

// DataPlaneTLS returns what a TCP data plane needs of f: the listener's
// config and the config of each dial to a peer (both following f's
// reloads); nil, nil without TLS.
func DataPlaneTLS(f *tlsfiles.Files) (server *tls.Config, client func(addr string) *tls.Config) {
	if f == nil {
		return nil, nil
	}
	return f.ServerConfig(), func(addr string) *tls.Config {
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			host = addr
		}
		return f.ClientConfig(host)
	}
}

// security is what the node secures its ports and peer dials with.
type security struct {
	tls *tlsfiles.Files // nil: plaintext
	// cluster is auth.cluster-token-file's token (nil: none), which the
	// raft guard and the gRPC side both read, so that one reload reaches
	// both.
	cluster *auth.ClusterToken
}

func openSecurity(cfg config.Config, files *tlsfiles.Files) (*security, error) {
	s := &security{tls: files}
	if s.tls == nil {
		var err error
		if s.tls, err = LoadTLS(cfg); err != nil {
			return nil, err
		}
	}
	if f := cfg.Auth.ClusterTokenFile; f != "" {
		var err error
		if s.cluster, err = auth.LoadClusterToken(f); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// peerCredentials secure the node's gRPC dials of other members.
func (s *security) peerCredentials() credentials.TransportCredentials {
	if s.tls == nil {
		return insecure.NewCredentials()
	}
	return grpctls.Client(s.tls, "")
}

// raftGuard secures the raft transport; nil when there is nothing to
// secure it with.
func (s *security) raftGuard() raftstore.ConnGuard {
	if s.tls == nil && s.cluster == nil {
		return nil
	}
	g := &peerauth.Guard{TLS: s.tls}
	if s.cluster != nil {
		g.Token = peerauth.NewToken(s.cluster.Secrets)
	}
	return g
}

// serverTLS is the config of the node's TLS listeners (HTTP, RESP).
func (s *security) serverTLS() *tls.Config {
	if s.tls == nil {
		return nil
	}
	return s.tls.ServerConfig()
}
