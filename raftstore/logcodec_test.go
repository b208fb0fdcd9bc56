package raftstore

import (
	"bytes"
	"math"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

func TestLogEncodingRoundTripsAndLogSizeIsExact(t *testing.T) {
	times := []time.Time{
		{},
		time.Unix(0, 0),
		time.Unix(-1, 999_999_999),
		time.Date(1900, 1, 1, 0, 0, 0, 1, time.UTC),
		time.Date(2026, 11, 29, 12, 0, 0, 5, time.FixedZone("x", 3600)),
		time.Date(9999, 12, 31, 23, 59, 59, 999_999_999, time.UTC),
	}
	for _, idx := range []uint64{0, 1, 127, 128, 1 << 40, math.MaxUint64} {
		for _, at := range times {
			for _, size := range []int{0, 1, 127, 128, 70_000} {
				l := &raft.Log{
					Index: idx, Term: idx / 3, Type: raft.LogConfiguration,
					Data: bytes.Repeat([]byte{7}, size), Extensions: bytes.Repeat([]byte{9}, size/2),
					AppendedAt: at,
				}
				enc := appendLog(nil, l)
				if len(enc) != logSize(l) {
					t.Fatalf("index %d, time %v, size %d: encoding has %d bytes, logSize says %d", idx, at, size, len(enc), logSize(l))
				}
				var got raft.Log
				if err := decodeLog(enc, &got); err != nil {
					t.Fatalf("decodeLog: %v", err)
				}
				if got.Index != l.Index || got.Term != l.Term || got.Type != l.Type ||
					!bytes.Equal(got.Data, l.Data) || !bytes.Equal(got.Extensions, l.Extensions) ||
					!got.AppendedAt.Equal(l.AppendedAt) || got.AppendedAt.IsZero() != l.AppendedAt.IsZero() {
					t.Fatalf("round trip of %+v gave %+v", l, got)
				}
			}
		}
	}
}

func TestDecodeLogRejectsDamage(t *testing.T) {
	enc := appendLog(nil, &raft.Log{Index: 5, Term: 2, Data: []byte("hello"), AppendedAt: time.Unix(1, 2)})
	for i := range enc {
		if err := decodeLog(enc[:i], new(raft.Log)); err == nil {
			t.Errorf("a log entry cut to %d of %d bytes decoded", i, len(enc))
		}
	}
	if err := decodeLog(append(bytes.Clone(enc), 0), new(raft.Log)); err == nil {
		t.Error("a log entry with a trailing byte decoded")
	}
	bad := bytes.Clone(enc)
	bad[0] = 2
	if err := decodeLog(bad, new(raft.Log)); err == nil {
		t.Error("a log entry of format 2 decoded")
	}
}
