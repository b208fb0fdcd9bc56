package zmtpguard

import (
	"encoding/binary"
	"errors"
	"slices"
	"testing"
)

func greeting() []byte {
	g := make([]byte, 64)
	g[0], g[8], g[9], g[10], g[11] = 0xff, 1, 0x7f, 3, 1 // as libzmq writes it
	copy(g[12:], "NULL")
	return g
}

// frame is a frame with flags and body, in the short or long form as the
// flags say.
func frame(flags byte, body []byte) []byte {
	if flags&flagLong != 0 {
		return append(binary.BigEndian.AppendUint64([]byte{flags}, uint64(len(body))), body...)
	}
	return append([]byte{flags, byte(len(body))}, body...)
}

func ready() []byte { return frame(flagCommand, append([]byte{5}, "READY"...)) }

// badAt feeds s one byte at a time and returns the offset of the byte
// the parser refused (len(s) if none) and the error.
func badAt(lim Limits, s []byte) (int, error) {
	p := NewParser(lim)
	for i := range s {
		if err := p.Feed(s[i : i+1]); err != nil {
			return i, err
		}
	}
	return len(s), nil
}

// checkSplits feeds s in two pieces, split at every offset, and checks
// that a piece is refused exactly when it holds byte bad (len(s): none),
// and that the refusal sticks.
func checkSplits(t *testing.T, lim Limits, s []byte, bad int, want error) {
	t.Helper()
	for i := 0; i <= len(s); i++ {
		p := NewParser(lim)
		err1 := p.Feed(s[:i])
		err2 := p.Feed(s[i:])
		switch {
		case bad >= len(s):
			if err1 != nil || err2 != nil {
				t.Fatalf("split at %d: refused a good stream: %v, %v", i, err1, err2)
			}
		case i > bad:
			if !errors.Is(err1, want) || !errors.Is(err2, want) {
				t.Fatalf("split at %d: the first piece holds byte %d: got %v, then %v; want %v", i, bad, err1, err2, want)
			}
		default:
			if err1 != nil || !errors.Is(err2, want) {
				t.Fatalf("split at %d: byte %d is in the second piece: got %v, then %v; want nil, then %v", i, bad, err1, err2, want)
			}
		}
	}
}

// TestParserGoodStream: a handshake, then short, long, empty and
// multipart messages and a PING within the limits pass, however the
// stream is split; the parser says the handshake is done between frames
// after READY.
func TestParserGoodStream(t *testing.T) {
	lim := Limits{MaxMessage: 1000, MaxFrames: 3}
	s := slices.Concat(greeting(), ready(),
		frame(0, []byte("a")),
		frame(flagLong, make([]byte, 1000)),
		frame(flagMore, nil), frame(flagMore|flagLong, make([]byte, 500)), frame(0, make([]byte, 500)),
		frame(flagCommand, append([]byte{4}, "PING\x00\x10"...)),
		frame(flagLong, make([]byte, 300)))
	checkSplits(t, lim, s, len(s), nil)
	if bad, err := badAt(lim, s); err != nil {
		t.Fatalf("byte by byte: refused byte %d: %v", bad, err)
	}
	p := NewParser(lim)
	if p.Feed(s[:64+len(ready())-1]); p.Handshaken() {
		t.Error("handshaken before READY's last byte")
	}
	if p.Feed(s[64+len(ready())-1 : 64+len(ready())]); !p.Handshaken() {
		t.Error("not handshaken after READY")
	}
	if p.Feed(s[64+len(ready()):][:2]); p.Handshaken() {
		t.Error("handshaken inside a frame")
	}
}

// TestParserRefuses: each bad stream is refused at the byte that makes it
// bad — for a frame too large, at the first byte of its length that shows
// it, so that no reader is handed the whole header — however the stream
// is split.
func TestParserRefuses(t *testing.T) {
	lim := Limits{MaxMessage: 1000, MaxFrames: 3}
	hs := slices.Concat(greeting(), ready())
	n := len(hs)
	with := func(i int, b byte) []byte { g := greeting(); g[i] = b; return slices.Concat(g, ready()) }
	plain := greeting()
	copy(plain[12:], "PLAIN")
	for _, c := range []struct {
		name   string
		stream []byte
		bad    int
		want   error
	}{
		{"not a signature", with(0, 'G'), 0, ErrMalformed},
		{"signature's last byte", with(9, 0), 9, ErrMalformed},
		{"ZMTP 2", with(10, 1), 10, ErrMalformed},
		{"PLAIN mechanism", plain, 12, ErrMalformed},
		{"as-server 2", with(32, 2), 32, ErrMalformed},
		{"reserved flag bits", slices.Concat(hs, []byte{0x08, 0}), n, ErrMalformed},
		{"command in a multipart message", slices.Concat(hs, frame(flagMore, nil), ready()), n + 2, ErrMalformed},
		{"command with more", slices.Concat(hs, []byte{flagCommand | flagMore, 0}), n, ErrMalformed},
		{"2^63-1 bytes", slices.Concat(hs, []byte{flagLong, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}), n + 1, ErrTooLarge},
		{"2^36 bytes", slices.Concat(hs, binary.BigEndian.AppendUint64([]byte{flagLong}, 1<<36)), n + 4, ErrTooLarge},
		{"1001 bytes, long", slices.Concat(hs, binary.BigEndian.AppendUint64([]byte{flagLong}, 1001)), n + 8, ErrTooLarge},
		{"huge command in the handshake", slices.Concat(greeting(), binary.BigEndian.AppendUint64([]byte{flagCommand | flagLong}, 1<<40)), 64 + 3, ErrTooLarge},
		{"short frame over a small limit", slices.Concat(greeting(), []byte{flagCommand, 255}), 65, ErrTooLarge},
		{"a multipart message over the limit", slices.Concat(hs, frame(flagMore|flagLong, make([]byte, 800)), []byte{0, 201, 0}), n + 9 + 800 + 1, ErrTooLarge},
		{"too many frames", slices.Concat(hs, frame(flagMore, nil), frame(flagMore, nil), frame(flagMore, nil), frame(0, nil)), n + 6, ErrTooLarge},
	} {
		t.Run(c.name, func(t *testing.T) {
			l := lim
			if c.name == "short frame over a small limit" {
				l.MaxMessage = 254
			}
			bad, err := badAt(l, c.stream)
			if bad != c.bad || !errors.Is(err, c.want) {
				t.Fatalf("byte by byte: refused byte %d with %v; want byte %d, %v", bad, err, c.bad, c.want)
			}
			checkSplits(t, l, c.stream, c.bad, c.want)
		})
	}
}

// BenchmarkParser: the parser's cost per byte of a stream of 64 KiB
// messages, fed in zmq4's reads (a 2-byte header, 7 more for a long
// length, then the body).
func BenchmarkParser(b *testing.B) {
	body := make([]byte, 64<<10)
	msg := frame(flagLong, body)
	p := NewParser(Limits{MaxMessage: 1 << 20})
	if err := p.Feed(slices.Concat(greeting(), ready())); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(msg)))
	for b.Loop() {
		if p.Feed(msg[:2]) != nil || p.Feed(msg[2:9]) != nil || p.Feed(msg[9:]) != nil {
			b.Fatal("refused")
		}
	}
}
