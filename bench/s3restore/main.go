// Command s3restore measures how fast a long context comes back from the
// object store through a kvstrata node, side by side with plain minio-go on
// the same store in the same run. bench/s3-restore.sh starts the store and
// the node and runs it; see there.
//
// It stores a context of --tokens tokens (KV of --kv-per-token bytes a
// token, in blocks of --block-tokens) through the node, moves every block
// down to the object store (kvctl evict --demote, tier by tier), and times:
//
//	(a) kvstrata: one Get of the whole chain over the data plane, the node
//	    reading segment ranges in parallel and streaming blocks in order
//	    straight into the destination buffer;
//	(d) kvstrata direct: api/client/s3direct — the node says which segment
//	    ranges hold the chain, the client reads them from the store itself
//	    (with the same credentials as the baselines) into the buffer;
//	(b) the limit: the same bytes as ONE object, one plain GetObject;
//	(c) the naive layout: one object per block, fetched one after another.
//
// For each it reports the time to restore everything, the throughput and
// the time to the first block (when an engine could start using it).
package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/kvstrata/kvstrata/api/client"
	"github.com/kvstrata/kvstrata/api/client/s3direct"
	pb "github.com/kvstrata/kvstrata/api/v1"
	"github.com/kvstrata/kvstrata/index"
)

// mark says on stderr which method is timed now, with --marks.
var mark = func(run int, what string) {}

type result struct {
	Name       string  `json:"name"`
	Bytes      int64   `json:"bytes"`
	Seconds    float64 `json:"seconds"`
	MBps       float64 `json:"mb_per_s"`
	FirstBlock float64 `json:"first_block_ms"`
}

func main() {
	addr := flag.String("addr", "127.0.0.1:7070", "gRPC address of the kvstrata node")
	endpoint := flag.String("s3-endpoint", "", "object store host:port (the node's); credentials from AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")
	bucket := flag.String("bucket", "kvstrata-restore-baseline", "bucket for the plain minio-go baselines")
	region := flag.String("region", "us-east-1", "region")
	tokens := flag.Int("tokens", 100_000, "context length in tokens")
	blockTokens := flag.Int("block-tokens", 256, "tokens per block")
	runs := flag.Int("runs", 3, "runs of each method; the median is reported")
	warmups := flag.Int("warmups", 1, "untimed runs of each method first: the first restore of a process pays for memory it touches for the first time (the node's read buffers, the client's destination), which later ones reuse")
	only := flag.Bool("only-kvstrata", false, "time only the kvstrata restore (for profiling the node)")
	marks := flag.Bool("marks", false, "print `run N: start X` and `run N: end X` on stderr around each timed method X (a, b, c, d), for a CPU count of each alone")
	flag.Parse()
	if *marks {
		mark = func(run int, what string) { fmt.Fprintf(os.Stderr, "run %d: %s\n", run, what) }
	}
	if err := run(*addr, *endpoint, *bucket, *region, *tokens, *blockTokens, *warmups, *runs, *only); err != nil {
		fmt.Fprintln(os.Stderr, "s3restore:", err)
		os.Exit(1)
	}
}

func run(addr, endpoint, bucket, region string, tokens, blockTokens, warmups, runs int, only bool) error {
	ctx := context.Background()
	// Qwen2.5-0.5B: 24 layers × 2 KV heads × 64 dims × 2 (K and V) × 2 bytes = 12 KiB a token.
	ns := index.Namespace{Model: "Qwen/Qwen2.5-0.5B-Instruct", BlockTokens: blockTokens,
		Layout: index.KVLayout{Layers: 24, KVHeads: 2, HeadDim: 64, DType: "bf16"}}
	blockSize := ns.BlockBytes()
	ids := make([]uint32, tokens)
	for i := range ids {
		ids[i] = uint32(i*7919) % 151643
	}
	hashes := ns.Hashes(ids)
	total := len(hashes) * blockSize
	fmt.Fprintf(os.Stderr, "context: %d tokens, %d blocks of %d tokens (%.1f MiB each), %.2f GB\n",
		tokens, len(hashes), blockTokens, float64(blockSize)/(1<<20), float64(total)/1e9)
	src := make([]byte, total)
	if _, err := rand.Read(src); err != nil {
		return err
	}
	blocks := make([][]byte, len(hashes))
	keys := make([]index.Key, len(hashes))
	for i := range hashes {
		blocks[i] = src[i*blockSize : (i+1)*blockSize]
		keys[i] = index.Key{NS: ns.ID(), Hash: hashes[i]}
	}

	c, err := client.Dial(ctx, addr, client.Options{Timeout: 10 * time.Minute})
	if err != nil {
		return err
	}
	defer c.Close()
	if err := c.Put(ctx, client.Chain(ns.ID(), hashes, blocks)); err != nil {
		return fmt.Errorf("put the context: %w", err)
	}
	st, err := c.Stats(ctx)
	if err != nil {
		return err
	}
	mc, err := minio.New(endpoint, &minio.Options{
		Creds:  credentials.NewStaticV4(os.Getenv("AWS_ACCESS_KEY_ID"), os.Getenv("AWS_SECRET_ACCESS_KEY"), ""),
		Region: region,
	})
	if err != nil {
		return err
	}
	if err := mc.MakeBucket(ctx, bucket, minio.MakeBucketOptions{Region: region}); err != nil {
		if exists, _ := mc.BucketExists(ctx, bucket); !exists {
			return fmt.Errorf("make bucket %s: %w", bucket, err)
		}
	}
	// The baselines' objects: the whole context as one, and one per block.
	if _, err := mc.PutObject(ctx, bucket, "context", bytesReader(src), int64(total),
		minio.PutObjectOptions{PartSize: 64 << 20}); err != nil {
		return fmt.Errorf("put the one-object baseline: %w", err)
	}
	for i, b := range blocks {
		if _, err := mc.PutObject(ctx, bucket, fmt.Sprintf("block/%05d", i), bytesReader(b), int64(len(b)), minio.PutObjectOptions{}); err != nil {
			return fmt.Errorf("put block object %d: %w", i, err)
		}
	}

	direct, err := s3direct.New(c, mc, s3direct.Config{})
	if err != nil {
		return err
	}
	dst := make([]byte, total)
	var results []result
	for r := range warmups + runs {
		r -= warmups // runs are numbered from 1, warm-ups from 0 down
		if err := demoteToS3(ctx, c, ns.ID(), st.Node.Tiers); err != nil {
			return err
		}
		var d result
		clear(dst)
		if !only { // a direct restore does not promote: the blocks stay in the store for (a)
			mark(r+1, "start d")
			if d, err = timeRestore(ctx, "kvstrata direct from the store (d)", direct.Get, keys, dst, blockSize); err != nil {
				return err
			}
			mark(r+1, "end d")
			if err := check(dst, blocks, blockSize); err != nil {
				return fmt.Errorf("direct: %w", err)
			}
			if n := direct.Counts(); n.Node != 0 {
				return fmt.Errorf("direct: %d blocks came through the node, not from the store", n.Node)
			}
		}
		clear(dst)
		if only { // a mark for a profiler or a CPU count of the restore alone
			fmt.Fprintf(os.Stderr, "run %d: restoring\n", r+1)
		}
		mark(r+1, "start a")
		a, err := timeRestore(ctx, "kvstrata segmented restore (a)", c.GetFunc, keys, dst, blockSize)
		if err != nil {
			return err
		}
		mark(r+1, "end a")
		if err := check(dst, blocks, blockSize); err != nil { // the restore must be right, not just fast
			return err
		}
		if only {
			fmt.Fprintf(os.Stderr, "run %d: kvstrata %.0f MB/s, first block %.1f ms\n", r+1, a.MBps, a.FirstBlock)
			continue
		}
		mark(r+1, "start b")
		b, err := timeOneObject(ctx, mc, bucket, dst, blockSize)
		if err != nil {
			return err
		}
		mark(r+1, "end b")
		mark(r+1, "start c")
		cc, err := timePerBlock(ctx, mc, bucket, len(blocks), dst, blockSize)
		if err != nil {
			return err
		}
		mark(r+1, "end c")
		fmt.Fprintf(os.Stderr, "run %d: kvstrata %.0f MB/s, direct %.0f MB/s, one object %.0f MB/s, object per block %.0f MB/s\n",
			r+1, a.MBps, d.MBps, b.MBps, cc.MBps)
		if r >= 0 { // a warm-up's figures are printed, not counted
			results = append(results, a, b, cc, d)
		}
	}
	if only {
		return nil
	}
	return report(results, runs)
}

// demoteToS3 moves the namespace's blocks out of every tier above the
// object store, so that a restore reads them all from it, and waits until
// the store holds them.
func demoteToS3(ctx context.Context, c *client.Client, ns index.NamespaceID, tiers []string) error {
	for _, tier := range tiers[:len(tiers)-1] {
		if _, err := c.Evict(ctx, &pb.EvictRequest{HasNamespace: true, Namespace: uint64(ns), Tier: tier, Demote: true, MaxListed: 1}); err != nil {
			return fmt.Errorf("demote from %s: %w", tier, err)
		}
	}
	for deadline := time.Now().Add(5 * time.Minute); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		st, err := c.Stats(ctx)
		if err != nil {
			return err
		}
		s3 := st.Tiers[len(st.Tiers)-1]
		if s3.Tier != "s3" {
			return fmt.Errorf("the node's last tier is %s, not s3: start it with --s3-endpoint", s3.Tier)
		}
		if s3.Detail["pending_bytes"] == 0 {
			return nil
		}
	}
	return fmt.Errorf("the object store's uploads did not finish")
}

// getFunc is client.Client.GetFunc or s3direct.Reader.Get.
type getFunc func(context.Context, []index.Key, client.GetOptions, func(int, client.Result) error) error

// timeRestore times one restore of keys into dst with get.
func timeRestore(ctx context.Context, name string, get getFunc, keys []index.Key, dst []byte, blockSize int) (result, error) {
	start := time.Now()
	var first time.Duration
	n := 0
	err := get(ctx, keys, client.GetOptions{StopAtMiss: true, Buffer: func(i, size int) []byte {
		return dst[i*blockSize : i*blockSize+size]
	}}, func(i int, r client.Result) error {
		if !r.Found {
			return fmt.Errorf("block %d missing", i)
		}
		if i == 0 {
			first = time.Since(start)
		}
		n += len(r.Data)
		return nil
	})
	return finish(name, n, start, first), err
}

// check says whether dst holds blocks.
func check(dst []byte, blocks [][]byte, blockSize int) error {
	for i := range blocks {
		if !bytes.Equal(dst[i*blockSize:(i+1)*blockSize], blocks[i]) {
			return fmt.Errorf("block %d restored wrong", i)
		}
	}
	return nil
}

func timeOneObject(ctx context.Context, mc *minio.Client, bucket string, dst []byte, blockSize int) (result, error) {
	start := time.Now()
	obj, err := mc.GetObject(ctx, bucket, "context", minio.GetObjectOptions{})
	if err != nil {
		return result{}, err
	}
	defer obj.Close()
	if _, err := io.ReadFull(obj, dst[:blockSize]); err != nil {
		return result{}, err
	}
	first := time.Since(start)
	if _, err := io.ReadFull(obj, dst[blockSize:]); err != nil {
		return result{}, err
	}
	return finish("one object, one GET (b, the limit)", len(dst), start, first), nil
}

func timePerBlock(ctx context.Context, mc *minio.Client, bucket string, n int, dst []byte, blockSize int) (result, error) {
	start := time.Now()
	var first time.Duration
	for i := range n {
		obj, err := mc.GetObject(ctx, bucket, fmt.Sprintf("block/%05d", i), minio.GetObjectOptions{})
		if err != nil {
			return result{}, err
		}
		_, err = io.ReadFull(obj, dst[i*blockSize:(i+1)*blockSize])
		obj.Close()
		if err != nil {
			return result{}, err
		}
		if i == 0 {
			first = time.Since(start)
		}
	}
	return finish("one object per block, in turn (c)", n*blockSize, start, first), nil
}

func finish(name string, n int, start time.Time, first time.Duration) result {
	s := time.Since(start).Seconds()
	return result{Name: name, Bytes: int64(n), Seconds: s, MBps: float64(n) / s / 1e6, FirstBlock: float64(first.Microseconds()) / 1000}
}

// report prints the median of each method and the ratios, as a table and
// as JSON on stdout.
func report(rs []result, runs int) error {
	by := map[string][]result{}
	var order []string
	for _, r := range rs {
		if _, ok := by[r.Name]; !ok {
			order = append(order, r.Name)
		}
		by[r.Name] = append(by[r.Name], r)
	}
	var med []result
	for _, name := range order {
		xs := by[name]
		sort.Slice(xs, func(i, j int) bool { return xs[i].Seconds < xs[j].Seconds })
		med = append(med, xs[len(xs)/2])
	}
	limit := 0.0
	for _, r := range med {
		if strings.Contains(r.Name, "(b") {
			limit = r.MBps
		}
	}
	fmt.Printf("%-36s %9s %9s %10s %16s\n", "METHOD", "SECONDS", "MB/S", "x_LIMIT", "FIRST_BLOCK_MS")
	for _, r := range med {
		fmt.Printf("%-36s %9.2f %9.0f %9.2fx %16.1f\n", r.Name, r.Seconds, r.MBps, r.MBps/limit, r.FirstBlock)
	}
	fmt.Printf("(median of %d runs; MB = 10^6 bytes)\n", runs)
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(med)
}

// bytesReader is a reader over b that minio-go can seek.
func bytesReader(b []byte) io.Reader { return bytes.NewReader(b) }
