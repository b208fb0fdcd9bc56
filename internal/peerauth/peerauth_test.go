package peerauth_test

import (
	"errors"
	"io"
	"net"
	"strings"
	"testing"

	"github.com/kvstrata/kvstrata/internal/peerauth"
	"github.com/kvstrata/kvstrata/internal/tlsfiles"
	"github.com/kvstrata/kvstrata/internal/tlsfiles/tlstest"
)

func clusterToken(t *testing.T, secret string) *peerauth.Token {
	t.Helper()
	return peerauth.NewToken(func() []string { return []string{secret} })
}

// exchange runs a guarded connection between server and client over real
// TCP, carries one message through it, and returns both sides' errors.
func exchange(t *testing.T, server, client *peerauth.Guard) (serverErr, clientErr error, seen []byte) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		c, err := ln.Accept()
		if err != nil {
			serverErr = err
			return
		}
		sc, err := server.Server(c)
		if err != nil {
			serverErr = err
			return
		}
		defer sc.Close()
		seen = make([]byte, 4)
		_, serverErr = io.ReadFull(sc, seen)
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	cc, clientErr := client.Client(c, ln.Addr().String())
	if clientErr == nil {
		_, clientErr = cc.Write([]byte("raft"))
		defer cc.Close()
	}
	<-done
	return serverErr, clientErr, seen
}

func TestMembersWithTheSameTokenConnect(t *testing.T) {
	tok := clusterToken(t, "a cluster secret of enough bytes")
	serr, cerr, seen := exchange(t, &peerauth.Guard{Token: tok}, &peerauth.Guard{Token: tok})
	if serr != nil || cerr != nil || string(seen) != "raft" {
		t.Fatalf("server %v, client %v, seen %q", serr, cerr, seen)
	}
}

func TestAPeerWithAnotherTokenIsRefusedBothWays(t *testing.T) {
	ours := clusterToken(t, "a cluster secret of enough bytes")
	theirs := clusterToken(t, "another secret, also long enough")
	serr, cerr, _ := exchange(t, &peerauth.Guard{Token: ours}, &peerauth.Guard{Token: theirs})
	if !errors.Is(serr, peerauth.ErrRefused) && serr == nil {
		t.Errorf("server: %v, want a refusal", serr)
	}
	if !errors.Is(cerr, peerauth.ErrRefused) {
		t.Errorf("client: %v, want ErrRefused (the server's proof is wrong)", cerr)
	}
}

// While a token is rotated, a member that presents the old token and
// one that presents the new connect as long as each accepts the other's;
// the step that would skip one is refused.
func TestMembersConnectThroughEachStepOfARotation(t *testing.T) {
	const old, fresh = "the old cluster secret, long enough", "the new cluster secret, long enough"
	tok := func(secrets ...string) *peerauth.Token {
		return peerauth.NewToken(func() []string { return secrets })
	}
	for _, c := range []struct {
		what           string
		server, client *peerauth.Token
		ok             bool
	}{
		{"old, and old accepting new", tok(old), tok(old, fresh), true},
		{"old accepting new, and new accepting old", tok(old, fresh), tok(fresh, old), true},
		{"new accepting old, and new", tok(fresh, old), tok(fresh), true},
		{"new, and old only", tok(fresh, old), tok(old), false},
		{"old only, and new", tok(old), tok(fresh, old), false},
	} {
		serr, cerr, seen := exchange(t, &peerauth.Guard{Token: c.server}, &peerauth.Guard{Token: c.client})
		if ok := serr == nil && cerr == nil && string(seen) == "raft"; ok != c.ok {
			t.Errorf("%s: server %v, client %v; want connected %v", c.what, serr, cerr, c.ok)
		}
	}
}

func TestAPeerWithoutTheExchangeIsRefused(t *testing.T) {
	tok := clusterToken(t, "a cluster secret of enough bytes")
	serr, _, seen := exchange(t, &peerauth.Guard{Token: tok}, &peerauth.Guard{})
	if serr == nil || string(seen) == "raft" {
		t.Fatalf("a plain client was let in: server %v, seen %q", serr, seen)
	}
}

func TestTokenOverMutualTLS(t *testing.T) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t, dir, "ca")
	a, b := ca.Issue(t, dir, "a"), ca.Issue(t, dir, "b")
	load := func(p tlstest.Pair) *tlsfiles.Files {
		f, err := tlsfiles.Load(tlsfiles.Paths{CertFile: p.CertFile, KeyFile: p.KeyFile, CAFile: ca.CAFile}, tlsfiles.VerifyIfGiven)
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	tok := clusterToken(t, "a cluster secret of enough bytes")
	serr, cerr, seen := exchange(t, &peerauth.Guard{TLS: load(a), Token: tok}, &peerauth.Guard{TLS: load(b), Token: tok})
	if serr != nil || cerr != nil || string(seen) != "raft" {
		t.Fatalf("server %v, client %v, seen %q", serr, cerr, seen)
	}
	// A peer whose certificate another CA issued is refused by TLS, even
	// with the token: raft asks a certificate of every peer.
	stranger := tlstest.NewCA(t, dir, "stranger")
	s := stranger.Issue(t, dir, "s")
	sf, err := tlsfiles.Load(tlsfiles.Paths{CertFile: s.CertFile, KeyFile: s.KeyFile, CAFile: ca.CAFile}, tlsfiles.VerifyIfGiven)
	if err != nil {
		t.Fatal(err)
	}
	serr, _, seen = exchange(t, &peerauth.Guard{TLS: load(a), Token: tok}, &peerauth.Guard{TLS: sf, Token: tok})
	if serr == nil || !strings.Contains(serr.Error(), "TLS") || string(seen) == "raft" {
		t.Fatalf("a stranger's certificate: server %v, seen %q", serr, seen)
	}
}
