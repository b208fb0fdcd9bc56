package main

import (
	"context"
	"errors"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/api/client"
	"github.com/kvstrata/kvstrata/api/node"
	"github.com/kvstrata/kvstrata/api/resp"
	"github.com/kvstrata/kvstrata/api/resp/respnode"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/loadgen"
	"github.com/kvstrata/kvstrata/transfer"
	"github.com/kvstrata/kvstrata/transfer/tcp"
)

// BenchmarkLoadgenGet runs kvctl bench's engine in-process against an
// in-process node, as kvctl bench --op get --size 1MiB does: 8 workers, one
// 1 MiB block a request, every block compared with its value. Client and
// node share the process, so a CPU profile shows both sides:
//
//	go test -run '^$' -bench LoadgenGet/path=tcp -benchtime 3000x -cpuprofile cpu.out ./cmd/kvctl
//	go tool pprof -top cpu.out
//
// The paths: tcp and grpc are api/client over the data plane and over
// gRPC, what kvctl bench measures; resp is loadgen's RESP2 client against
// the node's Redis-protocol server; raw is the data plane's transfer.Conn
// with one buffer per worker reused for every block: the same wire and
// checks as tcp, without api/client's fresh buffer per block.
func BenchmarkLoadgenGet(b *testing.B) {
	for _, path := range []string{"tcp", "grpc", "resp", "raw"} {
		b.Run("path="+path, func(b *testing.B) {
			addr, n := serveNode(b, 256<<20, node.Config{}, false)
			var dial loadgen.Dialer
			switch path {
			case "tcp", "grpc":
				c, err := client.Dial(context.Background(), addr, client.Options{PoolSize: 8, NoDataPlane: path == "grpc"})
				if err != nil {
					b.Fatal(err)
				}
				defer c.Close()
				dial = loadgen.Kvstrata(c, benchNamespace)
			case "resp":
				dial = loadgen.Redis(serveRESP(b, n), benchNamespace, 0)
			case "raw":
				c, err := client.Dial(context.Background(), addr, client.Options{NoDataPlane: true})
				if err != nil {
					b.Fatal(err)
				}
				dataAddr := c.Info().GetDataAddr()
				c.Close()
				dial = func(ctx context.Context) (loadgen.Target, error) {
					conn, err := tcp.New(tcp.Options{}).Dial(ctx, dataAddr)
					return &rawTarget{conn: conn}, err
				}
			}
			b.SetBytes(1 << 20)
			b.ResetTimer()
			var rep *loadgen.Report
			cpu := cpuTime(func() {
				var err error
				rep, err = loadgen.Run(context.Background(), dial,
					loadgen.Config{Op: loadgen.OpGet, ValueSize: 1 << 20, Keys: 16, Concurrency: 8, Requests: int64(b.N)})
				if err != nil || rep.Run.Errors > 0 {
					b.Fatalf("%v; %d errors, first %v", err, rep.Run.Errors, rep.Run.FirstError)
				}
			})
			b.ReportMetric(float64(rep.Run.Latency.Quantile(0.5).Microseconds()), "p50-µs")
			// CPU time (user and system, client and node) per MiB moved:
			// unlike MB/s, it hardly depends on what else the machine runs.
			b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/MiB")
		})
	}
}

// cpuTime returns the CPU time, user and system, the process spent in fn.
func cpuTime(fn func()) time.Duration {
	var before, after syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &before)
	fn()
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &after)
	tv := func(t syscall.Timeval) time.Duration { return time.Duration(t.Nano()) }
	return tv(after.Utime) - tv(before.Utime) + tv(after.Stime) - tv(before.Stime)
}

// serveRESP serves n's Redis-protocol endpoint on loopback.
func serveRESP(b *testing.B, n *node.Node) string {
	rs, err := resp.NewServer(respnode.New(n), &resp.Config{})
	if err != nil {
		b.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go rs.Serve(lis)
	b.Cleanup(func() { rs.Close() })
	return lis.Addr().String()
}

// rawTarget is a loadgen target on one data-plane connection that receives
// every block into the same buffer.
type rawTarget struct {
	conn transfer.Conn
	buf  []byte
	keys []index.Key
}

func (t *rawTarget) key(k uint64) index.Key {
	return index.Key{NS: benchNamespace, Hash: index.Hash(loadgen.KeyHash(k))}
}

func (t *rawTarget) Put(ctx context.Context, keys []uint64, values [][]byte) error {
	blocks := make([]transfer.Block, len(keys))
	for i, k := range keys {
		blocks[i] = transfer.Block{Header: index.Header{Key: t.key(k), Meta: index.Meta{Size: uint32(len(values[i]))}, Sum: index.Checksum(values[i])},
			Data: values[i]}
	}
	errs, err := t.conn.Put(ctx, blocks)
	if err != nil {
		return err
	}
	return errors.Join(errs...)
}

func (t *rawTarget) Get(ctx context.Context, keys []uint64, fn func(int, []byte, bool) error) error {
	t.keys = t.keys[:0]
	for _, k := range keys {
		t.keys = append(t.keys, t.key(k))
	}
	r := &rawReceiver{t: t, fn: fn}
	if err := t.conn.Get(ctx, t.keys, r); err != nil {
		return err
	}
	return r.err
}

func (t *rawTarget) Close() error { return t.conn.Close() }

type rawReceiver struct {
	t   *rawTarget
	fn  func(int, []byte, bool) error
	err error
}

func (r *rawReceiver) Buffer(_ int, h index.Header) []byte {
	if cap(r.t.buf) < int(h.Size) {
		r.t.buf = make([]byte, h.Size)
	}
	return r.t.buf[:h.Size]
}

func (r *rawReceiver) Done(i int, h index.Header, err error) {
	switch {
	case r.err != nil:
	case err == nil:
		r.err = r.fn(i, r.t.buf[:h.Size], true)
	case errors.Is(err, transfer.ErrNotFound):
		r.err = r.fn(i, nil, false)
	default:
		r.err = err
	}
}
