//go:build ucx

package ucx

import (
	"encoding/binary"
	"fmt"

	"github.com/kvstrata/kvstrata/transfer/internal/frame"
)

// The tags and frames of protocol version 1 that are the ucx backend's own;
// doc.go describes them. Keys, block headers and results are package
// frame's, shared with the tcp backend.

// Tag layout, high bits first: connection id, kind, request sequence
// number, block index, chunk index.
const (
	chunkShift = 0
	indexShift = 8
	seqShift   = 28
	kindShift  = 36
	idShift    = 40

	maxID     = 1<<24 - 1
	maxChunks = 1 << 8
	maxIndex  = 1<<20 - 1

	fullMask = ^uint64(0)
	// reqTag and reqMask match both request kinds (2 and 3) of any
	// connection: the server takes requests off the unexpected queue with
	// them.
	reqTag  = uint64(kindGet) << kindShift
	reqMask = uint64(0xe) << kindShift
	idMask  = uint64(maxID) << idShift
)

// kind says what a tagged message is.
type kind uint8

const (
	kindResponse kind = 1 // server → client: a request's answer
	kindGet      kind = 2 // client → server: a get; index holds count-1
	kindPut      kind = 3 // client → server: a put; index holds count-1
	kindHeader   kind = 4 // server → client: block index's header
	kindBlock    kind = 5 // server → client: a chunk of a got block
	kindPayload  kind = 6 // client → server: a chunk of a put block
	kindResults  kind = 7 // server → client: a put's outcome per block
)

func tagOf(id uint32, k kind, seq uint8, index, chunk int) uint64 {
	return uint64(id)<<idShift | uint64(k)<<kindShift | uint64(seq)<<seqShift |
		uint64(index)<<indexShift | uint64(chunk)<<chunkShift
}

// splitTag returns a request tag's parts.
func splitTag(tag uint64) (id uint32, k kind, seq uint8, index int) {
	return uint32(tag >> idShift), kind(tag >> kindShift & 0xf), uint8(tag >> seqShift), int(tag >> indexShift & maxIndex)
}

// chunking returns how a block of size bytes is cut into messages: n
// chunks of each bytes (the last one shorter), at most maxChunks.
func chunking(size, chunk int) (n, each int) {
	if size == 0 {
		return 0, 0
	}
	each = max(chunk, (size+maxChunks-1)/maxChunks)
	return (size + each - 1) / each, each
}

// chunkOf returns chunk j of b cut in chunks of each bytes.
func chunkOf(b []byte, j, each int) []byte {
	return b[j*each : min((j+1)*each, len(b))]
}

// Frames.
const (
	magic           = "KVUX"
	version         = 1
	clientHelloSize = 16
	serverHelloSize = 24
	requestSize     = 8
	responseSize    = 8
	// maxAddr bounds a worker address in a hello; UCX's are a few hundred
	// bytes.
	maxAddr = 64 << 10
)

// opcode is a request's operation; the values are the wire's.
type opcode = frame.Op

const (
	opGet = frame.OpGet
	opPut = frame.OpPut
)

// client hello: magic, version:u8, 0:u8, 0:u16, addrlen:u32, 0:u32, addr.
func putClientHello(b []byte, addrLen int) {
	copy(b, magic)
	b[4], b[5], b[6], b[7] = version, 0, 0, 0
	binary.LittleEndian.PutUint32(b[8:], uint32(addrLen))
	binary.LittleEndian.PutUint32(b[12:], 0)
}

func decodeClientHello(b []byte) (ver uint8, addrLen int, err error) {
	if string(b[:4]) != magic {
		return 0, 0, fmt.Errorf("%w: hello starts %q, want %q", frame.ErrProtocol, b[:4], magic)
	}
	ver, addrLen = b[4], int(binary.LittleEndian.Uint32(b[8:]))
	if addrLen == 0 || addrLen > maxAddr {
		return ver, 0, fmt.Errorf("%w: worker address of %d bytes", frame.ErrProtocol, addrLen)
	}
	return ver, addrLen, nil
}

// server hello: magic, version:u8, status:u8, msglen:u16, id:u32,
// chunk:u32, addrlen:u32, 0:u32, msg, addr.
func putServerHello(b []byte, st frame.Status, msgLen int, id uint32, chunk, addrLen int) {
	copy(b, magic)
	b[4], b[5] = version, byte(st)
	binary.LittleEndian.PutUint16(b[6:], uint16(msgLen))
	binary.LittleEndian.PutUint32(b[8:], id)
	binary.LittleEndian.PutUint32(b[12:], uint32(chunk))
	binary.LittleEndian.PutUint32(b[16:], uint32(addrLen))
	binary.LittleEndian.PutUint32(b[20:], 0)
}

func decodeServerHello(b []byte) (ver uint8, st frame.Status, msgLen int, id uint32, chunk, addrLen int, err error) {
	if string(b[:4]) != magic {
		return 0, 0, 0, 0, 0, 0, fmt.Errorf("%w: hello starts %q, want %q", frame.ErrProtocol, b[:4], magic)
	}
	ver, st, msgLen = b[4], frame.Status(b[5]), int(binary.LittleEndian.Uint16(b[6:]))
	id, chunk = binary.LittleEndian.Uint32(b[8:]), int(binary.LittleEndian.Uint32(b[12:]))
	addrLen = int(binary.LittleEndian.Uint32(b[16:]))
	switch {
	case !st.KnownInHello() || msgLen > frame.MaxMsg:
		err = fmt.Errorf("%w: hello status %d with a %d-byte message", frame.ErrProtocol, st, msgLen)
	case st == frame.StatusOK && (id == 0 || id > maxID || chunk < MinChunkSize || addrLen == 0 || addrLen > maxAddr):
		err = fmt.Errorf("%w: hello with id %d, chunk %d, a %d-byte address", frame.ErrProtocol, id, chunk, addrLen)
	}
	return ver, st, msgLen, id, chunk, addrLen, err
}

func putRequest(b []byte, o opcode, count int) {
	b[0], b[1], b[2], b[3] = byte(o), 0, 0, 0
	binary.LittleEndian.PutUint32(b[4:], uint32(count))
}

// response: status:u8, 0:u8, msglen:u16, count:u32, msg; a put's go-ahead
// goes on with count bytes, 1 for each block the client is to send.
func putResponse(b []byte, st frame.Status, msgLen, count int) {
	b[0], b[1] = byte(st), 0
	binary.LittleEndian.PutUint16(b[2:], uint16(msgLen))
	binary.LittleEndian.PutUint32(b[4:], uint32(count))
}

func decodeResponse(b []byte) (st frame.Status, msg []byte, count int, err error) {
	if len(b) < responseSize {
		return 0, nil, 0, fmt.Errorf("%w: response of %d bytes", frame.ErrProtocol, len(b))
	}
	st, msgLen, count := frame.Status(b[0]), int(binary.LittleEndian.Uint16(b[2:])), int(binary.LittleEndian.Uint32(b[4:]))
	switch {
	case st != frame.StatusOK && st != frame.StatusRefused && st != frame.StatusError:
		return st, nil, 0, fmt.Errorf("%w: response status %d", frame.ErrProtocol, st)
	case msgLen > frame.MaxMsg || responseSize+msgLen > len(b):
		return st, nil, 0, fmt.Errorf("%w: response message of %d bytes in a %d-byte frame", frame.ErrProtocol, msgLen, len(b))
	}
	return st, b[responseSize : responseSize+msgLen], count, nil
}

// decodeResult decodes the first of the results b holds back to back, each
// a frame.PutResult and its msg, and returns it and the rest of b.
func decodeResult(b []byte) (st frame.Status, msg []byte, rest []byte, err error) {
	if len(b) < frame.ResultSize {
		return 0, nil, nil, fmt.Errorf("%w: result cut short", frame.ErrProtocol)
	}
	st, msgLen, err := frame.DecodeResult(b)
	if err != nil || frame.ResultSize+msgLen > len(b) {
		return 0, nil, nil, fmt.Errorf("%w: result % x", frame.ErrProtocol, b[:frame.ResultSize])
	}
	return st, b[frame.ResultSize : frame.ResultSize+msgLen], b[frame.ResultSize+msgLen:], nil
}

// grow returns (*b)[:n], reallocating *b when it is shorter.
func grow(b *[]byte, n int) []byte {
	if cap(*b) < n {
		*b = make([]byte, n)
	}
	*b = (*b)[:n]
	return *b
}
