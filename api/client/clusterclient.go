package client

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc/codes"

	pb "github.com/kvstrata/kvstrata/api/v1"
	"github.com/kvstrata/kvstrata/index"
)

// The calls of the kvstrata.v1.Cluster service, on the node the client
// dialled.

// Members lists the cluster's members as the node's replica knows them.
func (c *Client) Members(ctx context.Context) (*pb.MembersResponse, error) {
	var resp *pb.MembersResponse
	err := c.call(ctx, "members", func(ctx context.Context) (err error) {
		resp, err = c.cluster.Members(ctx, &pb.MembersRequest{})
		return err
	})
	return resp, err
}

// Join asks the cluster to add a node (the node usually joins itself).
func (c *Client) Join(ctx context.Context, m *pb.Member) error {
	return c.call(ctx, "join", func(ctx context.Context) error {
		_, err := c.cluster.Join(ctx, &pb.JoinRequest{Member: m})
		return err
	})
}

// Remove takes a node out of the cluster and its blocks out of the
// directory.
func (c *Client) Remove(ctx context.Context, id index.NodeID) error {
	return c.call(ctx, "remove", func(ctx context.Context) error {
		_, err := c.cluster.Remove(ctx, &pb.RemoveRequest{Id: uint32(id)})
		return err
	})
}

// Sync returns once every directory change the node made before the call
// is committed in the cluster.
func (c *Client) Sync(ctx context.Context) error {
	return c.call(ctx, "sync", func(ctx context.Context) error {
		_, err := c.cluster.Sync(ctx, &pb.SyncRequest{})
		return err
	})
}

// Locate returns, for each key, every location of it the directory lists.
func (c *Client) Locate(ctx context.Context, keys []index.Key) ([]*pb.KeyLocations, error) {
	out, _, err := c.LocateFresh(ctx, keys)
	return out, err
}

// LocateFresh is Locate, and also says how current the node's directory
// was (see pb.Freshness): the least current of the answers when the keys
// took several requests. A node that is not current (no leader, out of
// touch with it, or catching up after a restart) may list blocks that are
// gone and miss blocks stored since; Lookup's answer carries the same.
func (c *Client) LocateFresh(ctx context.Context, keys []index.Key) ([]*pb.KeyLocations, *pb.Freshness, error) {
	out := make([]*pb.KeyLocations, 0, len(keys))
	var fresh *pb.Freshness
	for _, r := range chunks(len(keys), 1<<16) {
		var resp *pb.LocateResponse
		err := c.call(ctx, "locate", func(ctx context.Context) (err error) {
			resp, err = c.cluster.Locate(ctx, &pb.LocateRequest{Keys: pb.FromKeys(keys[r[0]:r[1]])})
			return err
		})
		if err != nil {
			return nil, nil, err
		}
		out = append(out, resp.Keys...)
		if f := resp.Freshness; fresh == nil || f != nil && fresh.Current && !f.Current {
			fresh = f
		}
	}
	return out, fresh, nil
}

// ClusterClient reads blocks wherever in a cluster they are: it asks the node it
// dialled (the seed) where each block is, fetches runs of blocks from the
// node that holds them in its fastest tier, and when a node turns out not to
// have a block after all (the directory lagged an eviction) tries the next
// location, then reports a miss. Blocks in the shared object store are read
// through the seed. A ClusterClient is safe for concurrent use.
type ClusterClient struct {
	seed     *Client
	ownsSeed bool // DialClusterClient's: Close closes it
	opts     Options

	mu      sync.Mutex
	nodes   map[index.NodeID]*Client
	members map[index.NodeID]*pb.Member
}

// DialClusterClient dials the node at addr as the cluster's seed.
func DialClusterClient(ctx context.Context, addr string, opts Options) (*ClusterClient, error) {
	seed, err := Dial(ctx, addr, opts)
	if err != nil {
		return nil, err
	}
	cl := NewClusterClient(seed, opts)
	cl.ownsSeed = true
	return cl, nil
}

// NewClusterClient makes a cluster client around a client of one of its nodes
// (which stays the caller's to close); other nodes are dialled with opts
// when a block is on them. A block has other places to come from (the next
// location, or a miss the engine recomputes), so where opts leave
// RetryBudget unset those nodes are retried for FallbackRetryBudget only.
func NewClusterClient(seed *Client, opts Options) *ClusterClient {
	if opts.Token == "" && opts.TokenFile == "" { // the other nodes know the seed's caller
		opts.Token = seed.opts.Token
	}
	if opts.RetryBudget == 0 {
		opts.RetryBudget = FallbackRetryBudget
	}
	return &ClusterClient{seed: seed, opts: opts, nodes: map[index.NodeID]*Client{}}
}

// FallbackRetryBudget is how long a ClusterClient retries a node other than its
// seed before it tries a block's next location, unless Options say.
const FallbackRetryBudget = 500 * time.Millisecond

// Seed is the client of the node DialClusterClient dialled.
func (cl *ClusterClient) Seed() *Client { return cl.seed }

// Close closes every connection.
func (cl *ClusterClient) Close() error {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	var errs []error
	for _, c := range cl.nodes {
		errs = append(errs, c.Close())
	}
	if cl.ownsSeed {
		errs = append(errs, cl.seed.Close())
	}
	return errors.Join(errs...)
}

// node returns a client of member id, dialling it on first use.
func (cl *ClusterClient) node(ctx context.Context, id index.NodeID) (*Client, error) {
	if id == index.AnyNode || id == index.NodeID(cl.seed.Info().NodeId) {
		return cl.seed, nil
	}
	cl.mu.Lock()
	c := cl.nodes[id]
	m := cl.members[id]
	cl.mu.Unlock()
	if c != nil {
		return c, nil
	}
	if m == nil { // a node the last listing did not know: list again
		resp, err := cl.seed.Members(ctx)
		if err != nil {
			return nil, err
		}
		cl.mu.Lock()
		cl.members = map[index.NodeID]*pb.Member{}
		for _, m := range resp.Members {
			cl.members[index.NodeID(m.Id)] = m
		}
		m = cl.members[id]
		cl.mu.Unlock()
		if m == nil {
			return nil, fmt.Errorf("kvstrata: node %d is not a member", id)
		}
	}
	c, err := Dial(ctx, m.GrpcAddr, cl.opts)
	if err != nil {
		return nil, err
	}
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if old := cl.nodes[id]; old != nil {
		c.Close()
		return old, nil
	}
	cl.nodes[id] = c
	return c, nil
}

// Get fetches keys from wherever they are; Result.Found is false for the
// ones no node has, and for the ones only held out of reach (Result.Err
// set, as Client.Get).
func (cl *ClusterClient) Get(ctx context.Context, keys []index.Key) ([]Result, error) {
	out := make([]Result, len(keys))
	err := cl.GetFunc(ctx, keys, GetOptions{}, func(i int, r Result) error {
		out[i] = r
		return nil
	})
	return out, err
}

// tierRank orders the tiers a block is fetched from: fastest first.
var tierRank = map[string]int{"hbm": 0, "dram": 1, "ssd": 2, "s3": 3}

// GetFunc is Client.GetFunc across the cluster: fn sees the blocks in key
// order.
func (cl *ClusterClient) GetFunc(ctx context.Context, keys []index.Key, opts GetOptions, fn func(i int, r Result) error) error {
	locs, err := cl.seed.Locate(ctx, keys)
	var ce *Error
	if errors.As(err, &ce) && ce.Code == codes.Unimplemented { // a node outside any cluster
		return cl.seed.GetFunc(ctx, keys, opts, fn)
	}
	if err != nil {
		return err
	}
	// Each key's candidate nodes, best first.
	cands := make([][]index.NodeID, len(keys))
	for i, kl := range locs {
		ls := slices.Clone(kl.Locations)
		slices.SortStableFunc(ls, func(a, b *pb.TierBlocks) int { return tierRank[a.Tier] - tierRank[b.Tier] })
		for _, l := range ls {
			if id := index.NodeID(l.NodeId); !slices.Contains(cands[i], id) {
				cands[i] = append(cands[i], id)
			}
		}
	}
	stopped := false
	emit := func(i int, r Result) error {
		if !r.Found && opts.StopAtMiss {
			stopped = true
		}
		return fn(i, r)
	}
	for i := 0; i < len(keys) && !stopped; {
		if len(cands[i]) == 0 {
			if err := emit(i, Result{}); err != nil {
				return err
			}
			i++
			continue
		}
		// A run: the keys whose best node is the same.
		j := i + 1
		for j < len(keys) && len(cands[j]) > 0 && cands[j][0] == cands[i][0] {
			j++
		}
		if err := cl.fetchRun(ctx, keys, cands, i, j, opts, emit, &stopped); err != nil {
			return err
		}
		i = j
	}
	return nil
}

// fetchRun fetches keys[i:j] from their best node, falling back key by key
// to the next candidates for the ones it lacks.
func (cl *ClusterClient) fetchRun(ctx context.Context, keys []index.Key, cands [][]index.NodeID, i, j int, opts GetOptions,
	emit func(int, Result) error, stopped *bool) error {
	got := make([]bool, j-i)
	missed := make([]Result, j-i) // the best node's answer for the keys it did not return
	var fnErr error
	if c, err := cl.node(ctx, cands[i][0]); err == nil {
		sub := GetOptions{Buffer: shift(opts.Buffer, i)}
		err = c.GetFunc(ctx, keys[i:j], sub, func(k int, r Result) error {
			if !r.Found && r.Err != nil {
				r.Node = cands[i][0]
				missed[k] = r
			}
			if !r.Found || *stopped {
				return nil
			}
			// Emit what came in order, the keys before it first (those the
			// node lacked are fetched elsewhere at once).
			for back := 0; back < k; back++ {
				if !got[back] {
					if fnErr = cl.fallback(ctx, keys, cands, i+back, 1, missed[back], emit); fnErr != nil {
						return fnErr
					}
					got[back] = true
				}
			}
			got[k] = true
			r.Node = cands[i][0]
			fnErr = emit(i+k, r)
			return fnErr
		})
		if fnErr != nil {
			return fnErr
		}
	}
	for k := range got {
		if !got[k] && !*stopped {
			if err := cl.fallback(ctx, keys, cands, i+k, 1, missed[k], emit); err != nil {
				return err
			}
		}
	}
	return nil
}

// fallback fetches keys[i] from its candidates after the first, then
// reports it not found: as miss says (the first candidate's answer), or as
// out of reach if a candidate held it but could not read it (Result.Err).
func (cl *ClusterClient) fallback(ctx context.Context, keys []index.Key, cands [][]index.NodeID, i, from int, miss Result,
	emit func(int, Result) error) error {
	for _, id := range cands[i][min(from, len(cands[i])):] {
		c, err := cl.node(ctx, id)
		if err != nil {
			continue
		}
		res, err := c.Get(ctx, keys[i:i+1])
		if err == nil && res[0].Found {
			res[0].Node = id
			return emit(i, res[0])
		}
		if err == nil && res[0].Err != nil && miss.Err == nil {
			miss, miss.Node = res[0], id
		}
	}
	return emit(i, miss)
}

// shift offsets the block positions a Buffer function sees.
func shift(buffer func(i, size int) []byte, by int) func(i, size int) []byte {
	if buffer == nil {
		return nil
	}
	return func(i, size int) []byte { return buffer(by+i, size) }
}
