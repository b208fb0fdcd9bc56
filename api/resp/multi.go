package resp

import (
	"fmt"
	"strings"
)

// MULTI, EXEC, DISCARD, WATCH and UNWATCH.
//
// After MULTI a connection queues the key commands it sends (each answered
// +QUEUED) and EXEC runs them as one batch: their reads see the batch's
// earlier writes, and its writes reach the Store in one KeyStore.Apply, so
// that either all of them are made or none, and no other client's write
// comes between them. Reads of keys the batch did not write see the Store
// as it is when EXEC reads them. A command refused while queueing — an
// unknown command, a wrong number of arguments, a syntax error, one that
// is not allowed in a transaction — discards the transaction: EXEC then
// replies EXECABORT and applies nothing, as Redis does. WATCH is refused:
// the Store keeps no versions of keys to check at EXEC.

// multiState is a connection's transaction.
type multiState struct {
	active  bool // between MULTI and EXEC or DISCARD
	aborted bool // a command was refused while queueing
	queued  []queuedCmd
	args    int   // arguments queued, names included
	bytes   int64 // bytes of the arguments queued
	tx      *overlay
}

// queuedCmd is one command waiting for EXEC, with its own copy of its
// arguments.
type queuedCmd struct {
	cmd  *command
	args [][]byte
}

// abort marks the transaction, if any, as discarded at EXEC: a command
// was refused while queueing.
func (m *multiState) abort() {
	if m.active {
		m.aborted = true
	}
}

// displayName is the command's name as a person types it ("CLIENT
// SETNAME").
func displayName(cmd *command) string {
	return strings.ToUpper(strings.ReplaceAll(cmd.name, "|", " "))
}

// queue handles cmd inside MULTI and reports whether it did: a command
// allowed in a transaction is checked and queued, one that is not is
// refused, and the transaction's own commands (EXEC, DISCARD, …) are left
// to run.
func (c *conn) queue(cmd *command, args [][]byte) bool {
	if cmd.control {
		return false
	}
	m := &c.multi
	if !cmd.queue {
		c.error(fmt.Sprintf("ERR %s is not allowed in a transaction: EXEC runs reads and writes of keys only (GET, SET, MGET, MSET, DEL, EXISTS, EXPIRE, TTL, …)", displayName(cmd)))
		m.abort()
		return true
	}
	if cmd.check != nil {
		if msg := cmd.check(args); msg != "" {
			c.error(msg)
			m.abort()
			return true
		}
	}
	var n int64
	for _, a := range args {
		n += int64(len(a))
	}
	if m.args+len(args) > c.s.cfg.MaxArgs || m.bytes+n > c.s.cfg.MaxCommandBytes {
		c.error(fmt.Sprintf("ERR transaction too large: the commands queued by MULTI may hold at most %d arguments and %d bytes in all, as one command", c.s.cfg.MaxArgs, c.s.cfg.MaxCommandBytes))
		m.abort()
		return true
	}
	// The reader reuses its buffers for the next command: keep a copy.
	buf := make([]byte, 0, n)
	own := make([][]byte, len(args))
	for i, a := range args {
		buf = append(buf, a...)
		own[i] = buf[len(buf)-len(a) : len(buf) : len(buf)]
	}
	m.queued = append(m.queued, queuedCmd{cmd: cmd, args: own})
	m.args += len(args)
	m.bytes += n
	c.w.simple("QUEUED")
	return true
}

func (c *conn) multiCmd(args [][]byte) {
	switch {
	case c.multi.active:
		c.error("ERR MULTI calls can not be nested")
		c.multi.abort()
	case c.s.ks == nil:
		c.error("ERR MULTI needs a store that applies batches atomically (resp.KeyStore); this server's store cannot, so it queues nothing")
	default:
		c.multi = multiState{active: true}
		c.w.simple("OK")
	}
}

func (c *conn) discard(args [][]byte) {
	if !c.multi.active {
		c.error("ERR DISCARD without MULTI")
		return
	}
	c.multi = multiState{}
	c.w.simple("OK")
}

// execCmd runs the queued commands on an overlay of their writes, then
// applies the writes. If the Store refuses them, the replies written so
// far are taken back and EXEC replies with the Store's error instead.
func (c *conn) execCmd(args [][]byte) {
	m := c.multi
	c.multi = multiState{}
	switch {
	case !m.active:
		c.error("ERR EXEC without MULTI")
		return
	case m.aborted:
		c.error("EXECABORT Transaction discarded because of previous errors.")
		return
	}
	tx := newOverlay(c.direct)
	c.multi.tx = tx
	mark := c.w.mark()
	c.w.array(len(m.queued))
	for _, q := range m.queued {
		q.cmd.run(c, q.args)
	}
	c.multi.tx = nil
	c.status = "ok" // EXEC's own status; its commands' errors are in its reply
	if err := tx.commit(); err != nil {
		c.w.rollback(mark)
		c.storeError(err)
	}
}

func (c *conn) watch(args [][]byte) {
	c.error("ERR WATCH is not supported: the store keeps no key versions for EXEC to check; EXEC's writes apply all or none, without optimistic locking")
	c.multi.abort()
}

func (c *conn) unwatch(args [][]byte) { c.w.simple("OK") }

// writerMark is a point in a writer's output that rollback returns to.
type writerMark struct{ buf, segs, releases, direct int }

func (w *writer) mark() writerMark {
	return writerMark{len(w.buf), len(w.segs), len(w.releases), w.direct}
}

// rollback drops what was written since m, which must be after the last
// flush, and releases the values it held.
func (w *writer) rollback(m writerMark) {
	for i := m.releases; i < len(w.releases); i++ {
		w.releases[i]()
		w.releases[i] = nil
	}
	clear(w.segs[m.segs:])
	w.buf, w.segs, w.releases, w.direct = w.buf[:m.buf], w.segs[:m.segs], w.releases[:m.releases], m.direct
}
