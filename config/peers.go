package config

import (
	"fmt"
	"strconv"
	"strings"
)

// Peer is one voter of a cluster.bootstrap list.
type Peer struct {
	ID       uint32 // node-id, > 0
	RaftAddr string // host:port of its raft transport
}

// ParsePeers reads a cluster.bootstrap list: "1=10.0.0.1:7072,2=10.0.0.2:7072".
func ParsePeers(s string) ([]Peer, error) {
	var out []Peer
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		id, addr, ok := strings.Cut(part, "=")
		n, err := strconv.ParseUint(id, 10, 32)
		if !ok || err != nil || n == 0 {
			return nil, fmt.Errorf("peer %q: want ID=HOST:PORT with ID > 0", part)
		}
		if err := checkAddr(addr, false); err != nil {
			return nil, fmt.Errorf("peer %q: %q %v", part, addr, err)
		}
		out = append(out, Peer{ID: uint32(n), RaftAddr: addr})
	}
	return out, nil
}
