package membership_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/index"
)

// The benchmarks of a 3-node cluster in one process over real loopback
// TCP (raft's transport and the gRPC forwarding to the leader). Run them
// with
//
//	go test -run '^$' -bench Publish -benchtime 3000000x ./api/membership
//	go test -run '^$' -bench CommitLatency -benchtime 10s ./api/membership
//	go test -run '^$' -bench Lookup256 -benchtime 200000x ./api/membership
//
// bench/cluster.sh measures the same over real kvstrata processes.

// BenchmarkPublish measures the directory events a 3-node cluster commits
// per second when they are published as fast as the batchers take them:
// from the leader (its proposals are pipelined), from a follower (each
// batch forwarded to the leader over gRPC, one at a time), and from all
// three nodes at once. One op is one event; each node stores blocks and
// removes each again 256 Ki events later, so that the directory stays at
// 128 Ki blocks a node. The latency it reports is that of a saturated
// cluster, mostly the wait in the bounded queue (maxQueued).
func BenchmarkPublish(b *testing.B) {
	for _, from := range []string{"leader", "follower", "all"} {
		b.Run(from, func(b *testing.B) { benchPublish(b, from, 0) })
	}
}

// BenchmarkCommitLatency measures the time from Publish to committed when
// all three nodes publish at a steady rate (events/s in all) below what the
// cluster can take.
func BenchmarkCommitLatency(b *testing.B) {
	for _, rate := range []int{10_000, 100_000, 250_000} {
		b.Run(fmt.Sprintf("%dk-events/s", rate/1000), func(b *testing.B) { benchPublish(b, "all", rate) })
	}
}

// maxQueued is how many events a node's batcher may hold before the
// benchmark waits for it: enough for MaxInFlight full batches and the one
// filling.
const maxQueued = 16 << 10

// mark is a count of events of one node at one time.
type mark struct {
	at time.Time
	n  uint64
}

// benchPublish publishes events from the members from names, rate events
// a second in all (0: as fast as they are taken), and reports the events
// committed a second and the commit latency: the time from Publish to the
// batcher's committed watermark passing the event, sampled every 256
// events of a node and read every 200µs or so (its resolution).
func benchPublish(b *testing.B, from string, rate int) {
	tc := startCluster(b, 3)
	var pubs []*member
	switch from {
	case "leader":
		pubs = []*member{tc.leader()}
	case "follower":
		pubs = []*member{tc.follower()}
	default:
		pubs = tc.running()
	}
	base := make([]uint64, len(pubs)) // events committed before the run
	for i, m := range pubs {
		base[i] = m.c.BatcherStats().Committed
	}
	// The watermark sampler.
	committed := make([][]mark, len(pubs))
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			now := time.Now()
			for i, m := range pubs {
				committed[i] = append(committed[i], mark{now, m.c.BatcherStats().Committed - base[i]})
			}
			time.Sleep(200 * time.Microsecond)
		}
	})

	const window = 256 << 10
	published := make([][]mark, len(pubs))
	seq := make([]uint64, len(pubs))
	i := 0
	start := time.Now()
	for b.Loop() {
		k := i % len(pubs)
		m, n := pubs[k], seq[k]
		if rate > 0 && i%64 == 0 { // keep to the schedule
			if ahead := time.Duration(float64(i)/float64(rate)*1e9) - time.Since(start); ahead > 0 {
				time.Sleep(ahead)
			}
		}
		if n%256 == 0 {
			for m.c.BatcherStats().Queued >= maxQueued {
				time.Sleep(20 * time.Microsecond) // as a steady producer would have to
			}
			published[k] = append(published[k], mark{time.Now(), n + 1})
		}
		loc := index.Location{Node: m.id, Tier: index.TierDRAM}
		ev := index.Change{Kind: index.ChangeStored, Key: index.Key{NS: testNS, Hash: index.Hash(n / 2)}, Meta: index.Meta{Size: 1 << 20}, Loc: loc}
		if n%2 == 1 {
			ev = index.Change{Kind: index.ChangeRemoved, Key: index.Key{NS: testNS, Hash: index.Hash(n/2 - window/2)}, Loc: loc}
		}
		m.c.Publish(ev)
		seq[k]++
		i++
	}
	for _, m := range pubs {
		if err := m.c.Sync(b.Context()); err != nil {
			b.Fatal(err)
		}
	}
	elapsed := b.Elapsed()
	close(stop)
	wg.Wait()

	var lat []time.Duration
	var batches, events, dropped uint64
	for k, m := range pubs {
		s := m.c.BatcherStats()
		batches, events, dropped = batches+s.Batches, events+s.Committed, dropped+s.Dropped
		committed[k] = append(committed[k], mark{time.Now(), s.Committed - base[k]})
		lat = append(lat, watermarkLatencies(published[k], committed[k])...)
	}
	if dropped > 0 {
		b.Fatalf("%d events dropped: the benchmark outran the queue", dropped)
	}
	b.ReportMetric(float64(i)/elapsed.Seconds(), "events/s")
	b.ReportMetric(float64(events)/float64(max(batches, 1)), "events/entry")
	b.ReportMetric(percentile(lat, 0.50).Seconds()*1e3, "p50-ms")
	b.ReportMetric(percentile(lat, 0.99).Seconds()*1e3, "p99-ms")
}

// watermarkLatencies returns, for each published mark (the nth event of a
// node published at a time), how long it took until the committed count
// reached n. Both lists are in time order.
func watermarkLatencies(published, committed []mark) []time.Duration {
	var out []time.Duration
	j := 0
	for _, p := range published {
		for j < len(committed) && (committed[j].n < p.n || committed[j].at.Before(p.at)) {
			j++
		}
		if j == len(committed) {
			break
		}
		out = append(out, committed[j].at.Sub(p.at))
	}
	return out
}

// percentile returns the q-th quantile of ds (which it sorts).
func percentile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	return ds[min(int(float64(len(ds))*q), len(ds)-1)]
}

// BenchmarkLookup256 measures a longest-prefix lookup of a 256-block chain
// on a follower's replica (FSM.Lookup, what a node's Lookup RPC runs) with
// 128 Ki blocks listed: half the chains on one node's DRAM, the other half
// on a second node's DRAM with their first 128 blocks also on a third
// node's SSD. "parallel" runs one lookup per core at once.
func BenchmarkLookup256(b *testing.B) {
	tc := startCluster(b, 3)
	const chains, length = 512, 256
	var hashes [][]index.Hash
	for c := range chains {
		m := tc.members[c%2]
		evs, chain := chainEvents(index.Location{Node: m.id, Tier: index.TierDRAM}, c*length, (c+1)*length)
		for _, ev := range evs {
			m.c.Publish(ev)
		}
		if c%2 == 1 {
			for _, ev := range evs[:length/2] {
				ev.Loc = index.Location{Node: 3, Tier: index.TierSSD}
				tc.members[2].c.Publish(ev)
			}
		}
		hashes = append(hashes, chain)
	}
	for _, m := range tc.running() {
		if err := m.c.Sync(b.Context()); err != nil {
			b.Fatal(err)
		}
	}
	f := tc.follower()
	waitFor(b, 10*time.Second, "the follower applies the chains", func() bool {
		return f.c.FSM().Directory().Len() == chains*length
	})
	for c, chain := range hashes {
		if p := f.c.Lookup(testNS, chain); p.Blocks != length {
			b.Fatalf("chain %d: %d blocks found, want %d", c, p.Blocks, length)
		}
	}

	// Chains are picked at random: a directory of 128 Ki blocks does not
	// stay in a core's caches.
	b.Run("serial", func(b *testing.B) {
		var lat []time.Duration
		for b.Loop() {
			chain := hashes[rand.IntN(chains)]
			start := time.Now()
			f.c.Lookup(testNS, chain)
			lat = append(lat, time.Since(start))
		}
		b.ReportMetric(float64(len(lat))/b.Elapsed().Seconds(), "lookups/s")
		b.ReportMetric(percentile(lat, 0.50).Seconds()*1e6, "p50-µs")
		b.ReportMetric(percentile(lat, 0.99).Seconds()*1e6, "p99-µs")
	})
	b.Run("parallel", func(b *testing.B) {
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				f.c.Lookup(testNS, hashes[rand.IntN(chains)])
			}
		})
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "lookups/s")
	})
}
