package storetest

import (
	"testing"

	"github.com/hashicorp/raft"
	raftbench "github.com/hashicorp/raft/bench"
)

// Bench runs raft's LogStore and StableStore benchmarks (package
// github.com/hashicorp/raft/bench) against the stores newStore returns, a
// fresh store for each, as sub-benchmarks named after raft's functions,
// plus StoreLogs64x16KiB: what a busy leader writes per disk sync, 64
// entries (raft's MaxAppendEntries) of 16 KiB (a batch of about a
// thousand directory events).
func Bench(b *testing.B, newStore NewFunc) {
	logBenches := []struct {
		name string
		fn   func(*testing.B, raft.LogStore)
	}{
		{"FirstIndex", raftbench.FirstIndex},
		{"LastIndex", raftbench.LastIndex},
		{"GetLog", raftbench.GetLog},
		{"StoreLog", raftbench.StoreLog},
		{"StoreLogs", raftbench.StoreLogs},
		{"DeleteRange", raftbench.DeleteRange},
		{"StoreLogs64x16KiB", storeLogsBig},
	}
	for _, bc := range logBenches {
		b.Run(bc.name, func(b *testing.B) { bc.fn(b, newStore(b)) })
	}
	stableBenches := []struct {
		name string
		fn   func(*testing.B, raft.StableStore)
	}{
		{"Set", raftbench.Set},
		{"Get", raftbench.Get},
		{"SetUint64", raftbench.SetUint64},
		{"GetUint64", raftbench.GetUint64},
	}
	for _, bc := range stableBenches {
		b.Run(bc.name, func(b *testing.B) { bc.fn(b, newStore(b)) })
	}
}

// storeLogsBig stores 64 entries of 16 KiB per iteration and reports the
// bytes stored per second.
func storeLogsBig(b *testing.B, s raft.LogStore) {
	const perBatch, size = 64, 16 << 10
	data := make([]byte, size)
	for i := range data {
		data[i] = byte(i * 7)
	}
	logs := make([]*raft.Log, perBatch)
	b.SetBytes(perBatch * size)
	next := uint64(1)
	for b.Loop() {
		for i := range logs {
			logs[i] = &raft.Log{Index: next, Term: 1, Data: data}
			next++
		}
		if err := s.StoreLogs(logs); err != nil {
			b.Fatalf("StoreLogs: %v", err)
		}
	}
}
