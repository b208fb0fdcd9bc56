package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/kvstrata/kvstrata/api/client"
	"github.com/kvstrata/kvstrata/api/membership"
	pb "github.com/kvstrata/kvstrata/api/v1"
	"github.com/kvstrata/kvstrata/engine/worker"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/raftstore"
)

// DefaultRegisterTTL is the lease of a worker's registration.
const DefaultRegisterTTL = 10 * time.Second

// registration is `kvstrata worker --register`: the worker's record in the
// cache cluster's worker registry, kept alive by a lease. It is a part of
// the worker's process after the worker itself, so it registers once the
// worker serves and deregisters before the worker stops: frontends stop
// routing to it while it finishes its requests. A kill -9 leaves the
// lease to end; frontends see the worker fail sooner, by its health.
type registration struct {
	w         *worker.Worker
	cache     string
	advertise string // the OpenAI API's URL for others; "" http://<listen address>
	ttl       time.Duration
	log       *slog.Logger

	rec    *pb.WorkerRecord
	failed chan error
	cancel context.CancelFunc
	done   chan struct{}
	c      *client.Client
	lease  *client.WorkerLease
}

func (r *registration) Name() string         { return "registration" }
func (r *registration) Failed() <-chan error { return r.failed }

// Start checks the worker's record and registers it in the background: a
// cache node that is down when the worker starts is no error, the record
// is registered once it is up.
func (r *registration) Start(context.Context) error {
	rec, err := r.record()
	if err != nil {
		return err
	}
	r.rec, r.failed, r.done = rec, make(chan error, 1), make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go r.run(ctx)
	return nil
}

// run dials the cache node until it answers, then keeps the lease.
func (r *registration) run(ctx context.Context) {
	defer close(r.done)
	for {
		c, err := client.Dial(ctx, r.cache, client.Options{NoDataPlane: true, Timeout: r.ttl / 3})
		if err == nil {
			r.c = c
			break
		}
		r.log.Warn("worker registry: the cache node does not answer; trying again", "cache", r.cache, "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(r.ttl / 3):
		}
	}
	lease, err := r.c.KeepWorker(ctx, r.rec, r.ttl, r.log)
	if err != nil {
		r.failed <- fmt.Errorf("worker registry at %s refused %s: %w", r.cache, r.rec.Url, err)
		return
	}
	r.lease = lease
}

// Stop deregisters the worker, within ctx.
func (r *registration) Stop(ctx context.Context) error {
	r.cancel()
	<-r.done
	if r.c == nil {
		return nil
	}
	defer r.c.Close()
	if r.lease == nil {
		return nil
	}
	if err := r.lease.Close(ctx); err != nil {
		return fmt.Errorf("deregistering %s: %w", r.rec.Url, err)
	}
	r.log.Info("worker registry: deregistered", "url", r.rec.Url)
	return nil
}

// record is the worker's registry record.
func (r *registration) record() (*pb.WorkerRecord, error) {
	cfg := r.w.Config()
	u := r.advertise
	if u == "" {
		u = "http://" + r.w.Addr()
	}
	u = strings.TrimSuffix(u, "/")
	host := ""
	if pu, err := url.Parse(u); err == nil {
		host = pu.Hostname()
	}
	ns := r.w.Model().Layout().Namespace
	rec := &pb.WorkerRecord{Url: u, Events: advertised(cfg.KVEvents, host), Replay: advertised(cfg.KVEventsReplay, host),
		Role: cfg.Role, Model: cfg.ModelName, Namespace: uint64(ns.ID()), BlockTokens: uint32(ns.BlockTokens),
		PoolBlocks: uint64(cfg.Blocks)}
	if unspecified(host) {
		return nil, fmt.Errorf("worker registry: the worker's URL %s names no host others can reach: set --advertise-url", u)
	}
	err := raftstore.CheckWorker(raftstore.Worker{URL: rec.Url, Events: rec.Events, Replay: rec.Replay, Role: rec.Role,
		Model: rec.Model, Namespace: index.NamespaceID(rec.Namespace)})
	if err != nil {
		return nil, fmt.Errorf("worker registry: %w", err)
	}
	return rec, nil
}

// advertised is a ZMQ endpoint as others dial it: a wildcard or
// unspecified host (tcp://*:5557, tcp://0.0.0.0:5557) becomes host.
func advertised(endpoint, host string) string {
	rest, ok := strings.CutPrefix(endpoint, "tcp://")
	if !ok || host == "" {
		return endpoint
	}
	h, port, err := net.SplitHostPort(rest)
	if err != nil || !(h == "*" || unspecified(h)) {
		return endpoint
	}
	return "tcp://" + net.JoinHostPort(host, port)
}

// unspecified reports whether host is "" or an unspecified address
// (0.0.0.0, ::).
func unspecified(host string) bool {
	if host == "" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsUnspecified()
}

// check reports what is wrong with --register's flags for a worker of cfg.
func (r *registration) check(cfg worker.Config) []string {
	var probs []string
	if cfg.Cache == "" {
		probs = append(probs, `--register: the worker has no --cache to register with`)
	}
	if r.ttl < membership.MinWorkerTTL || r.ttl > membership.MaxWorkerTTL {
		probs = append(probs, fmt.Sprintf("--register-ttl %v: must be %v to %v", r.ttl, membership.MinWorkerTTL, membership.MaxWorkerTTL))
	}
	if r.advertise != "" {
		if u, err := url.Parse(r.advertise); err != nil || (u.Scheme != "http" && u.Scheme != "https") || unspecified(u.Hostname()) {
			probs = append(probs, fmt.Sprintf("--advertise-url %q: not http://host:port", r.advertise))
		}
	}
	return probs
}
