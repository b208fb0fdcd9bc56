// Package client is the Go client of a kvstrata cache node, used by engines,
// the router and kvctl. It speaks gRPC for control and, when the node offers
// one, the data plane for block bytes; it splits large requests into batches
// the node accepts, retries transient failures with backoff, honours
// context deadlines and returns errors callers can test (ErrNotFound,
// ErrInvalid, ErrFull, ErrUnavailable).
//
// A Client is safe for concurrent use.
package client

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	pb "github.com/kvstrata/kvstrata/api/v1"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/internal/tlsfiles"
	"github.com/kvstrata/kvstrata/transfer"
	"github.com/kvstrata/kvstrata/transfer/tcp"
)

// Options configure a Client; zero fields take their defaults.
type Options struct {
	// Timeout bounds each call whose ctx has no deadline. Default 30s.
	Timeout time.Duration
	// RetryBudget is how long a call that failed transiently (node
	// unreachable, restarting, at its connection limit) keeps being tried
	// again, from its first try, within ctx's deadline: long enough to
	// ride out a node's restart. Default 5s.
	RetryBudget time.Duration
	// MaxRetries caps how often such a call is tried again. Default 0: as
	// often as RetryBudget allows; negative: never.
	MaxRetries int
	// Backoff is the wait before the first retry, doubled for each next one
	// up to MaxBackoff, with jitter (each wait is between half and all of
	// it). Defaults 50ms and 1s (or Backoff, if longer).
	Backoff, MaxBackoff time.Duration
	// NoDataPlane moves block bytes over gRPC even when the node offers a
	// data plane.
	NoDataPlane bool
	// Transports are the data-plane backends the client can use; it picks
	// the one the node names. Default: tcp, with the node's limits.
	Transports []transfer.Transport
	// PoolSize is how many idle data-plane connections the client keeps.
	// Default 8.
	PoolSize int
	// DialOptions are added to the gRPC dial.
	DialOptions []grpc.DialOption
	// Token is the secret the client presents to a node that
	// authenticates its clients: as "authorization: Bearer" on every gRPC
	// call, and in the hello of every data-plane connection. Default: the
	// contents of TokenFile, else the environment's KVSTRATA_TOKEN, else
	// none.
	Token string
	// TokenFile names a file that holds the token (surrounding blank space
	// is ignored), read once by Dial.
	TokenFile string
	// TLS, when set, speaks TLS to the node, gRPC and the TCP data plane
	// alike, with this config (its ServerName, when empty, is the host
	// dialled); see TLSConfig. Default nil: plaintext.
	TLS *tls.Config
}

// TokenEnv is the environment variable a client takes its token from when
// Options name none.
const TokenEnv = "KVSTRATA_TOKEN"

// ResolveToken fills o.Token from o.TokenFile or the environment when it
// is empty, as Dial does.
func (o *Options) ResolveToken() error {
	switch {
	case o.Token != "":
	case o.TokenFile != "":
		b, err := os.ReadFile(o.TokenFile)
		if err != nil {
			return fmt.Errorf("%w: token file: %w", ErrInvalidOptions, err)
		}
		if o.Token = strings.TrimSpace(string(b)); o.Token == "" {
			return fmt.Errorf("%w: token file %s is empty", ErrInvalidOptions, o.TokenFile)
		}
	default:
		o.Token = strings.TrimSpace(os.Getenv(TokenEnv))
	}
	return nil
}

// EnsureDefaults fills o's zero fields with their defaults.
func (o *Options) EnsureDefaults() {
	if o.Timeout == 0 {
		o.Timeout = 30 * time.Second
	}
	if o.RetryBudget == 0 {
		o.RetryBudget = DefaultRetryBudget
	}
	if o.MaxRetries == 0 {
		o.MaxRetries = math.MaxInt
	}
	if o.Backoff == 0 {
		o.Backoff = 50 * time.Millisecond
	}
	if o.MaxBackoff == 0 {
		o.MaxBackoff = max(time.Second, o.Backoff)
	}
	if o.PoolSize == 0 {
		o.PoolSize = 8
	}
}

// ErrInvalidOptions marks Options that fail Validate.
var ErrInvalidOptions = errors.New("kvstrata: invalid client options")

// Validate reports every problem with o, naming the fields. Call it after
// EnsureDefaults (Dial does both).
func (o *Options) Validate() error {
	var probs []string
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"Timeout", o.Timeout}, {"RetryBudget", o.RetryBudget}, {"Backoff", o.Backoff}, {"MaxBackoff", o.MaxBackoff}} {
		if d.v <= 0 {
			probs = append(probs, fmt.Sprintf("%s is %v, must be positive", d.name, d.v))
		}
	}
	if o.MaxBackoff < o.Backoff {
		probs = append(probs, fmt.Sprintf("MaxBackoff %v is shorter than Backoff %v", o.MaxBackoff, o.Backoff))
	}
	if o.PoolSize <= 0 {
		probs = append(probs, fmt.Sprintf("PoolSize is %d, must be positive", o.PoolSize))
	}
	if len(probs) > 0 {
		return fmt.Errorf("%w: %s", ErrInvalidOptions, strings.Join(probs, "; "))
	}
	return nil
}

// DefaultRetryBudget is Options.RetryBudget's default: a node restarts in
// one to three seconds.
const DefaultRetryBudget = 5 * time.Second

// reconnect is how the gRPC channel redials a node it lost: soon, and at
// most a second apart, so that a node back from a restart is used at once
// (gRPC's own default waits up to two minutes).
var reconnect = grpc.ConnectParams{
	Backoff:           backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
	MinConnectTimeout: 5 * time.Second,
}

// extraTransports make the data-plane backends, beyond tcp, that a client
// offers by default, for the node's block-size and batch limits; files
// behind build tags (transports_ucx.go) add theirs in init.
var extraTransports []func(maxBlockSize, maxBlocks int) transfer.Transport

// Client talks to one cache node.
type Client struct {
	opts    Options
	cc      *grpc.ClientConn
	api     pb.CacheClient
	cluster pb.ClusterClient
	info    *pb.NodeInfo
	data    *pool // nil: bytes go over gRPC
}

// Dial connects to the node whose gRPC address is addr and asks it for its
// Info (data-plane address, limits).
func Dial(ctx context.Context, addr string, opts Options) (*Client, error) {
	opts.EnsureDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if err := opts.ResolveToken(); err != nil {
		return nil, err
	}
	creds := insecure.NewCredentials()
	if opts.TLS != nil {
		creds = credentials.NewTLS(opts.TLS)
	}
	dopts := []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(16 << 20)),
		grpc.WithConnectParams(reconnect),
	}
	if opts.Token != "" {
		dopts = append(dopts, grpc.WithPerRPCCredentials(bearer(opts.Token)))
	}
	dopts = append(dopts, opts.DialOptions...)
	cc, err := grpc.NewClient(addr, dopts...)
	if err != nil {
		return nil, fmt.Errorf("kvstrata: dial %s: %w", addr, err)
	}
	c := &Client{opts: opts, cc: cc, api: pb.NewCacheClient(cc), cluster: pb.NewClusterClient(cc)}
	err = c.call(ctx, "info", func(ctx context.Context) error {
		var err error
		c.info, err = c.api.Info(ctx, &pb.InfoRequest{})
		return err
	})
	if err != nil {
		cc.Close()
		return nil, err
	}
	if !opts.NoDataPlane && c.info.DataAddr != "" {
		transports := opts.Transports
		if transports == nil {
			var clientTLS func(string) *tls.Config
			if opts.TLS != nil {
				clientTLS = func(addr string) *tls.Config { return tlsfiles.ForAddr(opts.TLS, addr) }
			}
			transports = []transfer.Transport{tcp.New(tcp.Options{
				MaxBlockSize: int(c.info.MaxBlockSize), MaxBlocks: int(c.info.MaxBatchBlocks), Token: opts.Token, ClientTLS: clientTLS})}
			for _, extra := range extraTransports {
				transports = append(transports, extra(int(c.info.MaxBlockSize), int(c.info.MaxBatchBlocks)))
			}
		}
		for _, t := range transports {
			if t.Name() == c.info.Transport {
				c.data = newPool(t, c.info.DataAddr, opts.PoolSize)
			}
		}
	}
	return c, nil
}

// Info returns what the node said about itself when the client dialled.
func (c *Client) Info() *pb.NodeInfo { return c.info }

// DataPlane names the transport block bytes travel over: the data-plane
// backend's name, or "grpc".
func (c *Client) DataPlane() string {
	if c.data == nil {
		return "grpc"
	}
	return c.data.t.Name()
}

// Close closes the client's connections.
func (c *Client) Close() error {
	if c.data != nil {
		c.data.close()
	}
	return c.cc.Close()
}

// call runs fn with the client's default deadline, retrying transient
// failures with exponential backoff and jitter for up to the retry budget,
// while ctx allows.
func (c *Client) call(ctx context.Context, op string, fn func(context.Context) error) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.opts.Timeout)
		defer cancel()
	}
	deadline, _ := ctx.Deadline()
	budgetEnd := time.Now().Add(c.opts.RetryBudget)
	wait := c.opts.Backoff
	for attempt := 0; ; attempt++ {
		err := wrap(op, fn(ctx))
		if err == nil || !transient(err) || attempt >= c.opts.MaxRetries {
			return err
		}
		// The last retry comes as the budget ends; none starts at or past
		// ctx's deadline, where it could only fail.
		pause := min(wait/2+rand.N(wait/2+1), time.Until(budgetEnd))
		if pause <= 0 || !deadline.IsZero() && !time.Now().Add(pause).Before(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(pause):
		}
		// The node may be back: let the channel dial it now rather than
		// when its own backoff ends.
		c.cc.ResetConnectBackoff()
		wait = min(2*wait, c.opts.MaxBackoff)
	}
}

// Lookup returns how many leading blocks of chain the node holds, in all and
// per tier. A cluster member's answer comes from its replica of the
// directory, and its Freshness says how current that is: one that is not
// Current may be stale (see LocateFresh).
func (c *Client) Lookup(ctx context.Context, ns index.NamespaceID, chain []index.Hash) (*pb.LookupResponse, error) {
	req := &pb.LookupRequest{Namespace: uint64(ns), Hashes: make([]uint64, len(chain))}
	for i, h := range chain {
		req.Hashes[i] = uint64(h)
	}
	var resp *pb.LookupResponse
	err := c.call(ctx, "lookup", func(ctx context.Context) (err error) {
		resp, err = c.api.Lookup(ctx, req)
		return err
	})
	return resp, err
}

// Exists says for each key whether the node holds it.
func (c *Client) Exists(ctx context.Context, keys []index.Key) ([]bool, error) {
	out := make([]bool, 0, len(keys))
	for _, batch := range chunks(len(keys), int(c.info.MaxBatchBlocks)) {
		var resp *pb.ExistsResponse
		err := c.call(ctx, "exists", func(ctx context.Context) (err error) {
			resp, err = c.api.Exists(ctx, &pb.ExistsRequest{Keys: pb.FromKeys(keys[batch[0]:batch[1]])})
			return err
		})
		if err != nil {
			return nil, err
		}
		out = append(out, resp.Exists...)
	}
	return out, nil
}

// Placement is where a node holds a block (see LocateObjects).
type Placement struct {
	// Tier is the fastest tier holding the block; "" when none does.
	Tier      string
	Size      int
	Sum       uint64 // xxhash64 of the block's bytes
	Parent    index.Hash
	HasParent bool
	// Object, when set, is where the object store keeps the block: Size
	// bytes at Offset in Object of Bucket, readable with the caller's own
	// credentials.
	Bucket, Object string
	Offset         int64
}

// LocateObjects says, for each key, which of the node's tiers holds its
// fastest copy and, when that is the object store, which object range
// holds it — what s3direct needs to restore a context straight from the
// store.
func (c *Client) LocateObjects(ctx context.Context, keys []index.Key) ([]Placement, error) {
	out := make([]Placement, 0, len(keys))
	for _, batch := range chunks(len(keys), int(c.info.MaxBatchBlocks)) {
		var resp *pb.LocateObjectsResponse
		err := c.call(ctx, "locate objects", func(ctx context.Context) (err error) {
			resp, err = c.api.LocateObjects(ctx, &pb.LocateObjectsRequest{Keys: pb.FromKeys(keys[batch[0]:batch[1]])})
			return err
		})
		if err != nil {
			return nil, err
		}
		if len(resp.Blocks) != batch[1]-batch[0] {
			return nil, fmt.Errorf("client: locate objects: %d answers for %d keys", len(resp.Blocks), batch[1]-batch[0])
		}
		for _, b := range resp.Blocks {
			h := pb.ToHeader(b.GetMeta())
			out = append(out, Placement{Tier: b.Tier, Size: int(h.Size), Sum: h.Sum, Parent: h.Parent, HasParent: h.HasParent,
				Bucket: b.Bucket, Object: b.Object, Offset: int64(b.Offset)})
		}
	}
	return out, nil
}

// Evict removes the blocks req selects (see EvictRequest).
func (c *Client) Evict(ctx context.Context, req *pb.EvictRequest) (*pb.EvictResponse, error) {
	var resp *pb.EvictResponse
	err := c.call(ctx, "evict", func(ctx context.Context) (err error) {
		resp, err = c.api.Evict(ctx, req)
		return err
	})
	return resp, err
}

// Stats returns the node's tier statistics.
func (c *Client) Stats(ctx context.Context) (*pb.StatsResponse, error) {
	var resp *pb.StatsResponse
	err := c.call(ctx, "stats", func(ctx context.Context) (err error) {
		resp, err = c.api.Stats(ctx, &pb.StatsRequest{})
		return err
	})
	return resp, err
}

// Pin leases keys for ttl and returns the lease id and its expiry.
func (c *Client) Pin(ctx context.Context, keys []index.Key, ttl time.Duration) (uint64, time.Time, error) {
	var resp *pb.PinResponse
	err := c.call(ctx, "pin", func(ctx context.Context) (err error) {
		resp, err = c.api.Pin(ctx, &pb.PinRequest{Keys: pb.FromKeys(keys), TtlMs: ttl.Milliseconds()})
		return err
	})
	if err != nil {
		return 0, time.Time{}, err
	}
	return resp.LeaseId, time.UnixMilli(resp.ExpiresUnixMs), nil
}

// Release ends a lease.
func (c *Client) Release(ctx context.Context, lease uint64) error {
	return c.call(ctx, "release", func(ctx context.Context) error {
		_, err := c.api.Release(ctx, &pb.ReleaseRequest{LeaseId: lease})
		return err
	})
}

// chunks splits n items into [from, to) ranges of at most size items.
func chunks(n, size int) [][2]int {
	size = max(size, 1)
	var out [][2]int
	for from := 0; from < n; from += size {
		out = append(out, [2]int{from, min(from+size, n)})
	}
	return out
}

// Warm asks the node to copy keys up from its slower tiers (an object
// store) into tier ("" for the fastest) ahead of need, in batches the node
// accepts; progress, if set, sees the running totals.
func (c *Client) Warm(ctx context.Context, keys []index.Key, tier string, progress func(*pb.WarmProgress)) (*pb.WarmProgress, error) {
	total := &pb.WarmProgress{Total: uint32(len(keys))}
	for _, r := range chunks(len(keys), int(c.info.MaxBatchBlocks)) {
		var last *pb.WarmProgress
		err := c.call(ctx, "warm", func(ctx context.Context) error {
			stream, err := c.api.Warm(ctx, &pb.WarmRequest{Keys: pb.FromKeys(keys[r[0]:r[1]]), Tier: tier})
			if err != nil {
				return err
			}
			for {
				p, err := stream.Recv()
				if err == io.EOF {
					return nil
				}
				if err != nil {
					return err
				}
				last = p
				if progress != nil {
					progress(sumWarm(total, p))
				}
			}
		})
		if err != nil {
			return total, err
		}
		if last != nil {
			total = sumWarm(total, last)
		}
	}
	return total, nil
}

// sumWarm adds one batch's progress to the totals of the batches before it.
func sumWarm(before, p *pb.WarmProgress) *pb.WarmProgress {
	out := &pb.WarmProgress{Total: before.Total, Done: before.Done + p.Done, Warmed: before.Warmed + p.Warmed,
		Already: before.Already + p.Already, Missing: before.Missing + p.Missing, Failed: before.Failed + p.Failed,
		Bytes: before.Bytes + p.Bytes, LastError: before.LastError}
	if p.LastError != "" {
		out.LastError = p.LastError
	}
	return out
}

// bearer sends a token as "authorization: Bearer <token>" on every call.
type bearer string

func (t bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(t)}, nil
}

// RequireTransportSecurity is false: a node on loopback or a trusted
// network may authenticate without TLS.
func (bearer) RequireTransportSecurity() bool { return false }
