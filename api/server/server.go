// Package server exposes a node over gRPC as the kvstrata.v1.Cache service.
// Bulk bytes have a faster path (the data plane); the byte-carrying calls
// here stream blocks in chunks so that no message grows with the batch.
package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvstrata/kvstrata/api/node"
	pb "github.com/kvstrata/kvstrata/api/v1"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/tiers"
)

// ChunkSize is the most block bytes one Get response message carries.
const ChunkSize = 1 << 20

// Server implements pb.CacheServer over a node.
type Server struct {
	pb.UnimplementedCacheServer
	n    *node.Node
	opts Options
}

// Options are what the Cache service says about the node besides what the
// node knows itself.
type Options struct {
	// Addrs are where the node's servers listen, for Info.
	Addrs Addrs
	// Version is the version Info reports. The default is "dev".
	Version string
	// Freshness, if set, makes Lookup say how current the directory that
	// answers it is (a cluster member's api/membership.Agent.Freshness).
	Freshness func() *pb.Freshness
	// TenantName, if set, names tenants by their tags in Stats (the users
	// file's tenants); without it Stats gives tags alone.
	TenantName func(index.TenantTag) string
	// GPUs, if set, reads the node's GPUs for Stats.
	GPUs func() []*pb.GPUDevice
}

// Addrs are the endpoints a node serves on.
type Addrs struct {
	GRPC, Data, RESP, HTTP string
	Transport              string // data-plane transport name
	// TransportDetail, if set, says what the transport uses underneath
	// now (ucx: its lanes).
	TransportDetail func() string
}

// Register adds the Cache service for n to g.
func Register(g *grpc.Server, n *node.Node, opts Options) *Server {
	if opts.Version == "" {
		opts.Version = "dev"
	}
	s := &Server{n: n, opts: opts}
	pb.RegisterCacheServer(g, s)
	return s
}

// Info describes the node.
func (s *Server) Info(context.Context, *pb.InfoRequest) (*pb.NodeInfo, error) {
	return s.info(), nil
}

func (s *Server) info() *pb.NodeInfo {
	i, a := s.n.Info(), s.opts.Addrs
	out := &pb.NodeInfo{
		NodeId: uint32(i.ID), Version: s.opts.Version,
		GrpcAddr: a.GRPC, DataAddr: a.Data, Transport: a.Transport,
		RespAddr: a.RESP, HttpAddr: a.HTTP,
		MaxBlockSize: uint64(i.Config.MaxBlockSize), MaxBatchBlocks: uint32(i.Config.MaxBatchBlocks),
		MaxBatchBytes: uint64(i.Config.MaxBatchBytes), StartedUnixMs: i.Started.UnixMilli(),
	}
	if a.TransportDetail != nil {
		out.TransportDetail = a.TransportDetail()
	}
	for _, t := range i.Tiers {
		out.Tiers = append(out.Tiers, t.String())
	}
	return out
}

// Put receives a batch header, checks the batch against the node's limits,
// then fills each block's reservation from the data messages that follow.
func (s *Server) Put(stream grpc.ClientStreamingServer[pb.PutRequest, pb.PutResponse]) error {
	first, err := stream.Recv()
	if err == io.EOF {
		return status.Error(codes.InvalidArgument, "put: the stream ended before its batch header; send a PutHeader first, then the blocks' bytes")
	}
	if err != nil {
		return toStatus(err)
	}
	hdr := first.GetHeader()
	if hdr == nil {
		return status.Error(codes.InvalidArgument, "put: the first message must be the batch header")
	}
	bind := bindingOf(stream.Context())
	metas := make([]index.Header, len(hdr.Blocks))
	asked := make([]index.Key, len(hdr.Blocks))
	for i, m := range hdr.Blocks {
		if m.GetKey() == nil {
			return status.Errorf(codes.InvalidArgument, "put: block %d has no key", i)
		}
		metas[i] = pb.ToHeader(m)
		asked[i] = metas[i].Key
		metas[i].Key = bind.key(asked[i])
	}
	if err := s.n.CheckBatch(metas); err != nil {
		return toStatus(err)
	}
	in := &chunkReader{stream: stream}
	results := make([]*pb.BlockResult, len(metas))
	for i, m := range metas {
		err := s.putOne(in, m, asked[i])
		if f, ok := err.(streamFailure); ok {
			return f.status
		}
		results[i] = &pb.BlockResult{Code: int32(Code(err))}
		if err != nil {
			results[i].Message = err.Error()
		}
	}
	if _, err := in.next(); err != io.EOF {
		return status.Error(codes.InvalidArgument, "put: more bytes than the batch header announced")
	}
	return stream.SendAndClose(&pb.PutResponse{Results: results})
}

// putOne reads one block's bytes into a reservation and commits it; when
// the node refuses the block, its bytes are read and dropped.
func (s *Server) putOne(in *chunkReader, m index.Header, asked index.Key) error {
	r, err := s.n.Reserve(m)
	if err != nil {
		if n, derr := io.CopyN(io.Discard, in, int64(m.Size)); derr != nil {
			return streamError(asked, m.Size, n, derr)
		}
		return err
	}
	if n, err := io.ReadFull(in, r.Bytes()); err != nil {
		r.Abort()
		return streamError(asked, m.Size, int64(n), err)
	}
	return node.CommitChecked(r, m)
}

// streamError reports a failure of the Put stream itself, got bytes into
// the block the caller names key, of size bytes, as the status that ends
// the call. A stream that ended early is
// the client's mistake (InvalidArgument); any other failure (a cancelled
// call, a second header) keeps its code.
func streamError(key index.Key, size uint32, got int64, err error) error {
	code, msg := Code(err), err.Error()
	if s, ok := status.FromError(err); ok {
		msg = s.Message()
	}
	if errors.Is(err, io.ErrUnexpectedEOF) {
		code, msg = codes.InvalidArgument, fmt.Sprintf(
			"the stream ended %d bytes into the block's %d; send every byte the batch header announces", got, size)
	}
	return streamFailure{status.Errorf(code, "put: block %v: %s", key, msg)}
}

// streamFailure carries a status that ends a Put call.
type streamFailure struct{ status error }

func (f streamFailure) Error() string { return f.status.Error() }

// chunkReader reads the data messages of a Put stream as one byte stream.
type chunkReader struct {
	stream grpc.ClientStreamingServer[pb.PutRequest, pb.PutResponse]
	buf    []byte
}

func (c *chunkReader) next() ([]byte, error) {
	for len(c.buf) == 0 {
		msg, err := c.stream.Recv()
		if err != nil {
			return nil, err
		}
		if msg.GetHeader() != nil {
			return nil, status.Error(codes.InvalidArgument, "put: a second batch header in one stream")
		}
		c.buf = msg.GetData()
	}
	return c.buf, nil
}

func (c *chunkReader) Read(p []byte) (int, error) {
	b, err := c.next()
	if err == io.EOF {
		return 0, io.ErrUnexpectedEOF
	}
	if err != nil {
		return 0, err
	}
	n := copy(p, b)
	c.buf = b[n:]
	return n, nil
}

// Get streams blocks back in request order. A block the node holds in a
// tier it cannot reach now is answered not found with code UNAVAILABLE and
// why, rather than ending the stream: the other blocks still come.
func (s *Server) Get(req *pb.GetRequest, stream grpc.ServerStreamingServer[pb.GetResponse]) error {
	if err := s.n.CheckKeys(len(req.Keys)); err != nil {
		return toStatus(err)
	}
	bind := bindingOf(stream.Context())
	for i, k := range req.Keys {
		if err := stream.Context().Err(); err != nil {
			return toStatus(err)
		}
		asked := pb.ToKey(k)
		found, err := s.sendBlock(stream, uint32(i), bind.key(asked), asked)
		if err != nil {
			return toStatus(err)
		}
		if !found && req.StopAtMiss {
			break
		}
	}
	return nil
}

// sendBlock sends the block kept under key, which the caller named asked.
func (s *Server) sendBlock(stream grpc.ServerStreamingServer[pb.GetResponse], i uint32, key, asked index.Key) (bool, error) {
	v, kind, err := s.n.View(key)
	if errors.Is(err, tiers.ErrUnavailable) { // held, out of reach for now: not a miss
		return false, stream.Send(&pb.GetResponse{Index: i, Tier: kind.String(), Code: int32(codes.Unavailable), Message: err.Error()})
	}
	if errors.Is(err, tiers.ErrNotFound) {
		return false, stream.Send(&pb.GetResponse{Index: i})
	}
	if err != nil {
		return false, err
	}
	defer v.Release()
	b := v.Bytes()
	first := min(len(b), ChunkSize)
	if err := stream.Send(&pb.GetResponse{Index: i, Found: true, Meta: meta(v.Meta(), asked), Tier: kind.String(), Data: b[:first]}); err != nil {
		return true, err
	}
	for b = b[first:]; len(b) > 0; {
		n := min(len(b), ChunkSize)
		if err := stream.Send(&pb.GetResponse{Index: i, Data: b[:n]}); err != nil {
			return true, err
		}
		b = b[n:]
	}
	return true, nil
}

// Lookup answers a longest-prefix query.
func (s *Server) Lookup(ctx context.Context, req *pb.LookupRequest) (*pb.LookupResponse, error) {
	chain := make([]index.Hash, len(req.Hashes))
	for i, h := range req.Hashes {
		chain[i] = index.Hash(h)
	}
	var fresh *pb.Freshness
	if s.opts.Freshness != nil { // before the lookup: its answer is at least this current
		fresh = s.opts.Freshness()
	}
	p, err := s.n.Lookup(bindingOf(ctx).ns(index.NamespaceID(req.Namespace)), chain)
	if err != nil {
		return nil, toStatus(err)
	}
	out := &pb.LookupResponse{Blocks: uint32(p.Blocks), Freshness: fresh}
	for _, lb := range p.ByLocation {
		out.Tiers = append(out.Tiers, &pb.TierBlocks{NodeId: uint32(lb.Location.Node), Tier: lb.Location.Tier.String(), Blocks: uint32(lb.Blocks)})
	}
	return out, nil
}

// Exists reports which keys the node holds.
func (s *Server) Exists(ctx context.Context, req *pb.ExistsRequest) (*pb.ExistsResponse, error) {
	ex, err := s.n.Exists(bindingOf(ctx).keys(req.Keys))
	if err != nil {
		return nil, toStatus(err)
	}
	return &pb.ExistsResponse{Exists: ex}, nil
}

// LocateObjects says where each key is held and, for blocks whose fastest
// copy is in the object store, which object range holds them.
func (s *Server) LocateObjects(ctx context.Context, req *pb.LocateObjectsRequest) (*pb.LocateObjectsResponse, error) {
	ps, err := s.n.Locate(ctx, bindingOf(ctx).keys(req.Keys))
	if err != nil {
		return nil, toStatus(err)
	}
	out := &pb.LocateObjectsResponse{Blocks: make([]*pb.BlockPlacement, len(ps))}
	for i, p := range ps {
		b := &pb.BlockPlacement{}
		if p.Kind != 0 {
			b.Tier, b.Meta = p.Kind.String(), meta(p.Meta, pb.ToKey(req.Keys[i]))
		}
		if p.InObject {
			b.Bucket, b.Object, b.Offset = p.Object.Bucket, p.Object.Object, uint64(p.Object.Offset)
		}
		out.Blocks[i] = b
	}
	return out, nil
}

// Evict removes the blocks a selector picks. A caller of a tenant
// evicts only its tenant's blocks, whatever it selects; a caller without
// one (an operator) selects among every tenant's, except where it names
// namespaces or keys, which are bound like any caller's.
func (s *Server) Evict(ctx context.Context, req *pb.EvictRequest) (*pb.EvictResponse, error) {
	bind := bindingOf(ctx)
	sel := node.Selector{
		Keys: bind.keys(req.Keys), OlderThan: millis(req.OlderThanMs),
		Bytes: int64(min(req.Bytes, math.MaxInt64)), All: req.All, DryRun: req.DryRun, Demote: req.Demote,
	}
	asked := make(map[index.Key]index.Key, len(req.Keys)) // bound key → the caller's
	for i, k := range req.Keys {
		asked[sel.Keys[i]] = pb.ToKey(k)
	}
	if req.HasNamespace {
		ns := bind.ns(index.NamespaceID(req.Namespace))
		sel.Namespace = &ns
	}
	if bind.bound && bind.id.Tenant != "" {
		tag := index.TagOf(bind.id.Tenant)
		sel.Tenant = &tag
	}
	if req.Tier != "" {
		kind, err := index.ParseTierKind(req.Tier)
		if err != nil {
			return nil, status.Error(codes.InvalidArgument, err.Error())
		}
		sel.Tier = kind
	}
	res, err := s.n.Evict(sel)
	if err != nil {
		return nil, toStatus(err)
	}
	out := &pb.EvictResponse{Blocks: uint64(res.Blocks), Bytes: uint64(res.Bytes), Pinned: uint64(res.Pinned)}
	listed := int(req.MaxListed)
	if listed == 0 {
		listed = 100
	}
	for _, e := range res.Removed {
		if len(out.Listed) == listed {
			break
		}
		k, ok := asked[e.Meta.Key]
		switch {
		case ok:
		case req.HasNamespace:
			k, ok = index.Key{NS: index.NamespaceID(req.Namespace), Hash: e.Meta.Key.Hash}, true
		case !bind.bound || bind.id.Tenant == "":
			k, ok = e.Meta.Key, true // an operator sees blocks as they are kept
		}
		if !ok { // a tenant's block it did not name: its namespace cannot be told
			continue
		}
		out.Listed = append(out.Listed, &pb.EvictedBlock{Meta: meta(e.Meta, k), Tier: e.Tier.String()})
	}
	return out, nil
}

// Stats reports the node's tiers and counters.
func (s *Server) Stats(context.Context, *pb.StatsRequest) (*pb.StatsResponse, error) {
	hs := s.n.Hierarchy().Stats()
	out := &pb.StatsResponse{Node: s.info(), Gets: uint64(hs.Gets), Misses: uint64(hs.Misses), Pins: uint32(hs.Pins), Keys: uint64(hs.Keys)}
	if s.opts.GPUs != nil {
		out.Gpus = s.opts.GPUs()
	}
	for _, l := range hs.Levels {
		out.Tiers = append(out.Tiers, &pb.TierStats{
			Tier: l.Kind.String(), Policy: l.Policy, CapacityBytes: uint64(l.Capacity), UsedBytes: uint64(l.Used),
			Blocks: uint64(l.Blocks), Hits: uint64(l.Hits), Evictions: uint64(l.Evictions), Drops: uint64(l.Drops),
			Demotions: uint64(l.Demotions), Promotions: uint64(l.Promotions),
			HighWatermark: l.HighWatermark, LowWatermark: l.LowWatermark,
			Available: l.Unavailable == nil, Detail: l.Detail, QuotaEvictions: uint64(l.QuotaEvictions),
			Tenants: s.tenants(l.Tenants),
		})
		if l.Unavailable != nil {
			out.Tiers[len(out.Tiers)-1].Unavailable = l.Unavailable.Error()
		}
	}
	return out, nil
}

// tenants converts a tier's per-tenant use, naming the tenants it can.
func (s *Server) tenants(us []tiers.TenantUsage) []*pb.TenantUsage {
	var out []*pb.TenantUsage
	for _, u := range us {
		t := &pb.TenantUsage{TenantTag: uint32(u.Tenant), Bytes: uint64(u.Bytes), Blocks: uint64(u.Blocks)}
		if s.opts.TenantName != nil {
			t.Tenant = s.opts.TenantName(u.Tenant)
		}
		if u.Quota != tiers.NoQuota {
			q := uint64(u.Quota)
			t.QuotaBytes = &q
		}
		out = append(out, t)
	}
	return out
}

// Warm copies blocks up into a faster tier, streaming progress at most
// every 100 ms and once at the end.
func (s *Server) Warm(req *pb.WarmRequest, stream grpc.ServerStreamingServer[pb.WarmProgress]) error {
	bind := bindingOf(stream.Context())
	var kind index.TierKind
	if req.Tier != "" {
		k, err := index.ParseTierKind(req.Tier)
		if err != nil {
			return status.Error(codes.InvalidArgument, err.Error())
		}
		kind = k
	}
	if kind != 0 && !slices.Contains(s.n.Hierarchy().Kinds(), kind) {
		return status.Errorf(codes.InvalidArgument, "this node has no %v tier", kind)
	}
	if err := s.n.CheckKeys(len(req.Keys)); err != nil {
		return toStatus(err)
	}
	var last time.Time
	var sendErr error
	p, err := s.n.Warm(stream.Context(), bind.keys(req.Keys), kind, 0, func(p node.WarmProgress) {
		if time.Since(last) >= 100*time.Millisecond && sendErr == nil {
			last = time.Now()
			sendErr = stream.Send(warmToPB(p))
		}
	})
	if err != nil {
		return toStatus(err)
	}
	if sendErr != nil {
		return sendErr
	}
	return stream.Send(warmToPB(p))
}

func warmToPB(p node.WarmProgress) *pb.WarmProgress {
	out := &pb.WarmProgress{Done: uint32(p.Done), Total: uint32(p.Total), Warmed: uint32(p.Warmed), Already: uint32(p.Already),
		Missing: uint32(p.Missing), Failed: uint32(p.Failed), Bytes: uint64(p.Bytes)}
	if p.LastError != nil {
		out.LastError = p.LastError.Error()
	}
	return out
}

// Pin leases blocks.
func (s *Server) Pin(ctx context.Context, req *pb.PinRequest) (*pb.PinResponse, error) {
	// A TTL too long for a Duration saturates, and the node refuses it as
	// longer than its longest lease.
	bind := bindingOf(ctx)
	id, exp, err := s.n.PinAs(bind.owner(), bind.keys(req.Keys), millis(req.TtlMs))
	if err != nil {
		return nil, toStatus(err)
	}
	return &pb.PinResponse{LeaseId: id, ExpiresUnixMs: exp.UnixMilli()}, nil
}

// Release ends a lease.
func (s *Server) Release(ctx context.Context, req *pb.ReleaseRequest) (*pb.ReleaseResponse, error) {
	if err := s.n.ReleaseAs(bindingOf(ctx).owner(), req.LeaseId); err != nil {
		return nil, toStatus(err)
	}
	return &pb.ReleaseResponse{}, nil
}
