package resp

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// The connection commands: PING, ECHO, SELECT, HELLO, AUTH, QUIT, RESET,
// CLIENT, and the HELP of the container commands.

// RedisVersion is the Redis version the server claims in INFO and HELLO:
// clients pick features by it, and it speaks what those of 7.0 use.
const RedisVersion = "7.0.0"

func (c *conn) ping(args [][]byte) {
	switch len(args) {
	case 1:
		c.w.simple("PONG")
	case 2:
		c.w.bulk(args[1])
	default:
		c.arityError("ping")
	}
}

func (c *conn) echo(args [][]byte) { c.w.bulk(args[1]) }

func (c *conn) selectDB(args [][]byte) {
	n, ok := parseInt(args[1])
	switch {
	case !ok:
		c.error("ERR value is not an integer or out of range")
	case n != 0:
		c.error("ERR DB index is out of range: this server has only database 0")
	default:
		c.w.simple("OK")
	}
}

// hello answers HELLO [protover [AUTH username password] [SETNAME name]].
// Only protocol 2 is spoken: HELLO 3 fails with NOPROTO, and clients that
// try it fall back to RESP2.
func (c *conn) hello(args [][]byte) {
	if len(args) > 1 {
		v, ok := parseInt(args[1])
		if !ok {
			c.error("ERR Protocol version is not an integer or out of range")
			return
		}
		if v != 2 {
			c.error("NOPROTO unsupported protocol version: this server speaks RESP2 only")
			return
		}
	}
	if c.helloNeedsAuth(args) {
		return
	}
	var name []byte
	setName := false
	for i := 2; i < len(args); i++ {
		more := len(args) - i - 1
		switch {
		case bytes.EqualFold(args[i], []byte("AUTH")) && more >= 2:
			if !c.login(args[i+1], args[i+2]) {
				return
			}
			i += 2
		case bytes.EqualFold(args[i], []byte("SETNAME")) && more >= 1:
			name, setName = args[i+1], true
			i++
		default:
			c.error(fmt.Sprintf("ERR Syntax error in HELLO option '%s'", args[i]))
			return
		}
	}
	if setName && !c.setName(name) {
		return
	}
	c.w.array(14)
	c.w.bulkString("server")
	c.w.bulkString("redis")
	c.w.bulkString("version")
	c.w.bulkString(RedisVersion)
	c.w.bulkString("proto")
	c.w.int(2)
	c.w.bulkString("id")
	c.w.int(int64(c.id))
	c.w.bulkString("mode")
	c.w.bulkString("standalone")
	c.w.bulkString("role")
	c.w.bulkString("master")
	c.w.bulkString("modules")
	c.w.array(0)
}

func (c *conn) quitCmd(args [][]byte) {
	c.w.simple("OK")
	c.quit = true
}

func (c *conn) reset(args [][]byte) {
	c.name.Store(nil)
	c.libName.Store(nil)
	c.libVer.Store(nil)
	c.multi = multiState{}
	c.logout()
	c.w.simple("RESET")
}

// setName sets the connection's name, or writes Redis's error for a name
// with spaces or special characters.
func (c *conn) setName(name []byte) bool {
	for _, b := range name {
		if b < '!' || b > '~' {
			c.error("ERR Client names cannot contain spaces, newlines or special characters.")
			return false
		}
	}
	if len(name) == 0 {
		c.name.Store(nil)
		return true
	}
	s := string(name)
	c.name.Store(&s)
	return true
}

func (c *conn) clientSetName(args [][]byte) {
	if c.setName(args[2]) {
		c.w.simple("OK")
	}
}

func (c *conn) clientGetName(args [][]byte) {
	if n := c.name.Load(); n != nil {
		c.w.bulkString(*n)
		return
	}
	c.w.null()
}

func (c *conn) clientID(args [][]byte) { c.w.int(int64(c.id)) }

func (c *conn) clientInfo(args [][]byte) { c.w.bulkString(c.describe(time.Now()) + "\n") }

// clientList answers CLIENT LIST [TYPE normal] [ID id …]; every client is
// of type normal.
func (c *conn) clientList(args [][]byte) {
	var ids map[uint64]bool
	for i := 2; i < len(args); {
		switch {
		case bytes.EqualFold(args[i], []byte("TYPE")) && i+1 < len(args):
			if !bytes.EqualFold(args[i+1], []byte("normal")) {
				ids = map[uint64]bool{} // no client has another type
			}
			i += 2
		case bytes.EqualFold(args[i], []byte("ID")) && i+1 < len(args):
			ids = map[uint64]bool{}
			for i++; i < len(args); i++ {
				id, err := strconv.ParseUint(string(args[i]), 10, 64)
				if err != nil || id == 0 {
					c.error("ERR Invalid client ID")
					return
				}
				ids[id] = true
			}
		default:
			c.syntaxError()
			return
		}
	}
	var b strings.Builder
	now := time.Now()
	for _, other := range c.s.clients() {
		if ids == nil || ids[other.id] {
			b.WriteString(other.describe(now))
			b.WriteByte('\n')
		}
	}
	c.w.bulkString(b.String())
}

// clientSetInfo answers CLIENT SETINFO LIB-NAME|LIB-VER value, which
// redis-py and other clients of Redis 7.2 and later send on connecting.
func (c *conn) clientSetInfo(args [][]byte) {
	var field = &c.libName
	switch {
	case bytes.EqualFold(args[2], []byte("LIB-NAME")):
	case bytes.EqualFold(args[2], []byte("LIB-VER")):
		field = &c.libVer
	default:
		c.error(fmt.Sprintf("ERR Unrecognized option '%s'", args[2]))
		return
	}
	for _, b := range args[3] {
		if b < '!' || b > '~' {
			c.error(fmt.Sprintf("ERR %s cannot contain spaces, newlines or special characters.", bytes.ToUpper(args[2])))
			return
		}
	}
	v := string(args[3])
	field.Store(&v)
	c.w.simple("OK")
}

// help answers "<CONTAINER> HELP" with its subcommands and what they do.
func (c *conn) help(args [][]byte) {
	parent := c.s.cmds.lookup(args[0])
	up := strings.ToUpper(parent.name)
	lines := []string{up + " <subcommand> [<arg> [value] [opt] ...]. Subcommands are:"}
	for _, sub := range parent.subs {
		lines = append(lines, strings.ToUpper(sub.name[len(parent.name)+1:]), "    "+sub.doc.summary)
	}
	c.w.array(len(lines))
	for _, l := range lines {
		c.w.simple(l)
	}
}
