package resp

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/bits"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/kvstrata/kvstrata/internal/units"
)

// ProtocolError is input that is not RESP: the server replies
// "-ERR Protocol error: <Msg>" and closes that connection.
type ProtocolError struct{ Msg string }

func (e *ProtocolError) Error() string { return "resp: protocol error: " + e.Msg }

func protoErr(format string, args ...any) error {
	return &ProtocolError{Msg: fmt.Sprintf(format, args...)}
}

// refusedError is a well-formed command the reader read to its end but
// did not keep, because an argument or the whole was over a limit: the
// server replies "-<msg>" and goes on with the next command.
type refusedError struct{ msg string }

func (e *refusedError) Error() string { return "resp: command refused: " + e.msg }

const (
	// maxHeaderLine bounds a "*<count>" or "$<length>" line, CRLF included;
	// the longest valid one is 23 bytes.
	maxHeaderLine = 64
	// maxSmallArg is the longest argument copied out of the read buffer;
	// longer ones are read straight from the socket into a slab.
	maxSmallArg = 32 << 10
	// keepArena and keepArgs bound what a reader keeps between commands.
	keepArena = 64 << 10
	keepArgs  = 1024
	// firstSlab is the first buffer of a long argument; it grows by
	// slabGrowth as the argument's bytes arrive, so a connection holds at
	// most slabGrowth times what it was sent, not what it announced.
	firstSlab  = 64 << 10
	slabGrowth = 4
	// freeHold is the memory a command may hold before it takes from the
	// server's budget (Config.MaxPendingBytes): short commands never do.
	freeHold = 64 << 10
	// maxPooledSlab is the largest slab kept for reuse; longer arguments
	// get a slab of their exact size, handed back to the garbage collector.
	maxPooledSlab = 16 << 20
	// filledRead is the most read from the socket into a store's room
	// before the store is told (PendingSet.Filled): small enough that the
	// piece is still in the CPU's cache when the store hashes it.
	filledRead = 128 << 10
	// copiedPiece is the most copied from the read buffer into a store's
	// room before the store is told, as index.CopySum copies and hashes.
	copiedPiece = 16 << 10
	// headerRoom is read buffer beyond Config.ReadBufferSize (a
	// sixteenth of it, at most 4 KiB) for the header of a command and the
	// CRLF after its value, so that a SET of a value as long as the
	// buffer (64 KiB by default, a common block size) arrives in one
	// read, not one for the value and a second for its last bytes.
	maxHeaderRoom = 4 << 10
)

// reader reads commands from one connection: RESP arrays of bulk strings
// ("*2\r\n$3\r\nGET\r\n$1\r\nk\r\n") and inline commands ("GET k\r\n").
// It reads through a fixed buffer, so pipelined commands cost one read
// for many; it never allocates for a length a client declared beyond the
// limits of its Config. Not safe for concurrent use.
type reader struct {
	src io.Reader
	// beforeRead runs before every read of src that may block: the
	// connection flushes its replies there and sets its idle deadline.
	beforeRead func() error
	// awaitCommand runs before the reader waits for a new command with no
	// input left, and commandStarted when input arrives after it; an error
	// from awaitCommand ends next with that error.
	awaitCommand   func() error
	commandStarted func()

	buf  []byte // fixed size; unread input is buf[r:w]
	r, w int
	// maxInline is the longest inline command, its line end included:
	// Config.ReadBufferSize, less than buf.
	maxInline int

	maxArgs  int
	maxBulk  int64
	maxCmd   int64
	smallArg int
	// bulkSetting names MaxBulkLen in the reply to a longer argument.
	bulkSetting string

	// The current command: refs locate its arguments, in arena (copies of
	// short ones) or in slabs (long ones); args is built from refs once
	// the command is complete, since arena may move as it grows.
	refs  []argRef
	args  [][]byte
	arena []byte
	slabs []*[]byte

	nread *atomic.Uint64 // counts the bytes read from src, if not nil

	// reserveSet, if set, is asked for room in the store for the value of
	// a plain SET (name, key, size) longer than smallArg before it is
	// read; nil means none. pending is the room it gave for the current
	// command, which the value was read into (pendingRoom), until the
	// command takes it (takePending) or release aborts it.
	reserveSet  func(name, key []byte, size int) PendingSet
	pending     PendingSet
	pendingRoom []byte

	// Progress of the command being read, for its connection's deadline
	// and for choosing which connection a full server closes. inCmd is set
	// from the command's first byte until it is read whole; cmdRead counts
	// the bytes read from src meanwhile. started and got are the
	// connection's to set (when the command first waits for input) and
	// publish; other goroutines read them, and waiting, which is set while
	// the command waits for memory rather than for its client.
	inCmd   bool
	cmdRead int64
	started atomic.Int64 // unix nanoseconds; 0: no command waiting
	got     atomic.Int64
	waiting atomic.Bool

	// held is the memory the current command holds (its slabs and arena),
	// charged the part of it taken through hold, which waits for the
	// server's budget and fails when it cannot have it; unhold gives it
	// back. With hold nil, memory is bounded only per command.
	held, charged int64
	arenaHeld     int64 // cap(arena) counted in held
	hold          func(n int64) error
	unhold        func(n int64)
}

type argRef struct {
	slab *[]byte // nil: arena[off:off+n]
	off  int
	n    int
}

func newReader(src io.Reader, cfg *Config) *reader {
	return &reader{
		src:       src,
		buf:       make([]byte, cfg.ReadBufferSize+min(maxHeaderRoom, cfg.ReadBufferSize/16)),
		maxInline: cfg.ReadBufferSize,
		maxArgs:   cfg.MaxArgs,
		maxBulk:   cfg.MaxBulkLen,
		maxCmd:    cfg.MaxCommandBytes,
		smallArg:  min(maxSmallArg, cfg.ReadBufferSize/2),

		bulkSetting: cfg.MaxBulkLenSetting,
	}
}

// next reads the next command, skipping empty ones, and returns its
// arguments, which stay valid until the next call or release. At the end
// of input between commands it returns io.EOF; inside one,
// io.ErrUnexpectedEOF; on malformed input, a *ProtocolError; after a
// command over the limits, read whole and dropped, a *refusedError.
func (r *reader) next() ([][]byte, error) {
	r.release()
	for len(r.refs) == 0 {
		if r.r == r.w {
			if r.awaitCommand != nil {
				if err := r.awaitCommand(); err != nil {
					return nil, err
				}
			}
			err := r.fill()
			if r.commandStarted != nil {
				r.commandStarted()
			}
			if err != nil {
				return nil, err
			}
		}
		r.inCmd = true
		var err error
		if r.buf[r.r] == '*' {
			var refused *refusedError
			refused, err = r.multibulk()
			if err == nil && refused != nil {
				r.release()
				return nil, refused
			}
		} else {
			err = r.inline()
		}
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		if err != nil {
			return nil, err
		}
	}
	for _, ref := range r.refs {
		if ref.slab != nil {
			r.args = append(r.args, (*ref.slab)[:ref.n:ref.n])
		} else {
			r.args = append(r.args, r.arena[ref.off:ref.off+ref.n:ref.off+ref.n])
		}
	}
	r.endCommand()
	return r.args, nil
}

// release ends the current command: its arguments become invalid, slabs
// go back to the pool, and oversized scratch space is dropped.
func (r *reader) release() {
	if r.pending != nil {
		r.pending.Abort()
		r.pending = nil
	}
	r.pendingRoom = nil
	for i, s := range r.slabs {
		putSlab(s)
		r.slabs[i] = nil
	}
	r.slabs = r.slabs[:0]
	clear(r.args)
	r.args, r.refs, r.arena = r.args[:0], r.refs[:0], r.arena[:0]
	if cap(r.arena) > keepArena {
		r.arena = nil
	}
	if cap(r.args) > keepArgs {
		r.args, r.refs = nil, nil
	}
	if r.charged > 0 && r.unhold != nil {
		r.unhold(r.charged)
	}
	r.arenaHeld = int64(cap(r.arena))
	r.held, r.charged = r.arenaHeld, 0
	r.endCommand()
}

// endCommand marks the command read whole (or given up).
func (r *reader) endCommand() {
	r.inCmd, r.cmdRead = false, 0
	if r.started.Load() != 0 {
		r.started.Store(0)
	}
}

// take counts n more bytes held by the current command, and takes what
// passes freeHold from the server's budget.
func (r *reader) take(n int64) error {
	r.held += n
	if over := r.held - freeHold - r.charged; over > 0 && r.hold != nil {
		if err := r.hold(over); err != nil {
			r.held -= n
			return err
		}
		r.charged += over
	}
	return nil
}

// fill reads more input into buf, moving unread bytes to its front when
// there is no room behind them. It fails if buf is full.
func (r *reader) fill() error {
	if r.r == r.w {
		r.r, r.w = 0, 0
	}
	if r.w == len(r.buf) {
		if r.r == 0 {
			return errors.New("resp: read buffer full")
		}
		r.w = copy(r.buf, r.buf[r.r:r.w])
		r.r = 0
	}
	if r.beforeRead != nil {
		if err := r.beforeRead(); err != nil {
			return err
		}
	}
	for range 100 {
		n, err := r.src.Read(r.buf[r.w:])
		r.w += n
		r.count(n)
		if n > 0 {
			return nil
		}
		if err != nil {
			return err
		}
	}
	return io.ErrNoProgress
}

// line returns the next line without its terminator and consumes it. With
// crlf the line must end in "\r\n" (protocol headers); otherwise "\n" with
// an optional '\r' before it (inline commands). A line longer than limit
// bytes, terminator included, is a protocol error saying tooBig.
func (r *reader) line(limit int, crlf bool, tooBig string) ([]byte, error) {
	limit = min(limit, len(r.buf))
	scanned := 0
	for {
		if i := bytes.IndexByte(r.buf[r.r+scanned:r.w], '\n'); i >= 0 {
			end := r.r + scanned + i
			if end+1-r.r > limit {
				return nil, protoErr("%s", tooBig)
			}
			line := r.buf[r.r:end]
			r.r = end + 1
			if n := len(line); n > 0 && line[n-1] == '\r' {
				return line[:n-1], nil
			}
			if crlf {
				return nil, protoErr("expected '\\r\\n' at the end of %q", line)
			}
			return line, nil
		}
		scanned = r.w - r.r
		if scanned >= limit {
			return nil, protoErr("%s", tooBig)
		}
		if err := r.fill(); err != nil {
			return nil, err
		}
	}
}

// multibulk reads an array of bulk strings. An argument over MaxBulkLen,
// or one that takes the command over MaxCommandBytes, is read and
// dropped, with every argument after it, and the command is refused: the
// client hears why and the connection stays in step.
func (r *reader) multibulk() (*refusedError, error) {
	line, err := r.line(maxHeaderLine, true, "too big mbulk count string")
	if err != nil {
		return nil, err
	}
	n, ok := parseInt(line[1:])
	if !ok || n > int64(r.maxArgs) {
		return nil, protoErr("invalid multibulk length")
	}
	var total int64
	var refused *refusedError
	for range n { // n ≤ 0: an empty command, which is skipped
		line, err := r.line(maxHeaderLine, true, "too big bulk count string")
		if err != nil {
			return nil, err
		}
		if len(line) == 0 || line[0] != '$' {
			got := byte('\r')
			if len(line) > 0 {
				got = line[0]
			}
			return nil, protoErr("expected '$', got %s", strconv.QuoteRuneToASCII(rune(got)))
		}
		l, ok := parseInt(line[1:])
		if !ok || l < 0 {
			return nil, protoErr("invalid bulk length")
		}
		total += l
		switch {
		case refused != nil:
		case l > r.maxBulk:
			refused = &refusedError{fmt.Sprintf("ERR argument of %d bytes is over the %s limit on one value%s",
				l, units.FormatBytes(r.maxBulk), r.settingNote())}
		case total > r.maxCmd:
			refused = &refusedError{fmt.Sprintf("ERR command of more than %d bytes is over the %s limit on one command",
				total, units.FormatBytes(r.maxCmd))}
		}
		if refused != nil {
			if err := r.skip(l); err != nil {
				return nil, err
			}
			continue
		}
		if refused == nil && n == 3 && len(r.refs) == 2 && l > int64(r.smallArg) && r.reserveSet != nil {
			ok, err := r.bulkReserved(int(l))
			if err != nil {
				return nil, err
			}
			if ok {
				continue
			}
		}
		if err := r.bulk(int(l)); err != nil {
			return nil, err
		}
	}
	return refused, nil
}

// bulkReserved reads the n bytes of a plain SET's value, and the CRLF
// after them, straight into room the store reserved for it, within the
// server's budget as a slab would be, and reports whether it had room.
func (r *reader) bulkReserved(n int) (bool, error) {
	if err := r.take(int64(n)); err != nil {
		return false, err
	}
	arg := func(i int) []byte { ref := r.refs[i]; return r.arena[ref.off : ref.off+ref.n] }
	p := r.reserveSet(arg(0), arg(1), n)
	if p == nil {
		r.held -= int64(n)
		r.giveBack()
		return false, nil
	}
	r.pending = p
	room := p.Bytes()
	// The value is read from src straight into the room, but for what
	// came in the read buffer with the command's header and a last piece
	// of copiedPiece or less, which is read into the buffer with the CRLF
	// after it (and what follows), saving a read. Bytes from the buffer
	// are copied in pieces, each told at once, while it is still in the
	// CPU's first-level cache.
	for k := 0; k < n; {
		if r.r == r.w && n-k > copiedPiece {
			if r.beforeRead != nil {
				if err := r.beforeRead(); err != nil {
					return true, err
				}
			}
			m, err := r.src.Read(room[k:min(n, k+filledRead)])
			r.count(m)
			if m > 0 {
				p.Filled(room[k : k+m])
			}
			k += m
			if err != nil && k < n {
				return true, err
			}
			continue
		}
		if r.r == r.w {
			if err := r.fill(); err != nil {
				return true, err
			}
		}
		c := copy(room[k:min(n, k+copiedPiece)], r.buf[r.r:r.w])
		p.Filled(room[k : k+c])
		r.r += c
		k += c
	}
	for r.w-r.r < 2 {
		if err := r.fill(); err != nil {
			return true, err
		}
	}
	if err := r.crlfAt(r.r); err != nil {
		return true, err
	}
	r.r += 2
	r.pendingRoom = room
	r.refs = append(r.refs, argRef{slab: &r.pendingRoom, n: n})
	return true, nil
}

// takePending returns the room the current command's value was read into,
// if any, for the command to commit; the reader forgets it.
func (r *reader) takePending() PendingSet {
	p := r.pending
	r.pending = nil
	return p
}

func (r *reader) settingNote() string {
	if r.bulkSetting == "" {
		return ""
	}
	return " (" + r.bulkSetting + ")"
}

// skip reads and drops the n bytes of a bulk string and the CRLF after
// them, holding no memory for them.
func (r *reader) skip(n int64) error {
	for n > 0 {
		if r.r == r.w {
			if err := r.fill(); err != nil {
				return err
			}
		}
		k := min(n, int64(r.w-r.r))
		r.r += int(k)
		n -= k
	}
	for r.w-r.r < 2 {
		if err := r.fill(); err != nil {
			return err
		}
	}
	if err := r.crlfAt(r.r); err != nil {
		return err
	}
	r.r += 2
	return nil
}

// bulk reads the n bytes of one bulk string and the CRLF after them.
func (r *reader) bulk(n int) error {
	if n <= r.smallArg {
		for r.w-r.r < n+2 {
			if err := r.fill(); err != nil {
				return err
			}
		}
		if err := r.crlfAt(r.r + n); err != nil {
			return err
		}
		r.refs = append(r.refs, argRef{off: len(r.arena), n: n})
		r.arena = append(r.arena, r.buf[r.r:r.r+n]...)
		r.r += n + 2
		if c := int64(cap(r.arena)); c > r.arenaHeld {
			if err := r.take(c - r.arenaHeld); err != nil {
				return err
			}
			r.arenaHeld = c
		}
		return nil
	}
	// Long arguments are read straight from src into a slab of their own,
	// which grows as the bytes arrive: memory follows what was sent, not
	// the length announced.
	slab, err := r.growSlab(nil, 0, min(n, firstSlab))
	if err != nil {
		return err
	}
	r.slabs = append(r.slabs, slab)
	for k := 0; k < n; {
		if k == len(*slab) {
			if slab, err = r.growSlab(slab, k, min(n, slabGrowth*k)); err != nil {
				return err
			}
			r.slabs[len(r.slabs)-1] = slab
		}
		if r.r < r.w { // what the read buffer holds comes first
			c := copy((*slab)[k:min(n, len(*slab))], r.buf[r.r:r.w])
			r.r += c
			k += c
			continue
		}
		if r.beforeRead != nil {
			if err := r.beforeRead(); err != nil {
				return err
			}
		}
		m, err := r.src.Read((*slab)[k:min(n, len(*slab))])
		r.count(m)
		k += m
		if err != nil && k < n {
			return err
		}
	}
	for r.w-r.r < 2 {
		if err := r.fill(); err != nil {
			return err
		}
	}
	if err := r.crlfAt(r.r); err != nil {
		return err
	}
	r.r += 2
	r.refs = append(r.refs, argRef{slab: slab, n: n})
	return nil
}

// growSlab returns a slab of at least n bytes that holds the first k
// bytes of old, which goes back to the pool (old nil: a first slab).
func (r *reader) growSlab(old *[]byte, k, n int) (*[]byte, error) {
	s := getSlab(n)
	if err := r.take(int64(len(*s))); err != nil {
		putSlab(s)
		return nil, err
	}
	if old != nil {
		copy(*s, (*old)[:k])
		r.held -= int64(len(*old))
		putSlab(old)
		r.giveBack()
	}
	return s, nil
}

// giveBack returns to the server's budget what the command was charged
// beyond what it holds now (a slab it outgrew), so that an argument of n
// bytes is charged at most about 2n while it grows, and n once it has.
func (r *reader) giveBack() {
	if extra := r.charged - max(0, r.held-freeHold); extra > 0 && r.unhold != nil {
		r.unhold(extra)
		r.charged -= extra
	}
}

func (r *reader) count(n int) {
	r.cmdRead += int64(n)
	if r.nread != nil {
		r.nread.Add(uint64(n))
	}
}

func (r *reader) crlfAt(i int) error {
	if r.buf[i] != '\r' || r.buf[i+1] != '\n' {
		return protoErr("expected '\\r\\n' after bulk string, got %q", r.buf[i:i+2])
	}
	return nil
}

// inline reads a command typed as one line of space-separated words.
func (r *reader) inline() error {
	line, err := r.line(r.maxInline, false, "too big inline request")
	if err != nil {
		return err
	}
	r.arena, r.refs, err = splitInline(line, r.arena, r.refs, r.maxArgs)
	return err
}

// parseInt parses a decimal integer strictly, as Redis does: an optional
// '-', no '+', no spaces, no leading zeros, no overflow.
func parseInt(b []byte) (int64, bool) {
	neg := len(b) > 0 && b[0] == '-'
	if neg {
		b = b[1:]
	}
	if len(b) == 0 || len(b) > 19 || (b[0] == '0' && (len(b) > 1 || neg)) {
		return 0, false
	}
	var n uint64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + uint64(c-'0')
	}
	switch {
	case !neg && n <= 1<<63-1:
		return int64(n), true
	case neg && n <= 1<<63:
		return -int64(n), true
	}
	return 0, false
}

// splitInline splits an inline command into arguments the way redis-cli
// and Redis do: words separated by spaces, "double quotes" with C escapes
// (\n, \r, \t, \b, \a, \\, \", \xHH) and 'single quotes' with only \'. It
// appends the words to arena and their places to refs; more than maxArgs
// words is an error.
func splitInline(line, arena []byte, refs []argRef, maxArgs int) ([]byte, []argRef, error) {
	i := 0
	for {
		for i < len(line) && isSpace(line[i]) {
			i++
		}
		if i == len(line) {
			return arena, refs, nil
		}
		if len(refs) == maxArgs {
			return arena, refs, protoErr("invalid multibulk length")
		}
		start := len(arena)
		inDouble, inSingle := false, false
	word:
		for ; ; i++ {
			if i == len(line) {
				if inDouble || inSingle {
					return arena, refs, protoErr("unbalanced quotes in request")
				}
				break
			}
			c := line[i]
			switch {
			case inDouble:
				switch {
				case c == '\\' && i+3 < len(line) && line[i+1] == 'x' && isHex(line[i+2]) && isHex(line[i+3]):
					arena = append(arena, unhex(line[i+2])<<4|unhex(line[i+3]))
					i += 3
				case c == '\\' && i+1 < len(line):
					i++
					arena = append(arena, unescape(line[i]))
				case c == '"':
					// A closing quote must end the word.
					if i+1 < len(line) && !isSpace(line[i+1]) {
						return arena, refs, protoErr("unbalanced quotes in request")
					}
					i++
					break word
				default:
					arena = append(arena, c)
				}
			case inSingle:
				switch {
				case c == '\\' && i+1 < len(line) && line[i+1] == '\'':
					i++
					arena = append(arena, '\'')
				case c == '\'':
					if i+1 < len(line) && !isSpace(line[i+1]) {
						return arena, refs, protoErr("unbalanced quotes in request")
					}
					i++
					break word
				default:
					arena = append(arena, c)
				}
			case isSpace(c):
				break word
			case c == '"':
				inDouble = true
			case c == '\'':
				inSingle = true
			default:
				arena = append(arena, c)
			}
		}
		refs = append(refs, argRef{off: start, n: len(arena) - start})
	}
}

func isSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c <= 'F':
		return c - 'A' + 10
	}
	return c - 'a' + 10
}

func unescape(c byte) byte {
	switch c {
	case 'n':
		return '\n'
	case 'r':
		return '\r'
	case 't':
		return '\t'
	case 'b':
		return '\b'
	case 'a':
		return '\a'
	}
	return c
}

// Slabs hold long arguments. They are pooled by power-of-two size class so
// that a connection streaming 1 MiB SETs reuses the same few buffers.
var slabPools [31]sync.Pool // class k holds *[]byte of length 1<<k

// getSlab returns a slab of at least n > 0 bytes, at most 2n; of exactly
// n past maxPooledSlab.
func getSlab(n int) *[]byte {
	if n > maxPooledSlab {
		s := make([]byte, n)
		return &s
	}
	k := bits.Len(uint(n - 1))
	if s, ok := slabPools[k].Get().(*[]byte); ok {
		return s
	}
	s := make([]byte, 1<<k)
	return &s
}

func putSlab(s *[]byte) {
	if len(*s) > maxPooledSlab {
		return
	}
	slabPools[bits.Len(uint(len(*s)-1))].Put(s)
}
