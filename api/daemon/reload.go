package daemon

import (
	"errors"
	"fmt"
)

// reloader is one thing Reload reads again: the TLS files, the cluster
// token, the users file.
type reloader struct {
	name   string
	reload func() error
}

// Reload reads the node's files again (internal/lifecycle calls it on
// SIGHUP): its TLS certificate, key and CA, the cluster token. New
// connections get what it read; open ones keep what they have. A file that
// fails to load keeps what was in use, and its error is returned. It logs
// one line per file set, never a secret.
func (d *Node) Reload() error {
	var errs []error
	for _, r := range d.reloaders {
		if err := r.reload(); err != nil {
			d.log.Error("reload failed; keeping what was in use", "what", r.name, "err", err)
			errs = append(errs, fmt.Errorf("reload %s: %w", r.name, err))
			continue
		}
		attrs := []any{"what", r.name}
		if r.name == "tls" {
			if c := d.sec.tls.Certificate(); c != nil {
				attrs = append(attrs, "subject", c.Subject.String(), "serial", c.SerialNumber.String(), "not-after", c.NotAfter)
			}
		}
		d.log.Info("reloaded", attrs...)
	}
	return errors.Join(errs...)
}
