// Package freeport hands tests loopback addresses for the servers they
// start as separate processes or on a later listen.
//
// Asking the kernel for port 0 and closing the socket leaves a window in
// which the port, being in the ephemeral range, can be taken as the local
// port of any outgoing connection — a test that then starts a server on
// it fails with "address already in use". The ports given here lie below
// the ephemeral range, which the kernel never picks on its own, and each
// is handed out once per process. Safe for concurrent use.
package freeport

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// lowest is the lowest port handed out: below it lie the well-known and
// commonly configured ports.
const lowest = 10000

var (
	mu    sync.Mutex
	given = map[int]bool{}
)

// Get returns "127.0.0.1:PORT" for a port nothing listened on a moment ago,
// never one it returned before.
func Get() (string, error) {
	high := ephemeralLow()
	mu.Lock()
	defer mu.Unlock()
	for range 1000 {
		p := lowest + rand.IntN(high-lowest)
		if given[p] {
			continue
		}
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(p))
		l, err := net.Listen("tcp", addr)
		if err != nil {
			continue
		}
		l.Close()
		given[p] = true
		return addr, nil
	}
	return "", errors.New("freeport: no free port below the ephemeral range")
}

// Addr is Get for a test: it fails t if there is no free port.
func Addr(t testing.TB) string {
	t.Helper()
	addr, err := Get()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

// ephemeralLow is the first port of the kernel's ephemeral range
// (Linux's default 32768 where it cannot be read).
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err == nil {
		var lo, hi int
		if _, err := fmt.Sscan(strings.TrimSpace(string(b)), &lo, &hi); err == nil && lo > lowest+1000 {
			return lo
		}
	}
	return 32768
}
