package respcluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/kvstrata/kvstrata/api/resp"
	pb "github.com/kvstrata/kvstrata/api/v1"
	"github.com/kvstrata/kvstrata/auth"
	"github.com/kvstrata/kvstrata/index"
)

// chunkSize is the most value bytes one ValueChunk carries: well under
// gRPC's default 4 MiB message limit.
const chunkSize = 1 << 20

// Service answers the Keyspace gRPC service from a node's own store: the
// store given to Register, never the cluster-wide Store, so a request
// from a peer is never passed on.
type Service struct {
	pb.UnimplementedKeyspaceServer
	local resp.Store
}

// Register adds the Keyspace service of local, the node's own store, to g.
func Register(g grpc.ServiceRegistrar, local resp.Store) *Service {
	s := &Service{local: local}
	pb.RegisterKeyspaceServer(g, s)
	return s
}

// Get streams the local value of the key.
func (s *Service) Get(req *pb.KeyRequest, stream grpc.ServerStreamingServer[pb.ValueChunk]) error {
	v, release, err := s.local.View(asked(stream.Context()), string(req.GetKey()))
	if err != nil {
		return statusOf(err)
	}
	defer release()
	first := true
	for first || len(v) > 0 {
		n := min(len(v), chunkSize)
		msg := &pb.ValueChunk{Data: v[:n]}
		if first {
			msg.Size = uint64(len(v))
		}
		if err := stream.Send(msg); err != nil {
			return err
		}
		v, first = v[n:], false
	}
	return nil
}

// Stat describes the local value of the key: with the store's Stat when
// it has one, else from its value.
func (s *Service) Stat(ctx context.Context, req *pb.KeyRequest) (*pb.KeyStat, error) {
	ctx = asked(ctx)
	key := string(req.GetKey())
	if ks, ok := s.local.(resp.KeyStore); ok {
		ki, err := ks.Stat(ctx, key)
		if err != nil {
			return nil, statusOf(err)
		}
		out := &pb.KeyStat{Size: uint64(ki.Size), Footprint: uint64(ki.Footprint)}
		if !ki.ExpireAt.IsZero() {
			out.ExpireAtUnixMs = ki.ExpireAt.UnixMilli()
		}
		return out, nil
	}
	v, release, err := s.local.View(ctx, key)
	if err != nil {
		return nil, statusOf(err)
	}
	defer release()
	return &pb.KeyStat{Size: uint64(len(v)), Footprint: uint64(len(key) + len(v))}, nil
}

// Delete removes the local value of the key.
func (s *Service) Delete(ctx context.Context, req *pb.KeyRequest) (*pb.KeyDeleted, error) {
	ctx = asked(ctx)
	ok, err := s.local.Delete(ctx, string(req.GetKey()))
	if err != nil {
		return nil, statusOf(err)
	}
	return &pb.KeyDeleted{Deleted: ok}, nil
}

// statusOf maps a store's error to a gRPC status; peerError maps it back.
func statusOf(err error) error {
	switch {
	case errors.Is(err, resp.ErrNotFound):
		return status.Error(codes.NotFound, err.Error())
	case errors.Is(err, resp.ErrUnavailable):
		return status.Error(codes.Unavailable, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	}
	return status.Error(codes.Internal, err.Error())
}

// GRPCPeers asks other nodes through their Keyspace service (Peers).
type GRPCPeers struct {
	conn func(index.NodeID) (grpc.ClientConnInterface, error)
}

var _ Peers = (*GRPCPeers)(nil)

// NewGRPCPeers returns Peers that reach node id through conn(id), a
// connection to its gRPC endpoint (cached by the caller).
func NewGRPCPeers(conn func(index.NodeID) (grpc.ClientConnInterface, error)) *GRPCPeers {
	return &GRPCPeers{conn: conn}
}

func (p *GRPCPeers) client(node index.NodeID) (pb.KeyspaceClient, error) {
	cc, err := p.conn(node)
	if err != nil {
		return nil, err
	}
	return pb.NewKeyspaceClient(cc), nil
}

// Get reads node's value of key.
func (p *GRPCPeers) Get(ctx context.Context, node index.NodeID, key string, progress func()) ([]byte, error) {
	c, err := p.client(node)
	if err != nil {
		return nil, err
	}
	stream, err := c.Get(asking(ctx), &pb.KeyRequest{Key: []byte(key)})
	if err != nil {
		return nil, peerError(node, err)
	}
	first, err := stream.Recv()
	if err != nil {
		return nil, peerError(node, err)
	}
	progress()
	if first.GetSize() > 1<<40 {
		return nil, fmt.Errorf("node %d: value of %d bytes", node, first.GetSize())
	}
	v := make([]byte, 0, first.GetSize())
	v = append(v, first.GetData()...)
	for uint64(len(v)) < first.GetSize() {
		msg, err := stream.Recv()
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return nil, peerError(node, err)
		}
		progress()
		v = append(v, msg.GetData()...)
	}
	if uint64(len(v)) != first.GetSize() {
		return nil, fmt.Errorf("node %d: sent %d bytes of a %d-byte value", node, len(v), first.GetSize())
	}
	return v, nil
}

// Stat describes node's value of key.
func (p *GRPCPeers) Stat(ctx context.Context, node index.NodeID, key string) (resp.KeyInfo, error) {
	c, err := p.client(node)
	if err != nil {
		return resp.KeyInfo{}, err
	}
	st, err := c.Stat(asking(ctx), &pb.KeyRequest{Key: []byte(key)})
	if err != nil {
		return resp.KeyInfo{}, peerError(node, err)
	}
	ki := resp.KeyInfo{Size: int64(st.GetSize()), Footprint: int64(st.GetFootprint())}
	if ms := st.GetExpireAtUnixMs(); ms != 0 {
		ki.ExpireAt = time.UnixMilli(ms)
	}
	return ki, nil
}

// Delete removes node's value of key.
func (p *GRPCPeers) Delete(ctx context.Context, node index.NodeID, key string) (bool, error) {
	c, err := p.client(node)
	if err != nil {
		return false, err
	}
	r, err := c.Delete(asking(ctx), &pb.KeyRequest{Key: []byte(key)})
	if err != nil {
		return false, peerError(node, err)
	}
	return r.GetDeleted(), nil
}

// peerError is the error of a request to node: matching resp.ErrNotFound
// when the node holds no value — or runs a version without the Keyspace
// service, whose values only its own RESP port serves, as before — a
// plain error otherwise.
func peerError(node index.NodeID, err error) error {
	if c := status.Code(err); c == codes.NotFound || c == codes.Unimplemented {
		return resp.Mark(fmt.Errorf("node %d: %s", node, status.Convert(err).Message()), resp.ErrNotFound)
	}
	return fmt.Errorf("node %d: %w", node, err)
}

// errNoKeys is the error of Scan and Flush on a store that cannot
// enumerate its keys.
var errNoKeys = status.Error(codes.Unimplemented, "this node's store cannot enumerate its keys")

// Scan returns a page of the local keys.
func (s *Service) Scan(ctx context.Context, req *pb.ScanRequest) (*pb.ScanPage, error) {
	ctx = asked(ctx)
	ks, ok := s.local.(resp.KeyStore)
	if !ok {
		return nil, errNoKeys
	}
	keys, next, err := ks.Scan(ctx, req.GetCursor(), int(min(req.GetCount(), 1<<20)))
	if err != nil {
		return nil, statusOf(err)
	}
	out := &pb.ScanPage{Keys: make([][]byte, len(keys)), Next: next}
	for i, k := range keys {
		out.Keys[i] = []byte(k)
	}
	return out, nil
}

// Len counts the local keys.
func (s *Service) Len(ctx context.Context, _ *pb.LenRequest) (*pb.KeyCount, error) {
	ctx = asked(ctx)
	n, err := s.local.Len(ctx)
	if err != nil {
		return nil, statusOf(err)
	}
	return &pb.KeyCount{Keys: n}, nil
}

// Flush deletes the local keys.
func (s *Service) Flush(ctx context.Context, _ *pb.FlushRequest) (*pb.KeyCount, error) {
	ctx = asked(ctx)
	ks, ok := s.local.(resp.KeyStore)
	if !ok {
		return nil, errNoKeys
	}
	n, err := ks.Flush(ctx)
	if err != nil {
		return nil, statusOf(err)
	}
	return &pb.KeyCount{Keys: n}, nil
}

// maxScanCount bounds the COUNT hint a node passes to another, so that a
// page of keys (each up to a block in size) stays a reasonable message.
const maxScanCount = 1000

// Scan runs node's Scan of its own keys. The page may be larger than
// gRPC's default 4 MiB message limit (long keys), so the limit is lifted
// for it.
func (p *GRPCPeers) Scan(ctx context.Context, node index.NodeID, cursor uint64, count int) ([]string, uint64, error) {
	c, err := p.client(node)
	if err != nil {
		return nil, 0, err
	}
	page, err := c.Scan(asking(ctx), &pb.ScanRequest{Cursor: cursor, Count: uint32(min(max(count, 0), maxScanCount))},
		grpc.MaxCallRecvMsgSize(math.MaxInt32))
	if err != nil {
		return nil, 0, fmt.Errorf("node %d: %w", node, err)
	}
	keys := make([]string, len(page.GetKeys()))
	for i, k := range page.GetKeys() {
		keys[i] = string(k)
	}
	return keys, page.GetNext(), nil
}

// Len counts node's keys.
func (p *GRPCPeers) Len(ctx context.Context, node index.NodeID) (int64, error) {
	c, err := p.client(node)
	if err != nil {
		return 0, err
	}
	r, err := c.Len(asking(ctx), &pb.LenRequest{})
	if err != nil {
		return 0, fmt.Errorf("node %d: %w", node, err)
	}
	return r.GetKeys(), nil
}

// Flush deletes node's keys.
func (p *GRPCPeers) Flush(ctx context.Context, node index.NodeID) (int64, error) {
	c, err := p.client(node)
	if err != nil {
		return 0, err
	}
	r, err := c.Flush(asking(ctx), &pb.FlushRequest{})
	if err != nil {
		return 0, fmt.Errorf("node %d: %w", node, err)
	}
	return r.GetKeys(), nil
}

// tenantHeader carries, from one node's keyspace to another's, the
// tenant whose keys a request is about: "t=" and the tenant's name (empty
// for an identity without a tenant). Without it the request is about the
// keys of a RESP server that does not authenticate.
const tenantHeader = "kvstrata-resp-tenant"

// asking is ctx with the tenant of the identity it carries, if any, in
// the metadata of a request to another node.
func asking(ctx context.Context) context.Context {
	if id, ok := auth.FromContext(ctx); ok {
		return metadata.AppendToOutgoingContext(ctx, tenantHeader, "t="+id.Tenant)
	}
	return ctx
}

// asked is the context a request from another node is answered in: one
// whose identity is of the tenant the request names, so that the local
// store reads and writes that tenant's keys, or none when it names none
// (the keys of a RESP server that does not authenticate). Only another
// member may name a tenant: a caller the gRPC server authenticated as
// anyone else keeps its own identity, and with it its own tenant's keys.
func asked(ctx context.Context) context.Context {
	caller, ok := auth.FromContext(ctx)
	if ok && !caller.Member {
		return ctx
	}
	vals := metadata.ValueFromIncomingContext(ctx, tenantHeader)
	if len(vals) != 1 || !strings.HasPrefix(vals[0], "t=") {
		return withoutValues{ctx} // not even the member's identity
	}
	id := auth.MemberIdentity()
	if ok {
		id = caller
	}
	id.Tenant = vals[0][len("t="):]
	return auth.NewContext(ctx, id)
}

// withoutValues is a context's cancellation and deadline without its
// values.
type withoutValues struct{ context.Context }

func (withoutValues) Value(any) any { return nil }
