// Package peerauth makes sure that the two ends of a connection between
// cluster members are members: it wraps the connection in TLS (verifying
// the peer's certificate against the node's CA file, both ways), and
// proves, in a challenge-response, that both hold the cluster's token,
// without sending the token — only HMACs of fresh nonces, bound to the TLS
// session when there is one, so that a recorded or relayed exchange is of
// no use.
//
// The exchange (all lengths fixed, 32-byte nonces and HMAC-SHA256s):
//
//	client → server  "KVPA" 1 nc
//	server → client  "KVPA" 1 ns HMAC(token, "kvstrata peer server" nc ns binding)
//	client → server  HMAC(token, "kvstrata peer client" nc ns binding)
//	server → client  0 (welcome) or 1 (refused)
//
// binding is 32 bytes of keying material exported from the TLS session
// (RFC 5705), or empty on a plain connection.
//
// Token and Guard are safe for concurrent use.
package peerauth

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/kvstrata/kvstrata/internal/tlsfiles"
)

// ErrRefused marks a peer that failed to prove it holds the cluster token,
// or a peer that refused this node's proof.
var ErrRefused = errors.New("peerauth: the peer does not hold the cluster token")

// Token is the cluster's shared secret as the exchange reads it: the
// secrets in use each time, so that a reload applies to the next
// connection. A member proves itself with the first secret and accepts a
// peer's proof by any of them (a token being rotated).
type Token struct {
	secrets func() []string
}

// NewToken makes a Token of the secrets that secrets returns, the one to
// present first (the daemon's auth.ClusterToken's Secrets).
func NewToken(secrets func() []string) *Token { return &Token{secrets: secrets} }

const (
	magic     = "KVPA"
	version   = 1
	nonceLen  = 32
	macLen    = sha256.Size
	exportKey = "EXPORTER-kvstrata-peer-token"
)

// mac is the proof of label by the secret this member presents.
func (t *Token) mac(label string, nc, ns, binding []byte) []byte {
	return macOf(t.secrets()[0], label, nc, ns, binding)
}

// accepts reports whether proof is label's by one of the secrets.
func (t *Token) accepts(proof []byte, label string, nc, ns, binding []byte) bool {
	ok := false
	for _, s := range t.secrets() {
		if hmac.Equal(proof, macOf(s, label, nc, ns, binding)) {
			ok = true
		}
	}
	return ok
}

func macOf(secret, label string, nc, ns, binding []byte) []byte {
	h := hmac.New(sha256.New, []byte(secret))
	h.Write([]byte(label))
	h.Write(nc)
	h.Write(ns)
	h.Write(binding)
	return h.Sum(nil)
}

// binding is the keying material of c's TLS session, nil on a plain
// connection.
func binding(c net.Conn) ([]byte, error) {
	tc, ok := c.(*tls.Conn)
	if !ok {
		return nil, nil
	}
	cs := tc.ConnectionState()
	return cs.ExportKeyingMaterial(exportKey, nil, 32)
}

// Client proves to the server at the other end of c that this node holds
// the token, and checks that the server does too. c's deadline bounds it.
func (t *Token) Client(c net.Conn) error {
	bind, err := binding(c)
	if err != nil {
		return fmt.Errorf("peerauth: %w", err)
	}
	hello := make([]byte, 5+nonceLen)
	copy(hello, magic)
	hello[4] = version
	nc := hello[5:]
	if _, err := rand.Read(nc); err != nil {
		return err
	}
	if _, err := c.Write(hello); err != nil {
		return fmt.Errorf("peerauth: %w", err)
	}
	answer := make([]byte, 5+nonceLen+macLen)
	if _, err := io.ReadFull(c, answer); err != nil {
		return fmt.Errorf("peerauth: reading the server's proof: %w", err)
	}
	if string(answer[:4]) != magic || answer[4] != version {
		return fmt.Errorf("peerauth: the server does not speak the cluster-token exchange")
	}
	ns, serverMAC := answer[5:5+nonceLen], answer[5+nonceLen:]
	if !t.accepts(serverMAC, "kvstrata peer server", nc, ns, bind) {
		return fmt.Errorf("%w (the server's proof is wrong)", ErrRefused)
	}
	if _, err := c.Write(t.mac("kvstrata peer client", nc, ns, bind)); err != nil {
		return fmt.Errorf("peerauth: %w", err)
	}
	var st [1]byte
	if _, err := io.ReadFull(c, st[:]); err != nil {
		return fmt.Errorf("peerauth: reading the server's verdict: %w", err)
	}
	if st[0] != 0 {
		return fmt.Errorf("%w (the server refused this node's proof)", ErrRefused)
	}
	return nil
}

// Server checks that the client at the other end of c holds the token,
// proving along the way that this node does. c's deadline bounds it.
func (t *Token) Server(c net.Conn) error {
	bind, err := binding(c)
	if err != nil {
		return fmt.Errorf("peerauth: %w", err)
	}
	hello := make([]byte, 5+nonceLen)
	if _, err := io.ReadFull(c, hello); err != nil {
		return fmt.Errorf("peerauth: reading the client's hello: %w", err)
	}
	if !bytes.Equal(hello[:4], []byte(magic)) || hello[4] != version {
		return fmt.Errorf("%w (it does not speak the cluster-token exchange)", ErrRefused)
	}
	nc := hello[5:]
	answer := make([]byte, 5+nonceLen, 5+nonceLen+macLen)
	copy(answer, magic)
	answer[4] = version
	ns := answer[5:]
	if _, err := rand.Read(ns); err != nil {
		return err
	}
	answer = append(answer, t.mac("kvstrata peer server", nc, ns, bind)...)
	if _, err := c.Write(answer); err != nil {
		return fmt.Errorf("peerauth: %w", err)
	}
	proof := make([]byte, macLen)
	if _, err := io.ReadFull(c, proof); err != nil {
		return fmt.Errorf("peerauth: reading the client's proof: %w", err)
	}
	if !t.accepts(proof, "kvstrata peer client", nc, ns, bind) {
		_, _ = c.Write([]byte{1})
		return ErrRefused
	}
	if _, err := c.Write([]byte{0}); err != nil {
		return fmt.Errorf("peerauth: %w", err)
	}
	return nil
}

// DefaultTimeout bounds a Guard's handshakes when its Timeout is zero.
const DefaultTimeout = 10 * time.Second

// Guard secures the raw connections between members (the raft transport;
// any peer stream): TLS when TLS is set, then the token exchange when
// Token is set. A zero Guard leaves connections as they are.
type Guard struct {
	// TLS is the node's TLS material; nil: plain connections. With a CA
	// file, the peer's certificate must chain to it, both ways.
	TLS *tlsfiles.Files
	// Token is the cluster token; nil: no exchange.
	Token *Token
	// Timeout bounds the handshakes of one connection. Default
	// DefaultTimeout.
	Timeout time.Duration
}

// Server secures a connection a peer opened. It returns the connection to
// use; on an error it has closed c.
func (g *Guard) Server(c net.Conn) (net.Conn, error) {
	return g.run(c, func(c net.Conn) (net.Conn, error) {
		if g.TLS != nil {
			tc := tls.Server(c, g.TLS.PeerServerConfig())
			if err := tc.Handshake(); err != nil {
				return c, fmt.Errorf("peerauth: TLS with %s: %w", c.RemoteAddr(), err)
			}
			c = tc
		}
		if g.Token != nil {
			if err := g.Token.Server(c); err != nil {
				return c, fmt.Errorf("peerauth: %s: %w", c.RemoteAddr(), err)
			}
		}
		return c, nil
	})
}

// Client secures a connection this node opened to the peer at addr
// ("host:port"; its host is the name the peer's certificate must hold).
func (g *Guard) Client(c net.Conn, addr string) (net.Conn, error) {
	return g.run(c, func(c net.Conn) (net.Conn, error) {
		if g.TLS != nil {
			host, _, err := net.SplitHostPort(addr)
			if err != nil {
				host = addr
			}
			tc := tls.Client(c, g.TLS.ClientConfig(host))
			if err := tc.Handshake(); err != nil {
				return c, fmt.Errorf("peerauth: TLS with %s: %w", addr, err)
			}
			c = tc
		}
		if g.Token != nil {
			if err := g.Token.Client(c); err != nil {
				return c, fmt.Errorf("peerauth: %s: %w", addr, err)
			}
		}
		return c, nil
	})
}

func (g *Guard) run(c net.Conn, fn func(net.Conn) (net.Conn, error)) (net.Conn, error) {
	if g == nil || g.TLS == nil && g.Token == nil {
		return c, nil
	}
	timeout := g.Timeout
	if timeout == 0 {
		timeout = DefaultTimeout
	}
	_ = c.SetDeadline(time.Now().Add(timeout))
	out, err := fn(c)
	if err != nil {
		out.Close()
		return nil, err
	}
	_ = out.SetDeadline(time.Time{})
	return out, nil
}
