package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"regexp"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/api/client"
	pb "github.com/kvstrata/kvstrata/api/v1"
)

// A node's reconcile passes compare what the directory lists at the node
// with the changes its tiers published. On a healthy node, whose blocks
// are demoted from a small DRAM to the SSD, promoted back by gets and
// deleted meanwhile, no change is lost, and the passes running every
// 200ms all along must find nothing to correct: their mirror of the tiers
// is exact, and a change in flight is no difference.
func TestReconcileFindsNothingToCorrectOnAHealthyNode(t *testing.T) {
	p := startNode(t, t.TempDir(), "--dram-capacity", "4MiB", "--cluster-reconcile-interval", "200ms")
	c := p.client(client.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for round := range 4 {
		keys := putBlocks(t, c, 1, round*64, round*64+128, 64<<10) // 8 MiB: half is demoted
		if _, err := c.Get(ctx, keys[:32]); err != nil {           // SSD hits: promoted
			t.Fatal(err)
		}
		var evict []*pb.BlockKey
		for _, k := range keys[96:] {
			evict = append(evict, &pb.BlockKey{Namespace: uint64(k.NS), Hash: uint64(k.Hash)})
		}
		if _, err := c.Evict(ctx, &pb.EvictRequest{Keys: evict}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second) // several passes
	}
	if err := syncNode(c, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	body := metricsOf(t, p)
	m := regexp.MustCompile(`(?m)^kvstrata_directory_reconcile_corrections_total (\S+)$`).FindSubmatch(body)
	if m == nil {
		t.Fatalf("/metrics lacks kvstrata_directory_reconcile_corrections_total:\n%s", body)
	}
	if string(m[1]) != "0" {
		t.Errorf("the reconcile passes corrected %s keys of a node that lost no change; want 0\n%s", m[1], p.log)
	}
}

// cluster.reconcile-interval takes a duration, 0 for off; a negative one is
// a usage error that says so.
func TestReconcileIntervalRefusesANegativeDuration(t *testing.T) {
	usageErrorSays(t, []string{"serve", "--data-dir", t.TempDir(), "--cluster-reconcile-interval", "-1s"},
		"cluster.reconcile-interval -1s is negative")
}

func metricsOf(t *testing.T, p *proc) []byte {
	t.Helper()
	resp, err := http.Get("http://" + p.http + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.TrimSpace(body)
}
