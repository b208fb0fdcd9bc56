package main

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvstrata/kvstrata/api/client"
	pb "github.com/kvstrata/kvstrata/api/v1"
	"github.com/kvstrata/kvstrata/index"
)

// Liveness, forwarding and readiness of real processes across leader
// pauses, restarts and partitions.

// pause stops p with SIGSTOP, as a stalled host or a debugger would; resume
// lets it go on.
func (p *proc) pause()  { p.signal(syscall.SIGSTOP) }
func (p *proc) resume() { p.signal(syscall.SIGCONT) }

func (p *proc) signal(sig syscall.Signal) {
	p.t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		p.t.Fatalf("%v: %v", sig, err)
	}
}

// readyz returns the status code of p's /readyz, or 0 when it does not
// answer within a second.
func readyz(p *proc) int {
	c := http.Client{Timeout: time.Second}
	resp, err := c.Get("http://" + p.http + "/readyz")
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// healthOf returns the gRPC health service's overall status on p.
func healthOf(t *testing.T, p *proc) healthpb.HealthCheckResponse_ServingStatus {
	t.Helper()
	cc, err := grpc.NewClient(p.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	resp, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		return healthpb.HealthCheckResponse_UNKNOWN
	}
	return resp.Status
}

// freshnessOf returns the freshness of a lookup on p.
func freshnessOf(t *testing.T, p *proc) *pb.Freshness {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r, err := p.api().Lookup(ctx, 1, []index.Hash{1})
	if err != nil {
		t.Fatalf("lookup: %v", err)
	}
	if r.Freshness == nil {
		t.Fatal("a lookup answer does not say how current it is")
	}
	return r.Freshness
}

// A leader paused for longer than the liveness timeout is deposed; when it
// wakes up, it must not mark the healthy nodes down on its old
// observations. Meanwhile a follower's puts are acknowledged as soon as
// the others elect a new leader, while the old one still sleeps.
func TestAPausedLeaderMarksNoHealthyNodeDown(t *testing.T) {
	const liveness = 2 * time.Second
	nodes := startCluster(t, loopback(3), "--cluster-liveness-timeout", liveness.String())
	leaderID := leaderOf(t, nodes...)
	leader := nodes[leaderID-1]
	var follower *proc
	for _, p := range nodes {
		if p != leader {
			follower = p
			break
		}
	}
	putBlocks(t, follower.api(), 9, 0, 4, 4096)
	if err := syncNode(follower.api(), 10*time.Second); err != nil {
		t.Fatal(err)
	}

	// Watch every node's view of every member's liveness, all along.
	type sighting struct {
		on, node index.NodeID
		at       time.Duration
	}
	var mu sync.Mutex
	var downs []sighting
	polls := 0
	stop := make(chan struct{})
	var wg sync.WaitGroup
	start := time.Now()
	for i, p := range nodes {
		c := p.client(client.Options{MaxRetries: -1})
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				case <-time.After(20 * time.Millisecond):
				}
				ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
				resp, err := c.Members(ctx)
				cancel()
				if err != nil {
					continue // the paused node does not answer
				}
				mu.Lock()
				polls++
				for _, m := range resp.Members {
					if !m.Up {
						downs = append(downs, sighting{index.NodeID(i + 1), index.NodeID(m.Id), time.Since(start)})
					}
				}
				mu.Unlock()
			}
		})
	}
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		wg.Wait()
	}()

	leader.pause()
	paused := time.Now()
	resumed := false
	defer func() {
		if !resumed {
			leader.resume()
		}
	}()
	// A follower's put right after the pause: its events go to the
	// paused leader first.
	putBlocks(t, follower.api(), 9, 100, 104, 4096)
	var acked time.Duration
	synced := make(chan error, 1)
	go func() {
		err := syncNode(follower.api(), 9*time.Second)
		acked = time.Since(paused)
		synced <- err
	}()
	const pause = 3 * liveness
	time.Sleep(pause - time.Since(paused))
	// The two others are a majority: the put is acknowledged while the
	// old leader still sleeps (it used to wait for a forward to it to
	// time out, after 10 s, or for it to wake up).
	select {
	case err := <-synced:
		if err != nil {
			t.Errorf("a follower's put failed while the leader was paused: %v", err)
		}
		synced = nil
	default:
		t.Errorf("a follower's put is not acknowledged after the leader was paused for %v", pause)
	}
	leader.resume()
	resumed = true
	resumedAt := time.Since(start)
	if synced != nil {
		<-synced // acked is set
	}

	eventually(t, 20*time.Second, "the woken leader is a member in good standing again", func() bool {
		for _, p := range nodes {
			r := members(t, p.api())
			if r.LeaderId == 0 || slices.ContainsFunc(r.Members, func(m *pb.Member) bool { return !m.Up }) {
				return false
			}
		}
		return true
	})
	time.Sleep(3 * time.Second) // and it stays so
	close(stop)
	wg.Wait()

	var healthyDown []string
	pausedDown := 0
	for _, s := range downs {
		if s.node == leaderID {
			pausedDown++
			continue
		}
		healthyDown = append(healthyDown, fmt.Sprintf("node %d down on node %d at %v", s.node, s.on, s.at.Round(time.Millisecond)))
	}
	t.Logf("leader %d paused %v (liveness timeout %v), resumed at %v; a follower's put acknowledged %v after the pause; "+
		"%d polls, %d sightings of the paused node down", leaderID, pause, liveness, resumedAt.Round(time.Millisecond),
		acked.Round(time.Millisecond), polls, pausedDown)
	if len(healthyDown) > 0 {
		t.Errorf("healthy nodes were marked down (%d sightings), the first: %v", len(healthyDown), healthyDown[:min(5, len(healthyDown))])
	}
}

// A restarted node that cannot reach a leader is not ready (/readyz 503,
// gRPC health NOT_SERVING) and says its lookups are not current; once a
// leader is back it is ready and current.
func TestARestartedNodeIsNotReadyUntilItHearsFromALeader(t *testing.T) {
	nodes := startCluster(t, loopback(3))
	n1, n2, n3 := nodes[0], nodes[1], nodes[2]
	for _, p := range nodes {
		if got := healthOf(t, p); got != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("a ready node's gRPC health is %v", got)
		}
	}
	n3.kill()
	n1.pause()
	n2.pause()
	defer n1.resume()
	defer n2.resume()
	n3.launch()
	eventually(t, 20*time.Second, "the restarted node serves lookups", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := n3.api().Lookup(ctx, 1, []index.Hash{1})
		return err == nil
	})
	time.Sleep(2 * time.Second) // it goes on without a leader
	if f := freshnessOf(t, n3); f.Current || f.Reason == "" {
		t.Errorf("with no leader to hear from, the restarted node calls its lookups %v", f)
	}
	if code := readyz(n3); code != http.StatusServiceUnavailable {
		t.Errorf("/readyz of the restarted node without a leader: %d, want 503", code)
	}
	if got := healthOf(t, n3); got != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("gRPC health of the restarted node without a leader: %v, want NOT_SERVING", got)
	}

	n1.resume()
	n2.resume()
	n3.waitReady()
	eventually(t, 10*time.Second, "the node's health and lookups follow", func() bool {
		return healthOf(t, n3) == healthpb.HealthCheckResponse_SERVING && freshnessOf(t, n3).Current
	})
}

// A node cut off from the others is not ready and says its lookups are
// not current for as long as the partition lasts, then catches up.
func TestACutOffNodeIsNotReadyAndSaysItsLookupsAreStale(t *testing.T) {
	nn, err := newNetnsNet(t, 3)
	if err != nil {
		t.Skipf("no partition test: %v", err)
	}
	nodes := startCluster(t, nn.hosts())
	n3 := nodes[2]
	nn.isolate(3)
	eventually(t, 10*time.Second, "the cut-off node reports it is not ready", func() bool {
		return readyz(n3) == http.StatusServiceUnavailable
	})
	cut := time.Now()
	for time.Since(cut) < 3*time.Second {
		if f := freshnessOf(t, n3); f.Current {
			t.Fatalf("%v into the partition the cut-off node calls its lookups current: %v", time.Since(cut).Round(time.Millisecond), f)
		}
		if code := readyz(n3); code != http.StatusServiceUnavailable {
			t.Fatalf("%v into the partition the cut-off node's /readyz is %d", time.Since(cut).Round(time.Millisecond), code)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if got := healthOf(t, n3); got != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("gRPC health of the cut-off node: %v, want NOT_SERVING", got)
	}
	nn.heal(3)
	n3.waitReady()
	eventually(t, 10*time.Second, "the healed node's lookups are current", func() bool { return freshnessOf(t, n3).Current })
}
