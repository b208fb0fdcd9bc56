package membership

import (
	"context"
	"errors"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/kvstrata/kvstrata/api/v1"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/raftstore"
)

// This file serves the worker registry (raftstore's Worker records): the
// inference workers that register with the cluster, so that every frontend
// replica, whichever node it asks, sees the same set.
//
// A registration is a lease. The leader records its end by its own clock
// (now + TTL) in the replicated record, and a worker renews it by
// registering again, a few times per TTL. While it leads, a node sweeps
// (every HeartbeatInterval): when a record's lease has ended it proposes
// raftstore.EncodeWorkerExpire with its clock's now, and every replica
// drops the same records. ListWorkers hides ended leases at once, by the
// answering node's clock, so a worker killed without deregistering leaves
// every list within its TTL (plus the skew of the clocks).

// Bounds of a worker's lease.
const (
	MinWorkerTTL = time.Second
	MaxWorkerTTL = 10 * time.Minute
)

// registryTimeout bounds the leader's proposal of a registry change.
const registryTimeout = 5 * time.Second

func (s *service) RegisterWorker(ctx context.Context, req *pb.RegisterWorkerRequest) (*pb.RegisterWorkerResponse, error) {
	w := workerFromPB(req.GetWorker())
	ttl := time.Duration(req.GetTtlMs()) * time.Millisecond
	if err := raftstore.CheckWorker(w); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "register worker: %v", err)
	}
	if req.GetTtlMs() < MinWorkerTTL.Milliseconds() || req.GetTtlMs() > MaxWorkerTTL.Milliseconds() {
		return nil, status.Errorf(codes.InvalidArgument, "register worker %.64q: a lease of %d ms, not %v to %v",
			w.URL, req.GetTtlMs(), MinWorkerTTL, MaxWorkerTTL)
	}
	if !s.c.rep.IsLeader() {
		return forward(s, ctx, func(cc pb.ClusterClient) (*pb.RegisterWorkerResponse, error) { return cc.RegisterWorker(ctx, req) })
	}
	fsm := s.c.rep.FSM
	if _, ok := fsm.Worker(w.URL); !ok && len(fsm.Workers(time.Time{})) >= raftstore.MaxWorkers {
		return nil, status.Errorf(codes.ResourceExhausted, "register worker %.64q: the registry holds %d workers, its most",
			w.URL, raftstore.MaxWorkers)
	}
	w.Expires = time.Now().Add(ttl)
	if err := s.proposeRegistry(ctx, raftstore.EncodeWorkerUpsert(w)); err != nil {
		return nil, err
	}
	return &pb.RegisterWorkerResponse{ExpiresUnixMs: w.Expires.UnixMilli()}, nil
}

func (s *service) DeregisterWorker(ctx context.Context, req *pb.DeregisterWorkerRequest) (*pb.DeregisterWorkerResponse, error) {
	url := req.GetUrl()
	if url == "" || len(url) > raftstore.MaxWorkerField {
		return nil, status.Errorf(codes.InvalidArgument, "deregister worker: a URL of %d bytes, not 1 to %d", len(url), raftstore.MaxWorkerField)
	}
	if !s.c.rep.IsLeader() {
		return forward(s, ctx, func(cc pb.ClusterClient) (*pb.DeregisterWorkerResponse, error) { return cc.DeregisterWorker(ctx, req) })
	}
	if _, ok := s.c.rep.FSM.Worker(url); !ok {
		return &pb.DeregisterWorkerResponse{}, nil
	}
	if err := s.proposeRegistry(ctx, raftstore.EncodeWorkerRemove(url)); err != nil {
		return nil, err
	}
	return &pb.DeregisterWorkerResponse{}, nil
}

func (s *service) ListWorkers(context.Context, *pb.ListWorkersRequest) (*pb.ListWorkersResponse, error) {
	ws := s.c.rep.FSM.Workers(time.Now())
	out := &pb.ListWorkersResponse{Workers: make([]*pb.WorkerRecord, len(ws))}
	for i, w := range ws {
		out.Workers[i] = workerToPB(w)
	}
	return out, nil
}

// proposeRegistry commits a registry entry through this node, the leader.
func (s *service) proposeRegistry(ctx context.Context, entry []byte) error {
	ctx, cancel := context.WithTimeout(ctx, registryTimeout)
	defer cancel()
	err := s.c.rep.Propose(ctx, entry)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, raftstore.ErrRegistryFull):
		return status.Error(codes.ResourceExhausted, err.Error())
	}
	return toStatus(err)
}

// expireWorkers runs on every node, every HeartbeatInterval, and acts
// while it leads: it proposes the end of the leases that ended by its
// clock. A deposed leader's late sweep is harmless: it drops only records
// whose lease ended by its cutoff, which every later sweep would drop too
// (a renewal in between moved the lease past it).
func (c *Agent) expireWorkers() {
	now := time.Now()
	if !c.rep.IsLeader() || !c.rep.FSM.WorkersExpired(now) {
		return
	}
	ctx, cancel := context.WithTimeout(c.ctx, registryTimeout)
	defer cancel()
	if err := c.rep.Propose(ctx, raftstore.EncodeWorkerExpire(now)); err != nil {
		c.log.Debug("expiring worker leases", "err", err)
	}
}

// workerToPB converts a registry record to its message.
func workerToPB(w raftstore.Worker) *pb.WorkerRecord {
	r := &pb.WorkerRecord{Url: w.URL, Events: w.Events, Replay: w.Replay, Role: w.Role, Model: w.Model,
		Namespace: uint64(w.Namespace), BlockTokens: w.BlockTokens, PoolBlocks: w.PoolBlocks}
	if !w.Expires.IsZero() {
		r.ExpiresUnixMs = w.Expires.UnixMilli()
	}
	return r
}

// workerFromPB converts a message to a registry record, without its lease.
func workerFromPB(r *pb.WorkerRecord) raftstore.Worker {
	return raftstore.Worker{URL: r.GetUrl(), Events: r.GetEvents(), Replay: r.GetReplay(), Role: r.GetRole(),
		Model: r.GetModel(), Namespace: index.NamespaceID(r.GetNamespace()), BlockTokens: r.GetBlockTokens(),
		PoolBlocks: r.GetPoolBlocks()}
}
