package dataplane

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/api/node"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/tiers"
	"github.com/kvstrata/kvstrata/tiers/dram"
	"github.com/kvstrata/kvstrata/tiers/tiertest"
	"github.com/kvstrata/kvstrata/transfer"
)

// observed is what an Observer heard, one "direction bytes status" each.
type observed struct {
	mu   sync.Mutex
	seen []string
}

func (o *observed) observe(direction string, bytes int, start time.Time, status string) {
	if start.IsZero() {
		status += " (no start)"
	}
	o.mu.Lock()
	o.seen = append(o.seen, direction+" "+status)
	o.mu.Unlock()
}

func (o *observed) take() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	s := o.seen
	o.seen = nil
	return s
}

func newHandler(t *testing.T) (*Handler, *observed) {
	t.Helper()
	tr, err := dram.New(dram.Config{Capacity: 1 << 20, MaxBlockSize: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	h, err := tiers.New(tiers.Config{Levels: []tiers.LevelConfig{{Kind: index.TierDRAM, Tier: tr}}})
	if err != nil {
		t.Fatal(err)
	}
	n, err := node.New(h, node.Config{MaxBlockSize: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	o := &observed{}
	return NewHandler(n, o.observe), o
}

// TestObserverHearsHowEachBlockEnded: blocks moved are "ok", a get of a
// block the node lacks is "not_found", a put over the limit "refused",
// one whose bytes failed their checksum "corrupt" — and each error is the
// data plane's sentinel.
func TestObserverHearsHowEachBlockEnded(t *testing.T) {
	d, o := newHandler(t)
	want := func(what string, exp ...string) {
		t.Helper()
		got := o.take()
		if len(got) != len(exp) {
			t.Fatalf("%s: observer heard %q, want %q", what, got, exp)
		}
		for i := range got {
			if got[i] != exp[i] {
				t.Fatalf("%s: observer heard %q, want %q", what, got, exp)
			}
		}
	}

	m, b := tiertest.Block(1, 4096)
	buf, commit, err := d.Reserve(m)
	if err != nil {
		t.Fatal(err)
	}
	copy(buf, b)
	if err := commit(true); err != nil {
		t.Fatal(err)
	}
	want("a put", "in ok")
	_, got, release, err := d.Open(m.Key)
	if err != nil || len(got) != len(b) {
		t.Fatalf("open: %d bytes, %v", len(got), err)
	}
	release()
	want("a get", "out ok")

	if _, _, _, err := d.Open(index.Key{NS: m.Key.NS, Hash: 999}); !errors.Is(err, transfer.ErrNotFound) {
		t.Fatalf("open of an absent block: %v, want transfer.ErrNotFound", err)
	}
	want("a miss", "out "+StatusNotFound)

	big, _ := tiertest.Block(2, 128<<10)
	if _, _, err := d.Reserve(big); !errors.Is(err, transfer.ErrRefused) {
		t.Fatalf("reserve over the limit: %v, want transfer.ErrRefused", err)
	}
	want("a put over the limit", "in "+StatusRefused)

	m3, _ := tiertest.Block(3, 4096)
	if _, commit, err = d.Reserve(m3); err != nil {
		t.Fatal(err)
	}
	if err := commit(false); err != nil {
		t.Fatal(err)
	}
	want("a put whose bytes failed their checksum", "in "+StatusCorrupt)

	p := d.Prefetch([]index.Key{{NS: m.Key.NS, Hash: 998}})
	if _, _, _, err := p.Open(index.Key{NS: m.Key.NS, Hash: 998}); !errors.Is(err, transfer.ErrNotFound) {
		t.Fatalf("prefetched open of an absent block: %v, want transfer.ErrNotFound", err)
	}
	p.Close()
	want("a prefetched miss", "out "+StatusNotFound)
}

func TestStatusOfEachSentinel(t *testing.T) {
	for err, want := range map[error]string{transfer.ErrNotFound: StatusNotFound, transfer.ErrFull: StatusFull,
		transfer.ErrUnavailable: StatusUnavailable, transfer.ErrRefused: StatusRefused, transfer.ErrCorrupt: StatusCorrupt,
		errors.New("disk on fire"): StatusError} {
		if got := Status(dataError(err)); got != want {
			t.Errorf("Status(%v) = %q, want %q", err, got, want)
		}
	}
}
