package resp_test

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"

	"github.com/kvstrata/kvstrata/api/resp"
	"github.com/kvstrata/kvstrata/api/resp/resptest"
	"github.com/kvstrata/kvstrata/index"
)

// reservingStore is a MemStore with the power to take a plain SET's value
// into room of its own (resp.SetReserver). It counts the reservations
// committed and aborted, and checks that the pieces it is told were filled
// cover the room in order.
type reservingStore struct {
	*resptest.MemStore
	mu                  sync.Mutex
	reserved, committed int
	aborted             int
}

func (s *reservingStore) ReserveSet(ctx context.Context, key string, size int) (resp.PendingSet, bool, error) {
	s.mu.Lock()
	s.reserved++
	s.mu.Unlock()
	return &pending{s: s, ctx: ctx, key: key, room: make([]byte, size), d: index.NewDigest()}, true, nil
}

type pending struct {
	s      *reservingStore
	ctx    context.Context
	key    string
	room   []byte
	filled int
	d      *index.Digest
	done   bool
}

func (p *pending) Bytes() []byte { return p.room }

func (p *pending) Filled(piece []byte) {
	if len(piece) == 0 || &piece[0] != &p.room[p.filled] {
		panic(fmt.Sprintf("filled a piece of %d bytes out of order at %d", len(piece), p.filled))
	}
	p.filled += len(piece)
	_, _ = p.d.Write(piece)
}

func (p *pending) Commit() error {
	if p.filled != len(p.room) || p.d.Sum64() != index.Checksum(p.room) {
		return fmt.Errorf("committed with %d of %d bytes told filled", p.filled, len(p.room))
	}
	p.done = true
	p.s.mu.Lock()
	p.s.committed++
	p.s.mu.Unlock()
	return p.s.Set(p.ctx, p.key, p.room)
}

func (p *pending) Abort() {
	if p.done {
		return
	}
	p.done = true
	p.s.mu.Lock()
	p.s.aborted++
	p.s.mu.Unlock()
}

func (s *reservingStore) counts() (reserved, committed, aborted int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reserved, s.committed, s.aborted
}

// A plain SET of a long value goes into the store's room, whatever pieces
// the client sends it in; a short one, one with options and one queued
// in MULTI are read by the server and stored with SetWith.
func TestSetReadsALongValueIntoTheStoresRoom(t *testing.T) {
	st := &reservingStore{MemStore: resptest.NewMemStore()}
	_, addr := startServer(t, st, nil)
	c := dial(t, addr)
	value := bytes.Repeat([]byte("0123456789abcdef"), 300<<10/16)
	value[0], value[len(value)-1] = 'A', 'Z'
	cmd := fmt.Sprintf("*3\r\n$3\r\nset\r\n$3\r\nbig\r\n$%d\r\n%s\r\n", len(value), value)
	for _, step := range []int{len(cmd), 1000, 64 << 10, 7} {
		for off := 0; off < len(cmd); off += step {
			c.sendRaw(cmd[off:min(off+step, len(cmd))])
		}
		if got := c.read(); got != "+OK" {
			t.Fatalf("SET in pieces of %d: %s", step, got)
		}
		if got := c.do("GET", "big"); got != strconv.Quote(string(value)) {
			t.Fatalf("GET after SET in pieces of %d: %d bytes back", step, len(got))
		}
	}
	if r, cm, a := st.counts(); r != 4 || cm != 4 || a != 0 {
		t.Fatalf("reserved %d, committed %d, aborted %d; want 4, 4, 0", r, cm, a)
	}
	long := string(value[:40<<10])
	for _, args := range [][]string{
		{"SET", "small", "v"},
		{"SET", "opt", long, "EX", "100"},
		{"SETNX", "nx", long},
	} {
		if got := c.do(args...); got != "+OK" && got != ":1" {
			t.Fatalf("%s: %s", args[0], got)
		}
	}
	if got := c.do("MULTI"); got != "+OK" {
		t.Fatal(got)
	}
	if got := c.do("SET", "tx", long); got != "+QUEUED" {
		t.Fatal(got)
	}
	if got := c.do("EXEC"); got != "*1\n+OK" && !bytes.Contains([]byte(got), []byte("OK")) {
		t.Fatalf("EXEC: %s", got)
	}
	for _, k := range []string{"opt", "nx", "tx"} {
		if got := c.do("GET", k); got != strconv.Quote(long) {
			t.Fatalf("GET %s: %d bytes back", k, len(got))
		}
	}
	if r, _, _ := st.counts(); r != 4 {
		t.Fatalf("%d reservations; want none for a short value, options, SETNX or MULTI", r-4)
	}
}

// A SET whose client goes away in the middle of its value gives the room
// back and leaves the key as it was.
func TestSetCutMidValueAbortsTheRoom(t *testing.T) {
	st := &reservingStore{MemStore: resptest.NewMemStore()}
	_, addr := startServer(t, st, nil)
	c := dial(t, addr)
	if got := c.do("SET", "k", "old"); got != "+OK" {
		t.Fatal(got)
	}
	c.sendRaw(fmt.Sprintf("*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$%d\r\n", 1<<20) + string(make([]byte, 100<<10)))
	c.nc.Close()
	c2 := dial(t, addr)
	// The first connection's reservation is aborted once the server sees
	// it closed; until then and after, the key reads "old".
	for {
		if got := c2.do("GET", "k"); got != strconv.Quote("old") {
			t.Fatalf("GET k after a cut SET: %s", got)
		}
		if r, cm, a := st.counts(); r == 1 && a == 1 {
			if cm != 0 {
				t.Fatalf("%d commits of a cut SET", cm)
			}
			break
		}
	}
}

// A client that may not write gets no room, and its SET is refused as
// before.
func TestSetReservesNothingForAClientThatMayNotRunIt(t *testing.T) {
	st := &reservingStore{MemStore: resptest.NewMemStore()}
	_, addr := startServer(t, st, &resp.Config{Auth: testUsers(t)})
	c := dial(t, addr)
	if got := c.do("AUTH", "reader", "reader-pw"); got != "+OK" {
		t.Fatal(got)
	}
	got := c.do("SET", "k", string(make([]byte, 100<<10)))
	if len(got) < 7 || got[:7] != "-NOPERM" {
		t.Fatalf("SET by a reader: %s", got)
	}
	if r, _, _ := st.counts(); r != 0 {
		t.Fatalf("%d reservations for a refused SET", r)
	}
}
