package gate_test

import (
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"net/url"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	"github.com/kvstrata/kvstrata/api/gate"
	"github.com/kvstrata/kvstrata/api/nodetest"
	pb "github.com/kvstrata/kvstrata/api/v1"
	"github.com/kvstrata/kvstrata/auth"
)

// Every method of every service a node serves says what it needs: one
// left out would be refused to everyone (and the daemon would not start).
func TestEveryServedMethodHasAnEntry(t *testing.T) {
	g := grpc.NewServer()
	pb.RegisterCacheServer(g, pb.UnimplementedCacheServer{})
	pb.RegisterClusterServer(g, pb.UnimplementedClusterServer{})
	pb.RegisterKeyspaceServer(g, pb.UnimplementedKeyspaceServer{})
	healthpb.RegisterHealthServer(g, health.NewServer())
	reflection.Register(g)
	if missing := gate.Missing(g.GetServiceInfo()); len(missing) > 0 {
		t.Fatalf("methods without an entry in gate.Methods: %v", missing)
	}
	g.Stop()
}

func TestTheRolesEachKindOfMethodNeeds(t *testing.T) {
	users := nodetest.Users(t)
	id := func(token string) auth.Identity {
		t.Helper()
		i, err := users.Token(token)
		if err != nil {
			t.Fatal(err)
		}
		return i
	}
	alice, reader, ops, member := id(nodetest.TokenAlice), id(nodetest.TokenReader), id(nodetest.TokenOperator), id(nodetest.TokenMember)
	for _, c := range []struct {
		method string
		who    auth.Identity
		ok     bool
	}{
		{pb.Cache_Get_FullMethodName, reader, true},
		{pb.Cache_Put_FullMethodName, reader, false},
		{pb.Cache_Put_FullMethodName, alice, true},
		{pb.Cache_Info_FullMethodName, reader, true},
		{pb.Cache_Evict_FullMethodName, alice, false},
		{pb.Cache_Evict_FullMethodName, ops, true},
		{pb.Cache_Warm_FullMethodName, alice, false},
		{pb.Cache_Warm_FullMethodName, ops, true},
		{pb.Cluster_Join_FullMethodName, alice, false},
		{pb.Cluster_Join_FullMethodName, ops, true},
		{pb.Cluster_Join_FullMethodName, member, true},
		{pb.Cluster_Propose_FullMethodName, ops, false},
		{pb.Cluster_Heartbeat_FullMethodName, ops, false},
		{pb.Cluster_Heartbeat_FullMethodName, member, true},
		{pb.Keyspace_Flush_FullMethodName, ops, false},
		{pb.Keyspace_Get_FullMethodName, alice, false},
		{pb.Keyspace_Get_FullMethodName, member, true},
		{"/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", reader, true},
	} {
		err := gate.Methods[c.method].Allows(c.who)
		if (err == nil) != c.ok || err != nil && !errors.Is(err, auth.ErrDenied) {
			t.Errorf("%s by %s: %v, want allowed %v", c.method, c.who.User, err, c.ok)
		}
	}
}

// A token decides alone; without one a verified certificate's URI SAN,
// then its common name; an unverified certificate names no one.
func TestIdentifyByTokenOrCertificate(t *testing.T) {
	users := nodetest.Users(t)
	leaf := &x509.Certificate{Subject: pkix.Name{CommonName: "nobody"}, URIs: []*url.URL{{Scheme: "spiffe", Host: "example.org", Path: "/x"}}}
	verified := &tls.ConnectionState{PeerCertificates: []*x509.Certificate{leaf}, VerifiedChains: [][]*x509.Certificate{{leaf}}}
	if got := gate.CertificateNames(verified); len(got) != 2 || got[0] != "spiffe://example.org/x" || got[1] != "nobody" {
		t.Errorf("names %q, want the URI SAN then the CN", got)
	}
	if got := gate.CertificateNames(&tls.ConnectionState{PeerCertificates: []*x509.Certificate{leaf}}); got != nil {
		t.Errorf("an unverified certificate names %q", got)
	}
	if id, err := gate.Identify(users, nodetest.TokenAlice, verified); err != nil || id.User != "alice" {
		t.Errorf("token and certificate: %+v, %v; want alice by the token", id, err)
	}
	if _, err := gate.Identify(users, "not-a-token-0123456789abcdef0123456789", nil); !errors.Is(err, auth.ErrWrongPass) {
		t.Errorf("a wrong token: %v", err)
	}
	bobs := &x509.Certificate{Subject: pkix.Name{CommonName: "bob"}, URIs: []*url.URL{{Scheme: "spiffe", Host: "example.org", Path: "/bob"}}}
	if id, err := gate.Identify(users, "", &tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{bobs}}}); err != nil || id.User != "bob" {
		t.Errorf("bob's certificate: %+v, %v", id, err)
	}
	if _, err := gate.Identify(users, "", verified); !errors.Is(err, auth.ErrWrongPass) {
		t.Errorf("a certificate the users file does not name: %v", err)
	}
	if _, err := gate.Identify(users, "", nil); !errors.Is(err, auth.ErrNoAuth) {
		t.Errorf("nothing presented: %v", err)
	}
}
