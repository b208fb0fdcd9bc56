package zmtpguard

import "fmt"

// The ZMTP 3 wire format, as far as the parser reads it (rfc.zeromq.org
// 23/ZMTP): a 64-byte greeting, then frames.
const (
	greetingLen = 64
	sigFirst    = 0  // 0xFF
	sigLast     = 9  // 0x7F
	verMajor    = 10 // >= 3
	mechStart   = 12 // the mechanism: 20 bytes, NUL-padded
	mechEnd     = 32 //
	asServer    = 32 // 0 or 1
	flagMore    = 1 << 0
	flagLong    = 1 << 1
	flagCommand = 1 << 2
	flagsKnown  = flagMore | flagLong | flagCommand
)

// mechanism is the only security mechanism kvstrata's sockets speak.
var mechanism = [mechEnd - mechStart]byte{'N', 'U', 'L', 'L'}

// Parser follows the inbound half of a ZMTP connection, byte by byte, as
// it passes, and refuses the first byte that makes it malformed or makes a
// message larger than its limits. It never buffers: its state is a few
// counters. A Parser is not safe for concurrent use.
type Parser struct {
	lim Limits

	pos      int // bytes of the greeting seen, up to greetingLen
	inFrame  bool
	flags    byte
	lenLeft  int    // length bytes still to come for the current header
	size     uint64 // the length read so far
	bodyLeft uint64 // body bytes still to come
	msgBytes uint64 // body bytes of the current message's frames
	msgFrame int    // frames of the current message, the current one included
	commands int    // command frames completed
	err      error
}

// NewParser returns a Parser at the start of a connection. lim's zero
// fields take their defaults.
func NewParser(lim Limits) *Parser {
	lim.EnsureDefaults()
	return &Parser{lim: lim}
}

// Feed reads b, the next bytes of the stream. It returns nil if all of
// them are well-formed and within limits; otherwise an error wrapping
// ErrMalformed or ErrTooLarge, and it returns that error again for every
// later call.
func (p *Parser) Feed(b []byte) error {
	if p.err != nil {
		return p.err
	}
	for len(b) > 0 {
		if p.pos < greetingLen {
			n := min(len(b), greetingLen-p.pos)
			if err := p.greeting(b[:n]); err != nil {
				p.err = err
				return err
			}
			b = b[n:]
			continue
		}
		switch {
		case !p.inFrame:
			if err := p.header(b[0]); err != nil {
				p.err = err
				return err
			}
			b = b[1:]
		case p.lenLeft > 0:
			p.size = p.size<<8 | uint64(b[0])
			p.lenLeft--
			b = b[1:]
			// Refuse as soon as the length's leading bytes make it too
			// large, whatever the bytes still to come (the shift is exact:
			// size holds 8-lenLeft bytes).
			if p.size<<(8*p.lenLeft) > p.limit() {
				p.err = p.tooLarge()
				return p.err
			}
			if p.lenLeft == 0 {
				if err := p.sized(); err != nil {
					p.err = err
					return err
				}
			}
		default:
			n := min(uint64(len(b)), p.bodyLeft)
			p.bodyLeft -= n
			b = b[n:]
			if p.bodyLeft == 0 {
				p.endFrame()
			}
		}
	}
	return nil
}

// Handshaken reports whether the parser is between frames after at least
// one command (for the NULL mechanism, the peer's READY): a reader that
// asks for more bytes now has finished the handshake.
func (p *Parser) Handshaken() bool {
	return p.err == nil && p.commands > 0 && !p.inFrame
}

func (p *Parser) greeting(b []byte) error {
	for _, c := range b {
		switch i := p.pos; {
		case i == sigFirst && c != 0xff, i == sigLast && c != 0x7f:
			return fmt.Errorf("%w: greeting: byte %d is %#x, not the signature's", ErrMalformed, i, c)
		case i == verMajor && c < 3:
			return fmt.Errorf("%w: greeting: ZMTP version %d, want 3 or later", ErrMalformed, c)
		case i >= mechStart && i < mechEnd && c != mechanism[i-mechStart]:
			return fmt.Errorf("%w: greeting: a mechanism other than NULL", ErrMalformed)
		case i == asServer && c > 1:
			return fmt.Errorf("%w: greeting: as-server is %d", ErrMalformed, c)
		}
		p.pos++
	}
	return nil
}

// header reads a frame's flags byte.
func (p *Parser) header(flags byte) error {
	if flags&^flagsKnown != 0 {
		return fmt.Errorf("%w: frame flags %#x: reserved bits set", ErrMalformed, flags)
	}
	if flags&flagCommand != 0 && (flags&flagMore != 0 || p.msgFrame > 0) {
		return fmt.Errorf("%w: frame flags %#x: a command inside a multipart message", ErrMalformed, flags)
	}
	if p.msgFrame++; flags&flagCommand == 0 && p.msgFrame > p.lim.MaxFrames {
		return fmt.Errorf("%w: a message of more than %d frames", ErrTooLarge, p.lim.MaxFrames)
	}
	p.inFrame, p.flags, p.size = true, flags, 0
	p.lenLeft = 1
	if flags&flagLong != 0 {
		p.lenLeft = 8
	}
	return nil
}

// limit is how large the current frame may be.
func (p *Parser) limit() uint64 {
	return uint64(p.lim.MaxMessage) - p.msgBytes
}

func (p *Parser) tooLarge() error {
	if p.lenLeft > 0 {
		return fmt.Errorf("%w: a frame longer than the %d bytes left of the %d-byte message limit",
			ErrTooLarge, p.limit(), p.lim.MaxMessage)
	}
	return fmt.Errorf("%w: a frame of %d bytes, over the %d bytes left of the %d-byte message limit",
		ErrTooLarge, p.size, p.limit(), p.lim.MaxMessage)
}

// sized takes the length of the current frame, once all of it is read.
func (p *Parser) sized() error {
	if p.size > p.limit() {
		return p.tooLarge()
	}
	p.bodyLeft = p.size
	if p.bodyLeft == 0 {
		p.endFrame()
	}
	return nil
}

func (p *Parser) endFrame() {
	p.inFrame = false
	switch {
	case p.flags&flagCommand != 0:
		p.commands++
		p.msgBytes, p.msgFrame = 0, 0
	case p.flags&flagMore != 0:
		p.msgBytes += p.size
	default:
		p.msgBytes, p.msgFrame = 0, 0
	}
}
