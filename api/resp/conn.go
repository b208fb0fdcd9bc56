package resp

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"
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

	name    atomic.Pointer[string]
	libName atomic.Pointer[string]
	libVer  atomic.Pointer[string]
	lastCmd atomic.Pointer[string] // full name of the last command run
	active  atomic.Int64           // unix nanoseconds of the last command

	quit bool // close after the replies are written (QUIT)

	// idle is set while the connection waits for the first byte of its
	// next command; Shutdown wakes only such connections.
	mu   sync.Mutex
	idle bool
}

// errDraining ends a connection at a command boundary during Shutdown.
var errDraining = errors.New("resp: server shutting down")

func newConn(s *Server, nc net.Conn, id uint64) *conn {
	c := &conn{s: s, nc: nc, id: id, created: time.Now()}
	c.rd = newReader(nc, &s.cfg)
	c.w = newWriter(nc, s.cfg.WriteBufferSize)
	c.rd.beforeRead = c.beforeRead
	c.rd.awaitCommand, c.rd.commandStarted = c.awaitCommand, c.commandStarted
	c.rd.nread, c.w.nwritten = &s.st.netIn, &s.st.netOut
	c.active.Store(c.created.UnixNano())
	return c
}

// serve reads and runs commands until the client leaves, sends something
// that is not RESP, or the server closes.
func (c *conn) serve() {
	defer c.s.drop(c)
	defer c.finish()
	for {
		args, err := c.rd.next()
		if err != nil {
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

// beforeRead runs before the reader may block: replies go out now, since
// the client may be waiting for them before it sends more.
func (c *conn) beforeRead() error {
	if err := c.w.flush(); err != nil {
		return err
	}
	if d := c.s.cfg.IdleTimeout; d > 0 {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.idle && c.s.draining.Load() {
			return errDraining // do not undo the deadline Shutdown set
		}
		return c.nc.SetReadDeadline(time.Now().Add(d))
	}
	return nil
}

// awaitCommand runs when the reader has no input left and waits for the
// next command: during Shutdown the connection ends here, its replies
// written.
func (c *conn) awaitCommand() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.s.draining.Load() {
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
	if c.s.draining.Load() {
		c.nc.SetReadDeadline(time.Time{})
	}
}

// wakeIfIdle ends the wait of a connection waiting for its next command.
func (c *conn) wakeIfIdle() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.idle {
		c.nc.SetReadDeadline(time.Now())
	}
}

// readFailed ends the connection after the reader failed.
func (c *conn) readFailed(err error) {
	var pe *ProtocolError
	var ne net.Error
	switch {
	case errors.As(err, &pe):
		c.s.st.protocolErrors.Add(1)
		c.error("ERR Protocol error: " + pe.Msg)
		c.w.flush()
		lingerClose(c.nc)
	case errors.As(err, &ne) && ne.Timeout() && !c.s.draining.Load():
		c.s.st.idleClosed.Add(1)
	}
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
	if cmd == nil {
		c.s.st.unknown.Add(1)
		c.error(unknownCommand(args))
		return
	}
	c.s.st.calls[cmd.id].Add(1)
	start := time.Now()
	c.active.Store(start.UnixNano())
	if !cmd.arityOK(len(args)) {
		c.arityError(cmd.name)
		return
	}
	if len(cmd.subs) > 0 && len(args) > 1 {
		sub := cmd.sub(args[1])
		if sub == nil {
			c.error(fmt.Sprintf("ERR unknown subcommand '%s'. Try %s HELP.", args[1][:min(len(args[1]), 128)], strings.ToUpper(cmd.name)))
			return
		}
		if !sub.arityOK(len(args)) {
			c.arityError(sub.name)
			return
		}
		cmd = sub
	}
	c.lastCmd.Store(&cmd.name)
	cmd.run(c, args)
	if f := c.s.cfg.OnCommand; f != nil {
		f(cmd.name, start)
	}
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
	return fmt.Sprintf("ERR unknown command '%s', with args beginning with: %s", args[0][:min(len(args[0]), 128)], b.String())
}

// error writes an error reply and counts it.
func (c *conn) error(msg string) {
	c.s.st.errorReplies.Add(1)
	c.w.error(msg)
}

func (c *conn) arityError(name string) {
	c.error("ERR wrong number of arguments for '" + name + "' command")
}

// storeError writes the reply for an error the Store returned.
func (c *conn) storeError(err error) {
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
	return fmt.Sprintf("id=%d addr=%s laddr=%s fd=-1 name=%s age=%d idle=%d flags=N db=0 sub=0 psub=0 ssub=0 multi=-1 qbuf=0 qbuf-free=0 argv-mem=0 multi-mem=0 rbs=%d rbp=0 obl=0 oll=0 omem=0 tot-mem=0 events=r cmd=%s user=default redir=-1 resp=2 lib-name=%s lib-ver=%s",
		c.id, c.nc.RemoteAddr(), c.nc.LocalAddr(), get(&c.name),
		int64(now.Sub(c.created).Seconds()), int64(now.Sub(time.Unix(0, c.active.Load())).Seconds()),
		len(c.rd.buf), cmd, get(&c.libName), get(&c.libVer))
}
