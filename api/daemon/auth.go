package daemon

import (
	"fmt"

	"github.com/kvstrata/kvstrata/api/resp"
	"github.com/kvstrata/kvstrata/auth"
	"github.com/kvstrata/kvstrata/config"
)

// openUsers loads the users file auth.users-file names; nil when it names
// none (no authentication).
func openUsers(cfg config.Config) (*auth.Holder, error) {
	if cfg.Auth.UsersFile == "" {
		return nil, nil
	}
	h, err := auth.Open(cfg.Auth.UsersFile)
	if err != nil {
		return nil, fmt.Errorf("auth.users-file: %w", err)
	}
	return h, nil
}

// respAuth is the RESP server's authenticator: none without a users
// file (a nil *auth.Holder must not become a non-nil interface).
func respAuth(h *auth.Holder) resp.Authenticator {
	if h == nil {
		return nil
	}
	return h
}

// ReloadUsers reads the users file again (on SIGHUP): new AUTHs and calls
// are checked against it; connections already authenticated keep their
// identity. A file that does not load leaves the one in use, and the
// error says why. Without a users file it does nothing.
func (d *Node) ReloadUsers() error {
	if d.users == nil {
		return nil
	}
	if err := d.users.Reload(); err != nil {
		return err
	}
	if err := d.applyTenants(); err != nil {
		return fmt.Errorf("users file reloaded, its tenants not applied: %w", err)
	}
	d.log.Info("users file reloaded", "file", d.cfg.Auth.UsersFile, "users", d.users.Users().String())
	return nil
}

// applyTenants hands the users file's tenants and their quotas to the
// tiers (SetTenants).
func (d *Node) applyTenants() error {
	if d.users == nil {
		return nil
	}
	quotas := map[string]map[string]int64{}
	for _, t := range d.users.Users().Tenants() {
		q := map[string]int64{}
		for kind, n := range t.Quota {
			q[kind.String()] = n
		}
		quotas[t.Name] = q
	}
	return d.SetTenants(quotas)
}
