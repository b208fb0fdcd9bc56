package s3direct_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvstrata/kvstrata/api/client"
	"github.com/kvstrata/kvstrata/api/client/s3direct"
	"github.com/kvstrata/kvstrata/api/nodetest"
	"github.com/kvstrata/kvstrata/api/server"
	pb "github.com/kvstrata/kvstrata/api/v1"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/tiers"
	"github.com/kvstrata/kvstrata/tiers/s3"
	"github.com/kvstrata/kvstrata/tiers/s3/s3test"
)

const blockSize = 64 << 10

// cache is a node whose bottom tier is an object store, a client of it and
// a context of n blocks stored through it.
type cache struct {
	srv    *s3test.Server
	node   *nodetest.Node
	bottom *s3.Tier
	client *client.Client
	keys   []index.Key
	blocks [][]byte
}

func newCache(t *testing.T, n int) *cache {
	t.Helper()
	srv := s3test.Start(t)
	cfg := srv.Config("direct")
	cfg.FlushInterval = time.Hour // uploads happen when the test flushes
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	bottom, err := s3.Open(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	nd := nodetest.Start(t, nodetest.Options{Inline: true, DRAMBytes: 4 << 20, SSDBytes: 4 << 20,
		Below: []tiers.LevelConfig{{Kind: index.TierS3, Tier: bottom, Shared: true}}})
	c, err := client.Dial(context.Background(), nd.Addr, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	ns := index.Namespace{Model: "test", BlockTokens: 16}
	ids := make([]uint32, n*16)
	for i := range ids {
		ids[i] = uint32(i)
	}
	hashes := ns.Hashes(ids)
	rng := rand.New(rand.NewPCG(1, 2))
	blocks := make([][]byte, n)
	keys := make([]index.Key, n)
	for i := range blocks {
		blocks[i] = make([]byte, blockSize)
		for j := range blocks[i] {
			blocks[i][j] = byte(rng.Uint32())
		}
		keys[i] = index.Key{NS: ns.ID(), Hash: hashes[i]}
	}
	if err := c.Put(context.Background(), client.Chain(ns.ID(), hashes, blocks)); err != nil {
		t.Fatal(err)
	}
	return &cache{srv: srv, node: nd, bottom: bottom, client: c, keys: keys, blocks: blocks}
}

// toStore moves blocks down to the object store and waits for the upload.
func (c *cache) toStore(t *testing.T, idx ...int) {
	t.Helper()
	h := c.node.Hierarchy()
	for _, i := range idx {
		for _, kind := range []index.TierKind{index.TierDRAM, index.TierSSD} {
			if err := h.Demote(kind, c.keys[i]); err != nil && !errors.Is(err, tiers.ErrNotFound) {
				t.Fatalf("demote block %d from %v: %v", i, kind, err)
			}
		}
	}
	if err := c.bottom.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func (c *cache) reader(t *testing.T, store *minio.Client) *s3direct.Reader {
	t.Helper()
	r, err := s3direct.New(c.client, store, s3direct.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// restore reads every key with r into buffers of its own and returns them
// with the results' tiers.
func (c *cache) restore(t *testing.T, r *s3direct.Reader, opts client.GetOptions) (got [][]byte, from []string) {
	t.Helper()
	err := r.Get(context.Background(), c.keys, opts, func(i int, res client.Result) error {
		if i != len(got) {
			t.Fatalf("block %d handed over after %d blocks", i, len(got))
		}
		if !res.Found {
			got, from = append(got, nil), append(from, "")
			return nil
		}
		got, from = append(got, bytes.Clone(res.Data)), append(from, res.Tier)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return got, from
}

func all(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}

func TestAContextInTheStoreIsReadFromTheStoreDirectly(t *testing.T) {
	c := newCache(t, 40)
	c.toStore(t, all(40)...)
	r := c.reader(t, c.srv.Client())
	got, from := c.restore(t, r, client.GetOptions{})
	for i := range c.blocks {
		if !bytes.Equal(got[i], c.blocks[i]) || from[i] != "s3" {
			t.Fatalf("block %d: from %q, intact %v", i, from[i], bytes.Equal(got[i], c.blocks[i]))
		}
	}
	if n := r.Counts(); n.Direct != 40 || n.Node != 0 || n.Fallbacks != 0 {
		t.Fatalf("counts %+v, want all 40 blocks direct", n)
	}
}

func TestBlocksInFasterTiersComeFromTheNode(t *testing.T) {
	c := newCache(t, 12)
	c.toStore(t, 0, 1, 2, 3, 8, 9) // 4–7 and 10–11 stay in DRAM or SSD
	r := c.reader(t, c.srv.Client())
	buf := make([]byte, len(c.keys)*blockSize) // one engine buffer, a block per page
	got, from := c.restore(t, r, client.GetOptions{Buffer: func(i, size int) []byte { return buf[i*blockSize : i*blockSize+size] }})
	for i := range c.blocks {
		want := "s3"
		if (i >= 4 && i < 8) || i >= 10 {
			want = "not s3"
		}
		if !bytes.Equal(got[i], c.blocks[i]) || (want == "s3") != (from[i] == "s3") {
			t.Fatalf("block %d: from %q, want %s; intact %v", i, from[i], want, bytes.Equal(got[i], c.blocks[i]))
		}
	}
	if !bytes.Equal(buf[5*blockSize:6*blockSize], c.blocks[5]) || !bytes.Equal(buf[9*blockSize:10*blockSize], c.blocks[9]) {
		t.Fatal("blocks did not land in the caller's buffer")
	}
	if n := r.Counts(); n.Direct != 6 || n.Node != 6 {
		t.Fatalf("counts %+v, want 6 direct and 6 through the node", n)
	}
}

func TestACorruptObjectIsNeverReturned(t *testing.T) {
	c := newCache(t, 6)
	c.toStore(t, all(6)...)
	ps, err := c.client.LocateObjects(context.Background(), c.keys[3:4])
	if err != nil || ps[0].Object == "" {
		t.Fatalf("locate block 3: %+v %v", ps, err)
	}
	// Flip one byte of block 3 where the store keeps it.
	store := c.srv.Client()
	ctx := context.Background()
	obj, err := store.GetObject(ctx, ps[0].Bucket, ps[0].Object, minio.GetObjectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	data, err := io.ReadAll(obj)
	if err != nil {
		t.Fatal(err)
	}
	data[ps[0].Offset+100] ^= 0xff
	if _, err := store.PutObject(ctx, ps[0].Bucket, ps[0].Object, bytes.NewReader(data), int64(len(data)), minio.PutObjectOptions{}); err != nil {
		t.Fatal(err)
	}

	r := c.reader(t, store)
	got, _ := c.restore(t, r, client.GetOptions{})
	for i := range c.blocks {
		if got[i] != nil && !bytes.Equal(got[i], c.blocks[i]) {
			t.Fatalf("block %d returned with wrong bytes", i)
		}
	}
	if got[3] != nil {
		t.Fatal("the corrupt block was returned; want a miss (the node checks it too)")
	}
	if n := r.Counts(); n.Fallbacks == 0 {
		t.Fatalf("counts %+v: the corrupt read should have fallen back to the node", n)
	}
}

func TestWithoutAccessToTheStoreEverythingComesThroughTheNode(t *testing.T) {
	c := newCache(t, 8)
	c.toStore(t, all(8)...)
	denied, err := minio.New(c.srv.Endpoint(), &minio.Options{
		Creds: credentials.NewStaticV4(c.srv.AccessKey(), "not-the-secret", ""), Region: s3test.Region})
	if err != nil {
		t.Fatal(err)
	}
	r := c.reader(t, denied)
	got, _ := c.restore(t, r, client.GetOptions{})
	for i := range c.blocks {
		if !bytes.Equal(got[i], c.blocks[i]) {
			t.Fatalf("block %d not restored through the node", i)
		}
	}
	if n := r.Counts(); n.Direct != 0 || n.Node != 8 || n.Fallbacks == 0 {
		t.Fatalf("counts %+v, want every block through the node after failed store reads", n)
	}
}

func TestStopAtMissStopsAtTheFirstBlockHeldNowhere(t *testing.T) {
	c := newCache(t, 10)
	c.toStore(t, all(10)...)
	if err := c.node.Hierarchy().Delete(c.keys[6]); err != nil {
		t.Fatal(err)
	}
	if err := c.bottom.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	r := c.reader(t, c.srv.Client())
	var found []int
	var missed []int
	err := r.Get(context.Background(), c.keys, client.GetOptions{StopAtMiss: true}, func(i int, res client.Result) error {
		if res.Found {
			found = append(found, i)
		} else {
			missed = append(missed, i)
		}
		return nil
	})
	if err != nil || len(found) != 6 || len(missed) != 1 || missed[0] != 6 {
		t.Fatalf("found %v, missed %v, err %v; want blocks 0–5 then a miss at 6", found, missed, err)
	}
}

func TestAnErrorFromTheCallbackEndsTheGet(t *testing.T) {
	c := newCache(t, 30)
	c.toStore(t, all(30)...)
	r := c.reader(t, c.srv.Client())
	stop := errors.New("enough")
	calls := 0
	err := r.Get(context.Background(), c.keys, client.GetOptions{}, func(i int, res client.Result) error {
		calls++
		if i == 2 {
			return stop
		}
		return nil
	})
	if !errors.Is(err, stop) || calls != 3 {
		t.Fatalf("Get after the callback failed at block 2: %v after %d calls", err, calls)
	}
}

func TestNewWantsBothClients(t *testing.T) {
	if _, err := s3direct.New(nil, nil, s3direct.Config{}); err == nil {
		t.Fatal("New without clients succeeded")
	}
}

func TestOneReaderServesConcurrentGets(t *testing.T) {
	c := newCache(t, 24)
	c.toStore(t, all(24)...)
	r := c.reader(t, c.srv.Client())
	errs := make(chan error, 4)
	for range 4 {
		go func() {
			errs <- r.Get(context.Background(), c.keys, client.GetOptions{}, func(i int, res client.Result) error {
				if !res.Found || !bytes.Equal(res.Data, c.blocks[i]) {
					return fmt.Errorf("block %d: found %v, intact %v", i, res.Found, bytes.Equal(res.Data, c.blocks[i]))
				}
				return nil
			})
		}()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if n := r.Counts(); n.Direct != 4*24 {
		t.Fatalf("counts %+v, want %d direct", n, 4*24)
	}
}

// oldNode is a node from before LocateObjects.
type oldNode struct{ pb.CacheServer }

func (oldNode) LocateObjects(context.Context, *pb.LocateObjectsRequest) (*pb.LocateObjectsResponse, error) {
	return nil, status.Error(codes.Unimplemented, "unknown method LocateObjects")
}

func TestANodeThatCannotLocateServesEverything(t *testing.T) {
	c := newCache(t, 6)
	c.toStore(t, all(6)...)
	g := grpc.NewServer()
	pb.RegisterCacheServer(g, oldNode{server.Register(grpc.NewServer(), c.node.Node, server.Options{})})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go g.Serve(lis)
	t.Cleanup(g.Stop)
	old, err := client.Dial(context.Background(), lis.Addr().String(), client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { old.Close() })
	r, err := s3direct.New(old, c.srv.Client(), s3direct.Config{})
	if err != nil {
		t.Fatal(err)
	}
	got, _ := c.restore(t, r, client.GetOptions{})
	for i := range c.blocks {
		if !bytes.Equal(got[i], c.blocks[i]) {
			t.Fatalf("block %d not restored through a node without LocateObjects", i)
		}
	}
	if n := r.Counts(); n.Direct != 0 {
		t.Fatalf("counts %+v: nothing can be read directly without LocateObjects", n)
	}
}

func TestConfigDefaultsAndValidate(t *testing.T) {
	var c s3direct.Config
	c.EnsureDefaults()
	if err := c.Validate(); err != nil || c.Concurrency != s3direct.DefaultConcurrency || c.MaxRange != s3direct.DefaultMaxRange {
		t.Fatalf("defaults %+v: %v", c, err)
	}
	bad := s3direct.Config{Concurrency: -1, MaxRange: -5}
	bad.EnsureDefaults()
	err := bad.Validate()
	if !errors.Is(err, s3direct.ErrInvalidConfig) || !strings.Contains(err.Error(), "Concurrency is -1") || !strings.Contains(err.Error(), "MaxRange is -5") {
		t.Fatalf("Validate of %+v: %v", bad, err)
	}
}
