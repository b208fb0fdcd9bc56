package main

import (
	"context"
	"net"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/kvstrata/kvstrata/api/client"
)

// redisPy returns a python3 that imports redis (Debian's python3-redis),
// or skips the test.
func redisPy(t *testing.T) string {
	t.Helper()
	for _, py := range []string{"python3", "/usr/bin/python3"} {
		if exec.Command(py, "-c", "import redis").Run() == nil {
			return py
		}
	}
	t.Skip("python3 with redis-py is missing (apt-get install -y python3-redis): skipping the LMCache replay")
	return ""
}

// lmcacheReplay runs testdata/lmcache_replay.py against p's RESP address and
// returns its output; the script exits non-zero on any mismatch.
func lmcacheReplay(t *testing.T, py string, p *proc, args ...string) string {
	t.Helper()
	host, port, _ := net.SplitHostPort(p.resp)
	out, err := exec.Command(py, append([]string{"testdata/lmcache_replay.py", host, port}, args...)...).CombinedOutput()
	t.Logf("lmcache_replay.py %v:\n%s", args, out)
	if err != nil {
		t.Fatalf("lmcache_replay.py %v: %v", args, err)
	}
	return string(out)
}

// LMCache's redis:// backend works unmodified at the sizes real models
// produce: chunks of 4, 14 and 32 MiB are stored, found and read back
// byte for byte, from DRAM and after most were demoted to the SSD; a
// chunk whose bytes are gone is a miss; a value over limits.max-value-size
// is refused on a connection that goes on; after a restart every chunk
// reads whole or as a miss, never as other bytes.
func TestLMCacheReplayWithLargeChunks(t *testing.T) {
	py := redisPy(t)
	dir := t.TempDir()
	// 100 MiB of chunks into 16 MiB of DRAM: most go to the SSD.
	p := startNode(t, dir, "--dram-capacity", "16MiB", "--limits-max-value-size", "40MiB")
	sizes := []string{"4", "14", "32"}
	lmcacheReplay(t, py, p, append([]string{"put"}, sizes...)...)
	c := p.client(client.Options{})
	st, err := c.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if ssd := st.Tiers[1].Blocks; ssd < 15 {
		t.Fatalf("only %d blocks on the ssd after 100 MiB went into 16 MiB of DRAM", ssd)
	}
	lmcacheReplay(t, py, p, append([]string{"get"}, sizes...)...)
	lmcacheReplay(t, py, p, "lose", "14")
	lmcacheReplay(t, py, p, "over", "41")

	c.Close()
	p.stop()
	p.restart()
	out := lmcacheReplay(t, py, p, append([]string{"survivors"}, sizes...)...)
	m := regexp.MustCompile(`ok whole (\d+) missing (\d+)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no count of the chunks that survived the restart in:\n%s", out)
	}
	if whole, _ := strconv.Atoi(m[1]); whole == 0 || !strings.Contains(out, "ok whole") {
		t.Fatalf("no chunk read back whole after a clean restart, though most were on the ssd")
	}
}
