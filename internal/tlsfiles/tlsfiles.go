// Package tlsfiles keeps a node's TLS material — its certificate chain and
// key, and the CA certificates its peers and clients must chain to — as
// files that are read again on Reload, and builds the *tls.Config of its
// servers and of its dials from them.
//
// A server's config picks the files' current contents at each handshake
// (GetConfigForClient), and a dial's config is built at each dial
// (ClientConfig), so that after a Reload new connections get the new
// certificate and CA pool while connections already open keep theirs. A
// Reload that fails — a missing file, a key that does not match its
// certificate — keeps the material in use and returns the error.
//
// Files is safe for concurrent use.
package tlsfiles

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"sync/atomic"
)

// ClientAuth is how a server treats client certificates.
type ClientAuth string

// The ClientAuth values.
const (
	// NoClientCert asks for no client certificate.
	NoClientCert ClientAuth = "none"
	// VerifyIfGiven verifies a client certificate against the CA pool
	// when the client sends one, and lets a client without one in.
	VerifyIfGiven ClientAuth = "optional"
	// RequireClientCert lets in only clients whose certificate chains to
	// the CA pool.
	RequireClientCert ClientAuth = "require"
)

// ParseClientAuth checks s.
func ParseClientAuth(s string) (ClientAuth, error) {
	switch a := ClientAuth(s); a {
	case NoClientCert, VerifyIfGiven, RequireClientCert:
		return a, nil
	}
	return "", fmt.Errorf("%q is not none, optional or require", s)
}

func (a ClientAuth) tls() tls.ClientAuthType {
	switch a {
	case NoClientCert:
		return tls.NoClientCert
	case RequireClientCert:
		return tls.RequireAndVerifyClientCert
	}
	return tls.VerifyClientCertIfGiven
}

// Paths names the files.
type Paths struct {
	// CertFile and KeyFile hold the PEM certificate chain and its private
	// key; both or neither.
	CertFile, KeyFile string
	// CAFile holds the PEM CA certificates; empty: the system's roots
	// verify servers, and client certificates cannot be verified.
	CAFile string
}

// ErrNoCA marks a configuration that asks to verify client certificates
// without a CA file to verify them against.
var ErrNoCA = errors.New("tlsfiles: client certificates need a CA file to be verified against")

// material is what the files held when last read.
type material struct {
	cert *tls.Certificate // nil without CertFile
	pool *x509.CertPool   // nil without CAFile: the system's roots
}

// Files is the TLS material of a node, read from Paths.
type Files struct {
	paths Paths
	auth  ClientAuth
	cur   atomic.Pointer[material]
}

// Load reads the files of p. auth is how the servers built from them treat
// client certificates; VerifyIfGiven and RequireClientCert need a CAFile.
func Load(p Paths, auth ClientAuth) (*Files, error) {
	if _, err := ParseClientAuth(string(auth)); err != nil {
		return nil, fmt.Errorf("tlsfiles: client auth %w", err)
	}
	if auth == RequireClientCert && p.CAFile == "" {
		return nil, ErrNoCA
	}
	f := &Files{paths: p, auth: auth}
	m, err := read(p)
	if err != nil {
		return nil, err
	}
	f.cur.Store(m)
	return f, nil
}

// Check reads the files of p as Load would and reports what is wrong with
// them, for a configuration's validation.
func Check(p Paths) error {
	_, err := read(p)
	return err
}

func read(p Paths) (*material, error) {
	if (p.CertFile == "") != (p.KeyFile == "") {
		return nil, errors.New("tlsfiles: a certificate file and a key file go together: set both or neither")
	}
	m := &material{}
	if p.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(p.CertFile, p.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("tlsfiles: certificate %s and key %s: %w", p.CertFile, p.KeyFile, err)
		}
		m.cert = &cert
	}
	if p.CAFile != "" {
		pem, err := os.ReadFile(p.CAFile)
		if err != nil {
			return nil, fmt.Errorf("tlsfiles: CA file: %w", err)
		}
		m.pool = x509.NewCertPool()
		if !m.pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("tlsfiles: CA file %s holds no PEM certificate", p.CAFile)
		}
	}
	return m, nil
}

// Reload reads the files again. New handshakes use what it read; on an
// error the material in use stays.
func (f *Files) Reload() error {
	m, err := read(f.paths)
	if err != nil {
		return err
	}
	f.cur.Store(m)
	return nil
}

// Paths returns the files' names.
func (f *Files) Paths() Paths { return f.paths }

// HasCert reports whether the node has a certificate of its own.
func (f *Files) HasCert() bool { return f.cur.Load().cert != nil }

// HasCA reports whether a CA file is set (else the system's roots are
// used to verify servers).
func (f *Files) HasCA() bool { return f.paths.CAFile != "" }

// Certificate returns the parsed leaf of the certificate in use, nil
// without one.
func (f *Files) Certificate() *x509.Certificate {
	m := f.cur.Load()
	if m.cert == nil {
		return nil
	}
	if m.cert.Leaf != nil {
		return m.cert.Leaf
	}
	leaf, err := x509.ParseCertificate(m.cert.Certificate[0])
	if err != nil {
		return nil
	}
	return leaf
}

// ServerConfig returns the config of a server that presents the node's
// certificate and treats client certificates as Load was told. Each
// handshake takes the material current then. It needs a certificate.
func (f *Files) ServerConfig() *tls.Config {
	return f.serverConfig(f.auth)
}

// PeerServerConfig is ServerConfig for a port only the cluster's members
// dial (raft): with a CA file, a client certificate that chains to it is
// required, whatever the client auth of the other ports.
func (f *Files) PeerServerConfig() *tls.Config {
	if f.HasCA() {
		return f.serverConfig(RequireClientCert)
	}
	return f.serverConfig(NoClientCert)
}

func (f *Files) serverConfig(auth ClientAuth) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			m := f.cur.Load()
			if m.cert == nil {
				return nil, errors.New("tlsfiles: no server certificate")
			}
			c := &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{*m.cert},
				ClientAuth: auth.tls(), ClientCAs: m.pool}
			if auth != NoClientCert && m.pool == nil {
				c.ClientAuth = tls.NoClientCert // Load refused require; optional without a CA verifies nothing
			}
			return c, nil
		},
	}
}

// ClientConfig returns the config of one dial to serverName (a host name
// or an IP address that the server's certificate must name), verified
// against the current CA pool (the system's roots without a CA file), and
// presenting the node's certificate when the server asks for one.
func (f *Files) ClientConfig(serverName string) *tls.Config {
	m := f.cur.Load()
	c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: serverName, RootCAs: m.pool}
	if m.cert != nil {
		c.Certificates = []tls.Certificate{*m.cert}
	}
	return c
}

// ForAddr returns a copy of c for a dial to addr ("host:port"), whose
// ServerName is addr's host unless c names one.
func ForAddr(c *tls.Config, addr string) *tls.Config {
	c = c.Clone()
	if c.ServerName == "" {
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			host = addr
		}
		c.ServerName = host
	}
	return c
}
