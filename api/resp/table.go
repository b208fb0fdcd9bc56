package resp

import (
	"strings"

	"github.com/kvstrata/kvstrata/auth"
)

// command is one command the server knows: how to run it and how COMMAND
// and COMMAND DOCS describe it to clients (redis-cli builds its hints and
// help from them).
type command struct {
	id    int    // index in commandTable.list; subcommands share their parent's
	name  string // lower case; subcommands are "parent|sub"
	arity int    // Redis's convention: n > 0 exactly n words, name included; n < 0 at least -n
	run   func(c *conn, args [][]byte)

	flags                   []string // COMMAND flags: "readonly", "write", "fast", …
	acl                     []string // ACL categories, with '@'
	firstKey, lastKey, step int
	doc                     doc
	subs                    []*command

	// queue says the command may be queued by MULTI for EXEC; control,
	// that it runs at once inside MULTI (EXEC, DISCARD, …). check, if set,
	// finds at queue time the errors the command would reply at EXEC
	// (syntax, numbers): its error reply, or "".
	queue, control bool
	check          func(args [][]byte) string

	// needs are the roles an authenticated identity must hold to run the
	// command; noAuth, that it runs before authentication (auth.go).
	needs  auth.Roles
	noAuth bool
}

// doc is the part of a command's COMMAND DOCS entry clients use.
type doc struct {
	summary, since, group, complexity string
	args                              []arg
}

// arg describes one argument in COMMAND DOCS.
type arg struct {
	name, typ, token   string
	optional, multiple bool
	args               []arg // of a "oneof" or "block"
}

func argKey(name string) arg    { return arg{name: name, typ: "key"} }
func argString(name string) arg { return arg{name: name, typ: "string"} }
func argInt(name string) arg    { return arg{name: name, typ: "integer"} }
func argToken(token string) arg {
	return arg{name: strings.ToLower(token), typ: "pure-token", token: token}
}
func optional(a arg) arg               { a.optional = true; return a }
func multiple(a arg) arg               { a.multiple = true; return a }
func oneOf(name string, as ...arg) arg { return arg{name: name, typ: "oneof", args: as} }
func block(name string, as ...arg) arg { return arg{name: name, typ: "block", args: as} }

func (c *command) arityOK(n int) bool {
	if c.arity >= 0 {
		return n == c.arity
	}
	return n >= -c.arity
}

// sub returns the subcommand named by word, or nil.
func (c *command) sub(word []byte) *command {
	for _, s := range c.subs {
		if strings.EqualFold(s.name[len(c.name)+1:], string(word)) {
			return s
		}
	}
	return nil
}

// commandTable is the server's commands, looked up case-insensitively.
type commandTable struct {
	list   []*command
	byName map[string]*command
}

func (t *commandTable) lookup(word []byte) *command {
	if cmd, ok := t.byName[string(word)]; ok {
		return cmd
	}
	var lower [32]byte
	if len(word) > len(lower) {
		return nil
	}
	for i, c := range word {
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		lower[i] = c
	}
	return t.byName[string(lower[:len(word)])]
}

func newCommandTable() *commandTable {
	keys := multiple(argKey("key"))
	list := []*command{
		{name: "get", queue: true, arity: 2, run: (*conn).get, flags: []string{"readonly", "fast"}, acl: []string{"@read", "@string", "@fast"}, firstKey: 1, lastKey: 1, step: 1,
			doc: doc{summary: "Returns the string value of a key.", since: "1.0.0", group: "string", complexity: "O(1)", args: []arg{argKey("key")}}},
		{name: "set", queue: true, check: checkSet, arity: -3, run: (*conn).set, flags: []string{"write", "denyoom"}, acl: []string{"@write", "@string", "@slow"}, firstKey: 1, lastKey: 1, step: 1,
			doc: doc{summary: "Sets the string value of a key, optionally with a deadline: the key is gone by then (the cache may evict it sooner). GET is refused.", since: "1.0.0", group: "string", complexity: "O(1)",
				args: []arg{argKey("key"), argString("value"), optional(oneOf("condition", argToken("NX"), argToken("XX"))),
					optional(oneOf("expiration", arg{name: "seconds", typ: "integer", token: "EX"}, arg{name: "milliseconds", typ: "integer", token: "PX"},
						arg{name: "unix-time-seconds", typ: "unix-time", token: "EXAT"}, arg{name: "unix-time-milliseconds", typ: "unix-time", token: "PXAT"}, argToken("KEEPTTL")))}}},
		{name: "mget", queue: true, arity: -2, run: (*conn).mget, flags: []string{"readonly", "fast"}, acl: []string{"@read", "@string", "@fast"}, firstKey: 1, lastKey: -1, step: 1,
			doc: doc{summary: "Returns the string values of one or more keys.", since: "1.0.0", group: "string", complexity: "O(N) where N is the number of keys to retrieve.", args: []arg{keys}}},
		{name: "mset", queue: true, check: checkMSet, arity: -3, run: (*conn).mset, flags: []string{"write", "denyoom"}, acl: []string{"@write", "@string", "@slow"}, firstKey: 1, lastKey: -1, step: 2,
			doc: doc{summary: "Atomically creates or modifies the string values of one or more keys: all of them, or none.", since: "1.0.1", group: "string", complexity: "O(N) where N is the number of keys to set.",
				args: []arg{multiple(block("data", argKey("key"), argString("value")))}}},
		{name: "exists", queue: true, arity: -2, run: (*conn).exists, flags: []string{"readonly", "fast"}, acl: []string{"@keyspace", "@read", "@fast"}, firstKey: 1, lastKey: -1, step: 1,
			doc: doc{summary: "Determines whether one or more keys exist.", since: "1.0.0", group: "generic", complexity: "O(N) where N is the number of keys to check.", args: []arg{keys}}},
		{name: "del", queue: true, arity: -2, run: (*conn).del, flags: []string{"write"}, acl: []string{"@keyspace", "@write", "@slow"}, firstKey: 1, lastKey: -1, step: 1,
			doc: doc{summary: "Deletes one or more keys.", since: "1.0.0", group: "generic", complexity: "O(N) where N is the number of keys that will be removed.", args: []arg{keys}}},
		{name: "unlink", queue: true, arity: -2, run: (*conn).del, flags: []string{"write", "fast"}, acl: []string{"@keyspace", "@write", "@fast"}, firstKey: 1, lastKey: -1, step: 1,
			doc: doc{summary: "Deletes one or more keys (the same as DEL).", since: "4.0.0", group: "generic", complexity: "O(N) where N is the number of keys that will be removed.", args: []arg{keys}}},
		{name: "dbsize", arity: 1, run: (*conn).dbsize, flags: []string{"readonly", "fast"}, acl: []string{"@keyspace", "@read", "@fast"},
			doc: doc{summary: "Returns the number of keys in the database.", since: "1.0.0", group: "server", complexity: "O(1)"}},
		{name: "ping", queue: true, arity: -1, run: (*conn).ping, flags: []string{"fast"}, acl: []string{"@fast", "@connection"},
			doc: doc{summary: "Returns the server's liveliness response.", since: "1.0.0", group: "connection", complexity: "O(1)", args: []arg{optional(argString("message"))}}},
		{name: "echo", queue: true, arity: 2, run: (*conn).echo, flags: []string{"fast"}, acl: []string{"@fast", "@connection"},
			doc: doc{summary: "Returns the given string.", since: "1.0.0", group: "connection", complexity: "O(1)", args: []arg{argString("message")}}},
		{name: "select", arity: 2, run: (*conn).selectDB, flags: []string{"loading", "stale", "fast"}, acl: []string{"@fast", "@connection"},
			doc: doc{summary: "Changes the selected database; only database 0 exists.", since: "1.0.0", group: "connection", complexity: "O(1)", args: []arg{argInt("index")}}},
		{name: "hello", arity: -1, run: (*conn).hello, flags: []string{"noscript", "loading", "stale", "fast", "no_auth"}, acl: []string{"@fast", "@connection"},
			doc: doc{summary: "Handshakes with the server; only protocol 2 is spoken.", since: "6.0.0", group: "connection", complexity: "O(1)",
				args: []arg{optional(block("arguments", argInt("protover"), optional(block("auth", argToken("AUTH"), argString("username"), argString("password"))), optional(arg{name: "clientname", typ: "string", token: "SETNAME"})))}}},
		{name: "auth", arity: -2, run: (*conn).auth, flags: []string{"noscript", "loading", "stale", "fast", "no_auth"}, acl: []string{"@fast", "@connection"},
			doc: doc{summary: "Authenticates the connection as a user of the node's users file (the password alone: the user default); without a users file, answers as a Redis without requirepass.", since: "1.0.0", group: "connection", complexity: "O(N) where N is the number of passwords defined for the user",
				args: []arg{optional(argString("username")), argString("password")}}},
		{name: "quit", control: true, arity: -1, run: (*conn).quitCmd, flags: []string{"noscript", "loading", "stale", "fast", "no_auth"}, acl: []string{"@fast", "@connection"},
			doc: doc{summary: "Closes the connection.", since: "1.0.0", group: "connection", complexity: "O(1)"}},
		{name: "reset", control: true, arity: 1, run: (*conn).reset, flags: []string{"noscript", "loading", "stale", "fast", "no_auth"}, acl: []string{"@fast", "@connection"},
			doc: doc{summary: "Resets the connection: its name and library.", since: "6.2.0", group: "connection", complexity: "O(1)"}},
		{name: "info", arity: -1, run: (*conn).infoCmd, flags: []string{"loading", "stale"}, acl: []string{"@slow", "@dangerous"},
			doc: doc{summary: "Returns information and statistics about the server.", since: "1.0.0", group: "server", complexity: "O(1)", args: []arg{optional(multiple(argString("section")))}}},
		{name: "command", arity: -1, run: (*conn).commandInfoAll, flags: []string{"loading", "stale"}, acl: []string{"@slow", "@connection"},
			doc: doc{summary: "Returns detailed information about all commands.", since: "2.8.13", group: "server", complexity: "O(N) where N is the total number of commands"},
			subs: []*command{
				{name: "command|count", arity: 2, run: (*conn).commandCount, doc: doc{summary: "Returns a count of commands.", since: "2.8.13", group: "server", complexity: "O(1)"}},
				{name: "command|docs", arity: -2, run: (*conn).commandDocs, doc: doc{summary: "Returns documentary information about one, multiple or all commands.", since: "7.0.0", group: "server", complexity: "O(N) where N is the number of commands to look up", args: []arg{optional(multiple(argString("command-name")))}}},
				{name: "command|info", arity: -2, run: (*conn).commandInfo, doc: doc{summary: "Returns information about one, multiple or all commands.", since: "2.8.13", group: "server", complexity: "O(N) where N is the number of commands to look up", args: []arg{optional(multiple(argString("command-name")))}}},
				{name: "command|list", arity: 2, run: (*conn).commandList, doc: doc{summary: "Returns a list of command names.", since: "7.0.0", group: "server", complexity: "O(N) where N is the total number of commands"}},
			}},
		{name: "config", arity: -2, flags: []string{"loading", "stale"}, acl: []string{"@slow"},
			doc: doc{summary: "A container for server configuration commands.", since: "2.0.0", group: "server", complexity: "Depends on subcommand."},
			subs: []*command{
				{name: "config|get", arity: -3, run: (*conn).configGet, doc: doc{summary: "Returns the effective values of configuration parameters; the server is configured by the kvstrata node, not CONFIG SET.", since: "2.0.0", group: "server", complexity: "O(N) when N is the number of configuration parameters provided", args: []arg{multiple(arg{name: "parameter", typ: "pattern"})}}},
			}},
		{name: "client", arity: -2, flags: []string{"loading", "stale"}, acl: []string{"@slow", "@connection"},
			doc: doc{summary: "A container for client connection commands.", since: "2.4.0", group: "connection", complexity: "Depends on subcommand."},
			subs: []*command{
				{name: "client|getname", arity: 2, run: (*conn).clientGetName, doc: doc{summary: "Returns the name of the connection.", since: "2.6.9", group: "connection", complexity: "O(1)"}},
				{name: "client|id", arity: 2, run: (*conn).clientID, doc: doc{summary: "Returns the unique client ID of the connection.", since: "5.0.0", group: "connection", complexity: "O(1)"}},
				{name: "client|info", arity: 2, run: (*conn).clientInfo, doc: doc{summary: "Returns information about the connection.", since: "6.2.0", group: "connection", complexity: "O(1)"}},
				{name: "client|list", arity: -2, run: (*conn).clientList, doc: doc{summary: "Lists open connections.", since: "2.4.0", group: "connection", complexity: "O(N) where N is the number of client connections"}},
				{name: "client|setinfo", arity: 4, run: (*conn).clientSetInfo, doc: doc{summary: "Sets information specific to the client or connection.", since: "7.2.0", group: "connection", complexity: "O(1)",
					args: []arg{oneOf("attr", arg{name: "libname", typ: "string", token: "LIB-NAME"}, arg{name: "libver", typ: "string", token: "LIB-VER"})}}},
				{name: "client|setname", arity: 3, run: (*conn).clientSetName, doc: doc{summary: "Sets the connection name.", since: "2.6.9", group: "connection", complexity: "O(1)", args: []arg{argString("connection-name")}}},
			}},
	}
	list = append(list, keyspaceCommands()...)
	list = append(list, clusterCommands()...)
	list = append(list, updateCommands()...)
	list = append(list, aclCommand())
	t := &commandTable{list: list, byName: map[string]*command{}}
	for i, cmd := range list {
		cmd.id = i
		t.byName[cmd.name] = cmd
		if len(cmd.subs) > 0 {
			help := &command{name: cmd.name + "|help", arity: 2, run: (*conn).help,
				doc: doc{summary: "Returns helpful text about the different subcommands.", since: "5.0.0", group: cmd.doc.group, complexity: "O(1)"}}
			cmd.subs = append(cmd.subs, help)
			for _, sub := range cmd.subs {
				sub.id = i
				sub.flags, sub.acl = cmd.flags, cmd.acl
				setNeeds(sub)
			}
		}
		setNeeds(cmd)
	}
	return t
}
