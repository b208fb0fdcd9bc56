package raftstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/raftstore"
)

// The benchmarks of the FSM and of a whole cluster; the log store's are
// in logstore_test.go, the event encoding's in events_test.go. Run them
// with
//
//	go test -run '^$' -bench FSMApply -benchtime 2000x ./raftstore
//	go test -run '^$' -bench ClusterCommit -benchtime 3000000x ./raftstore

// BenchmarkFSMApply applies entries of 1024 events to a directory of half
// a million blocks: one entry stores a chain, the next removes it again.
// Apply takes one entry at a time, ApplyBatch8 eight, as raft hands them
// to a busy FSM.
func BenchmarkFSMApply(b *testing.B) {
	b.Run("Apply", func(b *testing.B) { benchFSMApply(b, 1) })
	b.Run("ApplyBatch8", func(b *testing.B) { benchFSMApply(b, 8) })
}

// eventEntry returns the data of an entry of the 1024 events of chain seed
// on node 1, all of kind.
func eventEntry(seed uint64, kind index.ChangeKind) []byte {
	var eb raftstore.EventBatch
	for _, ev := range chainEvents(seed, 1024, index.Location{Node: 1, Tier: index.TierDRAM}) {
		ev.Kind = kind
		eb.Append(ev)
	}
	return eb.Encode()
}

func benchFSMApply(b *testing.B, perCall int) {
	const perEntry = 1024
	f := raftstore.NewFSM()
	idx := uint64(0)
	log := func(data []byte) *raft.Log {
		idx++
		return &raft.Log{Index: idx, Type: raft.LogCommand, Data: data}
	}
	for seed := range uint64(512) {
		f.Apply(log(eventEntry(1000+seed, raftstore.EventStored)))
	}
	var entries [][]byte
	for seed := range uint64(32) {
		entries = append(entries, eventEntry(seed, raftstore.EventStored), eventEntry(seed, raftstore.EventRemoved))
	}
	logs := make([]*raft.Log, perCall)
	applied := 0
	b.ReportAllocs()
	for b.Loop() {
		for i := range logs {
			logs[i] = log(entries[applied%len(entries)])
			applied++
		}
		if perCall == 1 {
			f.Apply(logs[0])
		} else {
			f.ApplyBatch(logs)
		}
	}
	b.ReportMetric(float64(applied*perEntry)/b.Elapsed().Seconds(), "events/s")
}

// BenchmarkClusterCommit measures the events a 3-node cluster in one
// process commits per second, fed through a Batcher on the leader, on
// synced Pebble log stores and raft's in-memory transport. One op is one
// event. The node stores blocks and removes each again 256 Ki events
// later, so that the directories stay at 128 Ki blocks.
func BenchmarkClusterCommit(b *testing.B) {
	const window = 256 << 10
	c := startCluster(b, 3, func(cfg *raft.Config) { cfg.TrailingLogs = 1024 })
	l := c.leader()
	bt := newBatcher(b, raftstore.BatcherConfig{Propose: raftstore.RaftPropose(l.raft)})
	loc := index.Location{Node: 1, Tier: index.TierDRAM}
	i := 0
	for b.Loop() {
		ev := raftstore.Event{Kind: raftstore.EventStored, Key: index.Key{NS: testNS, Hash: index.Hash(i / 2)}, Meta: index.Meta{Size: 1 << 20}, Loc: loc}
		if i%2 == 1 {
			ev = raftstore.Event{Kind: raftstore.EventRemoved, Key: index.Key{NS: testNS, Hash: index.Hash(i/2 - window/2)}, Loc: loc}
		}
		for !bt.Add(ev) {
			// The queue is full: wait for the cluster, as a steady
			// producer would have to.
			time.Sleep(50 * time.Microsecond)
		}
		i++
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := bt.Flush(ctx); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
	s := bt.Stats()
	b.ReportMetric(float64(s.Committed)/float64(max(s.Batches, 1)), "events/entry")
}
