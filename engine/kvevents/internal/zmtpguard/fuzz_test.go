package zmtpguard

import (
	"encoding/binary"
	"slices"
	"testing"
)

// FuzzParser: on any stream, fed in any pieces, the parser does not panic,
// refuses the same byte as when fed one byte at a time, and what it
// accepts never holds a frame header announcing more than the message
// limit allows (checked by a plain, non-incremental reading of the
// accepted bytes).
func FuzzParser(f *testing.F) {
	hs := slices.Concat(greeting(), ready())
	f.Add(hs, uint16(100), uint8(3), []byte{1, 7, 64})
	f.Add(slices.Concat(hs, frame(flagMore, []byte("ab")), frame(flagLong, make([]byte, 90))), uint16(100), uint8(3), []byte{66, 3})
	f.Add(slices.Concat(hs, binary.BigEndian.AppendUint64([]byte{flagLong}, 1<<63-1)), uint16(100), uint8(3), []byte{70})
	f.Add(slices.Concat(greeting(), []byte{0x06, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}), uint16(10), uint8(1), []byte{})
	f.Fuzz(func(t *testing.T, s []byte, maxMessage uint16, maxFrames uint8, cuts []byte) {
		lim := Limits{MaxMessage: int64(maxMessage) + 1, MaxFrames: int(maxFrames) + 1}
		bad, _ := badAt(lim, s)

		// The same stream in pieces whose lengths cuts gives.
		p := NewParser(lim)
		fed, refused := 0, -1
		for i := 0; fed < len(s); i++ {
			n := len(s) - fed
			if i < len(cuts) {
				n = min(n, int(cuts[i])+1)
			}
			if p.Feed(s[fed:fed+n]) != nil && refused < 0 {
				refused = fed
			}
			fed += n
		}
		if bad < len(s) && (refused < 0 || refused > bad) || bad == len(s) && refused >= 0 {
			t.Fatalf("byte by byte refused at %d of %d; in pieces %v, the piece from %d", bad, len(s), cuts, refused)
		}
		checkAccepted(t, lim, s[:bad])
	})
}

// checkAccepted reads a stream the parser accepted and fails the test if
// it announces a frame over the limits.
func checkAccepted(t *testing.T, lim Limits, s []byte) {
	if len(s) < greetingLen {
		return
	}
	s = s[greetingLen:]
	var msg uint64
	frames := 0
	for len(s) > 0 {
		flags := s[0]
		n := 1
		if flags&flagLong != 0 {
			n = 8
		}
		if len(s) < 1+n {
			return
		}
		var size uint64
		for _, c := range s[1 : 1+n] {
			size = size<<8 | uint64(c)
		}
		frames++
		if msg+size > uint64(lim.MaxMessage) {
			t.Fatalf("accepted a frame of %d bytes after %d of its message, over %d", size, msg, lim.MaxMessage)
		}
		if flags&flagCommand == 0 && frames > lim.MaxFrames {
			t.Fatalf("accepted frame %d of a message, over %d", frames, lim.MaxFrames)
		}
		if uint64(len(s)-1-n) < size {
			return
		}
		s = s[1+n+int(size):]
		if flags&flagMore != 0 && flags&flagCommand == 0 {
			msg += size
		} else {
			msg, frames = 0, 0
		}
	}
}
