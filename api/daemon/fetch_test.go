package daemon_test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/api/client"
	pb "github.com/kvstrata/kvstrata/api/v1"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/tiers/s3/s3test"
)

// fetch-concurrency decides how many reads a restore from the object
// store keeps in flight: a quarter of it. A proxy in front of a real
// store holds the restore's ranged GETs after the first (the first block,
// read alone) until as many as the setting allows have arrived, waits a
// moment for any more, and only then lets them through: the node must
// have exactly that many in flight, no fewer and no more.
func TestFetchConcurrencyDecidesTheReadsInFlightOfARestore(t *testing.T) {
	for _, tc := range []struct {
		setting  string
		inFlight int
	}{{"8", 2}, {"", 4}, {"32", 8}} {
		t.Run("fetch-concurrency="+tc.setting, func(t *testing.T) {
			srv := s3test.Start(t)
			g := newGetGate(t, srv.Endpoint())
			flags := map[string]string{"ssd-enabled": "false", "dram-capacity": "32MiB",
				"s3-endpoint": g.addr, "s3-bucket": "fetch", "s3-access-key": srv.AccessKey(), "s3-secret-key": srv.SecretKey(),
				"s3-segment-size": "1MiB"}
			if tc.setting != "" {
				flags["fetch-concurrency"] = tc.setting
			}
			c := startNode(t, t.TempDir(), flags)

			// 160 blocks of 64 KiB in segment objects of 16 blocks: after the
			// first chunks (1, 2, 4, 8 blocks and the object's last), one chunk
			// a segment, more than 8 chunks ahead of the first block.
			ctx := context.Background()
			const blocks = 160
			ns := index.NamespaceID(7)
			hashes := make([]index.Hash, blocks)
			data := make([][]byte, blocks)
			keys := make([]index.Key, blocks)
			for i := range blocks {
				hashes[i] = index.Hash(i + 1)
				data[i] = bytes.Repeat([]byte{byte(i)}, 64<<10)
				keys[i] = index.Key{NS: ns, Hash: hashes[i]}
			}
			if err := c.Put(ctx, client.Chain(ns, hashes, data)); err != nil {
				t.Fatal(err)
			}
			if _, err := c.Evict(ctx, &pb.EvictRequest{HasNamespace: true, Namespace: uint64(ns), Tier: "dram", Demote: true, MaxListed: 1}); err != nil {
				t.Fatal(err)
			}
			waitUploaded(t, c)

			g.arm()
			got := make(chan error, 1)
			go func() {
				got <- c.GetFunc(ctx, keys, client.GetOptions{}, func(i int, r client.Result) error {
					if !r.Found || !bytes.Equal(r.Data, data[i]) {
						return fmt.Errorf("block %d: found %v, or not the bytes put", i, r.Found)
					}
					return nil
				})
			}()
			held := g.waitHeld(tc.inFlight)
			g.release()
			if err := <-got; err != nil {
				t.Fatalf("the restore: %v", err)
			}
			if held != tc.inFlight {
				t.Fatalf("the restore had %d ranged GETs in flight, want %d", held, tc.inFlight)
			}
		})
	}
}

// waitUploaded waits until the node's object store has no segment left to
// upload.
func waitUploaded(t *testing.T, c *client.Client) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		st, err := c.Stats(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		s3 := st.Tiers[len(st.Tiers)-1]
		if s3.Tier != "s3" {
			t.Fatalf("the node's last tier is %s, not s3", s3.Tier)
		}
		if s3.Detail["pending_bytes"] == 0 && s3.Detail["segments"] > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("segments not uploaded after 30s: %v", s3.Detail)
		}
	}
}

// getGate is a proxy in front of an object store that, once armed, holds
// every ranged GET but the first until released.
type getGate struct {
	t    *testing.T
	addr string

	mu     sync.Mutex
	armed  bool
	passed bool          // the first ranged GET since arm went through
	held   int           // ranged GETs waiting at the gate
	open   chan struct{} // closed by release
}

func newGetGate(t *testing.T, store string) *getGate {
	t.Helper()
	g := &getGate{t: t, open: make(chan struct{})}
	proxy := httputil.NewSingleHostReverseProxy(&url.URL{Scheme: "http", Host: store}) // keeps the Host header, which requests are signed with
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g.addr = l.Addr().String()
	hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && r.Header.Get("Range") != "" && g.hold() {
			<-g.open
		}
		proxy.ServeHTTP(w, r)
	})}
	go hs.Serve(l)
	t.Cleanup(func() {
		g.release()
		hs.Close()
	})
	return g
}

// hold says whether a ranged GET arriving now waits at the gate, and
// counts it if so.
func (g *getGate) hold() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.armed {
		return false
	}
	if !g.passed {
		g.passed = true
		return false
	}
	g.held++
	return true
}

func (g *getGate) arm() {
	g.mu.Lock()
	g.armed = true
	g.mu.Unlock()
}

// waitHeld waits until at least want ranged GETs wait at the gate, then a
// moment more for any beyond them, and returns how many wait. The held
// GETs must be let through before the store's request timeout (5s).
func (g *getGate) waitHeld(want int) int {
	held := func() int {
		g.mu.Lock()
		defer g.mu.Unlock()
		return g.held
	}
	for deadline := time.Now().Add(3 * time.Second); held() < want && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond)
	return held()
}

// release lets every held GET through, and every later one.
func (g *getGate) release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-g.open:
	default:
		close(g.open)
	}
}
