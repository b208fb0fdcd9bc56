package resp

import (
	"bytes"
	"cmp"
	"path"
	"strconv"
	"strings"
)

// The introspection commands: INFO, COMMAND and CONFIG GET.

func (c *conn) infoCmd(args [][]byte) {
	c.w.bulkString(c.s.infoText(c, args[1:]))
}

// commandInfoAll answers COMMAND: every command, as Redis 7 describes it.
func (c *conn) commandInfoAll(args [][]byte) {
	c.w.array(len(c.s.cmds.list))
	for _, cmd := range c.s.cmds.list {
		c.w.commandEntry(cmd)
	}
}

func (c *conn) commandCount(args [][]byte) { c.w.int(int64(len(c.s.cmds.list))) }

func (c *conn) commandList(args [][]byte) {
	names := make([]string, len(c.s.cmds.list))
	for i, cmd := range c.s.cmds.list {
		names[i] = cmd.name
	}
	c.w.stringArray(names)
}

// commandInfo answers COMMAND INFO [name …]: one entry per name, null for
// a name the server does not know; all commands without names.
func (c *conn) commandInfo(args [][]byte) {
	if len(args) == 2 {
		c.commandInfoAll(args)
		return
	}
	c.w.array(len(args) - 2)
	for _, name := range args[2:] {
		if cmd := c.s.cmds.find(name); cmd != nil {
			c.w.commandEntry(cmd)
		} else {
			c.w.null()
		}
	}
}

// commandDocs answers COMMAND DOCS [name …] with a map (a flat array in
// RESP2) from command name to its documentation; unknown names are left
// out. redis-cli builds its help and hints from it.
func (c *conn) commandDocs(args [][]byte) {
	cmds := c.s.cmds.list
	if len(args) > 2 {
		cmds = nil
		for _, name := range args[2:] {
			if cmd := c.s.cmds.find(name); cmd != nil {
				cmds = append(cmds, cmd)
			}
		}
	}
	c.w.array(2 * len(cmds))
	for _, cmd := range cmds {
		c.w.bulkString(cmd.name)
		c.w.docEntry(cmd)
	}
}

// find looks up a command or a subcommand ("client|setname").
func (t *commandTable) find(name []byte) *command {
	parent, sub, isSub := bytes.Cut(name, []byte("|"))
	cmd := t.lookup(parent)
	if cmd == nil || !isSub {
		return cmd
	}
	return cmd.sub(sub)
}

func (w *writer) simpleArray(ss []string) {
	w.array(len(ss))
	for _, s := range ss {
		w.simple(s)
	}
}

// commandEntry writes cmd as one entry of COMMAND's reply in Redis 7's
// format: name, arity, flags, first key, last key, step, ACL categories,
// tips, key specifications, subcommands.
func (w *writer) commandEntry(cmd *command) {
	w.array(10)
	w.bulkString(cmd.name)
	w.int(int64(cmd.arity))
	w.simpleArray(cmd.flags)
	w.int(int64(cmd.firstKey))
	w.int(int64(cmd.lastKey))
	w.int(int64(cmd.step))
	w.simpleArray(cmd.acl)
	w.array(0)
	w.array(0)
	w.array(len(cmd.subs))
	for _, sub := range cmd.subs {
		w.commandEntry(sub)
	}
}

// docEntry writes cmd's documentation map as a flat array.
func (w *writer) docEntry(cmd *command) {
	n := 8
	if len(cmd.doc.args) > 0 {
		n += 2
	}
	if len(cmd.subs) > 0 {
		n += 2
	}
	w.array(n)
	w.bulkString("summary")
	w.bulkString(cmd.doc.summary)
	w.bulkString("since")
	w.bulkString(cmd.doc.since)
	w.bulkString("group")
	w.bulkString(cmd.doc.group)
	w.bulkString("complexity")
	w.bulkString(cmd.doc.complexity)
	if len(cmd.doc.args) > 0 {
		w.bulkString("arguments")
		w.argEntries(cmd.doc.args)
	}
	if len(cmd.subs) > 0 {
		w.bulkString("subcommands")
		w.array(2 * len(cmd.subs))
		for _, sub := range cmd.subs {
			w.bulkString(sub.name)
			w.docEntry(sub)
		}
	}
}

func (w *writer) argEntries(as []arg) {
	w.array(len(as))
	for _, a := range as {
		var flags []string
		if a.optional {
			flags = append(flags, "optional")
		}
		if a.multiple {
			flags = append(flags, "multiple")
		}
		n := 4
		for _, present := range []bool{a.token != "", len(flags) > 0, len(a.args) > 0} {
			if present {
				n += 2
			}
		}
		w.array(n)
		w.bulkString("name")
		w.bulkString(a.name)
		w.bulkString("type")
		w.bulkString(a.typ)
		if a.token != "" {
			w.bulkString("token")
			w.bulkString(a.token)
		}
		if len(flags) > 0 {
			w.bulkString("flags")
			w.simpleArray(flags)
		}
		if len(a.args) > 0 {
			w.bulkString("arguments")
			w.argEntries(a.args)
		}
	}
}

// configGet answers CONFIG GET pattern [pattern …] with the few parameters
// clients ask for: redis-benchmark reads "save" and "appendonly" when it
// starts; maxmemory is the Store's, from its INFO memory field of that
// name (0 if it has none). The values describe this server; it has no
// CONFIG SET, as the node configures it.
func (c *conn) configGet(args [][]byte) {
	params := c.s.configParams()
	var out []string
	seen := map[string]bool{}
	for _, p := range args[2:] {
		pattern := strings.ToLower(string(p))
		for _, kv := range params {
			if ok, _ := path.Match(pattern, kv[0]); ok && !seen[kv[0]] {
				seen[kv[0]] = true
				out = append(out, kv[0], kv[1])
			}
		}
	}
	c.w.stringArray(out)
}

func (s *Server) configParams() [][2]string {
	return [][2]string{
		{"save", ""},
		{"appendonly", "no"},
		{"databases", "1"},
		{"maxclients", strconv.Itoa(s.cfg.MaxClients)},
		{"timeout", strconv.FormatInt(int64(s.cfg.IdleTimeout.Seconds()), 10)},
		{"proto-max-bulk-len", strconv.FormatInt(s.cfg.MaxBulkLen, 10)},
		{"client-query-buffer-limit", strconv.FormatInt(s.cfg.MaxCommandBytes, 10)},
		{"maxmemory", cmp.Or(s.infoValue("memory", "maxmemory"), "0")},
	}
}
