package tcp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/transfer"
)

// The frames of protocol version 1; doc.go describes them.
const (
	magic        = "KVST"
	version      = 1
	helloSize    = 8
	requestSize  = 8
	responseSize = 8
	keySize      = 16
	headerSize   = 40
	resultSize   = 4
	// maxMsg is the longest msg of any frame, in bytes.
	maxMsg = 512
	// maxBatchBlocks is the most blocks the server gathers into one writev.
	maxBatchBlocks = 32
)

type op uint8

const (
	opGet op = 1
	opPut op = 2
)

func (o op) String() string {
	switch o {
	case opGet:
		return "get"
	case opPut:
		return "put"
	}
	return fmt.Sprintf("op 0x%02x", uint8(o))
}

type status uint8

const (
	statusOK status = iota
	statusNotFound
	statusCorrupt
	statusRefused
	statusError
	statusFull // the handler had no room for the block (transfer.ErrFull)
	numStatus
)

const (
	flagHasParent = 1 << 0 // block header flags
	flagClosing   = 1 << 0 // response flags: the server closes after it
)

// errProtocol marks bytes from the network that break the protocol.
var errProtocol = errors.New("protocol violation")

func putHello(b []byte, st status, msgLen int) {
	copy(b, magic)
	b[4] = version
	b[5] = byte(st)
	binary.LittleEndian.PutUint16(b[6:], uint16(msgLen))
}

// decodeHello decodes a hello; the version is returned even when it is not
// ours, so that the caller can say which one it got.
func decodeHello(b []byte) (ver uint8, st status, msgLen int, err error) {
	if string(b[:4]) != magic {
		return 0, 0, 0, fmt.Errorf("%w: hello starts %q, want %q", errProtocol, b[:4], magic)
	}
	ver, st, msgLen = b[4], status(b[5]), int(binary.LittleEndian.Uint16(b[6:]))
	switch {
	case st >= numStatus:
		return ver, st, msgLen, fmt.Errorf("%w: hello status %d", errProtocol, st)
	case msgLen > maxMsg:
		return ver, st, msgLen, fmt.Errorf("%w: hello message of %d bytes, over %d", errProtocol, msgLen, maxMsg)
	}
	return ver, st, msgLen, nil
}

func putRequest(b []byte, o op, count int) {
	b[0], b[1], b[2], b[3] = byte(o), 0, 0, 0
	binary.LittleEndian.PutUint32(b[4:], uint32(count))
}

// decodeRequest decodes a request header. An unknown op or nonzero reserved
// bytes are an error: the request cannot be framed.
func decodeRequest(b []byte) (o op, count uint32, err error) {
	o, count = op(b[0]), binary.LittleEndian.Uint32(b[4:])
	if o != opGet && o != opPut {
		return o, count, fmt.Errorf("%w: unknown %v", errProtocol, o)
	}
	if b[1]|b[2]|b[3] != 0 {
		return o, count, fmt.Errorf("%w: %v request has reserved bytes % x", errProtocol, o, b[1:4])
	}
	return o, count, nil
}

func putResponse(b []byte, st status, flags uint8, msgLen, count int) {
	b[0], b[1] = byte(st), flags
	binary.LittleEndian.PutUint16(b[2:], uint16(msgLen))
	binary.LittleEndian.PutUint32(b[4:], uint32(count))
}

func decodeResponse(b []byte) (st status, flags uint8, msgLen int, count uint32, err error) {
	st, flags = status(b[0]), b[1]
	msgLen, count = int(binary.LittleEndian.Uint16(b[2:])), binary.LittleEndian.Uint32(b[4:])
	switch {
	case st != statusOK && st != statusRefused && st != statusError:
		err = fmt.Errorf("%w: response status %d", errProtocol, st)
	case flags&^flagClosing != 0:
		err = fmt.Errorf("%w: response flags 0x%02x", errProtocol, flags)
	case msgLen > maxMsg:
		err = fmt.Errorf("%w: response message of %d bytes, over %d", errProtocol, msgLen, maxMsg)
	}
	return st, flags, msgLen, count, err
}

func putKey(b []byte, k index.Key) {
	binary.LittleEndian.PutUint64(b, uint64(k.NS))
	binary.LittleEndian.PutUint64(b[8:], uint64(k.Hash))
}

func decodeKey(b []byte) index.Key {
	return index.Key{
		NS:   index.NamespaceID(binary.LittleEndian.Uint64(b)),
		Hash: index.Hash(binary.LittleEndian.Uint64(b[8:])),
	}
}

// putHeader encodes a block header. A header without a parent goes out with
// parent 0, whatever h.Parent holds.
func putHeader(b []byte, h *transfer.Header, st status, msgLen int) {
	putKey(b, h.Key)
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

// decodeHeader decodes a block header. The header's fields are returned even
// when err reports a malformed flag, status or msglen, so that a server can
// still skip the block's payload.
func decodeHeader(b []byte) (h transfer.Header, st status, msgLen int, err error) {
	h.Key = decodeKey(b)
	parent := binary.LittleEndian.Uint64(b[16:])
	h.Sum = binary.LittleEndian.Uint64(b[24:])
	h.Size = binary.LittleEndian.Uint32(b[32:])
	flags, st, msgLen := b[36], status(b[37]), int(binary.LittleEndian.Uint16(b[38:]))
	h.HasParent = flags&flagHasParent != 0
	if h.HasParent {
		h.Parent = index.Hash(parent)
	}
	switch {
	case flags&^flagHasParent != 0:
		err = fmt.Errorf("%w: unknown flags 0x%02x", errProtocol, flags)
	case !h.HasParent && parent != 0:
		err = fmt.Errorf("%w: parent %016x without the has-parent flag", errProtocol, parent)
	case st >= numStatus:
		err = fmt.Errorf("%w: status %d", errProtocol, st)
	case msgLen > maxMsg:
		err = fmt.Errorf("%w: message of %d bytes, over %d", errProtocol, msgLen, maxMsg)
	}
	return h, st, msgLen, err
}

func putResult(b []byte, st status, msgLen int) {
	b[0], b[1] = byte(st), 0
	binary.LittleEndian.PutUint16(b[2:], uint16(msgLen))
}

func decodeResult(b []byte) (st status, msgLen int, err error) {
	st, msgLen = status(b[0]), int(binary.LittleEndian.Uint16(b[2:]))
	switch {
	case st >= numStatus || b[1] != 0:
		err = fmt.Errorf("%w: result % x", errProtocol, b[:2])
	case msgLen > maxMsg:
		err = fmt.Errorf("%w: result message of %d bytes, over %d", errProtocol, msgLen, maxMsg)
	}
	return st, msgLen, err
}

// statusOf maps a Handler's error to the status that carries it.
func statusOf(err error) status {
	switch {
	case err == nil:
		return statusOK
	case errors.Is(err, transfer.ErrNotFound):
		return statusNotFound
	case errors.Is(err, transfer.ErrCorrupt):
		return statusCorrupt
	case errors.Is(err, transfer.ErrFull):
		return statusFull
	}
	return statusError
}

// message returns the text that goes on the wire for err: at most maxMsg
// bytes of valid UTF-8; none for statuses that say it all.
func message(st status, err error) string {
	if err == nil || st == statusNotFound {
		return ""
	}
	return clip(err.Error())
}

// clip returns s as valid UTF-8 of at most maxMsg bytes.
func clip(s string) string {
	s = strings.ToValidUTF8(s, "?")
	if len(s) > maxMsg {
		s = s[:maxMsg]
		for r, n := utf8.DecodeLastRuneInString(s); r == utf8.RuneError && n == 1; {
			s = s[:len(s)-1]
			r, n = utf8.DecodeLastRuneInString(s)
		}
	}
	return s
}
