package kvevents

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/engine/pool"
	"github.com/kvstrata/kvstrata/index"
)

// sinkSubScript subscribes to a worker's publisher through libzmq, waits
// for one message, asks the replay socket for everything from 0, and
// prints each event of batches 0 to n-1, decoded with plain msgpack
// (tagged arrays or "type" maps, integer or 8-byte hashes), as one line of
// JSON with sorted keys.
const sinkSubScript = `
import json, sys, msgpack, zmq
pub, replay, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
FIELDS = {"BlockStored": ["block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium"],
          "BlockRemoved": ["block_hashes", "medium"], "AllBlocksCleared": []}
def h(v):
    if isinstance(v, bytes):
        assert len(v) == 8, v
        return int.from_bytes(v, "big")
    assert v is None or isinstance(v, int), v
    return v
def event(ev):
    if isinstance(ev, dict): t, f = ev["type"], ev
    else: t, f = ev[0], dict(zip(FIELDS[ev[0]], ev[1:]))
    out = {"type": t}
    for k in FIELDS[t]:
        v = f[k]
        if k == "block_hashes": v = [h(x) for x in v]
        if k == "parent_block_hash": v = h(v)
        out[k] = v
    return out
ctx = zmq.Context()
sub = ctx.socket(zmq.SUB); sub.connect(pub); sub.setsockopt(zmq.SUBSCRIBE, b""); sub.RCVTIMEO = 30000
sub.recv_multipart()
dealer = ctx.socket(zmq.DEALER); dealer.connect(replay); dealer.RCVTIMEO = 30000
dealer.send_multipart([b"", (0).to_bytes(8, "big")])
want = 0
while want < n:
    empty, seq, payload = dealer.recv_multipart()
    seq = int.from_bytes(seq, "big", signed=True)
    assert seq == want, "replayed seq %d, want %d" % (seq, want)
    ts, events, rank = msgpack.unpackb(payload, raw=False)  # three elements, as Dynamo reads them
    assert isinstance(ts, float) and rank == 0, (ts, rank)
    for ev in events:
        print(json.dumps(event(ev), sort_keys=True, separators=(",", ":")))
    want += 1
`

// poolJSON is a pool event as sinkSubScript prints it.
func poolJSON(t *testing.T, e pool.Event) string {
	t.Helper()
	hashes := func(hs []index.Hash) []uint64 {
		out := []uint64{}
		for _, h := range hs {
			out = append(out, uint64(h))
		}
		return out
	}
	m := map[string]any{"type": e.Kind.String()}
	switch e.Kind {
	case pool.BlockStored:
		var parent any
		if e.HasParent {
			parent = uint64(e.Parent)
		}
		m["block_hashes"], m["parent_block_hash"], m["token_ids"] = hashes(e.Hashes), parent, e.Tokens
		m["block_size"], m["lora_id"], m["medium"] = e.BlockTokens, nil, MediumGPU
	case pool.BlockRemoved:
		m["block_hashes"], m["medium"] = hashes(e.Hashes), MediumGPU
	}
	j, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return string(j)
}

// TestPythonSubscribesToPoolSink: a libzmq subscriber (pyzmq) of a
// PoolSink-fed publisher replays the worker's batches and decodes every
// event with plain msgpack into exactly what the pool said, in order.
func TestPythonSubscribesToPoolSink(t *testing.T) {
	py := needPythonZMQ(t)
	for _, c := range []struct {
		enc  Encoding
		form HashForm
	}{{TaggedArrays, HashInts}, {Maps, HashInts}, {Maps, HashBytes}} {
		t.Run(fmt.Sprintf("%v/hashes=%d", c.enc, c.form), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			w := newWorker(t, PublisherConfig{Encoding: c.enc}, SinkConfig{Hashes: c.form})
			w.workload()
			w.mu.Lock()
			var want []string
			for _, e := range w.said {
				want = append(want, poolJSON(t, e))
			}
			w.mu.Unlock()
			covers(t, w.expected())
			n := w.sink.Stats().Batches

			var out, errOut bytes.Buffer
			cmd := exec.CommandContext(ctx, py, "-c", sinkSubScript, "tcp://"+w.pub.Addr(), "tcp://"+w.pub.ReplayAddr(), fmt.Sprint(n))
			cmd.Stdout, cmd.Stderr = &out, &errOut
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			exited := make(chan error, 1)
			go func() { exited <- cmd.Wait() }()
			var werr error
			w.heartbeat(ctx, func() bool {
				select {
				case werr = <-exited:
					return true
				default:
					return false
				}
			})
			if werr != nil {
				t.Fatalf("python3: %v\n%s%s", werr, out.String(), errOut.String())
			}
			got := strings.Split(strings.TrimSpace(out.String()), "\n")
			if !slices.Equal(got, want) {
				t.Fatalf("python3 decoded:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
			t.Logf("python3 decoded %d events of %d batches", len(got), n)
		})
	}
}

// pyPubScript is a worker that is not Go: an XPUB (a PUB that hears
// subscriptions) and a replay ROUTER through libzmq. Once a subscriber
// joins, it sends a message that is no event batch, then batches 0 to 4
// — built from the expected JSON in the named encoding, packed with
// msgpack — all but batch 2, which only its replay socket answers with.
// It prints its ports, and exits when its stdin closes.
const pyPubScript = `
import json, sys, msgpack, zmq
enc, expected = sys.argv[1], json.load(open(sys.argv[2]))
FIELDS = {"BlockStored": ["block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium"],
          "BlockRemoved": ["block_hashes", "medium"], "AllBlocksCleared": []}
def h(v):
    if isinstance(v, dict): return bytes.fromhex(v["hex"])
    return v
def value(ev, f):
    v = ev[f]
    if f == "block_hashes": return [h(x) for x in v]
    return h(v) if f == "parent_block_hash" else v
def event(ev):
    t = ev["type"]
    if enc == "arrays": return [t] + [value(ev, f) for f in FIELDS[t]]
    return dict([("type", t)] + [(f, value(ev, f)) for f in FIELDS[t]])
def batch(e):
    b = [float(e["ts"]), [event(ev) for ev in e["events"] or []]]
    b.append(e["data_parallel_rank"])  # vLLM writes its None default too
    return msgpack.packb(b)
payloads = [batch(expected[i % len(expected)]) for i in range(5)]
ctx = zmq.Context()
pub = ctx.socket(zmq.XPUB); port = pub.bind_to_random_port("tcp://127.0.0.1")
rep = ctx.socket(zmq.ROUTER); rport = rep.bind_to_random_port("tcp://127.0.0.1")
print(port, rport, flush=True)
pub.RCVTIMEO = rep.RCVTIMEO = 30000
sub = pub.recv()
assert sub[:1] == b"\x01", sub
pub.send_multipart([b"kv", b"no sequence number"])
for seq, p in enumerate(payloads):
    if seq != 2:
        pub.send_multipart([b"kv", seq.to_bytes(8, "big"), p])
ident, empty, start = rep.recv_multipart()
for seq in range(int.from_bytes(start, "big", signed=True), len(payloads)):
    rep.send_multipart([ident, b"", seq.to_bytes(8, "big"), payloads[seq]])
rep.send_multipart([ident, b"", (-1).to_bytes(8, "big", signed=True), b""])
sys.stdin.read()
`

// TestSubscriberHearsPython: a Subscriber of a libzmq publisher that is
// not Go gets its batches, in both encodings, in order, with the one it
// missed replayed by that publisher's ROUTER socket, and skips the
// message that is no batch.
func TestSubscriberHearsPython(t *testing.T) {
	py := needPythonZMQ(t)
	expected := writeExpected(t, t.TempDir(), sampleBatches())
	for _, enc := range []Encoding{TaggedArrays, Maps} {
		t.Run(enc.String(), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, py, "-c", pyPubScript, enc.String(), expected)
			stdin, err := cmd.StdinPipe()
			if err != nil {
				t.Fatal(err)
			}
			stdout, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			var errOut bytes.Buffer
			cmd.Stderr = &errOut
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer func() {
				stdin.Close()
				if err := cmd.Wait(); err != nil {
					t.Errorf("python3: %v\n%s", err, errOut.String())
				}
			}()
			var port, rport int
			if _, err := fmt.Fscan(bufio.NewReader(stdout), &port, &rport); err != nil {
				t.Fatalf("python3's ports: %v\n%s", err, errOut.String())
			}

			c, s := subscribe(t, nil, SubscriberConfig{
				Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", port), ReplayEndpoint: fmt.Sprintf("tcp://127.0.0.1:%d", rport),
				Topic: "kv",
			})
			waitUntil(t, ctx, "the subscriber hears batch 4", func() bool { return c.upTo(4) })
			c.mu.Lock()
			defer c.mu.Unlock()
			if !slices.Equal(c.seqs, []int64{0, 1, 2, 3, 4}) {
				t.Fatalf("delivered %v, want 0 to 4", c.seqs)
			}
			for i, got := range c.descs {
				if want := describe(sampleBatches()[i%3]); got != want {
					t.Errorf("batch %d:\n got %s\nwant %s", i, got, want)
				}
			}
			if st := s.Stats(); st.Replayed != 1 || st.Malformed != 1 || st.Lost != 0 {
				t.Fatalf("stats %+v: want batch 2 replayed, one message skipped, none lost", st)
			}
		})
	}
}
