package resp

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/kvstrata/kvstrata/auth"
)

// Authentication and authorization, as Redis 6's ACLs do them.
//
// With Config.Auth set, a connection starts unauthenticated: every
// command but AUTH, HELLO, QUIT and RESET — PING and unknown commands
// included — is answered "-NOAUTH Authentication required.", so a client
// that has not authenticated learns nothing else. AUTH password (as the
// user "default") or AUTH user password, or HELLO … AUTH user password,
// authenticates it; a refusal is "-WRONGPASS invalid username-password
// pair or user is disabled." whatever was wrong, and leaves the
// connection as it was. Each command then needs roles of the identity:
// the reads read, the writes write (those that return the old value,
// read as well), FLUSHDB, FLUSHALL, INFO and CLIENT LIST operate; a
// command the identity may not run is answered "-NOPERM …".
//
// The identity goes with every call to the Store in its context
// (auth.NewContext), so a store keeps each tenant's keys apart
// (respnode binds its namespace to the tenant): a tenant's keys are
// invisible to another, whose GET, EXISTS, SCAN, DBSIZE, DEL and FLUSHDB
// see only its own, and a key of another tenant reads exactly as a key
// that does not exist.
//
// Without Config.Auth nothing of this applies: every command runs, as on
// a Redis without requirepass, and the Store's context carries no
// identity.

// Authenticator checks the passwords AUTH and HELLO … AUTH present; an
// auth.Users or auth.Holder is one. Refusals must be auth.ErrWrongPass
// (any other error is refused the same way and logged).
type Authenticator interface {
	Password(user, secret string) (auth.Identity, error)
}

// defaultUser is the user AUTH with a password alone authenticates as.
const defaultUser = "default"

const (
	noAuthReply    = "NOAUTH Authentication required."
	wrongPassReply = "WRONGPASS invalid username-password pair or user is disabled."
)

// mustAuthenticate reports whether c must authenticate before running
// cmd (nil: an unknown command).
func (c *conn) mustAuthenticate(cmd *command) bool {
	return c.s.cfg.Auth != nil && !c.authed && (cmd == nil || !cmd.noAuth)
}

// permitted reports whether c's identity may run cmd, and writes the
// NOPERM reply if not.
func (c *conn) permitted(cmd *command) bool {
	if c.may(cmd) {
		return true
	}
	c.error(fmt.Sprintf("NOPERM User %s has no permissions to run the '%s' command", c.ident.User, cmd.name))
	return false
}

// may reports whether c's identity may run cmd.
func (c *conn) may(cmd *command) bool {
	return c.s.cfg.Auth == nil || c.ident.Roles&cmd.needs == cmd.needs || c.ident.Can(auth.Admin)
}

// login checks user's secret and, if it holds, makes the connection that
// identity; else it writes WRONGPASS (or, on a server without
// authentication, what Redis without requirepass answers).
func (c *conn) login(user, secret []byte) bool {
	a := c.s.cfg.Auth
	if a == nil {
		if string(user) != defaultUser {
			c.error(wrongPassReply)
			return false
		}
		return true
	}
	id, err := a.Password(string(user), string(secret))
	if err != nil {
		if !errors.Is(err, auth.ErrWrongPass) {
			c.s.cfg.Logger.Warn("resp: authentication failed", "user", string(user), "err", err)
		}
		c.error(wrongPassReply)
		return false
	}
	c.setIdentity(id)
	return true
}

// setIdentity makes c act as id: the Store sees id in the context of c's
// calls.
func (c *conn) setIdentity(id auth.Identity) {
	c.ident, c.authed = id, true
	c.direct.ctx = auth.NewContext(c.s.ctx, id)
	name := id.User
	c.user.Store(&name)
}

// logout makes c unauthenticated again (RESET).
func (c *conn) logout() {
	if c.s.cfg.Auth == nil {
		return
	}
	c.ident, c.authed = auth.Identity{}, false
	c.direct.ctx = c.s.ctx
	c.user.Store(nil)
}

// auth answers AUTH [user] password.
func (c *conn) auth(args [][]byte) {
	switch {
	case len(args) == 2 && c.s.cfg.Auth == nil:
		c.error("ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?")
	case len(args) == 2:
		if c.login([]byte(defaultUser), args[1]) {
			c.w.simple("OK")
		}
	case len(args) == 3:
		if c.login(args[1], args[2]) {
			c.w.simple("OK")
		}
	default:
		c.syntaxError()
	}
}

// userName is the user c acts as: "default" until it authenticates.
func (c *conn) userName() string {
	if u := c.user.Load(); u != nil {
		return *u
	}
	return defaultUser
}

// aclCommand is ACL, of which only WHOAMI is served.
func aclCommand() *command {
	return &command{name: "acl", arity: -2, flags: []string{"noscript", "loading", "stale"}, acl: []string{"@slow"},
		doc: doc{summary: "A container for Access List Control commands; only WHOAMI is served (users live in the node's users file).", since: "6.0.0", group: "server", complexity: "Depends on subcommand."},
		subs: []*command{
			{name: "acl|whoami", arity: 2, run: (*conn).aclWhoami, doc: doc{summary: "Returns the authenticated username of the current connection.", since: "6.0.0", group: "server", complexity: "O(1)"}},
		}}
}

func (c *conn) aclWhoami(args [][]byte) { c.w.bulkString(c.userName()) }

// The roles a command needs beyond its flags: those that hand back a
// value they replace or delete read it too; those that empty the
// keyspace or describe other clients and the node operate.
var (
	readsToo = map[string]bool{"getset": true, "getdel": true, "getex": true}
	operates = map[string]bool{"flushdb": true, "flushall": true, "info": true, "client|list": true}
)

// setNeeds fills in the roles each command needs, from its flags.
func setNeeds(cmd *command) {
	for _, f := range cmd.flags {
		switch f {
		case "readonly":
			cmd.needs |= auth.Roles(auth.Read)
		case "write":
			cmd.needs |= auth.Roles(auth.Write)
		case "no_auth":
			cmd.noAuth = true
		}
	}
	if readsToo[cmd.name] {
		cmd.needs |= auth.Roles(auth.Read)
	}
	if operates[cmd.name] {
		cmd.needs = auth.Roles(auth.Operate)
	}
}

// helloNeedsAuth reports whether a HELLO without AUTH must be refused,
// and writes Redis's reply if so.
func (c *conn) helloNeedsAuth(args [][]byte) bool {
	if c.s.cfg.Auth == nil || c.authed {
		return false
	}
	for i := 2; i < len(args); i++ {
		if bytes.EqualFold(args[i], []byte("AUTH")) {
			return false
		}
	}
	c.error("NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time")
	return true
}
