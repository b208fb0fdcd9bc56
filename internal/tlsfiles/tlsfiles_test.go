package tlsfiles_test

import (
	"crypto/tls"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvstrata/kvstrata/internal/tlsfiles"
	"github.com/kvstrata/kvstrata/internal/tlsfiles/tlstest"
)

// serve accepts on a TLS listener of conf and echoes one line per
// connection, until the listener closes.
func serve(t *testing.T, conf *tls.Config) string {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", conf)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 5)
				if _, err := io.ReadFull(c, buf); err == nil {
					c.Write(buf)
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// dial opens a TLS connection with conf and echoes "hello" through it;
// it returns the server's certificate serial.
func dial(addr string, conf *tls.Config) (string, error) {
	c, err := tls.Dial("tcp", addr, conf)
	if err != nil {
		return "", err
	}
	defer c.Close()
	if _, err := c.Write([]byte("hello")); err != nil {
		return "", err
	}
	buf := make([]byte, 5)
	if _, err := io.ReadFull(c, buf); err != nil {
		return "", err
	}
	return c.ConnectionState().PeerCertificates[0].SerialNumber.String(), nil
}

func TestReloadServesTheNewCertificateToNewConnectionsAndKeepsOpenOnes(t *testing.T) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t, dir, "ca")
	first := ca.Issue(t, dir, "node")
	f, err := tlsfiles.Load(tlsfiles.Paths{CertFile: first.CertFile, KeyFile: first.KeyFile, CAFile: ca.CAFile}, tlsfiles.VerifyIfGiven)
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, f.ServerConfig())
	open, err := tls.Dial("tcp", addr, f.ClientConfig("127.0.0.1"))
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close()
	if err := open.Handshake(); err != nil {
		t.Fatal(err)
	}

	second := ca.Issue(t, dir, "node") // the same files, rewritten
	if err := f.Reload(); err != nil {
		t.Fatal(err)
	}
	got, err := dial(addr, f.ClientConfig("127.0.0.1"))
	if err != nil {
		t.Fatal(err)
	}
	if want := second.Cert.SerialNumber.String(); got != want {
		t.Fatalf("a new connection got certificate %s, want the reloaded %s", got, want)
	}
	if _, err := open.Write([]byte("hello")); err != nil {
		t.Fatalf("the connection opened before the reload broke: %v", err)
	}
	buf := make([]byte, 5)
	if _, err := io.ReadFull(open, buf); err != nil {
		t.Fatalf("the connection opened before the reload broke: %v", err)
	}
	if s := open.ConnectionState().PeerCertificates[0].SerialNumber; s.Cmp(first.Cert.SerialNumber) != 0 {
		t.Fatalf("the open connection's certificate changed to %s", s)
	}
}

func TestAFailedReloadKeepsTheMaterialInUse(t *testing.T) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t, dir, "ca")
	p := ca.Issue(t, dir, "node")
	f, err := tlsfiles.Load(tlsfiles.Paths{CertFile: p.CertFile, KeyFile: p.KeyFile, CAFile: ca.CAFile}, tlsfiles.VerifyIfGiven)
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, f.ServerConfig())
	// A key that is not the certificate's: another pair's key.
	other := ca.Issue(t, dir, "other")
	own, _ := os.ReadFile(p.KeyFile)
	key, _ := os.ReadFile(other.KeyFile)
	if err := os.WriteFile(p.KeyFile, key, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := f.Reload(); err == nil {
		t.Fatal("Reload accepted a key that does not match its certificate")
	}
	if err := os.WriteFile(p.KeyFile, own, 0o600); err != nil {
		t.Fatal(err)
	}
	os.Remove(ca.CAFile)
	if err := f.Reload(); err == nil || !strings.Contains(err.Error(), "CA file") {
		t.Fatalf("Reload without the CA file: %v, want an error naming the CA file", err)
	}
	got, err := dial(addr, f.ClientConfig("localhost"))
	if err != nil {
		t.Fatalf("after failed reloads: %v", err)
	}
	if got != p.Cert.SerialNumber.String() {
		t.Fatalf("served certificate %s, want the one loaded first", got)
	}
}

func TestRequireLetsInOnlyClientsWhoseCertificateChainsToTheCA(t *testing.T) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t, dir, "ca")
	stranger := tlstest.NewCA(t, dir, "stranger")
	p := ca.Issue(t, dir, "node")
	f, err := tlsfiles.Load(tlsfiles.Paths{CertFile: p.CertFile, KeyFile: p.KeyFile, CAFile: ca.CAFile}, tlsfiles.RequireClientCert)
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, f.ServerConfig())
	if _, err := dial(addr, f.ClientConfig("127.0.0.1")); err != nil {
		t.Fatalf("a member's certificate was refused: %v", err)
	}
	noCert := f.ClientConfig("127.0.0.1")
	noCert.Certificates = nil
	if _, err := dial(addr, noCert); err == nil {
		t.Fatal("a client without a certificate got in")
	}
	bad := stranger.Issue(t, dir, "intruder")
	cert, err := tls.LoadX509KeyPair(bad.CertFile, bad.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	badConf := f.ClientConfig("127.0.0.1")
	badConf.Certificates = []tls.Certificate{cert}
	if _, err := dial(addr, badConf); err == nil {
		t.Fatal("a client whose certificate chains to another CA got in")
	}
}

func TestAClientRefusesAServerItsCADoesNotVouchFor(t *testing.T) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t, dir, "ca")
	stranger := tlstest.NewCA(t, dir, "stranger")
	p := stranger.Issue(t, dir, "impostor")
	srv, err := tlsfiles.Load(tlsfiles.Paths{CertFile: p.CertFile, KeyFile: p.KeyFile}, tlsfiles.NoClientCert)
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, srv.ServerConfig())
	me := ca.Issue(t, dir, "node")
	f, err := tlsfiles.Load(tlsfiles.Paths{CertFile: me.CertFile, KeyFile: me.KeyFile, CAFile: ca.CAFile}, tlsfiles.VerifyIfGiven)
	if err != nil {
		t.Fatal(err)
	}
	var uerr *tls.CertificateVerificationError
	if _, err := dial(addr, f.ClientConfig("127.0.0.1")); !errors.As(err, &uerr) {
		t.Fatalf("dialling an impostor: %v, want a certificate verification error", err)
	}
	// A certificate that names other hosts is refused too.
	if _, err := dial(addr, f.ClientConfig("db.example.com")); err == nil {
		t.Fatal("a certificate not naming the host dialled was accepted")
	}
}

func TestLoadSaysWhatIsWrongWithTheFiles(t *testing.T) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t, dir, "ca")
	p := ca.Issue(t, dir, "node")
	missing := filepath.Join(dir, "missing.pem")
	for _, c := range []struct {
		name  string
		paths tlsfiles.Paths
		auth  tlsfiles.ClientAuth
		want  string
	}{
		{"cert without key", tlsfiles.Paths{CertFile: p.CertFile}, tlsfiles.NoClientCert, "set both or neither"},
		{"unreadable cert", tlsfiles.Paths{CertFile: missing, KeyFile: p.KeyFile}, tlsfiles.NoClientCert, "missing.pem"},
		{"CA not PEM", tlsfiles.Paths{CertFile: p.CertFile, KeyFile: p.KeyFile, CAFile: p.KeyFile}, tlsfiles.NoClientCert, "no PEM certificate"},
		{"require without CA", tlsfiles.Paths{CertFile: p.CertFile, KeyFile: p.KeyFile}, tlsfiles.RequireClientCert, "CA file"},
		{"unknown client auth", tlsfiles.Paths{CertFile: p.CertFile, KeyFile: p.KeyFile}, "sometimes", "none, optional or require"},
	} {
		if _, err := tlsfiles.Load(c.paths, c.auth); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error containing %q", c.name, err, c.want)
		}
	}
}
