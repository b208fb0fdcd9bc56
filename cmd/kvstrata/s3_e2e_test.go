package main

import (
	"context"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/api/client"
	pb "github.com/kvstrata/kvstrata/api/v1"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/internal/freeport"
	"github.com/kvstrata/kvstrata/tiers/s3/s3test"
)

// s3Flags point a node at a real object store.
func s3Flags(srv *s3test.Server) []string {
	return []string{"--s3-endpoint", srv.Endpoint(), "--s3-bucket", "kvstrata-e2e", "--s3-region", s3test.Region,
		"--s3-access-key", srv.AccessKey(), "--s3-secret-key", srv.SecretKey(), "--s3-flush-interval", "100ms"}
}

func tierBlocks(t *testing.T, c *client.Client, tier string) uint64 {
	t.Helper()
	st, err := c.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, tr := range st.Tiers {
		if tr.Tier == tier {
			return tr.Blocks
		}
	}
	t.Fatalf("no %s tier in %v", tier, st.Tiers)
	return 0
}

func TestLongContextSurvivesEvictionAndRestartThroughTheObjectStore(t *testing.T) {
	srv := s3test.Start(t)
	dir := t.TempDir()
	p := startNode(t, dir, append(s3Flags(srv), "--dram-capacity", "8MiB", "--ssd-capacity", "8MiB")...)
	c := p.client(client.Options{})
	keys := putBlocks(t, c, 5, 0, 48, 1<<20) // 48 MiB through 16 MiB of DRAM and SSD
	ctx := context.Background()
	// Move what is still in DRAM and SSD down, so the object store holds it all.
	for _, tier := range []string{"dram", "ssd"} {
		if _, err := c.Evict(ctx, &pb.EvictRequest{HasNamespace: true, Namespace: 5, Tier: tier, Demote: true}); err != nil {
			t.Fatal(err)
		}
	}
	if n := tierBlocks(t, c, "s3"); n != 48 {
		t.Fatalf("s3 holds %d blocks, want all 48", n)
	}
	// Restore it all back, in order, streamed.
	if n, _ := checkIntactOrMissing(t, c, keys, 1<<20); n != 48 {
		t.Fatalf("%d of 48 blocks restored from s3", n)
	}
	c.Close()
	p.stop() // flushes what the object store had pending

	// A new node with empty DRAM and SSD on the same bucket has it all.
	q := startNode(t, t.TempDir(), s3Flags(srv)...)
	cq := q.client(client.Options{})
	hashes := make([]index.Hash, len(keys))
	for i, k := range keys {
		hashes[i] = k.Hash
	}
	lr, err := cq.Lookup(ctx, 5, hashes)
	if err != nil || lr.Blocks != 48 {
		t.Fatalf("lookup on the new node: %v %v", lr, err)
	}
	wp, err := cq.Warm(ctx, keys[:8], "dram", nil)
	if err != nil || wp.Warmed != 8 || wp.Done != 8 {
		t.Fatalf("warm: %v %v", wp, err)
	}
	if n, _ := checkIntactOrMissing(t, cq, keys, 1<<20); n != 48 {
		t.Fatalf("%d of 48 blocks from the new node", n)
	}
}

func TestObjectStoreOutageShowsInStatsAndReadyzAndTheNodeKeepsServing(t *testing.T) {
	srv := s3test.Start(t)
	p := startNode(t, t.TempDir(), s3Flags(srv)...)
	c := p.client(client.Options{})
	keys := putBlocks(t, c, 6, 0, 4, 64<<10)
	srv.Stop()
	deadline := time.Now().Add(15 * time.Second)
	for {
		st, err := c.Stats(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if s3 := st.Tiers[2]; !s3.Available {
			if s3.Unavailable == "" {
				t.Fatal("unavailable tier without a reason")
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("s3 never shown unavailable (the probe runs every second)")
		}
		// Reads of blocks not in memory make the tier notice; keep some coming.
		_, _ = c.Get(context.Background(), []index.Key{{NS: 6, Hash: 999}})
		time.Sleep(200 * time.Millisecond)
	}
	resp, err := http.Get("http://" + p.http + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "[!] tier s3") {
		t.Fatalf("/readyz with s3 down: %d\n%s", resp.StatusCode, body)
	}
	if n, _ := checkIntactOrMissing(t, c, keys, 64<<10); n != 4 {
		t.Fatalf("%d of 4 DRAM blocks served with s3 down", n)
	}
	putBlocks(t, c, 6, 10, 14, 64<<10) // puts keep landing
	srv.Restart()
	deadline = time.Now().Add(15 * time.Second)
	for {
		st, _ := c.Stats(context.Background())
		if st.Tiers[2].Available {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("s3 never came back in the node's stats")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func s3Available(t *testing.T, c *client.Client) bool {
	t.Helper()
	st, err := c.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, tr := range st.Tiers {
		if tr.Tier == "s3" {
			return tr.Available
		}
	}
	t.Fatalf("no s3 tier in %v", st.Tiers)
	return false
}

func TestANodeStartsWithTheObjectStoreDownAndFindsItsBlocksWhenItComesBack(t *testing.T) {
	srv := s3test.Start(t)
	p := startNode(t, t.TempDir(), s3Flags(srv)...)
	c := p.client(client.Options{})
	keys := putBlocks(t, c, 7, 0, 8, 64<<10)
	for _, tier := range []string{"dram", "ssd"} {
		if _, err := c.Evict(context.Background(), &pb.EvictRequest{HasNamespace: true, Namespace: 7, Tier: tier, Demote: true}); err != nil {
			t.Fatal(err)
		}
	}
	c.Close()
	p.stop() // uploads what is pending
	srv.Stop()

	// With the store down the node starts anyway (ready, serving DRAM and SSD)…
	q := startNode(t, t.TempDir(), s3Flags(srv)...)
	cq := q.client(client.Options{})
	if s3Available(t, cq) {
		t.Fatal("s3 shown available with the store down")
	}
	fresh := putBlocks(t, cq, 8, 0, 2, 64<<10)
	// …and once the store answers it lists the bucket and serves its blocks.
	srv.Restart()
	for deadline := time.Now().Add(15 * time.Second); !s3Available(t, cq); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("s3 never became available after the store came back")
		}
	}
	if n, _ := checkIntactOrMissing(t, cq, keys, 64<<10); n != 8 {
		t.Fatalf("%d of 8 blocks stored before the outage found once the store is back", n)
	}
	if n, _ := checkIntactOrMissing(t, cq, fresh, 64<<10); n != 2 {
		t.Fatalf("%d of 2 blocks put during the outage", n)
	}
}

func TestRequireAtStartRefusesToStartWithTheObjectStoreDown(t *testing.T) {
	srv := s3test.Start(t)
	srv.Stop()
	cmd := exec.Command(binary, append([]string{"serve", "--data-dir", t.TempDir(), "--s3-require-at-start",
		"--listen-grpc", freeport.Addr(t), "--listen-data", freeport.Addr(t), "--listen-resp", "", "--listen-http", "",
		"--cluster-raft-addr", freeport.Addr(t)}, s3Flags(srv)...)...)
	out, err := cmd.CombinedOutput()
	if _, ok := err.(*exec.ExitError); !ok || !strings.Contains(string(out), "s3 tier at "+srv.Endpoint()) {
		t.Fatalf("serve --s3-require-at-start with the store down: %v\n%s", err, out)
	}
}
