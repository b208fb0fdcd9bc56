package s3

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Object layout, under Config.Prefix (see the package doc):
//
//	<prefix>/v1/seg/<segment-id>   a segment's data: its blocks back to back
//	<prefix>/v1/idx/<segment-id>   the segment's index (segindex.go)
//
// The format version is part of every name, so a later format can live
// beside this one in the same bucket and prefix.
const (
	layoutVersion = "v1"
	dataDir       = "seg/"
	indexDir      = "idx/"
)

// layout names a tier's objects.
type layout struct {
	root string // "<prefix>/v1/", or "v1/" without a prefix
}

func newLayout(prefix string) layout {
	if prefix == "" {
		return layout{root: layoutVersion + "/"}
	}
	return layout{root: prefix + "/" + layoutVersion + "/"}
}

func (l layout) dataName(id segID) string  { return l.root + dataDir + id.String() }
func (l layout) indexName(id segID) string { return l.root + indexDir + id.String() }

// dataPrefix and indexPrefix are what a listing of every data or index
// object asks for.
func (l layout) dataPrefix() string  { return l.root + dataDir }
func (l layout) indexPrefix() string { return l.root + indexDir }

// parseIndexName returns the segment id of an index object's name; ok is
// false for a name that is not one (a stray object under the prefix).
func (l layout) parseIndexName(name string) (segID, bool) { return parseUnder(l.indexPrefix(), name) }

// parseDataName returns the segment id of a data object's name.
func (l layout) parseDataName(name string) (segID, bool) { return parseUnder(l.dataPrefix(), name) }

func parseUnder(prefix, name string) (segID, bool) {
	rest, found := strings.CutPrefix(name, prefix)
	if !found {
		return segID{}, false
	}
	id, err := parseSegID(rest)
	return id, err == nil
}

// indexNameAt is the smallest index name of a segment sealed at or after
// t: listing after it lists the segments sealed since about t.
func (l layout) indexNameAt(t time.Time) string {
	return l.indexPrefix() + fmt.Sprintf("%016x", uint64(max(t.UnixNano(), 0)))
}

// segID names a segment. Ids are ordered by the time their segment was
// sealed, then by the writer: Time is Unix nanoseconds, strictly
// increasing within one Tier; Writer is chosen at random by each Tier at
// Open, so two nodes never name a segment alike. Printed as two groups
// of 16 hex digits, ids sort as text the way they sort as numbers, so a
// listing is in seal order.
type segID struct {
	Time   uint64
	Writer uint64
}

const segIDLen = 33 // "%016x-%016x"

func (id segID) String() string {
	var b [segIDLen]byte
	const hex = "0123456789abcdef"
	for i := range 16 {
		b[15-i] = hex[id.Time>>(4*i)&0xf]
		b[32-i] = hex[id.Writer>>(4*i)&0xf]
	}
	b[16] = '-'
	return string(b[:])
}

// parseSegID is the inverse of segID.String; it accepts only lower-case
// hex, so that every id has one name.
func parseSegID(s string) (segID, error) {
	if len(s) != segIDLen || s[16] != '-' {
		return segID{}, fmt.Errorf("segment id %q is not %d characters of the form <hex16>-<hex16>", s, segIDLen)
	}
	var v [2]uint64
	for i, part := range [2]string{s[:16], s[17:]} {
		if strings.ToLower(part) != part {
			return segID{}, fmt.Errorf("segment id %q is not lower-case hex", s)
		}
		n, err := strconv.ParseUint(part, 16, 64)
		if err != nil {
			return segID{}, fmt.Errorf("segment id %q: %w", s, err)
		}
		v[i] = n
	}
	return segID{Time: v[0], Writer: v[1]}, nil
}

// newer reports whether id was sealed after o. Of two copies of one block
// in two segments, every node keeps the one in the newer segment.
func (id segID) newer(o segID) bool {
	if id.Time != o.Time {
		return id.Time > o.Time
	}
	return id.Writer > o.Writer
}

// putBinary and segIDFrom encode an id in 16 bytes, big-endian.
func (id segID) putBinary(b []byte) {
	binary.BigEndian.PutUint64(b[0:8], id.Time)
	binary.BigEndian.PutUint64(b[8:16], id.Writer)
}

func segIDFrom(b []byte) segID {
	return segID{Time: binary.BigEndian.Uint64(b[0:8]), Writer: binary.BigEndian.Uint64(b[8:16])}
}

// idSource hands out the ids of one Tier's segments.
type idSource struct {
	mu     sync.Mutex
	writer uint64
	last   uint64
}

func newIDSource() *idSource { return &idSource{writer: rand.Uint64()} }

// next returns a fresh id, later than every id it returned before even if
// the clock steps back.
func (s *idSource) next(now time.Time) segID {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := max(uint64(max(now.UnixNano(), 0)), s.last+1)
	s.last = t
	return segID{Time: t, Writer: s.writer}
}
