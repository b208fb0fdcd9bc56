package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvstrata/kvstrata/internal/tlsfiles/tlstest"
)

func TestTLSSettingsThatCannotWorkAreEachReported(t *testing.T) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t, dir, "ca")
	p := ca.Issue(t, dir, "node")
	short := filepath.Join(dir, "token")
	os.WriteFile(short, []byte("tiny"), 0o600)
	for _, c := range []struct {
		name string
		set  func(*Config)
		want string
	}{
		{"cert without key", func(c *Config) { c.TLS.CertFile = p.CertFile }, "tls.cert-file is set without tls.key-file"},
		{"key without cert", func(c *Config) { c.TLS.KeyFile = p.KeyFile }, "tls.key-file is set without tls.cert-file"},
		{"unreadable cert", func(c *Config) { c.TLS.CertFile, c.TLS.KeyFile = filepath.Join(dir, "none.pem"), p.KeyFile }, "none.pem"},
		{"CA not PEM", func(c *Config) { c.TLS.CertFile, c.TLS.KeyFile, c.TLS.CAFile = p.CertFile, p.KeyFile, p.KeyFile }, "tls.ca-file"},
		{"unknown client auth", func(c *Config) { c.TLS.ClientAuth = "always" }, `tls.client-auth "always" is not none, optional or require`},
		{"require without CA", func(c *Config) {
			c.TLS.CertFile, c.TLS.KeyFile, c.TLS.ClientAuth = p.CertFile, p.KeyFile, "require"
		}, "tls.client-auth require needs tls.ca-file"},
		{"resp-tls without cert", func(c *Config) { c.Listen.RESPTLS = "127.0.0.1:6390" }, `listen.resp-tls "127.0.0.1:6390" needs tls.cert-file`},
		{"short cluster token", func(c *Config) { c.Auth.ClusterTokenFile = short }, "auth.cluster-token-file"},
	} {
		cfg := Default()
		cfg.DRAM.Capacity = 64 << 20
		c.set(&cfg)
		err := cfg.Validate()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want a problem containing %q", c.name, err, c.want)
		}
	}
	cfg := Default()
	cfg.DRAM.Capacity = 64 << 20
	cfg.TLS = TLS{CertFile: p.CertFile, KeyFile: p.KeyFile, CAFile: ca.CAFile, ClientAuth: "require"}
	cfg.Listen.RESPTLS = "127.0.0.1:6390"
	if err := cfg.Validate(); err != nil {
		t.Fatalf("a complete TLS configuration: %v", err)
	}
}

func TestExposureNeedsTLSAndAuthenticationOrTheInsecureSwitch(t *testing.T) {
	cfg := Default()
	if err := cfg.CheckExposure(); err != nil {
		t.Fatalf("the defaults listen on loopback: %v", err)
	}
	cfg.Listen.RESP = "0.0.0.0:6380"
	cfg.Cluster.RaftAddr = "10.0.0.5:7072"
	err := cfg.CheckExposure()
	for _, want := range []string{"listen.resp 0.0.0.0:6380", "cluster.raft-addr 10.0.0.5:7072",
		"without TLS (tls.cert-file) and authentication (auth.users-file)", "insecure.allow-remote"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("CheckExposure: %v, want it to say %q", err, want)
		}
	}
	cfg.TLS.CertFile, cfg.Auth.UsersFile = "node.pem", "users.toml"
	if err := cfg.CheckExposure(); err != nil {
		t.Fatalf("with TLS and authentication: %v", err)
	}
	cfg.Listen.Data, cfg.Transport = "10.0.0.5:7071", "ucx"
	if err := cfg.CheckExposure(); err == nil || !strings.Contains(err.Error(), "transport ucx is not encrypted") {
		t.Fatalf("a UCX data plane on the network: %v", err)
	}
	cfg.Insecure.AllowRemote = true
	if err := cfg.CheckExposure(); err != nil {
		t.Fatalf("with insecure.allow-remote: %v", err)
	}
	for addr, want := range map[string]bool{"127.0.0.1:1": true, "[::1]:1": true, "localhost:1": true,
		":1": false, "0.0.0.0:1": false, "[::]:1": false, "10.1.2.3:1": false, "cache.example.com:1": false} {
		if got := IsLoopback(addr); got != want {
			t.Errorf("IsLoopback(%q) = %v, want %v", addr, got, want)
		}
	}
}
