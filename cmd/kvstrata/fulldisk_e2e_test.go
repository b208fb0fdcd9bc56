package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	pb "github.com/kvstrata/kvstrata/api/v1"
)

// mountTmpfs mounts a tmpfs of size bytes on a new directory and unmounts
// it when the test ends; it skips the test where that is not allowed.
func mountTmpfs(t *testing.T, size int64) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting a small tmpfs needs root")
	}
	dir := filepath.Join(t.TempDir(), "fs")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, fmt.Sprintf("size=%d", size)); err != nil {
		t.Skipf("cannot mount a tmpfs (%v)", err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, 0); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	return dir
}

// respSet sends SET key value over the Redis protocol and returns the
// reply line, failing the test if none comes before deadline.
func respSet(t *testing.T, addr, key string, value []byte, deadline time.Duration) string {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, deadline)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(deadline))
	fmt.Fprintf(conn, "*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n", len(key), key, len(value))
	if _, err := conn.Write(append(value, "\r\n"...)); err != nil {
		t.Fatalf("SET %s: %v", key, err)
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		t.Fatalf("SET %s: no reply before its %v deadline: %v", key, deadline, err)
	}
	return strings.TrimSpace(line)
}

// httpBody returns the body of a GET of path on the node's HTTP address.
func httpBody(t *testing.T, p *proc, path string) string {
	t.Helper()
	r, err := http.Get("http://" + p.http + path)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	b, _ := io.ReadAll(r.Body)
	return string(b)
}

// emptyOutputs lists the zero-byte sstables and blob files in dir.
func emptyOutputs(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		info, err := e.Info()
		if err == nil && info.Size() == 0 && (strings.HasSuffix(e.Name(), ".sst") || strings.HasSuffix(e.Name(), ".blob")) {
			out = append(out, e.Name())
		}
	}
	return out
}

// A node whose data directory is on a 64 MiB file system, with an SSD
// capacity of 2 GiB, warns at start; once the disk fills, writes still
// answer before their deadline, an eviction answers, /readyz and the
// metrics show the SSD tier degraded, no empty files are left, and when
// space is freed the tier takes blocks again by itself.
func TestAFullDiskIsAnErrorNotAHang(t *testing.T) {
	fs := mountTmpfs(t, 64<<20)
	filler := filepath.Join(fs, "filler")
	if err := os.WriteFile(filler, make([]byte, 16<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(fs, "data")
	p := startNode(t, data, "--ssd-capacity", "2GiB", "--dram-capacity", "16MiB")
	if !strings.Contains(p.log.String(), "capacity exceeds what the file system has room for") {
		t.Errorf("no warning at start about an SSD capacity over the file system's room:\n%s", p.log)
	}

	const deadline = 10 * time.Second
	value := make([]byte, 1<<20)
	// 320 MiB through 16 MiB of DRAM into what is left of 64 MiB: enough,
	// before the fix, for Pebble's failing flushes to stall every write.
	for i := range 320 {
		for j := range value {
			value[j] = byte(i + j)
		}
		if got := respSet(t, p.resp, fmt.Sprintf("big:%d", i), value, deadline); got != "+OK" {
			t.Fatalf("SET big:%d = %q, want +OK (DRAM victims the SSD cannot take are dropped)", i, got)
		}
	}
	if got := respSet(t, p.resp, "tiny", []byte("x"), deadline); got != "+OK" {
		t.Fatalf("SET tiny x = %q", got)
	}
	eventually(t, 20*time.Second, "/readyz showing the SSD tier degraded", func() bool {
		return strings.Contains(httpBody(t, p, "/readyz"), "[!] tier ssd: degraded")
	})
	if m := httpBody(t, p, "/metrics"); !strings.Contains(m, `kvstrata_tier_degraded{tier="ssd"} 1`) {
		t.Errorf("/metrics lacks kvstrata_tier_degraded{tier=\"ssd\"} 1")
	}
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	res, err := p.api().Evict(ctx, &pb.EvictRequest{Tier: "ssd", Bytes: 4 << 20})
	cancel()
	if err != nil {
		t.Fatalf("evict from the SSD of a full disk: %v", err)
	}
	t.Logf("evicted %d blocks from the full SSD; readyz:\n%s", res.Blocks, httpBody(t, p, "/readyz"))
	// A flush in progress may have created its outputs and not yet written
	// them: an empty file counts as left behind if it is still empty later.
	before := emptyOutputs(t, filepath.Join(data, "ssd"))
	time.Sleep(2 * time.Second)
	for _, name := range emptyOutputs(t, filepath.Join(data, "ssd")) {
		if slices.Contains(before, name) {
			t.Errorf("empty output %s left behind", name)
		}
	}

	if err := os.Remove(filler); err != nil { // space returns
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "the SSD tier recovering", func() bool {
		return strings.Contains(httpBody(t, p, "/readyz"), "[+] tier ssd ok") &&
			strings.Contains(httpBody(t, p, "/metrics"), `kvstrata_tier_degraded{tier="ssd"} 0`)
	})
	for i := range 4 {
		if got := respSet(t, p.resp, fmt.Sprintf("after:%d", i), value, deadline); got != "+OK" {
			t.Fatalf("SET after:%d = %q after space returned", i, got)
		}
	}
	p.stop()
	if e := emptyOutputs(t, filepath.Join(data, "ssd")); len(e) > 0 {
		t.Errorf("%d empty sstables and blob files left: %v", len(e), e)
	}
}
