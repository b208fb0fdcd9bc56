package respcluster_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/api/resp"
	"github.com/kvstrata/kvstrata/api/resp/respcluster"
	"github.com/kvstrata/kvstrata/api/resp/resptest"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/internal/hung"
)

// fill stores n keys in node id's own store and returns them.
func fill(t *testing.T, c *cluster, id index.NodeID, n int) []string {
	t.Helper()
	var keys []string
	for i := range n {
		k := fmt.Sprintf("n%d:key:%02d", id, i)
		if err := c.locals[id].Set(ctx(t), k, []byte("v")); err != nil {
			t.Fatal(err)
		}
		keys = append(keys, k)
	}
	return keys
}

// scanAll walks the keyspace to the end, each page through the next of
// through (so that a cursor goes from node to node), and returns the
// keys sorted.
func scanAll(t *testing.T, count int, through ...resp.Store) []string {
	t.Helper()
	var all []string
	var cursor uint64
	for i := range 10000 {
		keys, next, err := through[i%len(through)].(resp.KeyStore).Scan(ctx(t), cursor, count)
		if err != nil {
			t.Fatalf("SCAN %d: %v", cursor, err)
		}
		all = append(all, keys...)
		if cursor = next; cursor == 0 {
			slices.Sort(all)
			return all
		}
	}
	t.Fatal("SCAN did not end in 10000 calls")
	return nil
}

func TestScanWalksEveryMember(t *testing.T) {
	c := newCluster(t, 3)
	var want []string
	for id := index.NodeID(1); id <= 3; id++ {
		want = append(want, fill(t, c, id, 5+int(id))...)
	}
	slices.Sort(want)
	for _, count := range []int{1, 4, 1000} {
		for id := index.NodeID(1); id <= 3; id++ {
			if got := scanAll(t, count, c.stores[id]); !slices.Equal(got, want) {
				t.Fatalf("SCAN COUNT %d through node %d = %q, want %q", count, id, got, want)
			}
		}
		// A cursor is good on any node.
		if got := scanAll(t, count, c.stores[2], c.stores[3], c.stores[1]); !slices.Equal(got, want) {
			t.Fatalf("SCAN COUNT %d, each page through another node = %q, want %q", count, got, want)
		}
	}
	for id := index.NodeID(1); id <= 3; id++ {
		if n, err := c.stores[id].Len(ctx(t)); n != int64(len(want)) || err != nil {
			t.Fatalf("DBSIZE through node %d = %d, %v; want %d", id, n, err, len(want))
		}
	}
}

func TestFlushEmptiesEveryMember(t *testing.T) {
	c := newCluster(t, 3)
	total := 0
	for id := index.NodeID(1); id <= 3; id++ {
		total += len(fill(t, c, id, 3))
	}
	n, err := c.stores[2].(resp.KeyStore).Flush(ctx(t))
	if n != int64(total) || err != nil {
		t.Fatalf("FLUSHALL through node 2 = %d, %v; want %d", n, err, total)
	}
	for id := index.NodeID(1); id <= 3; id++ {
		if n, err := c.locals[id].Len(ctx(t)); n != 0 || err != nil {
			t.Fatalf("node %d holds %d keys after FLUSHALL (%v)", id, n, err)
		}
	}
}

// A member that leaves during a walk is passed over: the walk goes on
// with the next member from its start.
func TestScanGoesOnPastAMemberThatLeft(t *testing.T) {
	c := newCluster(t, 3)
	one, three := fill(t, c, 1, 4), fill(t, c, 3, 4)
	fill(t, c, 2, 4)
	var got []string
	var cursor uint64
	for {
		keys, next, err := c.stores[1].(resp.KeyStore).Scan(ctx(t), cursor, 1)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, keys...)
		if next>>32 == 2 && next&(1<<32-1) != 0 { // inside node 2's keys
			c.mu.Lock()
			delete(c.addrs, 2)
			c.mu.Unlock()
		}
		if cursor = next; cursor == 0 {
			break
		}
	}
	for _, k := range append(one, three...) {
		if !slices.Contains(got, k) {
			t.Fatalf("SCAN missed %s of a member still there: got %q", k, got)
		}
	}
}

// A member that does not answer costs a walk one PeerTimeout, is left
// out (SCAN, DBSIZE) and makes FLUSHALL reply TRYAGAIN if it is believed
// up, after the others are flushed.
func TestAMemberThatDoesNotAnswerIsSkipped(t *testing.T) {
	c := newClusterTimeout(t, 3, 2*time.Second)
	var want []string
	for id := index.NodeID(1); id <= 3; id++ {
		want = append(want, fill(t, c, id, 3)...)
	}
	slices.Sort(want)
	c.setAddr(8, hung.Listener(t))
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c.setAddr(9, l.Addr().String())
	l.Close() // nothing listens there

	if got := scanAll(t, 100, c.stores[2]); !slices.Equal(got, want) {
		t.Fatalf("SCAN past a hung and a dead member = %q, want %q", got, want)
	}
	if n, err := c.stores[2].Len(ctx(t)); n != int64(len(want)) || err != nil {
		t.Fatalf("DBSIZE past a hung and a dead member = %d, %v; want %d", n, err, len(want))
	}
	_, err = c.stores[2].(resp.KeyStore).Flush(ctx(t))
	if !errors.Is(err, resp.ErrUnavailable) {
		t.Fatalf("FLUSHALL with members up that do not answer: %v; want TRYAGAIN", err)
	}
	for id := index.NodeID(1); id <= 3; id++ {
		if n, _ := c.locals[id].Len(ctx(t)); n != 0 {
			t.Fatalf("node %d holds %d keys after FLUSHALL", id, n)
		}
	}
	c.mu.Lock()
	c.down[8], c.down[9] = true, true
	c.mu.Unlock()
	if _, err := c.stores[2].(resp.KeyStore).Flush(ctx(t)); err != nil {
		t.Fatalf("FLUSHALL with only members marked down not answering: %v", err)
	}
}

// bigCursor is a store whose SCAN cursors use all 64 bits.
type bigCursor struct{ *resptest.MemStore }

func (b bigCursor) Scan(ctx context.Context, cursor uint64, count int) ([]string, uint64, error) {
	keys, _, err := b.MemStore.Scan(ctx, 0, count)
	return keys, 1 << 40, err
}

func TestScanRefusesAMemberCursorItCannotHold(t *testing.T) {
	c := newClusterOf(t, 2, 20*time.Second, func() resp.Store { return bigCursor{resptest.NewMemStore()} })
	fill(t, c, 1, 2)
	if _, _, err := c.stores[1].(resp.KeyStore).Scan(ctx(t), 0, 1); !errors.Is(err, respcluster.ErrCursor) {
		t.Fatalf("SCAN of a store with 64-bit cursors: %v; want ErrCursor", err)
	}
}

// A page of long keys from another node may be over gRPC's default 4 MiB
// message limit.
func TestScanBringsAPageOfLongKeys(t *testing.T) {
	c := newCluster(t, 2)
	var want []string
	for i := range 5 {
		k := fmt.Sprintf("%d:%s", i, strings.Repeat("k", 1<<20))
		if err := c.locals[1].Set(ctx(t), k, []byte("v")); err != nil {
			t.Fatal(err)
		}
		want = append(want, k)
	}
	if got := scanAll(t, 10, c.stores[2]); !slices.Equal(got, want) {
		t.Fatalf("SCAN through node 2 of node 1's five 1 MiB keys returned %d keys", len(got))
	}
}

// An update through a node of a key another node holds starts from that
// node's value and deadline, and leaves the key on the updating node only.
func TestUpdateOfAKeyHeldElsewhere(t *testing.T) {
	c := newCluster(t, 2)
	k := c.key("counter")
	at := time.Now().Add(time.Hour).Truncate(time.Millisecond)
	if _, err := c.stores[1].(resp.KeyStore).SetWith(ctx(t), k, []byte("41"), resp.SetOptions{ExpireAt: at}); err != nil {
		t.Fatal(err)
	}
	err := c.stores[2].(resp.Updater).Update(ctx(t), k, func(old []byte, info resp.KeyInfo, found bool) (resp.Write, error) {
		if !found || string(old) != "41" || !info.ExpireAt.Equal(at) {
			t.Errorf("Update through node 2 saw %q, %v, found %v; want node 1's \"41\", %v", old, info.ExpireAt, found, at)
		}
		return resp.Write{Value: []byte("42"), ExpireAt: info.ExpireAt}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	mustGet(t, c.stores[1], k, "42")
	mustMiss(t, c.locals[1], k)
	if ki, err := c.stores[1].(resp.KeyStore).Stat(ctx(t), k); err != nil || !ki.ExpireAt.Equal(at) {
		t.Fatalf("deadline after the update = %v, %v; want %v", ki.ExpireAt, err, at)
	}
}
