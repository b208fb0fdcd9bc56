package kvevents

import (
	"bytes"
	"context"
	"os/exec"
	"testing"
	"time"
)

// zmqScript subscribes to a Publisher through libzmq (Debian's
// python3-zmq), checks the first message it hears, then asks the replay
// socket for everything from sequence 0 and checks each batch against
// the expected JSON (as checkScript does), until the end marker.
const zmqScript = `
import json, sys, msgpack, zmq
enc, pub, replay, expected = sys.argv[1], sys.argv[2], sys.argv[3], json.load(open(sys.argv[4]))
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
def check(seq, payload):
    e = expected[seq % len(expected)]
    want = [float(e["ts"]), [event(ev) for ev in e["events"] or []]]
    want.append(e["data_parallel_rank"])  # vLLM writes its None default too
    got = msgpack.unpackb(payload, raw=False)
    assert got == want, "seq %d: got %r, want %r" % (seq, got, want)
ctx = zmq.Context()
sub = ctx.socket(zmq.SUB); sub.connect(pub); sub.setsockopt(zmq.SUBSCRIBE, b"kv")
sub.RCVTIMEO = 30000
topic, seq, payload = sub.recv_multipart()
assert topic == b"kv", topic
check(int.from_bytes(seq, "big"), payload)
dealer = ctx.socket(zmq.DEALER); dealer.connect(replay); dealer.RCVTIMEO = 30000
dealer.send_multipart([b"", (0).to_bytes(8, "big")])
n = 0
while True:
    empty, seq, payload = dealer.recv_multipart()
    seq = int.from_bytes(seq, "big", signed=True)
    if seq == -1:
        assert payload == b""; break
    assert seq == n, "replayed seq %d, want %d" % (seq, n)
    check(seq, payload); n += 1
assert n > 0
print(enc, "subscribed and replayed", n, "batches")
`

// needPythonZMQ returns a Python interpreter with the msgpack and zmq
// modules, or skips the test.
func needPythonZMQ(t *testing.T) string {
	t.Helper()
	py := needPython(t)
	if exec.Command(py, "-c", "import zmq").Run() != nil {
		t.Skip("python3-zmq is not installed (apt-get install -y python3-zmq): skipping the ZeroMQ interop test")
	}
	return py
}

// TestPythonZMQSubscribes: a libzmq subscriber (pyzmq) hears a Publisher
// and replays its buffer, and every batch decodes to what was published.
func TestPythonZMQSubscribes(t *testing.T) {
	py := needPythonZMQ(t)
	batches := sampleBatches()
	expected := writeExpected(t, t.TempDir(), batches)
	for _, enc := range []Encoding{TaggedArrays, Maps} {
		p, err := NewPublisher(PublisherConfig{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0", Topic: "kv", Encoding: enc})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		var out bytes.Buffer
		cmd := exec.CommandContext(ctx, py, "-c", zmqScript, enc.String(), "tcp://"+p.Addr(), "tcp://"+p.ReplayAddr(), expected)
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		// Publish until the subscriber is done: a PUB drops what it sends
		// before the subscriber joins.
		var werr error
	publishing:
		for i := 0; ; i++ {
			if _, err := p.Publish(batches[i%len(batches)]); err != nil {
				t.Fatal(err)
			}
			select {
			case werr = <-exited:
				break publishing
			case <-time.After(20 * time.Millisecond):
			}
		}
		cancel()
		p.Close()
		if werr != nil {
			t.Fatalf("%v: python3: %v\n%s", enc, werr, out.String())
		}
		t.Logf("python3: %s", out.String())
	}
}
