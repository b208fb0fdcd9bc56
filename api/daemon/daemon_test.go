package daemon_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/api/client"
	"github.com/kvstrata/kvstrata/api/daemon"
	pb "github.com/kvstrata/kvstrata/api/v1"
	"github.com/kvstrata/kvstrata/config"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/internal/freeport"
	"github.com/kvstrata/kvstrata/internal/lifecycle"
	"github.com/kvstrata/kvstrata/transfer/tcp"
)

// newConfig is a lone node's configuration in dir, on loopback ports.
func newConfig(t *testing.T, dir string, flags map[string]string) config.Config {
	t.Helper()
	all := map[string]string{"data-dir": dir, "dram-capacity": "16MiB", "ssd-capacity": "64MiB",
		"listen-grpc": "127.0.0.1:0", "listen-data": "127.0.0.1:0", "listen-resp": "127.0.0.1:0", "listen-http": "127.0.0.1:0",
		"cluster-raft-addr": freeport.Addr(t)}
	for k, v := range flags {
		all[k] = v
	}
	l, err := config.Load("", func(string) string { return "" }, all)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Resolve(); err != nil {
		t.Fatal(err)
	}
	return l.Config
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// A node run by a lifecycle Runner becomes ready, reports every address it
// listens on (they are known before the gRPC service is made), serves
// blocks, and stops cleanly when asked.
func TestNodeRunsUnderARunner(t *testing.T) {
	cfg := newConfig(t, t.TempDir(), nil)
	n, err := daemon.New(cfg, daemon.Options{Logger: quiet(), Version: "test", Transport: tcp.New(tcp.Options{})})
	if err != nil {
		t.Fatal(err)
	}
	r, err := lifecycle.New(lifecycle.Config{ShutdownTimeout: 10 * time.Second, Logger: quiet()}, n)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	for deadline := time.Now().Add(20 * time.Second); r.Ready() != nil; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("not ready after 20s: %v", r.Ready())
		}
	}
	if err := n.Ready(); err != nil {
		t.Fatalf("the runner is ready, the node says %v", err)
	}
	a := n.Addrs()
	if a.GRPC == "" || a.Data == "" || a.RESP == "" || a.HTTP == "" {
		t.Fatalf("addrs: %+v", a)
	}
	c, err := client.Dial(context.Background(), a.GRPC, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Info(); got.GetDataAddr() != a.Data || got.GetRespAddr() != a.RESP || got.GetHttpAddr() != a.HTTP || got.GetVersion() != "test" {
		t.Errorf("NodeInfo over gRPC %v, want the addresses of %+v and version test", got, a)
	}
	c.Close()
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run after a stop asked for: %v", err)
	}
	if err := n.Ready(); err == nil {
		t.Fatal("ready after it stopped")
	}
}

// A start that fails — here a port taken — closes what it opened: the
// same directory and raft address start again at once.
func TestAFailedStartClosesWhatItOpened(t *testing.T) {
	dir, taken := t.TempDir(), freeport.Addr(t)
	l, err := net.Listen("tcp", taken)
	if err != nil {
		t.Fatal(err)
	}
	cfg := newConfig(t, dir, map[string]string{"listen-http": taken})
	n, err := daemon.New(cfg, daemon.Options{Logger: quiet(), Transport: tcp.New(tcp.Options{})})
	if err != nil {
		t.Fatal(err)
	}
	var op *net.OpError
	if err := n.Start(context.Background()); !errors.As(err, &op) {
		t.Fatalf("start with the HTTP port taken: %v", err)
	}
	l.Close()
	cfg.Listen.HTTP = "127.0.0.1:0"
	n, err = daemon.New(cfg, daemon.Options{Logger: quiet(), Transport: tcp.New(tcp.Options{})})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(context.Background()); err != nil {
		t.Fatalf("start again over the same data and raft address: %v", err)
	}
	if err := n.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// ssd.open-files decides whether the SSD tier keeps a small block's file
// open after a read of it: it does by default, and keeps none open at 0.
func TestSSDOpenFilesDecidesWhetherABlockFileStaysOpen(t *testing.T) {
	for _, tc := range []struct {
		setting  string
		wantOpen int
	}{{"", 1}, {"0", 0}} {
		t.Run("open-files="+tc.setting, func(t *testing.T) {
			dir, c, block := demotedBlock(t, "ssd-open-files", tc.setting)
			ctx := context.Background()
			// The file written stays open until the tier's next flush
			// (a second by default) syncs it.
			blocks := filepath.Join(dir, "ssd", "blocks")
			for deadline := time.Now().Add(30 * time.Second); openBlockFiles(t, blocks) > 0; {
				if time.Now().After(deadline) {
					t.Fatal("the block file written is still open after 30s")
				}
				time.Sleep(50 * time.Millisecond)
			}
			got, err := c.Get(ctx, []index.Key{block.Key})
			if err != nil || len(got) != 1 || !got[0].Found || !bytes.Equal(got[0].Data, block.Data) {
				t.Fatalf("get after the demotion: %v, %d results, the block not back as it was put", err, len(got))
			}
			if open := openBlockFiles(t, blocks); open != tc.wantOpen {
				t.Errorf("%d block files open after a read, want %d", open, tc.wantOpen)
			}
		})
	}
}

// startNode starts a node with data directory dir and the given flags
// over the TCP data plane, and returns a client of it; the test's cleanup
// stops both.
func startNode(t *testing.T, dir string, flags map[string]string) *client.Client {
	t.Helper()
	n, err := daemon.New(newConfig(t, dir, flags), daemon.Options{Logger: quiet(), Transport: tcp.New(tcp.Options{})})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Stop(context.Background()) })
	c, err := client.Dial(context.Background(), n.Addrs().GRPC, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// demotedBlock starts a node with the flag set to value (unless value is
// empty), puts a 128 KiB block and demotes it from DRAM to the SSD. It
// returns the node's data directory, a client and the block; the test's
// cleanup stops both.
func demotedBlock(t *testing.T, flag, value string) (string, *client.Client, client.Block) {
	t.Helper()
	dir := t.TempDir()
	flags := map[string]string{}
	if value != "" {
		flags[flag] = value
	}
	c := startNode(t, dir, flags)
	ctx := context.Background()
	block := client.Block{Key: index.Key{NS: 1, Hash: 2}, Data: bytes.Repeat([]byte{7}, 128<<10)}
	if err := c.Put(ctx, []client.Block{block}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Evict(ctx, &pb.EvictRequest{Tier: "dram", Demote: true, All: true}); err != nil {
		t.Fatal(err)
	}
	return dir, c, block
}

// openBlockFiles counts this process's descriptors of files under dir.
func openBlockFiles(t *testing.T, dir string) int {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc/self/fd: %v", err)
	}
	n := 0
	for _, fd := range fds {
		if target, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name())); err == nil &&
			strings.HasPrefix(target, dir+string(filepath.Separator)) {
			n++
		}
	}
	return n
}

// ssd.file-min-size decides which blocks the SSD tier keeps in files of
// their own: a 128 KiB block demoted from DRAM lands in a block file at
// the default (64 KiB) and inside Pebble when the setting is 1 MiB.
func TestSSDFileMinSizeDecidesWhereADemotedBlockLives(t *testing.T) {
	for _, tc := range []struct {
		setting   string
		wantFiles int
	}{{"", 1}, {"1MiB", 0}} {
		t.Run("file-min-size="+tc.setting, func(t *testing.T) {
			dir, c, block := demotedBlock(t, "ssd-file-min-size", tc.setting)
			ctx := context.Background()
			files, err := filepath.Glob(filepath.Join(dir, "ssd", "blocks", "*", "*"))
			if err != nil {
				t.Fatal(err)
			}
			if len(files) != tc.wantFiles {
				t.Errorf("%d block files %v, want %d", len(files), files, tc.wantFiles)
			}
			got, err := c.Get(ctx, []index.Key{block.Key})
			if err != nil || len(got) != 1 || !got[0].Found || !bytes.Equal(got[0].Data, block.Data) {
				t.Fatalf("get after the demotion: %v, %d results, the block not back as it was put", err, len(got))
			}
		})
	}
}
