// Package gate is who may call what on a node's gRPC server and data
// plane. It authenticates a caller once — a bearer token, or the identity
// of a verified client certificate — into an auth.Identity, and checks the
// role each gRPC method needs from one table (Methods), so that no service
// decides for itself and no method is left open by forgetting it.
//
// A Gate is safe for concurrent use; so must its Authenticator be.
package gate

import (
	"context"
	"crypto/tls"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/kvstrata/kvstrata/auth"
)

// Authenticator turns what a caller presents into who it is: the users
// file, reloaded on SIGHUP, with the cluster's token. An error means the
// credential is not valid; it is never shown to the caller.
type Authenticator interface {
	// Token is the identity a bearer token belongs to.
	Token(secret string) (auth.Identity, error)
	// Certificate is the identity a verified client certificate names
	// (its URI SAN or its common name).
	Certificate(name string) (auth.Identity, error)
}

// MsgAuthenticateFirst is all an unauthenticated caller is told, whether it
// sent no credential or one that is not valid: nothing about which users
// exist or which part was wrong.
const MsgAuthenticateFirst = "authenticate first"

// Identify authenticates a caller that presented token (empty: none) over
// a connection in state (nil: not TLS). A token, when given, decides
// alone; without one, the verified client certificate does, by its URI
// SANs, then its common name. The error is auth.ErrNoAuth when the caller
// presented nothing, auth.ErrWrongPass when what it presented is not valid.
func Identify(a Authenticator, token string, state *tls.ConnectionState) (auth.Identity, error) {
	if token != "" {
		id, err := a.Token(token)
		if err != nil {
			return auth.Identity{}, auth.ErrWrongPass
		}
		return id, nil
	}
	names := CertificateNames(state)
	for _, name := range names {
		if id, err := a.Certificate(name); err == nil {
			return id, nil
		}
	}
	if len(names) > 0 {
		return auth.Identity{}, auth.ErrWrongPass
	}
	return auth.Identity{}, auth.ErrNoAuth
}

// CertificateNames are the names a verified client certificate goes by,
// in the order Identify tries them: its URI SANs, then its common name.
// An unverified certificate (no chain to the trusted CAs) names nothing.
func CertificateNames(state *tls.ConnectionState) []string {
	if state == nil || len(state.VerifiedChains) == 0 || len(state.VerifiedChains[0]) == 0 {
		return nil
	}
	leaf := state.VerifiedChains[0][0]
	var names []string
	for _, u := range leaf.URIs {
		names = append(names, u.String())
	}
	if cn := leaf.Subject.CommonName; cn != "" {
		names = append(names, cn)
	}
	return names
}

// Gate authenticates and authorizes the calls of a gRPC server.
type Gate struct {
	a       Authenticator
	methods map[string]Need
}

// New returns a Gate that authenticates callers with a and checks each
// method against Methods.
func New(a Authenticator) *Gate { return &Gate{a: a, methods: Methods} }

// ServerOptions are the interceptors that put g in front of every call.
// They go first in the chains, so that nothing else runs for a caller
// that is turned away.
func (g *Gate) ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.ChainUnaryInterceptor(g.Unary), grpc.ChainStreamInterceptor(g.Stream)}
}

// Unary is the unary interceptor of g.
func (g *Gate) Unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
	ctx, err := g.admit(ctx, info.FullMethod)
	if err != nil {
		return nil, err
	}
	return next(ctx, req)
}

// Stream is the stream interceptor of g.
func (g *Gate) Stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, next grpc.StreamHandler) error {
	ctx, err := g.admit(ss.Context(), info.FullMethod)
	if err != nil {
		return err
	}
	return next(srv, &identified{ServerStream: ss, ctx: ctx})
}

// identified is a stream whose context carries the caller's identity.
type identified struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *identified) Context() context.Context { return s.ctx }

// admit authenticates the caller of method and checks that it may call
// it; the context it returns carries the caller's identity.
func (g *Gate) admit(ctx context.Context, method string) (context.Context, error) {
	need, known := g.methods[method]
	if known && need.Open {
		return ctx, nil
	}
	token, err := bearer(ctx)
	if err != nil {
		return nil, err
	}
	id, err := Identify(g.a, token, tlsState(ctx))
	if err != nil {
		return nil, status.Error(codes.Unauthenticated, MsgAuthenticateFirst)
	}
	if !known { // a method registered without an entry: closed to all
		return nil, status.Errorf(codes.PermissionDenied, "permission denied: %s is open to no one", method)
	}
	if err := need.Allows(id); err != nil {
		return nil, status.Errorf(codes.PermissionDenied, "%s: %v", method, err)
	}
	return auth.NewContext(ctx, id), nil
}

// bearer reads the token of the call's "authorization: Bearer <token>"
// metadata; "" when there is none.
func bearer(ctx context.Context) (string, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	vs := md.Get("authorization")
	if len(vs) == 0 {
		return "", nil
	}
	scheme, token, ok := strings.Cut(vs[0], " ")
	if len(vs) > 1 || !ok || !strings.EqualFold(scheme, "bearer") || strings.TrimSpace(token) == "" {
		return "", status.Error(codes.Unauthenticated, MsgAuthenticateFirst+` (send "authorization: Bearer <token>")`)
	}
	return strings.TrimSpace(token), nil
}

// tlsState is the TLS state of the call's connection; nil if it is not TLS.
func tlsState(ctx context.Context) *tls.ConnectionState {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil
	}
	if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok {
		return &ti.State
	}
	return nil
}

// Bearer is the per-call credential that sends the token token returns,
// at each call, as "authorization: Bearer <token>": what a node's own
// clients of its peers dial with (the cluster token in use, which a
// reload may change).
func Bearer(token func() string) credentials.PerRPCCredentials { return bearerCreds(token) }

type bearerCreds func() string

func (t bearerCreds) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + t()}, nil
}

// RequireTransportSecurity is false: a cluster on loopback or a trusted
// network runs without TLS; the daemon refuses to listen elsewhere
// without it.
func (bearerCreds) RequireTransportSecurity() bool { return false }
