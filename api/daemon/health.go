package daemon

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvstrata/kvstrata/api/membership"
	"github.com/kvstrata/kvstrata/api/metrics"
	"github.com/kvstrata/kvstrata/tiers"
)

// checks are the node's health checks (/readyz, /healthz): the node is
// started and not stopping, its replica of the directory is current, and
// — advisory — each tier is available and not degraded.
func (d *Node) checks(cl *membership.Agent, h *tiers.Hierarchy) []metrics.Check {
	checks := []metrics.Check{{Name: "node", Fn: func() error {
		if !d.ready.Load() {
			return errors.New("starting or shutting down")
		}
		return nil
	}}, {Name: "cluster", Fn: cl.Ready}}
	for i, kind := range h.Kinds() {
		checks = append(checks, metrics.Check{Name: "tier " + kind.String(), Advisory: true, Fn: func() error {
			l := h.Stats().Levels[i]
			if l.Unavailable != nil {
				return l.Unavailable
			}
			if l.Degraded != nil {
				return fmt.Errorf("degraded: %w", l.Degraded)
			}
			return nil
		}})
	}
	return checks
}

// healthEvery is how often the gRPC health service is brought in line with
// readiness.
const healthEvery = 100 * time.Millisecond

// healthServices are the names the gRPC health service answers for on g:
// "" (the server as a whole) and every service registered on it — Cache,
// Cluster, reflection — as grpc-health-probe -service and Kubernetes' gRPC
// probes ask by name. The health service itself is left out: it answers
// whatever the node's state.
func healthServices(g *grpc.Server) []string {
	names := []string{""}
	for name := range g.GetServiceInfo() {
		if name != healthpb.Health_ServiceDesc.ServiceName {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names
}

// followHealth sets the gRPC health status of every one of names to
// SERVING while ready says so and NOT_SERVING otherwise — the node's
// readiness (/readyz): started, and its replica of the directory current —
// until done is closed. Every service follows the node: none of them
// answers right while the node is not ready.
func followHealth(hs *health.Server, names []string, ready func() bool, done <-chan struct{}) {
	t := time.NewTicker(healthEvery)
	defer t.Stop()
	serving := false
	for first := true; ; first = false {
		if r := ready(); first || r != serving {
			serving = r
			setHealth(hs, names, r)
		}
		select {
		case <-t.C:
		case <-done:
			return
		}
	}
}

// setHealth sets the status of every one of names to SERVING or
// NOT_SERVING.
func setHealth(hs *health.Server, names []string, serving bool) {
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if serving {
		st = healthpb.HealthCheckResponse_SERVING
	}
	for _, name := range names {
		hs.SetServingStatus(name, st)
	}
}

// healthServer is grpc's health server, except that its Watch streams end
// once Shutdown has turned every service NOT_SERVING, each after saying
// so. A graceful stop of the gRPC server waits for open streams, and a
// watcher — gRPC's client-side health checking keeps one open to each
// server — would otherwise hold the node's stop until the shutdown
// deadline cut it.
type healthServer struct {
	*health.Server
	stopped chan struct{} // closed by Shutdown
	once    sync.Once
}

func newHealthServer() *healthServer {
	return &healthServer{Server: health.NewServer(), stopped: make(chan struct{})}
}

// Shutdown sets every service NOT_SERVING for good and ends the watches.
func (h *healthServer) Shutdown() {
	h.Server.Shutdown()
	h.once.Do(func() { close(h.stopped) })
}

// Watch is the health server's Watch until Shutdown; then it sends the
// service's last status, unless the watcher has it already, and returns.
func (h *healthServer) Watch(req *healthpb.HealthCheckRequest, stream healthpb.Health_WatchServer) error {
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	ws := &watchStream{Health_WatchServer: stream, ctx: ctx}
	inner := make(chan error, 1)
	go func() { inner <- h.Server.Watch(req, ws) }()
	select {
	case err := <-inner:
		return err
	case <-h.stopped:
	}
	cancel()
	<-inner // no Send of its own from now on
	last := healthpb.HealthCheckResponse_SERVICE_UNKNOWN
	if resp, err := h.Server.Check(stream.Context(), req); err == nil {
		last = resp.Status
	}
	if ws.sent != nil && *ws.sent == last {
		return nil
	}
	return stream.Send(&healthpb.HealthCheckResponse{Status: last})
}

// watchStream is a Watch stream whose context ends with the node's stop,
// and which remembers the last status sent.
type watchStream struct {
	healthpb.Health_WatchServer
	ctx  context.Context
	sent *healthpb.HealthCheckResponse_ServingStatus
}

func (w *watchStream) Context() context.Context { return w.ctx }

func (w *watchStream) Send(r *healthpb.HealthCheckResponse) error {
	st := r.Status
	w.sent = &st
	return w.Health_WatchServer.Send(r)
}
