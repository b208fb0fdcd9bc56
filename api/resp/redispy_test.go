package resp_test

import (
	"context"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/api/resp/resptest"
)

// redis-py (Debian python3-redis) drives the server as an application
// does; the script says what differed.
func TestRedisPy(t *testing.T) {
	// The Debian package installs into the system's python3, which may
	// not be the first in PATH.
	python := ""
	for _, py := range []string{"python3", "/usr/bin/python3"} {
		if exec.Command(py, "-c", "import redis").Run() == nil {
			python = py
			break
		}
	}
	if python == "" {
		t.Skip("no python3 with the redis module, skipping (Debian/Ubuntu: apt-get install python3-redis)")
	}
	store := resptest.NewMemStore()
	store.MaxValue = 1 << 20
	_, addr := startServer(t, store, nil)
	host, port, _ := net.SplitHostPort(addr)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, python, "testdata/redispy_commands.py", host, port, strconv.FormatInt(store.MaxValue, 10)).CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "ok" {
		t.Fatalf("redispy_commands.py: %v\n%s", err, out)
	}
}
