package config

import (
	"fmt"
	"net"
	"strings"

	"github.com/kvstrata/kvstrata/auth"
	"github.com/kvstrata/kvstrata/internal/tlsfiles"
)

// checkSecurity reports the problems of the tls.*, auth.cluster-token-file
// and listen.resp-tls settings: every file is read, as the node will read
// it at start.
func (c *Config) checkSecurity(bad func(format string, args ...any)) {
	t := c.TLS
	if _, err := tlsfiles.ParseClientAuth(t.ClientAuth); err != nil {
		bad("tls.client-auth %v", err)
	}
	switch {
	case t.CertFile != "" && t.KeyFile == "":
		bad("tls.cert-file is set without tls.key-file: give the certificate's private key too")
	case t.CertFile == "" && t.KeyFile != "":
		bad("tls.key-file is set without tls.cert-file: give the key's certificate too")
	case t.CertFile != "":
		if err := tlsfiles.Check(tlsfiles.Paths{CertFile: t.CertFile, KeyFile: t.KeyFile}); err != nil {
			bad("tls.cert-file and tls.key-file: %v", err)
		}
	}
	if t.CAFile != "" {
		if err := tlsfiles.Check(tlsfiles.Paths{CAFile: t.CAFile}); err != nil {
			bad("tls.ca-file: %v", err)
		}
		if t.CertFile == "" {
			bad("tls.ca-file is set without tls.cert-file: the node serves TLS only with a certificate of its own")
		}
	}
	if t.ClientAuth == "require" && t.CAFile == "" {
		bad("tls.client-auth require needs tls.ca-file, the CA client certificates must chain to")
	}
	if c.Listen.RESPTLS != "" {
		if err := checkAddr(c.Listen.RESPTLS, true); err != nil {
			bad("listen.resp-tls %q %v", c.Listen.RESPTLS, err)
		}
		if t.CertFile == "" {
			bad("listen.resp-tls %q needs tls.cert-file and tls.key-file: it serves the Redis protocol over TLS", c.Listen.RESPTLS)
		}
	}
	if f := c.Auth.ClusterTokenFile; f != "" {
		if err := checkClusterToken(f); err != nil {
			bad("auth.cluster-token-file: %v", err)
		}
	}
}

// CheckExposure refuses a node that listens on an address other machines
// can reach (any but loopback; wildcards included) without both TLS
// (tls.cert-file) and authentication (auth.users-file), unless
// insecure.allow-remote says to; it returns a *Error that names the
// addresses and the setting. A data plane over UCX counts as unencrypted:
// UCX is for trusted networks only.
func (c *Config) CheckExposure() error {
	if c.Insecure.AllowRemote {
		return nil
	}
	var missing []string
	if c.TLS.CertFile == "" {
		missing = append(missing, "TLS (tls.cert-file)")
	}
	if c.Auth.UsersFile == "" {
		missing = append(missing, "authentication (auth.users-file)")
	}
	var exposed []string
	for _, a := range []struct{ name, addr string }{
		{"listen.grpc", c.Listen.GRPC}, {"listen.data", c.Listen.Data}, {"listen.resp", c.Listen.RESP},
		{"listen.resp-tls", c.Listen.RESPTLS}, {"listen.http", c.Listen.HTTP}, {"cluster.raft-addr", c.Cluster.RaftAddr},
	} {
		if a.addr == "" || IsLoopback(a.addr) {
			continue
		}
		if a.name == "listen.data" && c.Transport != "tcp" && len(missing) == 0 {
			exposed = append(exposed, fmt.Sprintf("%s %s (transport %s is not encrypted: trusted networks only)", a.name, a.addr, c.Transport))
			continue
		}
		if len(missing) > 0 {
			exposed = append(exposed, a.name+" "+a.addr)
		}
	}
	if len(exposed) == 0 {
		return nil
	}
	why := "without " + strings.Join(missing, " and ")
	if len(missing) == 0 {
		why = "with an unencrypted data plane"
	}
	return &Error{Problems: []string{fmt.Sprintf(
		"refusing to listen on %s %s: anyone who can reach the node could read, write and evict every block and join its cluster. "+
			"Set tls.cert-file, tls.key-file and auth.users-file, listen on 127.0.0.1, or, on a network you trust, set insecure.allow-remote=true (--insecure-allow-remote)",
		strings.Join(exposed, ", "), why)}}
}

// IsLoopback reports whether the host of addr ("host:port") is a
// loopback address or "localhost"; an empty host, a wildcard and any
// other name are not.
func IsLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// checkClusterToken reads the cluster token file as the node will.
func checkClusterToken(path string) error {
	_, err := auth.LoadClusterToken(path)
	return err
}
