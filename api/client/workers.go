package client

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	pb "github.com/kvstrata/kvstrata/api/v1"
)

// The worker registry of the kvstrata.v1.Cluster service: inference workers
// register with a lease, and frontends list them.

// RegisterWorker registers w, or renews its lease, for ttl (1 s to 10
// min), and returns when the lease ends by the cluster leader's clock. A
// record the node refuses (empty URL, fields too long, ttl out of bounds)
// is an error matching ErrInvalid; a new worker in a full registry one
// matching ErrFull.
func (c *Client) RegisterWorker(ctx context.Context, w *pb.WorkerRecord, ttl time.Duration) (time.Time, error) {
	var resp *pb.RegisterWorkerResponse
	err := c.call(ctx, "register-worker", func(ctx context.Context) (err error) {
		resp, err = c.cluster.RegisterWorker(ctx, &pb.RegisterWorkerRequest{Worker: w, TtlMs: ttl.Milliseconds()})
		return err
	})
	if err != nil {
		return time.Time{}, err
	}
	return time.UnixMilli(resp.ExpiresUnixMs), nil
}

// DeregisterWorker removes the worker of url from the registry; an unknown
// one is no error.
func (c *Client) DeregisterWorker(ctx context.Context, url string) error {
	return c.call(ctx, "deregister-worker", func(ctx context.Context) error {
		_, err := c.cluster.DeregisterWorker(ctx, &pb.DeregisterWorkerRequest{Url: url})
		return err
	})
}

// ListWorkers lists the registered workers whose lease has not ended, by
// URL, as the node's replica knows them.
func (c *Client) ListWorkers(ctx context.Context) ([]*pb.WorkerRecord, error) {
	var resp *pb.ListWorkersResponse
	err := c.call(ctx, "list-workers", func(ctx context.Context) (err error) {
		resp, err = c.cluster.ListWorkers(ctx, &pb.ListWorkersRequest{})
		return err
	})
	return resp.GetWorkers(), err
}

// WorkerLease keeps a worker registered: it renews the lease three times
// per TTL, so that a renewal or two may fail without the lease ending,
// until Close deregisters the worker. A process killed without Close
// leaves the lease to end.
type WorkerLease struct {
	c      *Client
	w      *pb.WorkerRecord
	ttl    time.Duration
	log    *slog.Logger
	cancel context.CancelFunc
	done   chan struct{}

	mu      sync.Mutex
	expires time.Time
}

// KeepWorker registers w for ttl and keeps renewing it until the lease is
// closed. A record the node refuses (ErrInvalid) is returned at once;
// any other failure of the first registration (the cache is down) is
// logged and retried with the renewals. log nil is slog.Default().
func (c *Client) KeepWorker(ctx context.Context, w *pb.WorkerRecord, ttl time.Duration, log *slog.Logger) (*WorkerLease, error) {
	if log == nil {
		log = slog.Default()
	}
	l := &WorkerLease{c: c, w: w, ttl: ttl, log: log, done: make(chan struct{})}
	if err := l.renew(ctx); errors.Is(err, ErrInvalid) {
		return nil, err
	}
	ctx, l.cancel = context.WithCancel(context.Background())
	go l.run(ctx)
	return l, nil
}

// Expires is when the lease last renewed ends; zero before the first
// registration succeeds.
func (l *WorkerLease) Expires() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.expires
}

func (l *WorkerLease) run(ctx context.Context) {
	defer close(l.done)
	t := time.NewTicker(l.ttl / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			_ = l.renew(ctx)
		}
	}
}

// renew registers the worker once, within a third of the TTL.
func (l *WorkerLease) renew(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, l.ttl/3)
	defer cancel()
	exp, err := l.c.RegisterWorker(ctx, l.w, l.ttl)
	if err != nil {
		if ctx.Err() == nil || !errors.Is(err, context.Canceled) {
			l.log.Warn("worker registry: renewing the lease failed", "url", l.w.GetUrl(), "err", err)
		}
		return err
	}
	l.mu.Lock()
	first := l.expires.IsZero()
	l.expires = exp
	l.mu.Unlock()
	if first {
		l.log.Info("worker registry: registered", "url", l.w.GetUrl(), "ttl", l.ttl)
	}
	return nil
}

// Close stops renewing and deregisters the worker, within ctx.
func (l *WorkerLease) Close(ctx context.Context) error {
	l.cancel()
	<-l.done
	return l.c.DeregisterWorker(ctx, l.w.GetUrl())
}
