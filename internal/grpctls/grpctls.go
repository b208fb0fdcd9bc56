// Package grpctls gives gRPC the TLS credentials of a node's tlsfiles:
// a server's picks the current certificate at each handshake, and a
// dial's builds its config at each connection, so that both follow a
// reload of the files.
package grpctls

import (
	"context"
	"errors"
	"net"

	"google.golang.org/grpc/credentials"

	"github.com/kvstrata/kvstrata/internal/tlsfiles"
)

// Server returns the credentials of a gRPC server that presents f's
// certificate and treats client certificates as f was loaded to.
func Server(f *tlsfiles.Files) credentials.TransportCredentials {
	return credentials.NewTLS(f.ServerConfig())
}

// Client returns the credentials of dials to other nodes, verified
// against f's CA pool (at each connection, the current one); serverName,
// when not empty, replaces the dialled host as the name the server's
// certificate must hold.
func Client(f *tlsfiles.Files, serverName string) credentials.TransportCredentials {
	return &dynamic{f: f, serverName: serverName}
}

type dynamic struct {
	f          *tlsfiles.Files
	serverName string
}

func (d *dynamic) creds(authority string) credentials.TransportCredentials {
	name := d.serverName
	if name == "" {
		host, _, err := net.SplitHostPort(authority)
		if err != nil {
			host = authority
		}
		name = host
	}
	return credentials.NewTLS(d.f.ClientConfig(name))
}

func (d *dynamic) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return d.creds(authority).ClientHandshake(ctx, authority, raw)
}

func (d *dynamic) ServerHandshake(net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, errors.New("grpctls: dial credentials cannot serve")
}

func (d *dynamic) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "tls", SecurityVersion: "1.2"}
}

func (d *dynamic) Clone() credentials.TransportCredentials {
	return &dynamic{f: d.f, serverName: d.serverName}
}

func (d *dynamic) OverrideServerName(name string) error { //nolint:staticcheck // part of the interface
	d.serverName = name
	return nil
}
