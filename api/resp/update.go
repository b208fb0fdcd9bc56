package resp

import (
	"errors"
	"math"
	"strconv"
)

// The read-modify-write string commands — INCR, INCRBY, DECR, DECRBY,
// APPEND, GETSET, GETDEL — through Updater. They are not queued in MULTI
// (EXEC's overlay cannot update in place): there they abort the
// transaction.

var errNoUpdate = &lacksError{"updates keys in place (resp.Updater); this server's store cannot"}

// errReply is an error of an update's fn that is replied as it is.
type errReply string

func (e errReply) Error() string { return string(e) }

// update runs fn on key through the Store's Updater and replies the
// error, if any; it reports whether it succeeded.
func (c *conn) update(key []byte, fn func(old []byte, info KeyInfo, found bool) (Write, error)) bool {
	u, ok := c.s.store.(Updater)
	if !ok {
		c.storeError(errNoUpdate)
		return false
	}
	err := u.Update(c.direct.ctx, string(key), fn)
	var reply errReply
	switch {
	case errors.As(err, &reply):
		c.error(string(reply))
		return false
	case err != nil:
		c.storeError(err)
		return false
	}
	return true
}

// incrBy adds by to the integer key holds (0 if missing), keeping its
// deadline, as Redis's INCRBY.
func (c *conn) incrBy(key []byte, by int64) {
	var n int64
	if c.update(key, func(old []byte, info KeyInfo, found bool) (Write, error) {
		var cur int64
		if found {
			v, err := strconv.ParseInt(string(old), 10, 64)
			if err != nil || strconv.FormatInt(v, 10) != string(old) {
				return Write{}, errReply(errNotInteger)
			}
			cur = v
		}
		if by > 0 && cur > math.MaxInt64-by || by < 0 && cur < math.MinInt64-by {
			return Write{}, errReply("ERR increment or decrement would overflow")
		}
		n = cur + by
		return Write{Value: strconv.AppendInt(nil, n, 10), ExpireAt: info.ExpireAt}, nil
	}) {
		c.w.int(n)
	}
}

func (c *conn) incr(args [][]byte) { c.incrBy(args[1], 1) }
func (c *conn) decr(args [][]byte) { c.incrBy(args[1], -1) }

func (c *conn) incrByCmd(args [][]byte) {
	by, ok := parseInt(args[2])
	if !ok {
		c.error(errNotInteger)
		return
	}
	c.incrBy(args[1], by)
}

func (c *conn) decrByCmd(args [][]byte) {
	by, ok := parseInt(args[2])
	if !ok || by == math.MinInt64 {
		c.error(errNotInteger)
		return
	}
	c.incrBy(args[1], -by)
}

// appendCmd appends to key's value (stores it if missing), keeping its
// deadline, and replies the new length.
func (c *conn) appendCmd(args [][]byte) {
	var n int
	if c.update(args[1], func(old []byte, info KeyInfo, _ bool) (Write, error) {
		v := append(append(make([]byte, 0, len(old)+len(args[2])), old...), args[2]...)
		n = len(v)
		return Write{Value: v, ExpireAt: info.ExpireAt}, nil
	}) {
		c.w.int(int64(n))
	}
}

// getset stores the value, without a deadline, and replies the old one.
func (c *conn) getset(args [][]byte) {
	var prev []byte
	var had bool
	if c.update(args[1], func(old []byte, _ KeyInfo, found bool) (Write, error) {
		prev, had = append([]byte(nil), old...), found
		return Write{Value: args[2]}, nil
	}) {
		c.bulkOrNull(prev, had)
	}
}

// getdel deletes key and replies its value.
func (c *conn) getdel(args [][]byte) {
	var prev []byte
	var had bool
	if c.update(args[1], func(old []byte, _ KeyInfo, found bool) (Write, error) {
		prev, had = append([]byte(nil), old...), found
		return Write{Delete: true}, nil
	}) {
		c.bulkOrNull(prev, had)
	}
}

func (c *conn) bulkOrNull(v []byte, ok bool) {
	if !ok {
		c.w.null()
		return
	}
	c.w.bulk(v)
}

// updateCommands are the commands above, for the table.
func updateCommands() []*command {
	key := argKey("key")
	wr := []string{"write", "denyoom", "fast"}
	acl := []string{"@write", "@string", "@fast"}
	cmd := func(name string, arity int, run func(*conn, [][]byte), summary, since string, args ...arg) *command {
		return &command{name: name, arity: arity, run: run, flags: wr, acl: acl, firstKey: 1, lastKey: 1, step: 1,
			doc: doc{summary: summary + " Atomic on the node; not allowed in MULTI.", since: since, group: "string", complexity: "O(1)", args: append([]arg{key}, args...)}}
	}
	return []*command{
		cmd("incr", 2, (*conn).incr, "Increments the integer value of a key by one, keeping its deadline; a missing key counts as 0.", "1.0.0"),
		cmd("decr", 2, (*conn).decr, "Decrements the integer value of a key by one, keeping its deadline; a missing key counts as 0.", "1.0.0"),
		cmd("incrby", 3, (*conn).incrByCmd, "Increments the integer value of a key by a number, keeping its deadline; a missing key counts as 0.", "1.0.0", argInt("increment")),
		cmd("decrby", 3, (*conn).decrByCmd, "Decrements the integer value of a key by a number, keeping its deadline; a missing key counts as 0.", "1.0.0", argInt("decrement")),
		cmd("append", 3, (*conn).appendCmd, "Appends a string to the value of a key, keeping its deadline; creates the key if missing.", "2.0.0", argString("value")),
		cmd("getset", 3, (*conn).getset, "Returns the old value of a key after setting it to a new one, without a deadline.", "1.0.0", argString("value")),
		cmd("getdel", 2, (*conn).getdel, "Returns the value of a key after deleting it.", "6.2.0"),
	}
}
