package server_test

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/kvstrata/kvstrata/api/nodetest"
	"github.com/kvstrata/kvstrata/api/server"
	pb "github.com/kvstrata/kvstrata/api/v1"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/tiers"
	"github.com/kvstrata/kvstrata/tiers/tiertest"
)

// serve starts a node and returns a raw gRPC client of it, so that tests
// can send what the Go client never would.
func serve(t *testing.T) (*nodetest.Node, pb.CacheClient) {
	t.Helper()
	n := nodetest.Start(t, nodetest.Options{})
	cc, err := grpc.NewClient(n.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return n, pb.NewCacheClient(cc)
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return c
}

func putBlocks(t *testing.T, n *nodetest.Node, count int) []index.Header {
	t.Helper()
	var out []index.Header
	for i := range count {
		m, b := tiertest.Block(index.Hash(i+1), 4096)
		if err := n.Put(m, b); err != nil {
			t.Fatal(err)
		}
		out = append(out, m)
	}
	return out
}

func wantCode(t *testing.T, what string, err error, want codes.Code, says string) {
	t.Helper()
	s, _ := status.FromError(err)
	if s.Code() != want || !strings.Contains(s.Message(), says) {
		t.Errorf("%s: %v, want %v saying %q", what, err, want, says)
	}
}

// An age in milliseconds too large for a Duration (18446744073710 ms is
// 584,000 years) once wrapped around to 448 µs and selected every block.
func TestEvictOlderThanBeyondTheEpochSelectsNothing(t *testing.T) {
	n, api := serve(t)
	metas := putBlocks(t, n, 3)
	time.Sleep(5 * time.Millisecond) // older than any wrapped-around age
	for _, ms := range []int64{18446744073710, math.MaxInt64, 100 * 365 * 24 * 3600 * 1000} {
		resp, err := api.Evict(ctx(t), &pb.EvictRequest{OlderThanMs: ms})
		if err != nil {
			t.Fatalf("evict older than %d ms: %v", ms, err)
		}
		if resp.Blocks != 0 {
			t.Errorf("evict older than %d ms removed %d blocks, want none", ms, resp.Blocks)
		}
	}
	for _, m := range metas {
		if ex, _ := n.Exists([]index.Key{m.Key}); !ex[0] {
			t.Fatalf("block %v is gone", m.Key)
		}
	}
	// A byte count over what an int64 holds is no limit, not a negative one.
	resp, err := api.Evict(ctx(t), &pb.EvictRequest{Bytes: math.MaxUint64, DryRun: true})
	if err != nil || resp.Blocks != 3 {
		t.Fatalf("dry evict of up to 2^64-1 bytes: %v, %v; want 3 blocks", resp, err)
	}
	// An age that does select still works.
	resp, err = api.Evict(ctx(t), &pb.EvictRequest{OlderThanMs: 1})
	if err != nil || resp.Blocks != 3 {
		t.Fatalf("evict older than 1 ms: %v, %v; want 3 blocks", resp, err)
	}
}

// A TTL too large for a Duration once wrapped around to a lease that
// expired at once; it is longer than the longest lease, so it is refused.
func TestPinTTLOverTheLongestLeaseIsInvalid(t *testing.T) {
	n, api := serve(t)
	metas := putBlocks(t, n, 1)
	keys := []*pb.BlockKey{pb.FromKey(metas[0].Key)}
	for _, ms := range []int64{18446744073710, math.MaxInt64, -1, math.MinInt64, 0} {
		_, err := api.Pin(ctx(t), &pb.PinRequest{Keys: keys, TtlMs: ms})
		wantCode(t, "pin", err, codes.InvalidArgument, "lease of")
	}
	resp, err := api.Pin(ctx(t), &pb.PinRequest{Keys: keys, TtlMs: 60_000})
	if err != nil || time.Until(time.UnixMilli(resp.ExpiresUnixMs)) < 30*time.Second {
		t.Fatalf("pin for a minute: %v, %v", resp, err)
	}
}

// A Put that sends no message at all once came back as Internal "EOF".
func TestPutWithoutAHeaderIsInvalid(t *testing.T) {
	_, api := serve(t)
	stream, err := api.Put(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	_, err = stream.CloseAndRecv()
	wantCode(t, "put of nothing", err, codes.InvalidArgument, "before its batch header")

	stream, err = api.Put(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	_ = stream.Send(&pb.PutRequest{Msg: &pb.PutRequest_Data{Data: []byte("x")}})
	_, err = stream.CloseAndRecv()
	wantCode(t, "put of bytes first", err, codes.InvalidArgument, "must be the batch header")
}

func header(m index.Header) *pb.PutRequest {
	return &pb.PutRequest{Msg: &pb.PutRequest_Header{Header: &pb.PutHeader{Blocks: []*pb.BlockMeta{pb.FromHeader(m)}}}}
}

// A Put whose bytes stop short of what its header announced once came back
// as Internal "unexpected EOF"; a second header as Internal too.
func TestPutCutShortIsInvalid(t *testing.T) {
	n, api := serve(t)
	m, b := tiertest.Block(7, 1000)
	stream, err := api.Put(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	_ = stream.Send(header(m))
	_ = stream.Send(&pb.PutRequest{Msg: &pb.PutRequest_Data{Data: b[:10]}})
	_, err = stream.CloseAndRecv()
	wantCode(t, "put cut short", err, codes.InvalidArgument, "ended 10 bytes into the block's 1000")

	stream, err = api.Put(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	_ = stream.Send(header(m))
	_ = stream.Send(&pb.PutRequest{Msg: &pb.PutRequest_Data{Data: b[:10]}})
	_ = stream.Send(header(m))
	_, err = stream.CloseAndRecv()
	wantCode(t, "put with a second header", err, codes.InvalidArgument, "a second batch header")

	if ex, _ := n.Exists([]index.Key{m.Key}); ex[0] {
		t.Fatal("a block cut short was stored")
	}
	// The refused block's reservation was given back: the whole block
	// goes in now.
	stream, err = api.Put(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	_ = stream.Send(header(m))
	_ = stream.Send(&pb.PutRequest{Msg: &pb.PutRequest_Data{Data: b}})
	resp, err := stream.CloseAndRecv()
	if err != nil || resp.Results[0].Code != 0 {
		t.Fatalf("whole put: %v, %v", resp, err)
	}
}

// A block its tenant's quota refuses is ResourceExhausted, as a full
// tier is: the client can free its own blocks or wait.
func TestQuotaRefusalIsResourceExhausted(t *testing.T) {
	err := fmt.Errorf("put: %w", &tiers.QuotaError{Tenant: 7, Kind: index.TierDRAM, Size: 2 << 20, Quota: 1 << 20})
	if got := server.Code(err); got != codes.ResourceExhausted {
		t.Errorf("Code(%v) = %v, want ResourceExhausted", err, got)
	}
}
