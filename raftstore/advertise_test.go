package raftstore_test

import (
	"net"
	"strings"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/raftstore"
)

// A replica listening on every address leads a cluster that knows it by
// its advertised address; without one it refuses to start, since peers
// cannot dial a wildcard.
func TestAReplicaListensOnAWildcardAndAdvertisesAnother(t *testing.T) {
	_, port, _ := net.SplitHostPort(freeRaftAddr(t))
	cfg := raftstore.ReplicaConfig{ID: 1, Dir: t.TempDir(), Logger: quiet, RaftAddr: net.JoinHostPort("0.0.0.0", port),
		HeartbeatTimeout: 100 * time.Millisecond, ElectionTimeout: 100 * time.Millisecond}
	if _, err := raftstore.OpenReplica(cfg); err == nil || !strings.Contains(err.Error(), "peers cannot dial") {
		t.Fatalf("a wildcard raft address without Advertise: %v, want a refusal", err)
	}
	cfg.Advertise = net.JoinHostPort("127.0.0.1", port)
	cfg.Bootstrap = []raftstore.Peer{{ID: 1, RaftAddr: cfg.Advertise}}
	r, err := raftstore.OpenReplica(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	eventually(t, "the lone replica leads", r.IsLeader)
	voters, err := r.Voters()
	if err != nil || len(voters) != 1 || voters[0].RaftAddr != cfg.Advertise {
		t.Fatalf("voters %v, %v; want node 1 at %s", voters, err, cfg.Advertise)
	}
	if addr, _ := r.Raft.LeaderWithID(); string(addr) != cfg.Advertise {
		t.Errorf("raft names its leader at %s, want the advertised %s", addr, cfg.Advertise)
	}
}
