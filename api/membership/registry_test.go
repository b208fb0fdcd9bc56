package membership_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/kvstrata/kvstrata/api/v1"
	"github.com/kvstrata/kvstrata/raftstore"
)

func workerPB(i int) *pb.WorkerRecord {
	return &pb.WorkerRecord{Url: fmt.Sprintf("http://127.0.0.1:%d", 9000+i), Events: fmt.Sprintf("tcp://127.0.0.1:%d", 6000+i),
		Role: "aggregated", Model: "kvstrata-sim", Namespace: 42, BlockTokens: 16, PoolBlocks: 512}
}

// listed returns the URLs m's ListWorkers answers, joined by spaces.
func (tc *testCluster) listed(m *member) string {
	tc.t.Helper()
	resp, err := tc.rpc(m).ListWorkers(context.Background(), &pb.ListWorkersRequest{})
	if err != nil {
		tc.t.Fatalf("node %d: ListWorkers: %v", m.id, err)
	}
	var urls []string
	for _, w := range resp.Workers {
		urls = append(urls, w.Url)
	}
	return strings.Join(urls, " ")
}

// everyListing waits until every running member lists exactly want.
func (tc *testCluster) everyListing(timeout time.Duration, want string) {
	tc.t.Helper()
	waitFor(tc.t, timeout, fmt.Sprintf("every node lists the workers %q", want), func() bool {
		for _, m := range tc.running() {
			if tc.listed(m) != want {
				return false
			}
		}
		return true
	})
}

func TestWorkerRegistryIsReplicatedAndLeasesEnd(t *testing.T) {
	tc := startCluster(t, 3)
	ctx := context.Background()
	leader, follower := tc.leader(), tc.follower()
	// Through a follower (forwarded to the leader) and through the leader.
	short, long := workerPB(1), workerPB(2)
	resp, err := tc.rpc(follower).RegisterWorker(ctx, &pb.RegisterWorkerRequest{Worker: short, TtlMs: 2000})
	if err != nil {
		t.Fatalf("RegisterWorker through node %d: %v", follower.id, err)
	}
	if left := time.Until(time.UnixMilli(resp.ExpiresUnixMs)); left <= 0 || left > 2*time.Second {
		t.Fatalf("a 2 s lease ends in %v", left)
	}
	if _, err := tc.rpc(leader).RegisterWorker(ctx, &pb.RegisterWorkerRequest{Worker: long, TtlMs: 60000}); err != nil {
		t.Fatalf("RegisterWorker through the leader: %v", err)
	}
	both := short.Url + " " + long.Url
	tc.everyListing(10*time.Second, both)
	// Every replica holds the same records, lease ends included.
	for _, m := range tc.running() {
		got := m.c.FSM().Workers(time.Time{})
		want := leader.c.FSM().Workers(time.Time{})
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("node %d holds %+v, the leader %+v", m.id, got, want)
		}
	}
	// The short lease ends without a renewal: the leader's sweep drops the
	// record on every replica, not only from the lists.
	tc.everyListing(10*time.Second, long.Url)
	waitFor(t, 10*time.Second, "every replica drops the ended lease", func() bool {
		for _, m := range tc.running() {
			if _, ok := m.c.FSM().Worker(short.Url); ok {
				return false
			}
		}
		return true
	})
	// Deregistering through the other follower.
	var other *member
	for _, m := range tc.running() {
		if m != leader && m != follower {
			other = m
		}
	}
	if _, err := tc.rpc(other).DeregisterWorker(ctx, &pb.DeregisterWorkerRequest{Url: long.Url}); err != nil {
		t.Fatalf("DeregisterWorker: %v", err)
	}
	if _, err := tc.rpc(other).DeregisterWorker(ctx, &pb.DeregisterWorkerRequest{Url: long.Url}); err != nil {
		t.Fatalf("DeregisterWorker of an unknown worker: %v, want no error", err)
	}
	tc.everyListing(10*time.Second, "")
}

func TestRegisterWorkerRefusesBadInputAndChangesNothing(t *testing.T) {
	tc := startCluster(t, 3)
	ctx := context.Background()
	follower := tc.follower()
	huge := strings.Repeat("x", raftstore.MaxWorkerField+1)
	with := func(change func(w *pb.WorkerRecord)) *pb.WorkerRecord {
		w := workerPB(1)
		change(w)
		return w
	}
	bad := map[string]*pb.RegisterWorkerRequest{
		"no record":      {TtlMs: 5000},
		"empty URL":      {Worker: with(func(w *pb.WorkerRecord) { w.Url = "" }), TtlMs: 5000},
		"no lease":       {Worker: workerPB(1)},
		"negative lease": {Worker: workerPB(1), TtlMs: -5000},
		"a year's lease": {Worker: workerPB(1), TtlMs: (365 * 24 * time.Hour).Milliseconds()},
		"huge URL":       {Worker: with(func(w *pb.WorkerRecord) { w.Url = "http://" + huge }), TtlMs: 5000},
		"huge model":     {Worker: with(func(w *pb.WorkerRecord) { w.Model = huge }), TtlMs: 5000},
		"unknown role":   {Worker: with(func(w *pb.WorkerRecord) { w.Role = "janitor" }), TtlMs: 5000},
	}
	for _, m := range []*member{tc.leader(), follower} {
		for name, req := range bad {
			_, err := tc.rpc(m).RegisterWorker(ctx, req)
			if status.Code(err) != codes.InvalidArgument {
				t.Errorf("node %d, %s: RegisterWorker = %v, want InvalidArgument", m.id, name, err)
			}
		}
		for _, url := range []string{"", huge} {
			if _, err := tc.rpc(m).DeregisterWorker(ctx, &pb.DeregisterWorkerRequest{Url: url}); status.Code(err) != codes.InvalidArgument {
				t.Errorf("node %d: DeregisterWorker of a %d-byte URL = %v, want InvalidArgument", m.id, len(url), err)
			}
		}
	}
	for _, m := range tc.running() {
		if n := len(m.c.FSM().Workers(time.Time{})); n != 0 {
			t.Fatalf("node %d holds %d workers after bad registrations", m.id, n)
		}
	}

	// A full registry refuses a new worker and keeps renewing the others.
	var wg sync.WaitGroup
	errs := make(chan error, raftstore.MaxWorkers)
	for g := range 16 {
		wg.Go(func() {
			for i := g; i < raftstore.MaxWorkers; i += 16 {
				if _, err := tc.rpc(follower).RegisterWorker(ctx, &pb.RegisterWorkerRequest{Worker: workerPB(i), TtlMs: 60000}); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("filling the registry: %v", err)
	}
	_, err := tc.rpc(follower).RegisterWorker(ctx, &pb.RegisterWorkerRequest{Worker: workerPB(raftstore.MaxWorkers), TtlMs: 60000})
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("registering worker %d: %v, want ResourceExhausted", raftstore.MaxWorkers+1, err)
	}
	if _, err := tc.rpc(follower).RegisterWorker(ctx, &pb.RegisterWorkerRequest{Worker: workerPB(0), TtlMs: 60000}); err != nil {
		t.Fatalf("renewing a worker of a full registry: %v", err)
	}
	if n := len(tc.leader().c.FSM().Workers(time.Time{})); n != raftstore.MaxWorkers {
		t.Fatalf("the registry holds %d workers, want %d", n, raftstore.MaxWorkers)
	}
}
