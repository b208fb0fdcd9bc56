package freeport

import (
	"net"
	"strconv"
	"testing"
)

func TestAddrsAreDistinctListenableAndBelowTheEphemeralRange(t *testing.T) {
	seen := map[string]bool{}
	for range 200 {
		addr := Addr(t)
		if seen[addr] {
			t.Fatalf("%s handed out twice", addr)
		}
		seen[addr] = true
		_, port, _ := net.SplitHostPort(addr)
		if p, _ := strconv.Atoi(port); p < lowest || p >= ephemeralLow() {
			t.Fatalf("port %d outside [%d, %d)", p, lowest, ephemeralLow())
		}
		l, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatalf("listen on %s: %v", addr, err)
		}
		l.Close()
	}
}
