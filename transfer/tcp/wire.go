package tcp

import (
	"encoding/binary"
	"fmt"

	"github.com/kvstrata/kvstrata/transfer/internal/frame"
)

// The frames of protocol version 1 that are the tcp backend's own: hellos,
// requests and responses; doc.go describes them. Keys, block headers and
// results are package frame's, shared with the ucx backend.
const (
	magic        = "KVST"
	version      = 1
	helloSize    = 8
	requestSize  = 8
	responseSize = 8
	// maxBatchBlocks is the most blocks the server gathers into one writev.
	maxBatchBlocks = 32
)

// op is a request's operation; the values are the wire's.
type op = frame.Op

const (
	opGet = frame.OpGet
	opPut = frame.OpPut
)

const flagClosing = 1 << 0 // response flags: the server closes after it

func putHello(b []byte, st frame.Status, msgLen int) {
	copy(b, magic)
	b[4] = version
	b[5] = byte(st)
	binary.LittleEndian.PutUint16(b[6:], uint16(msgLen))
}

// decodeHello decodes a hello; the version is returned even when it is not
// ours, so that the caller can say which one it got.
func decodeHello(b []byte) (ver uint8, st frame.Status, msgLen int, err error) {
	if string(b[:4]) != magic {
		return 0, 0, 0, fmt.Errorf("%w: hello starts %q, want %q", frame.ErrProtocol, b[:4], magic)
	}
	ver, st, msgLen = b[4], frame.Status(b[5]), int(binary.LittleEndian.Uint16(b[6:]))
	switch {
	case !st.Known() && st != frame.StatusUnauthenticated:
		return ver, st, msgLen, fmt.Errorf("%w: hello status %d", frame.ErrProtocol, st)
	case msgLen > frame.MaxMsg:
		return ver, st, msgLen, fmt.Errorf("%w: hello message of %d bytes, over %d", frame.ErrProtocol, msgLen, frame.MaxMsg)
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
		return o, count, fmt.Errorf("%w: unknown %v", frame.ErrProtocol, o)
	}
	if b[1]|b[2]|b[3] != 0 {
		return o, count, fmt.Errorf("%w: %v request has reserved bytes % x", frame.ErrProtocol, o, b[1:4])
	}
	return o, count, nil
}

func putResponse(b []byte, st frame.Status, flags uint8, msgLen, count int) {
	b[0], b[1] = byte(st), flags
	binary.LittleEndian.PutUint16(b[2:], uint16(msgLen))
	binary.LittleEndian.PutUint32(b[4:], uint32(count))
}

func decodeResponse(b []byte) (st frame.Status, flags uint8, msgLen int, count uint32, err error) {
	st, flags = frame.Status(b[0]), b[1]
	msgLen, count = int(binary.LittleEndian.Uint16(b[2:])), binary.LittleEndian.Uint32(b[4:])
	switch {
	case st != frame.StatusOK && st != frame.StatusRefused && st != frame.StatusError:
		err = fmt.Errorf("%w: response status %d", frame.ErrProtocol, st)
	case flags&^flagClosing != 0:
		err = fmt.Errorf("%w: response flags 0x%02x", frame.ErrProtocol, flags)
	case msgLen > frame.MaxMsg:
		err = fmt.Errorf("%w: response message of %d bytes, over %d", frame.ErrProtocol, msgLen, frame.MaxMsg)
	}
	return st, flags, msgLen, count, err
}
