// Package frame has one job: the frame encodings and status mapping that
// both transfer backends (transfer/tcp and transfer/ucx) share, so that the
// two speak protocol version 1 byte for byte alike. It encodes and decodes
// the frames both put on the wire (a key, a block header, a put's result),
// defines the status codes those frames carry, maps a Handler's error to a
// status and a block's status back to the error a Conn reports, and makes
// the checks of block headers whose messages go on the wire or into a
// Conn's errors. Each backend frames its hellos, requests and responses its
// own way and keeps that code.
//
// Everything here is a pure function of its arguments and safe for
// concurrent use.
//
// All integers are little-endian:
//
//	key           ns:u64 hash:u64                                     (16 bytes)
//	block header  ns:u64 hash:u64 parent:u64 sum:u64 size:u32
//	              flags:u8 status:u8 msglen:u16                       (40 bytes)
//	result        status:u8 0:u8 msglen:u16                           (4 bytes)
//
// A block header's flags bit 0 is HasParent; no other bit is defined. The
// msg of a header or a result follows it on the wire, as each backend
// frames it.
package frame

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strings"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/internal/units"
	"github.com/kvstrata/kvstrata/transfer"
)

// Frame sizes, in bytes.
const (
	KeySize    = 16
	HeaderSize = 40
	ResultSize = 4
	// MaxMsg is the longest msg of any frame.
	MaxMsg = 512
)

const flagHasParent = 1 << 0 // block header flags

// ErrProtocol marks bytes from the peer that break the protocol.
var ErrProtocol = errors.New("protocol violation")

// PutKey encodes k into b[:KeySize].
func PutKey(b []byte, k index.Key) {
	binary.LittleEndian.PutUint64(b, uint64(k.NS))
	binary.LittleEndian.PutUint64(b[8:], uint64(k.Hash))
}

// DecodeKey decodes the key in b[:KeySize]; every 16 bytes are a key.
func DecodeKey(b []byte) index.Key {
	return index.Key{
		NS:   index.NamespaceID(binary.LittleEndian.Uint64(b)),
		Hash: index.Hash(binary.LittleEndian.Uint64(b[8:])),
	}
}

// PutHeader encodes a block header into b[:HeaderSize]. A header without a
// parent goes out with parent 0, whatever h.Parent holds.
func PutHeader(b []byte, h *index.Header, st Status, msgLen int) {
	PutKey(b, h.Key)
	var parent uint64
	var flags uint8
	if h.HasParent {
		parent, flags = uint64(h.Parent), flagHasParent
	}
	binary.LittleEndian.PutUint64(b[16:], parent)
	binary.LittleEndian.PutUint64(b[24:], h.Sum)
	binary.LittleEndian.PutUint32(b[32:], h.Size)
	b[36], b[37] = flags, byte(st)
	binary.LittleEndian.PutUint16(b[38:], uint16(msgLen))
}

// DecodeHeader decodes the block header in b[:HeaderSize]. The header's
// fields are returned even when err (which wraps ErrProtocol) reports a
// malformed flag, status or msglen, so that a server can still skip the
// block's payload.
func DecodeHeader(b []byte) (h index.Header, st Status, msgLen int, err error) {
	h.Key = DecodeKey(b)
	parent := binary.LittleEndian.Uint64(b[16:])
	h.Sum = binary.LittleEndian.Uint64(b[24:])
	h.Size = binary.LittleEndian.Uint32(b[32:])
	flags, st, msgLen := b[36], Status(b[37]), int(binary.LittleEndian.Uint16(b[38:]))
	h.HasParent = flags&flagHasParent != 0
	if h.HasParent {
		h.Parent = index.Hash(parent)
	}
	switch {
	case flags&^flagHasParent != 0:
		err = fmt.Errorf("%w: unknown flags 0x%02x", ErrProtocol, flags)
	case !h.HasParent && parent != 0:
		err = fmt.Errorf("%w: parent %016x without the has-parent flag", ErrProtocol, parent)
	case !st.Known():
		err = fmt.Errorf("%w: status %d", ErrProtocol, st)
	case msgLen > MaxMsg:
		err = fmt.Errorf("%w: message of %d bytes, over %d", ErrProtocol, msgLen, MaxMsg)
	}
	return h, st, msgLen, err
}

// PutResult encodes a put's result for one block into b[:ResultSize].
func PutResult(b []byte, st Status, msgLen int) {
	b[0], b[1] = byte(st), 0
	binary.LittleEndian.PutUint16(b[2:], uint16(msgLen))
}

// DecodeResult decodes the result in b[:ResultSize]; err wraps ErrProtocol.
func DecodeResult(b []byte) (st Status, msgLen int, err error) {
	st, msgLen = Status(b[0]), int(binary.LittleEndian.Uint16(b[2:]))
	switch {
	case !st.Known() || b[1] != 0:
		err = fmt.Errorf("%w: result % x", ErrProtocol, b[:2])
	case msgLen > MaxMsg:
		err = fmt.Errorf("%w: result message of %d bytes, over %d", ErrProtocol, msgLen, MaxMsg)
	}
	return st, msgLen, err
}

// The checks both sides of a connection make of block headers, whatever
// the backend: a client of what it is about to put and of each header a Get
// answers with, a server of a put's headers before it reserves anything.
// Their messages go on the wire (a server's refusal) or into a Conn's
// errors, the same for every backend.

// CheckPut checks what a client can of a put before it sends anything: at
// most maxBlocks blocks (the protocol's limit), each as long as its header
// says.
func CheckPut(blocks []transfer.Block, maxBlocks int) error {
	if len(blocks) > maxBlocks {
		return fmt.Errorf("%d blocks, over the protocol's %d-block limit", len(blocks), maxBlocks)
	}
	for i, b := range blocks {
		if len(b.Data) > math.MaxUint32 || len(b.Data) != int(b.Size) {
			return fmt.Errorf("block %d (%v) has %d bytes but its header says %d", i, b.Key, len(b.Data), b.Size)
		}
	}
	return nil
}

// CheckGetHeader checks the well-formed header h, with status st, of block
// i of a Get that asked for want: that it is want's, and that a block with
// bytes has at most maxBlockSize of them, the client's limit. The error
// wraps ErrProtocol: the stream cannot be trusted after it.
func CheckGetHeader(i int, want index.Key, h index.Header, st Status, maxBlockSize int) error {
	switch {
	case h.Key != want:
		return fmt.Errorf("%w: block %d is %v, want %v", ErrProtocol, i, h.Key, want)
	case st == StatusOK && int64(h.Size) > int64(maxBlockSize):
		return fmt.Errorf("%w: block %d is %s, over this client's %s limit",
			ErrProtocol, i, units.FormatBytes(int64(h.Size)), units.FormatBytes(int64(maxBlockSize)))
	}
	return nil
}

// DecodePutHeaders decodes the block headers of a put, raw holding them
// back to back, and appends them to dst[:0]. It returns them with the
// payload bytes they declare, and problem, which says what is wrong with
// them for the server's refusal, or is "" when every header is well
// formed, carries no status nor message, and declares at most maxBlockSize
// bytes. The headers are returned whatever problem says.
func DecodePutHeaders(dst []index.Header, raw []byte, maxBlockSize int) (hdrs []index.Header, payload int64, problem string) {
	hdrs = dst[:0]
	var problems []string
	for i := range len(raw) / HeaderSize {
		h, st, msgLen, err := DecodeHeader(raw[i*HeaderSize:])
		payload += int64(h.Size)
		switch {
		case err != nil:
			problems = append(problems, fmt.Sprintf("block %d: %v", i, err))
		case st != StatusOK || msgLen != 0:
			problems = append(problems, fmt.Sprintf(
				"block %d: a put's header carries status %d and a %d-byte message, want neither", i, st, msgLen))
		case int64(h.Size) > int64(maxBlockSize):
			problems = append(problems, fmt.Sprintf("block %d is %s, over the %s limit",
				i, units.FormatBytes(int64(h.Size)), units.FormatBytes(int64(maxBlockSize))))
		}
		hdrs = append(hdrs, h)
	}
	return hdrs, payload, summarize(problems)
}

// summarize joins the problems of a refused put: the first three, then how
// many more there are.
func summarize(problems []string) string {
	const shown = 3
	if len(problems) <= shown {
		return strings.Join(problems, "; ")
	}
	return fmt.Sprintf("%s; and %d more", strings.Join(problems[:shown], "; "), len(problems)-shown)
}
