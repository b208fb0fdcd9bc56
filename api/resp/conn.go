package resp

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvstrata/kvstrata/auth"
)

// conn is one client connection. Its goroutine (serve) owns the reader,
// the writer and everything else except the fields other goroutines read
// for CLIENT LIST, which are atomic.
type conn struct {
	s       *Server
	nc      net.Conn
	id      uint64
	created time.Time
	rd      *reader
	w       *writer
	// direct is how the key commands reach the Store outside EXEC, with
	// the context that carries the connection's identity.
	direct direct
	// ident is who the connection authenticated as (authed), when the
	// server authenticates; user is its name, for CLIENT LIST.
	ident  auth.Identity
	authed bool
	user   atomic.Pointer[string]

	name    atomic.Pointer[string]
	libName atomic.Pointer[string]
	libVer  atomic.Pointer[string]
	lastCmd atomic.Pointer[string] // full name of the last command run
	active  atomic.Int64           // unix nanoseconds of the last command

	quit bool // close after the replies are written (QUIT)
	// status is how the command running now ended so far: "ok", or the
	// first word of its error reply in lower case ("err", "oom", …).
	status string
	// multi is the transaction MULTI opened, if any (multi.go).
	multi multiState

	// evicted is set, under the netserve Server's lock, when a new
	// connection takes this one's place; the connection ends at its next
	// read.
	evicted atomic.Bool

	// idle is set while the connection waits for the first byte of its
	// next command; Shutdown wakes only such connections. deadline is the
	// read deadline last set.
	mu       sync.Mutex
	idle     bool
	deadline time.Time
}

var (
	// errDraining ends a connection at a command boundary during Shutdown.
	errDraining = errors.New("resp: server shutting down")
	// errEvicted ends a connection closed to make room for a new one.
	errEvicted = errors.New("resp: connection closed to make room for another")
	// errBusy ends a connection whose command could not get memory in time.
	errBusy = errors.New("resp: no memory for the command in time")
)

// evictGrace is how long a command must have been arriving, slower than
// MinReadRate, before a full server may close its connection for a new one.
const evictGrace = time.Second

func newConn(s *Server, nc net.Conn, id uint64) *conn {
	c := &conn{s: s, nc: nc, id: id, created: time.Now(), direct: direct{s, s.ctx}}
	sock := newSock(nc)
	c.rd = newReader(sock, &s.cfg)
	c.w = newWriter(sock, s.cfg.WriteBufferSize)
	c.rd.beforeRead = c.beforeRead
	c.rd.awaitCommand, c.rd.commandStarted = c.awaitCommand, c.commandStarted
	c.rd.nread, c.w.nwritten = &s.st.netIn, &s.st.netOut
	c.rd.hold, c.rd.unhold = c.hold, s.pending.release
	if s.reserver != nil {
		c.rd.reserveSet = c.reserveSet
	}
	c.active.Store(c.created.UnixNano())
	return c
}

// Serve reads and runs commands until the client leaves, sends something
// that is not RESP, or the server closes (netserve.Conn).
func (c *conn) Serve() {
	defer c.finish()
	for {
		args, err := c.rd.next()
		if err != nil {
			if ref := (*refusedError)(nil); errors.As(err, &ref) {
				c.s.st.commandsProcessed.Add(1)
				c.error(ref.msg)
				c.multi.abort()
				continue
			}
			c.readFailed(err)
			return
		}
		c.exec(args)
		if c.quit {
			c.w.flush()
			lingerClose(c.nc)
			return
		}
		if c.w.full() && c.w.flush() != nil {
			return
		}
	}
}

// reserveSet asks the store for room for the value of a plain SET the
// connection may run now (authenticated and permitted, outside MULTI), of
// size bytes under key; nil when it gives none, and the value is read as
// any argument.
func (c *conn) reserveSet(name, key []byte, size int) PendingSet {
	if c.multi.active {
		return nil
	}
	cmd := c.s.cmds.lookup(name)
	if cmd == nil || cmd.name != "set" || c.mustAuthenticate(cmd) || !c.may(cmd) {
		return nil
	}
	p, ok, err := c.s.reserver.ReserveSet(c.direct.ctx, string(key), size)
	if err != nil || !ok {
		return nil
	}
	if len(p.Bytes()) != size {
		p.Abort()
		return nil
	}
	return p
}

// beforeRead runs before the reader may block: replies go out now, since
// the client may be waiting for them before it sends more. It sets the
// read deadline: the command's, while one is arriving, else IdleTimeout's.
func (c *conn) beforeRead() error {
	if err := c.w.flush(); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.evicted.Load():
		return errEvicted
	case c.idle && c.s.net.Draining():
		return errDraining // do not undo the deadline Shutdown set
	}
	var dl time.Time
	if c.rd.inCmd {
		dl = c.commandDeadline(time.Now())
	} else if d := c.s.cfg.IdleTimeout; d > 0 {
		dl = time.Now().Add(d)
	}
	if dl.Equal(c.deadline) {
		return nil
	}
	c.deadline = dl
	return c.nc.SetReadDeadline(dl)
}

// commandDeadline is when the command being read must have arrived whole:
// CommandTimeout after it first waited for input, plus a second for every
// MinReadRate bytes received since. Bytes trickling in slower than that
// do not keep a connection, as they would an idle timer.
func (c *conn) commandDeadline(now time.Time) time.Time {
	st := c.rd.started.Load()
	if st == 0 {
		st = now.UnixNano()
		c.rd.started.Store(st)
	}
	got := c.rd.cmdRead
	c.rd.got.Store(got)
	allowance := c.s.cfg.CommandTimeout + time.Duration(got*int64(time.Second)/c.s.cfg.MinReadRate)
	return time.Unix(0, st).Add(allowance)
}

// hold takes n bytes of the server's budget for the command being read,
// waiting for them at most CommandTimeout. The wait is the server's, not
// the client's: it is not counted against the command's deadline, and a
// full server does not close a connection for it.
func (c *conn) hold(n int64) error {
	start := time.Now()
	c.rd.waiting.Store(true)
	ok := c.s.pending.acquire(c.s.ctx, n, start.Add(c.s.cfg.CommandTimeout))
	c.rd.waiting.Store(false)
	if st := c.rd.started.Load(); st != 0 {
		c.rd.started.Store(st + int64(time.Since(start)))
	}
	if !ok {
		return errBusy
	}
	return nil
}

// evict makes c end at its next read, or now if it is blocked reading or
// writing; the caller holds the netserve Server's lock.
func (c *conn) evict() {
	c.evicted.Store(true)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.deadline = time.Now()
	c.nc.SetDeadline(c.deadline)
}

// isIdle reports whether c waits for the first byte of its next command.
func (c *conn) isIdle() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.idle
}

// awaitCommand runs when the reader has no input left and waits for the
// next command: during Shutdown the connection ends here, its replies
// written.
func (c *conn) awaitCommand() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.s.net.Draining() {
		c.w.flush()
		return errDraining
	}
	c.idle = true
	return nil
}

// commandStarted runs when input arrives after awaitCommand. A command
// that started while Shutdown woke the connection is read to its end.
func (c *conn) commandStarted() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.idle = false
	if c.s.net.Draining() {
		c.deadline = time.Time{}
		c.nc.SetReadDeadline(c.deadline)
	}
}

// Cut closes the connection now (netserve.Conn): Close, or Shutdown's
// deadline.
func (c *conn) Cut() { c.nc.Close() }

// Drain ends the wait of a connection waiting for its next command
// (netserve.Conn); one in the middle of a command ends after it.
func (c *conn) Drain() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.idle {
		c.deadline = time.Now()
		c.nc.SetReadDeadline(c.deadline)
	}
}

// readFailed ends the connection after the reader failed. A client cut
// in the middle of a command is told why.
func (c *conn) readFailed(err error) {
	var pe *ProtocolError
	var ne net.Error
	timeout := errors.As(err, &ne) && ne.Timeout()
	switch {
	case errors.As(err, &pe):
		c.s.st.protocolErrors.Add(1)
		c.closeWith("ERR Protocol error: " + pe.Msg)
	case errors.Is(err, errBusy):
		c.s.st.busyClosed.Add(1)
		c.closeWith(fmt.Sprintf("ERR server busy: commands being received hold its limit of %d bytes (maxpendingbytes); retry later",
			c.s.cfg.MaxPendingBytes))
	case c.evicted.Load():
		c.s.st.evicted.Add(1)
		if c.rd.inCmd {
			c.closeWith(fmt.Sprintf("ERR connection closed for a new client: the server is at its limit of %d clients and this command arrived at under %d bytes/s",
				c.s.cfg.MaxClients, c.s.cfg.MinReadRate))
		}
	case timeout && c.rd.inCmd:
		c.s.st.slowClosed.Add(1)
		c.closeWith(fmt.Sprintf("ERR command not received in time: a command must arrive within %v plus 1s per %d bytes",
			c.s.cfg.CommandTimeout, c.s.cfg.MinReadRate))
	case timeout && !c.s.net.Draining():
		c.s.st.idleClosed.Add(1)
	}
}

// closeWith replies msg, as an error, and closes the connection.
func (c *conn) closeWith(msg string) {
	c.nc.SetWriteDeadline(time.Now().Add(time.Second))
	c.error(msg)
	c.w.flush()
	lingerClose(c.nc)
}

// finish closes the socket and hands back what the connection holds.
func (c *conn) finish() {
	c.nc.Close()
	c.w.discard()
	c.rd.release()
}

// exec runs one command.
func (c *conn) exec(args [][]byte) {
	c.s.st.commandsProcessed.Add(1)
	cmd := c.s.cmds.lookup(args[0])
	if c.mustAuthenticate(cmd) {
		c.error(noAuthReply)
		c.multi.abort()
		return
	}
	if cmd == nil {
		c.s.st.unknown.Add(1)
		c.error(unknownCommand(args))
		c.multi.abort()
		return
	}
	c.s.st.calls[cmd.id].Add(1)
	start := time.Now()
	c.active.Store(start.UnixNano())
	c.status = "ok"
	if f := c.s.cfg.OnCommand; f != nil {
		defer func() { f(cmd.name, c.status, start) }()
	}
	if !cmd.arityOK(len(args)) {
		c.arityError(cmd.name)
		c.multi.abort()
		return
	}
	if len(cmd.subs) > 0 && len(args) > 1 {
		sub := cmd.sub(args[1])
		if sub == nil {
			c.error(fmt.Sprintf("ERR unknown subcommand '%s'. Try %s HELP.", args[1][:min(len(args[1]), 128)], strings.ToUpper(cmd.name)))
			c.multi.abort()
			return
		}
		if !sub.arityOK(len(args)) {
			c.arityError(sub.name)
			c.multi.abort()
			return
		}
		cmd = sub
	}
	if !c.permitted(cmd) {
		c.multi.abort()
		return
	}
	c.lastCmd.Store(&cmd.name)
	if c.multi.active && c.queue(cmd, args) {
		return
	}
	cmd.run(c, args)
}

// errorCode is the first word of an error reply in lower case, the
// status OnCommand reports: "err", "oom", "tryagain", "wrongtype", ….
func errorCode(msg string) string {
	code, _, _ := strings.Cut(msg, " ")
	return strings.ToLower(code)
}

// unknownCommand is Redis's reply to a command it does not know, quoting
// up to 128 bytes of its arguments.
func unknownCommand(args [][]byte) string {
	var b strings.Builder
	for _, a := range args[1:] {
		if b.Len() >= 128 {
			break
		}
		fmt.Fprintf(&b, "'%s' ", a[:min(len(a), 128-b.Len())])
	}
	return fmt.Sprintf("ERR unknown command '%s', with args beginning with: %s", args[0][:min(len(args[0]), 128)], b.String()) + notServed(args[0])
}

// error writes an error reply and counts it.
func (c *conn) error(msg string) {
	c.s.st.errorReplies.Add(1)
	c.status = errorCode(msg)
	c.w.error(msg)
}

func (c *conn) arityError(name string) {
	c.error("ERR wrong number of arguments for '" + name + "' command")
}

// storeError writes the reply for an error the Store returned.
func (c *conn) storeError(err error) {
	var lacks *lacksError
	if errors.As(err, &lacks) {
		name := "the command"
		if n := c.lastCmd.Load(); n != nil {
			name = strings.ToUpper(strings.ReplaceAll(*n, "|", " "))
		}
		c.error("ERR " + name + " " + lacks.Error())
		return
	}
	c.error(storeErrorReply(err))
}

func (c *conn) syntaxError() { c.error("ERR syntax error") }

// describe is the connection's line in CLIENT LIST and CLIENT INFO.
func (c *conn) describe(now time.Time) string {
	get := func(p *atomic.Pointer[string]) string {
		if v := p.Load(); v != nil {
			return *v
		}
		return ""
	}
	cmd := get(&c.lastCmd)
	if cmd == "" {
		cmd = "NULL"
	}
	return fmt.Sprintf("id=%d addr=%s laddr=%s fd=-1 name=%s age=%d idle=%d flags=N db=0 sub=0 psub=0 ssub=0 multi=-1 qbuf=0 qbuf-free=0 argv-mem=0 multi-mem=0 rbs=%d rbp=0 obl=0 oll=0 omem=0 tot-mem=0 events=r cmd=%s user=%s redir=-1 resp=2 lib-name=%s lib-ver=%s",
		c.id, c.nc.RemoteAddr(), c.nc.LocalAddr(), get(&c.name),
		int64(now.Sub(c.created).Seconds()), int64(now.Sub(time.Unix(0, c.active.Load())).Seconds()),
		len(c.rd.buf), cmd, c.userName(), get(&c.libName), get(&c.libVer))
}
