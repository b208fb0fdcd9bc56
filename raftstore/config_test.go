package raftstore_test

import (
	"strings"
	"testing"

	"github.com/kvstrata/kvstrata/raftstore"
)

func TestConfigsNameEveryBadField(t *testing.T) {
	for _, tc := range []struct {
		what string
		err  error
		want []string
	}{
		{"replica", func() error {
			_, err := raftstore.OpenReplica(raftstore.ReplicaConfig{ElectionTimeout: -1})
			return err
		}(),
			[]string{"ID is 0", "Dir is empty", "RaftAddr is empty", "ElectionTimeout -1ns must be positive"}},
		{"batcher", func() error {
			_, err := raftstore.NewBatcher(raftstore.BatcherConfig{MaxEvents: 1 << 20, QueueSize: 10})
			return err
		}(), []string{"Propose is nil", "MaxEvents is out of range", "QueueSize 10 is below MaxEvents"}},
		{"log store", func() error {
			_, err := raftstore.Open(t.TempDir(), &raftstore.Options{CacheSize: -1, MemTableSize: 1})
			return err
		}(), []string{"CacheSize -1 is not positive", "MemTableSize 1 is below 1 MiB"}},
	} {
		for _, w := range tc.want {
			if tc.err == nil || !strings.Contains(tc.err.Error(), w) {
				t.Errorf("%s: %v does not say %q", tc.what, tc.err, w)
			}
		}
	}
	var r raftstore.ReplicaConfig
	r.EnsureDefaults()
	if r.HeartbeatTimeout != raftstore.DefaultHeartbeatTimeout || r.ElectionTimeout != raftstore.DefaultElectionTimeout ||
		r.SnapshotThreshold != raftstore.DefaultSnapshotThreshold || r.Logger == nil {
		t.Errorf("replica defaults: %+v", r)
	}
}
