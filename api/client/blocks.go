package client

import (
	"context"
	"errors"
	"fmt"
	"io"

	"google.golang.org/grpc/codes"

	pb "github.com/kvstrata/kvstrata/api/v1"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/internal/units"
	"github.com/kvstrata/kvstrata/transfer"
)

// Block is one block to store.
type Block struct {
	Key       index.Key
	Parent    index.Hash // the previous block of its chain, if HasParent
	HasParent bool
	Data      []byte
}

// Chain makes the blocks of one chain: hashes[i] names data[i], and each
// block's parent is the one before it.
func Chain(ns index.NamespaceID, hashes []index.Hash, data [][]byte) []Block {
	out := make([]Block, len(hashes))
	for i, h := range hashes {
		out[i] = Block{Key: index.Key{NS: ns, Hash: h}, Data: data[i]}
		if i > 0 {
			out[i].Parent, out[i].HasParent = hashes[i-1], true
		}
	}
	return out
}

// Result is one fetched block.
type Result struct {
	Found     bool
	Data      []byte
	Sum       uint64 // xxhash64 of Data, checked on arrival
	Parent    index.Hash
	HasParent bool
	// Device is set for a block delivered into GPU memory
	// (GetOptions.Device): its bytes are there, and Data is nil.
	Device bool
	Tier   string // the tier that served it, when the node says (gRPC)
	// Err is set, with Found false, for a block the node holds but could
	// not read now: it is in a tier out of reach (an object store that is
	// down). It matches ErrUnavailable; try again later. A block the node
	// does not hold has Found false and no Err.
	Err error
	// Node is the node that served it, for a ClusterClient's gets (AnyNode: the
	// shared object store, through the seed).
	Node index.NodeID
}

// Put stores blocks, in batches the node accepts. A block that failed alone
// is reported in a *BatchError (the others are stored); a batch refused as a
// whole fails the call.
func (c *Client) Put(ctx context.Context, blocks []Block) error {
	headers := make([]index.Header, len(blocks))
	for i, b := range blocks {
		if len(b.Data) > int(c.info.MaxBlockSize) {
			return &Error{Op: "put", Code: codes.InvalidArgument, Msg: fmt.Sprintf("block %d is %s, over the node's %s limit",
				i, units.FormatBytes(int64(len(b.Data))), units.FormatBytes(int64(c.info.MaxBlockSize)))}
		}
		headers[i] = index.Header{Key: b.Key, Meta: index.Meta{Parent: b.Parent, HasParent: b.HasParent,
			Size: uint32(len(b.Data))}, Sum: index.Checksum(b.Data)}
	}
	errs := make([]error, len(blocks))
	failed := false
	for _, r := range c.putBatches(blocks) {
		batch := make([]transfer.Block, 0, r[1]-r[0])
		for i := r[0]; i < r[1]; i++ {
			batch = append(batch, transfer.Block{Header: headers[i], Data: blocks[i].Data})
		}
		var berrs []error
		err := c.call(ctx, "put", func(ctx context.Context) (err error) {
			if c.data != nil {
				return c.data.with(ctx, func(conn transfer.Conn) (err error) {
					berrs, err = conn.Put(ctx, batch)
					return err
				})
			}
			berrs, err = c.putGRPC(ctx, batch)
			return err
		})
		if err != nil {
			return err
		}
		for j, e := range berrs {
			if e != nil {
				errs[r[0]+j], failed = wrap("put", e), true
			}
		}
	}
	if failed {
		return &BatchError{Errs: errs}
	}
	return nil
}

// putBatches splits blocks into runs within the node's batch limits.
func (c *Client) putBatches(blocks []Block) [][2]int {
	var out [][2]int
	from, bytes := 0, int64(0)
	for i, b := range blocks {
		n := int64(len(b.Data))
		if i > from && (i-from >= int(c.info.MaxBatchBlocks) || bytes+n > int64(c.info.MaxBatchBytes)) {
			out = append(out, [2]int{from, i})
			from, bytes = i, 0
		}
		bytes += n
	}
	if from < len(blocks) {
		out = append(out, [2]int{from, len(blocks)})
	}
	return out
}

// grpcChunk is the most bytes a Put data message carries.
const grpcChunk = 1 << 20

func (c *Client) putGRPC(ctx context.Context, blocks []transfer.Block) ([]error, error) {
	stream, err := c.api.Put(ctx)
	if err != nil {
		return nil, err
	}
	hdr := &pb.PutHeader{Blocks: make([]*pb.BlockMeta, len(blocks))}
	for i, b := range blocks {
		hdr.Blocks[i] = pb.FromHeader(b.Header)
	}
	if err := stream.Send(&pb.PutRequest{Msg: &pb.PutRequest_Header{Header: hdr}}); err != nil {
		return nil, closeErr(stream.CloseAndRecv())
	}
	for _, b := range blocks {
		for d := b.Data; len(d) > 0; d = d[min(len(d), grpcChunk):] {
			if err := stream.Send(&pb.PutRequest{Msg: &pb.PutRequest_Data{Data: d[:min(len(d), grpcChunk)]}}); err != nil {
				return nil, closeErr(stream.CloseAndRecv())
			}
		}
	}
	resp, err := stream.CloseAndRecv()
	if err != nil {
		return nil, err
	}
	if len(resp.Results) != len(blocks) {
		return nil, fmt.Errorf("node answered %d results for %d blocks", len(resp.Results), len(blocks))
	}
	errs := make([]error, len(blocks))
	for i, r := range resp.Results {
		if codes.Code(r.Code) != codes.OK {
			errs[i] = &Error{Op: "put", Code: codes.Code(r.Code), Msg: r.Message}
		}
	}
	return errs, nil
}

// closeErr returns the status a failed stream ended with (Send only says
// io.EOF).
func closeErr(_ *pb.PutResponse, err error) error {
	if err == nil {
		return errors.New("put stream ended early")
	}
	return err
}

// Get fetches keys; Result.Found is false for the ones the node lacks, and
// for the ones it holds but cannot read now, which have Result.Err set.
func (c *Client) Get(ctx context.Context, keys []index.Key) ([]Result, error) {
	out := make([]Result, len(keys))
	err := c.GetFunc(ctx, keys, GetOptions{}, func(i int, r Result) error {
		out[i] = r
		return nil
	})
	return out, err
}

// GetOptions tune GetFunc.
type GetOptions struct {
	// StopAtMiss stops after the first missing block: a prefix fetch.
	StopAtMiss bool
	// Buffer, if set, says where block i of size bytes goes — an engine's
	// pinned host memory, or one buffer reused for every block — and the
	// Result's Data is that memory: the bytes are read from the socket
	// straight into it. It must return a slice of at least size bytes.
	// Unset, each block gets a buffer of its own.
	Buffer func(i, size int) []byte
	// Device, if set, may put block i in GPU memory the caller owns:
	// returning ok, the block's bytes go to dst (see DeviceDest and
	// api/client/devmem, which makes them) and its Result has Device set
	// and no Data. Over UCX built with CUDA they are received straight into
	// device memory; otherwise through a pinned bounce buffer and a copy to
	// the device, which the Result's arrival waits for.
	Device func(i, size int) (dst DeviceDest, ok bool)
}

// DeviceDest is where GetOptions.Device puts a block in GPU memory.
type DeviceDest = transfer.DeviceTarget

// GetFunc fetches keys and calls fn for each block in order as it arrives,
// so that the first blocks of a long context can be used while the rest is
// on the way. An error from fn ends the call with that error.
func (c *Client) GetFunc(ctx context.Context, keys []index.Key, opts GetOptions, fn func(i int, r Result) error) error {
	stopAtMiss := opts.StopAtMiss
	buffer := opts.Buffer
	if buffer == nil {
		buffer = func(_, size int) []byte { return make([]byte, size) }
	}
	for _, r := range chunks(len(keys), int(c.info.MaxBatchBlocks)) {
		stopped := false
		done := 0       // blocks of this batch already passed to fn: a retry resumes after them
		var fnErr error // fn's own error, returned as it is
		err := c.call(ctx, "get", func(ctx context.Context) error {
			base := r[0] + done
			emit := func(i int, res Result) error {
				if stopped {
					return nil
				}
				if !res.Found && stopAtMiss {
					stopped = true
				}
				if fnErr = fn(base+i, res); fnErr == nil {
					done++
				}
				return fnErr
			}
			if c.data != nil {
				return c.data.with(ctx, func(conn transfer.Conn) error {
					rcv := &receiver{emit: emit, buffer: func(i, size int) []byte { return buffer(base+i, size)[:size] }}
					if opts.Device != nil {
						rcv.device = func(i, size int) (DeviceDest, bool) { return opts.Device(base+i, size) }
					}
					if err := conn.Get(ctx, keys[base:r[1]], rcv); err != nil {
						return err
					}
					return rcv.err
				})
			}
			if opts.Device != nil { // over gRPC: into host memory, then to the device
				emit = deviceEmit(emit, func(i, size int) (DeviceDest, bool) { return opts.Device(base+i, size) })
			}
			return c.getGRPC(ctx, keys[base:r[1]], stopAtMiss, func(i, size int) []byte { return buffer(base+i, size)[:0] }, emit)
		})
		if fnErr != nil {
			return fnErr
		}
		if err != nil || stopped {
			return err
		}
	}
	return nil
}

// receiver adapts a data-plane Get to GetFunc's callback. Blocks arrive in
// order, so the buffer of the block being received is all it keeps.
type receiver struct {
	emit   func(int, Result) error
	buffer func(i, size int) []byte
	device func(i, size int) (DeviceDest, bool) // nil: every block into host memory
	buf    []byte
	onDev  bool // the block being received goes to device memory
	err    error
}

var _ transfer.DeviceReceiver = (*receiver)(nil)

func (r *receiver) Buffer(i int, h index.Header) []byte {
	r.buf = r.buffer(i, int(h.Size))
	return r.buf
}

func (r *receiver) DeviceBuffer(i int, h index.Header) (transfer.DeviceTarget, bool) {
	if r.device == nil {
		return transfer.DeviceTarget{}, false
	}
	t, ok := r.device(i, int(h.Size))
	r.onDev = ok
	return t, ok
}

func (r *receiver) Done(i int, h index.Header, err error) {
	if r.err != nil {
		return
	}
	switch {
	case err == nil && r.onDev:
		r.err = r.emit(i, Result{Found: true, Device: true, Sum: h.Sum, Parent: h.Parent, HasParent: h.HasParent})
	case err == nil:
		r.err = r.emit(i, Result{Found: true, Data: r.buf, Sum: h.Sum, Parent: h.Parent, HasParent: h.HasParent})
	case errors.Is(err, transfer.ErrNotFound):
		r.err = r.emit(i, Result{})
	case errors.Is(err, transfer.ErrUnavailable):
		r.err = r.emit(i, Result{Err: &Error{Op: "get", Code: codes.Unavailable, Msg: err.Error()}})
	default:
		r.err = wrap("get", err)
	}
	r.buf, r.onDev = nil, false
}

// deviceEmit wraps emit for a Get over gRPC, which receives into host
// memory: a found block that device wants in GPU memory is copied there
// first.
func deviceEmit(emit func(int, Result) error, device func(i, size int) (DeviceDest, bool)) func(int, Result) error {
	return func(i int, res Result) error {
		if !res.Found {
			return emit(i, res)
		}
		t, ok := device(i, len(res.Data))
		if !ok {
			return emit(i, res)
		}
		if err := t.Unstage(res.Data); err != nil {
			return fmt.Errorf("get: copying block %d to the device: %w", i, err)
		}
		res.Data, res.Device = nil, true
		return emit(i, res)
	}
}

func (c *Client) getGRPC(ctx context.Context, keys []index.Key, stopAtMiss bool, buffer func(i, size int) []byte, emit func(int, Result) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.api.Get(ctx, &pb.GetRequest{Keys: pb.FromKeys(keys), StopAtMiss: stopAtMiss})
	if err != nil {
		return err
	}
	var cur Result
	idx, want := -1, 0
	for {
		msg, err := stream.Recv()
		if err == io.EOF {
			if idx >= 0 && len(cur.Data) < want {
				return fmt.Errorf("block %d ended after %d of %d bytes", idx, len(cur.Data), want)
			}
			return nil
		}
		if err != nil {
			return err
		}
		if int(msg.Index) != idx { // the first message of the next block
			if idx >= 0 && len(cur.Data) < want {
				return fmt.Errorf("block %d ended after %d of %d bytes", idx, len(cur.Data), want)
			}
			idx = int(msg.Index)
			if idx >= len(keys) {
				return fmt.Errorf("node sent block %d of a %d-block request", idx, len(keys))
			}
			cur, want = Result{}, 0
			if !msg.Found {
				if code := codes.Code(msg.Code); code != codes.OK {
					cur = Result{Tier: msg.Tier, Err: &Error{Op: "get", Code: code, Msg: msg.Message}}
				}
				if err := emit(idx, cur); err != nil {
					return err
				}
				continue
			}
			h := pb.ToHeader(msg.GetMeta())
			want = int(h.Size)
			cur = Result{Found: true, Data: buffer(idx, want), Sum: h.Sum, Parent: h.Parent, HasParent: h.HasParent, Tier: msg.Tier}
		}
		cur.Data = append(cur.Data, msg.Data...)
		if len(cur.Data) > want {
			return fmt.Errorf("block %d sent %d bytes, more than its %d", idx, len(cur.Data), want)
		}
		if len(cur.Data) == want && cur.Found {
			if index.Checksum(cur.Data) != cur.Sum {
				return &Error{Op: "get", Code: codes.DataLoss, Msg: fmt.Sprintf("block %d failed its checksum", idx)}
			}
			if err := emit(idx, cur); err != nil {
				return err
			}
			cur.Found = false // emitted; further data is an error
		}
	}
}
