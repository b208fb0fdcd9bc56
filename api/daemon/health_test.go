package daemon_test

import (
	"context"
	"io"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/kvstrata/kvstrata/api/daemon"
	pb "github.com/kvstrata/kvstrata/api/v1"
	"github.com/kvstrata/kvstrata/transfer/tcp"
)

// The gRPC health service answers for the server ("") and for each
// service by its full name, as grpc-health-probe -service and Kubernetes'
// gRPC probes ask: SERVING while the node is ready, NOT_SERVING from the
// moment it starts stopping; a name the node does not serve is NotFound.
func TestHealthAnswersForEveryServiceByName(t *testing.T) {
	n, err := daemon.New(newConfig(t, t.TempDir(), nil), daemon.Options{Logger: quiet(), Transport: tcp.New(tcp.Options{})})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			n.Stop(context.Background())
		}
	})
	cc, err := grpc.NewClient(n.Addrs().GRPC, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	hc := healthpb.NewHealthClient(cc)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	// The health service follows readiness, which comes once the replica
	// of the directory is current: a moment after Start, on a busy machine.
	services := []string{"", pb.Cache_ServiceDesc.ServiceName, pb.Cluster_ServiceDesc.ServiceName}
	for _, name := range services {
		for {
			resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: name})
			if err == nil && resp.Status == healthpb.HealthCheckResponse_SERVING {
				break
			}
			if ctx.Err() != nil || err != nil {
				t.Fatalf("Check(%q) of a started node: %v, %v; want SERVING (node ready: %v)", name, resp.GetStatus(), err, n.Ready())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	if _, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: "kvstrata.v1.NoSuchService"}); status.Code(err) != codes.NotFound {
		t.Errorf("Check of a service the node does not serve: %v, want NotFound", err)
	}

	// Watchers hear every service go NOT_SERVING when the node stops, and
	// then their streams end: an open watch — gRPC's client-side health
	// checking keeps one — does not hold the graceful stop.
	var watches []healthpb.Health_WatchClient
	for _, name := range services {
		w, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{Service: name})
		if err != nil {
			t.Fatal(err)
		}
		if got, err := w.Recv(); err != nil || got.Status != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("Watch(%q) first says %v, %v; want SERVING", name, got.GetStatus(), err)
		}
		watches = append(watches, w)
	}
	stopErr := make(chan error, 1)
	go func() { stopErr <- n.Stop(context.Background()) }() // no deadline: nothing cuts the watches
	stopped = true
	for i, w := range watches {
		if got, err := w.Recv(); err != nil || got.Status != healthpb.HealthCheckResponse_NOT_SERVING {
			t.Errorf("Watch(%q) once the node stops: %v, %v; want NOT_SERVING", services[i], got.GetStatus(), err)
		}
		if got, err := w.Recv(); err != io.EOF {
			t.Errorf("Watch(%q) after NOT_SERVING: %v, %v; want the stream to end", services[i], got.GetStatus(), err)
		}
	}
	select {
	case err := <-stopErr:
		if err != nil {
			t.Fatalf("stop: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the node is still stopping after 30s, with health watches open")
	}
}
