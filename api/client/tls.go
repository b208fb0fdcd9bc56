package client

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
)

// TLSFiles name what a client needs to speak TLS to nodes.
type TLSFiles struct {
	// CAFile holds the PEM certificates the nodes' certificates must
	// chain to; empty: the system's roots.
	CAFile string
	// CertFile and KeyFile are the client's own certificate and key, for
	// nodes that ask for one (tls.client-auth optional or require); both
	// or neither.
	CertFile, KeyFile string
	// ServerName is the name the nodes' certificates must hold, where it
	// is not the host dialled.
	ServerName string
}

// TLSConfig reads the files of f into a config for Options.TLS.
func TLSConfig(f TLSFiles) (*tls.Config, error) {
	c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: f.ServerName}
	if f.CAFile != "" {
		pem, err := os.ReadFile(f.CAFile)
		if err != nil {
			return nil, fmt.Errorf("kvstrata: TLS CA file: %w", err)
		}
		c.RootCAs = x509.NewCertPool()
		if !c.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("kvstrata: TLS CA file %s holds no PEM certificate", f.CAFile)
		}
	}
	switch {
	case (f.CertFile == "") != (f.KeyFile == ""):
		return nil, errors.New("kvstrata: a TLS client certificate and its key go together: give both or neither")
	case f.CertFile != "":
		cert, err := tls.LoadX509KeyPair(f.CertFile, f.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("kvstrata: TLS client certificate: %w", err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return c, nil
}
