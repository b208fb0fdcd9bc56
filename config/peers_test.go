package config

import (
	"net"
	"testing"
)

func TestParsePeers(t *testing.T) {
	peers, err := ParsePeers(" 1=10.0.0.1:7072, 2=[::1]:7072,,")
	if err != nil || len(peers) != 2 || peers[0] != (Peer{1, "10.0.0.1:7072"}) || peers[1] != (Peer{2, "[::1]:7072"}) {
		t.Fatalf("ParsePeers: %v %v", peers, err)
	}
	for _, bad := range []string{"0=h:1", "x=h:1", "1=h", "1:h:1", "=h:1", "4294967296=h:1"} {
		if _, err := ParsePeers(bad); err == nil {
			t.Errorf("ParsePeers(%q) succeeded", bad)
		}
	}
}

func FuzzParsePeers(f *testing.F) {
	for _, s := range []string{"1=10.0.0.1:7072,2=10.0.0.2:7072", "0=h:1", "1=[::1]:7", ",,", "1=h"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		peers, err := ParsePeers(s)
		if err != nil {
			return
		}
		for _, p := range peers {
			if _, _, err := net.SplitHostPort(p.RaftAddr); err != nil || p.ID == 0 {
				t.Fatalf("ParsePeers(%q) accepted %+v", s, p)
			}
		}
	})
}
