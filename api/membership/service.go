package membership

import (
	"context"
	"encoding/binary"
	"errors"
	"slices"
	"strconv"
	"time"

	"github.com/cespare/xxhash/v2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	pb "github.com/kvstrata/kvstrata/api/v1"
	"github.com/kvstrata/kvstrata/auth"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/raftstore"
)

// Register serves the Cluster service for c on g.
func (c *Agent) Register(g *grpc.Server) { pb.RegisterClusterServer(g, &service{c: c}) }

type service struct {
	pb.UnimplementedClusterServer
	c *Agent
}

// forward sends a leader-only call to the leader; call runs it there.
func forward[Resp any](s *service, ctx context.Context, call func(pb.ClusterClient) (Resp, error)) (Resp, error) {
	var zero Resp
	conn, err := s.c.leaderConn()
	if err != nil {
		return zero, status.Error(codes.Unavailable, err.Error())
	}
	return call(pb.NewClusterClient(conn))
}

func (s *service) Members(context.Context, *pb.MembersRequest) (*pb.MembersResponse, error) {
	fsm := s.c.rep.FSM
	servers, _ := s.c.rep.Servers()
	out := &pb.MembersResponse{LeaderId: uint32(s.c.rep.Leader()), AppliedIndex: fsm.AppliedIndex()}
	for _, m := range fsm.Members() {
		pm := memberToPB(m)
		pm.Up = fsm.Alive(m.ID)
		if l, ok := fsm.Liveness(m.ID); ok {
			pm.SinceUnixMs = l.Since.UnixMilli()
		}
		pm.Voter = slices.ContainsFunc(servers, func(sv raftstore.Server) bool { return sv.ID == m.ID && sv.Voter })
		if caps, ok := fsm.Capacities(m.ID); ok {
			pm.Tiers, pm.TiersUnixMs = usageToPB(caps.Tiers), caps.At.UnixMilli()
		}
		out.Members = append(out.Members, pm)
	}
	out.DirectoryKeys, out.DirectoryDigest = digest(fsm.Directory())
	return out, nil
}

// digest counts a directory's keys and hashes its content, the same on
// every replica that holds the same entries whatever their order. It reads
// the directory shard by shard under its read locks rather than through a
// Snapshot, which would make the next write to every shard copy it: a
// Members call must not cost the directory's writers.
func digest(d *index.Directory) (uint64, uint64) {
	var n, sum uint64
	var buf []byte
	d.Range(func(k index.Key, e index.Entry) bool {
		slices.SortFunc(e.Locations, func(a, b index.Location) int {
			if a.Node != b.Node {
				return int(a.Node) - int(b.Node)
			}
			return int(a.Tier) - int(b.Tier)
		})
		buf = binary.LittleEndian.AppendUint64(buf[:0], uint64(k.NS))
		buf = binary.LittleEndian.AppendUint64(buf, uint64(k.Hash))
		for _, l := range e.Locations {
			buf = binary.LittleEndian.AppendUint32(buf, uint32(l.Node))
			buf = append(buf, byte(l.Tier))
		}
		sum ^= xxhash.Sum64(buf)
		n++
		return true
	})
	return n, sum
}

func (s *service) Join(ctx context.Context, req *pb.JoinRequest) (*pb.JoinResponse, error) {
	m := memberFromPB(req.GetMember())
	if m.ID == 0 || m.RaftAddr == "" || m.GRPCAddr == "" {
		return nil, status.Error(codes.InvalidArgument, "join: the member needs an id > 0, a raft address and a gRPC address")
	}
	if !s.c.rep.IsLeader() {
		return forward(s, ctx, func(cc pb.ClusterClient) (*pb.JoinResponse, error) { return cc.Join(ctx, req) })
	}
	servers, err := s.c.rep.Servers()
	if err != nil {
		return nil, toStatus(err)
	}
	for _, sv := range servers {
		if sv.ID == m.ID && sv.RaftAddr != m.RaftAddr {
			return nil, status.Errorf(codes.FailedPrecondition,
				"join: node %d is a member at raft address %s already; remove it before it joins again at %s", m.ID, sv.RaftAddr, m.RaftAddr)
		}
	}
	// A non-voter first: the quorum stays that of the voters, whether or
	// not the node can be reached. The leader promotes it once it has
	// caught up (promote); joining again is harmless.
	if err := s.c.rep.AddNonvoter(m.ID, m.RaftAddr, 10*time.Second); err != nil {
		return nil, toStatus(err)
	}
	if err := s.c.proposeNow(raftstore.EncodeMemberUpsert(m)); err != nil {
		return nil, toStatus(err)
	}
	s.c.log.Info("node joined as a non-voter", "node", m.ID, "raft", m.RaftAddr, "grpc", m.GRPCAddr)
	return &pb.JoinResponse{}, nil
}

func (s *service) Remove(ctx context.Context, req *pb.RemoveRequest) (*pb.RemoveResponse, error) {
	id := index.NodeID(req.Id)
	if id == 0 {
		return nil, status.Error(codes.InvalidArgument, "remove: node id 0")
	}
	if !s.c.rep.IsLeader() {
		return forward(s, ctx, func(cc pb.ClusterClient) (*pb.RemoveResponse, error) { return cc.Remove(ctx, req) })
	}
	if err := s.c.rep.RemoveServer(id, 10*time.Second); err != nil {
		return nil, toStatus(err)
	}
	if err := s.c.proposeNow(raftstore.EncodeMemberRemove(id)); err != nil && !errors.Is(err, raftstore.ErrUnknownMember) {
		return nil, toStatus(err)
	}
	s.c.log.Info("node removed", "node", id)
	return &pb.RemoveResponse{}, nil
}

func (s *service) Propose(ctx context.Context, req *pb.ProposeRequest) (*pb.ProposeResponse, error) {
	if err := raftstore.ValidateEntry(req.Entry); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "propose: %v", err)
	}
	if !s.c.rep.IsLeader() {
		return nil, status.Error(codes.Unavailable, "propose: not the leader")
	}
	id, ok := proposer(ctx)
	if !ok {
		return nil, status.Errorf(codes.PermissionDenied, "propose: only a member forwards entries, naming itself in the %s metadata", proposerKey)
	}
	servers, err := s.c.rep.Servers()
	if err != nil {
		return nil, toStatus(err)
	}
	if !slices.ContainsFunc(servers, func(sv raftstore.Server) bool { return sv.ID == id }) {
		return nil, status.Errorf(codes.FailedPrecondition, "propose: node %d is not a member of this cluster (removed?)", id)
	}
	if err := raftstore.CheckForwarded(req.Entry, id); err != nil {
		return nil, toStatus(err)
	}
	var committed uint64
	if err := s.c.rep.Propose(raftstore.WithCommitted(ctx, func(i uint64) { committed = i }), req.Entry); err != nil {
		return nil, toStatus(err)
	}
	return &pb.ProposeResponse{Index: committed}, nil
}

func (s *service) Heartbeat(ctx context.Context, req *pb.HeartbeatRequest) (*pb.HeartbeatResponse, error) {
	if !s.c.rep.IsLeader() {
		return forward(s, ctx, func(cc pb.ClusterClient) (*pb.HeartbeatResponse, error) { return cc.Heartbeat(ctx, req) })
	}
	s.c.heard(index.NodeID(req.Id), usageFromPB(req.Tiers))
	s.c.heardApplied(index.NodeID(req.Id), req.AppliedIndex)
	return &pb.HeartbeatResponse{CommitIndex: s.c.rep.Raft.CommitIndex()}, nil
}

func (s *service) Sync(ctx context.Context, _ *pb.SyncRequest) (*pb.SyncResponse, error) {
	if err := s.c.Sync(ctx); err != nil {
		return nil, toStatus(err)
	}
	return &pb.SyncResponse{}, nil
}

// Locate answers where keys are; a caller that authenticated names keys of
// its tenant's namespaces (auth.Identity.Namespace), as on the Cache
// service.
func (s *service) Locate(ctx context.Context, req *pb.LocateRequest) (*pb.LocateResponse, error) {
	if len(req.Keys) > 1<<16 {
		return nil, status.Errorf(codes.InvalidArgument, "locate: %d keys, over the 65536-key limit", len(req.Keys))
	}
	// Freshness is read before the directory: the answer is at least as
	// current as it says.
	fresh := FreshnessToPB(s.c.Freshness())
	fsm := s.c.rep.FSM
	dir := fsm.Directory()
	out := &pb.LocateResponse{Keys: make([]*pb.KeyLocations, len(req.Keys)), Freshness: fresh}
	id, bound := auth.FromContext(ctx)
	for i, k := range req.Keys {
		kl := &pb.KeyLocations{}
		key := pb.ToKey(k)
		if bound {
			key.NS = id.Namespace(key.NS)
		}
		if e, ok := dir.Get(key); ok {
			for _, l := range e.Locations {
				if fsm.Alive(l.Node) {
					kl.Locations = append(kl.Locations, &pb.TierBlocks{NodeId: uint32(l.Node), Tier: l.Tier.String(), Blocks: 1})
				}
			}
		}
		out.Keys[i] = kl
	}
	return out, nil
}

// proposer returns the node a forwarded proposal names, if it names one.
func proposer(ctx context.Context) (index.NodeID, bool) {
	md, _ := metadata.FromIncomingContext(ctx)
	vs := md.Get(proposerKey)
	if len(vs) != 1 {
		return 0, false
	}
	n, err := strconv.ParseUint(vs[0], 10, 32)
	return index.NodeID(n), err == nil
}

// toStatus maps the replica's errors to gRPC codes.
func toStatus(err error) error {
	if _, ok := status.FromError(err); ok {
		return err
	}
	switch {
	case errors.Is(err, raftstore.ErrNotLeader), errors.Is(err, ErrNoLeader), errors.Is(err, ErrCatchingUp):
		return status.Error(codes.Unavailable, err.Error())
	case errors.Is(err, raftstore.ErrUnknownMember), errors.Is(err, raftstore.ErrInvalidMember),
		errors.Is(err, raftstore.ErrInvalidEntry):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, raftstore.ErrNotForwardable):
		return status.Error(codes.PermissionDenied, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	}
	return status.Error(codes.Internal, err.Error())
}

func memberToPB(m raftstore.Member) *pb.Member {
	return &pb.Member{Id: uint32(m.ID), Name: m.Name, RaftAddr: m.RaftAddr, GrpcAddr: m.GRPCAddr,
		DataAddr: m.DataAddr, Transport: m.Transport}
}

func memberFromPB(m *pb.Member) raftstore.Member {
	return raftstore.Member{ID: index.NodeID(m.GetId()), Name: m.GetName(), RaftAddr: m.GetRaftAddr(),
		GRPCAddr: m.GetGrpcAddr(), DataAddr: m.GetDataAddr(), Transport: m.GetTransport()}
}

func usageToPB(us []raftstore.TierUsage) []*pb.TierUsage {
	out := make([]*pb.TierUsage, len(us))
	for i, u := range us {
		out[i] = &pb.TierUsage{Tier: u.Tier.String(), CapacityBytes: u.Capacity, UsedBytes: u.Used, Blocks: u.Blocks}
	}
	return out
}

func usageFromPB(us []*pb.TierUsage) []raftstore.TierUsage {
	out := make([]raftstore.TierUsage, 0, len(us))
	for _, u := range us {
		kind, err := index.ParseTierKind(u.Tier)
		if err != nil {
			continue
		}
		out = append(out, raftstore.TierUsage{Tier: kind, Capacity: u.CapacityBytes, Used: u.UsedBytes, Blocks: u.Blocks})
	}
	return out
}
