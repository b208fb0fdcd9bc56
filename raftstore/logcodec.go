package raftstore

import (
	"encoding/binary"
	"fmt"
	"time"

	"github.com/hashicorp/raft"
)

// logFormatV1 is the version byte of a stored raft.Log.
//
// Version 1, after the version byte:
//
//	uvarint Index
//	uvarint Term
//	byte    Type
//	uvarint len(Data)       Data
//	uvarint len(Extensions) Extensions
//	varint  AppendedAt.Unix()  uvarint AppendedAt.Nanosecond()
//
// A zero AppendedAt round-trips as a time for which IsZero is true.
const logFormatV1 = 1

// logSize returns the length of appendLog's encoding of l.
func logSize(l *raft.Log) int {
	return 1 + uvarintLen(l.Index) + uvarintLen(l.Term) + 1 +
		uvarintLen(uint64(len(l.Data))) + len(l.Data) +
		uvarintLen(uint64(len(l.Extensions))) + len(l.Extensions) +
		timeSize(l.AppendedAt)
}

// timeSize returns the length of appendTime's encoding of t.
func timeSize(t time.Time) int {
	sec := t.Unix()
	return uvarintLen(uint64(sec<<1)^uint64(sec>>63)) + uvarintLen(uint64(t.Nanosecond()))
}

// uvarintLen returns the length of the uvarint encoding of v.
func uvarintLen(v uint64) int {
	n := 1
	for v >= 0x80 {
		v >>= 7
		n++
	}
	return n
}

// appendLog appends the encoding of l to dst.
func appendLog(dst []byte, l *raft.Log) []byte {
	dst = append(dst, logFormatV1)
	dst = binary.AppendUvarint(dst, l.Index)
	dst = binary.AppendUvarint(dst, l.Term)
	dst = append(dst, byte(l.Type))
	dst = binary.AppendUvarint(dst, uint64(len(l.Data)))
	dst = append(dst, l.Data...)
	dst = binary.AppendUvarint(dst, uint64(len(l.Extensions)))
	dst = append(dst, l.Extensions...)
	return appendTime(dst, l.AppendedAt)
}

// decodeLog decodes an entry that appendLog encoded into l. Data and
// Extensions are copied out of v, into one allocation.
func decodeLog(v []byte, l *raft.Log) error {
	r := reader{b: v}
	if ver := r.byte(); r.err == nil && ver != logFormatV1 {
		return fmt.Errorf("%w: log entry format %d, this build reads %d", ErrCorrupt, ver, logFormatV1)
	}
	var out raft.Log
	out.Index = r.uvarint()
	out.Term = r.uvarint()
	out.Type = raft.LogType(r.byte())
	data := r.bytes()
	ext := r.bytes()
	out.AppendedAt = r.time()
	if err := r.done(); err != nil {
		return fmt.Errorf("%w: log entry: %w", ErrCorrupt, err)
	}
	if n := len(data) + len(ext); n > 0 {
		buf := make([]byte, n)
		copy(buf, data)
		copy(buf[len(data):], ext)
		if len(data) > 0 {
			out.Data = buf[:len(data):len(data)]
		}
		if len(ext) > 0 {
			out.Extensions = buf[len(data):]
		}
	}
	*l = out
	return nil
}

// appendTime appends t as its Unix seconds and nanoseconds: any time,
// the zero time included, round-trips (in UTC).
func appendTime(dst []byte, t time.Time) []byte {
	dst = binary.AppendVarint(dst, t.Unix())
	return binary.AppendUvarint(dst, uint64(t.Nanosecond()))
}

// reader decodes the fields of a binary encoding. The first error sticks:
// later reads return zero values, and done reports it.
type reader struct {
	b   []byte
	err error
}

func (r *reader) fail(what string) {
	if r.err == nil {
		r.err = fmt.Errorf("truncated or bad %s", what)
	}
	r.b = nil
}

func (r *reader) byte() byte {
	if len(r.b) < 1 {
		r.fail("byte")
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

func (r *reader) uvarint() uint64 {
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.fail("uvarint")
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) varint() int64 {
	v, n := binary.Varint(r.b)
	if n <= 0 {
		r.fail("varint")
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) u64() uint64 {
	if len(r.b) < 8 {
		r.fail("uint64")
		return 0
	}
	v := binary.LittleEndian.Uint64(r.b)
	r.b = r.b[8:]
	return v
}

// uint32 reads a uvarint that must fit in 32 bits.
func (r *reader) uint32() uint32 {
	v := r.uvarint()
	if v > 1<<32-1 {
		r.fail("uint32")
		return 0
	}
	return uint32(v)
}

// count reads the uvarint number of items that follow, each at least a
// byte long: a count beyond the bytes left is damage, and must not make
// the caller allocate.
func (r *reader) count() int {
	n := r.uvarint()
	if n > uint64(len(r.b)) {
		r.fail("count")
		return 0
	}
	return int(n)
}

// bytes reads a uvarint length and that many bytes, which alias r's.
func (r *reader) bytes() []byte {
	n := r.uvarint()
	if n > uint64(len(r.b)) {
		r.fail("length")
		return nil
	}
	v := r.b[:n:n]
	r.b = r.b[n:]
	return v
}

func (r *reader) string() string { return string(r.bytes()) }

func (r *reader) time() time.Time {
	sec := r.varint()
	nsec := r.uvarint()
	if nsec >= 1e9 {
		r.fail("nanoseconds")
		return time.Time{}
	}
	return time.Unix(sec, int64(nsec)).UTC()
}

// done reports the first error, or an error if bytes are left over.
func (r *reader) done() error {
	if r.err != nil {
		return r.err
	}
	if len(r.b) > 0 {
		return fmt.Errorf("%d bytes left over", len(r.b))
	}
	return nil
}

// appendString appends s with its uvarint length.
func appendString(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}
