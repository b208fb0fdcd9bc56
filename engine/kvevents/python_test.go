package kvevents

import (
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// Wire compatibility with a peer that is not Go: Python's msgpack (Debian's
// python3-msgpack), the library family vLLM's subscribers decode with.
// vLLM itself encodes with msgspec, which writes integers, floats, strings,
// bytes, arrays and maps in the same forms, so byte equality with what
// Python packs from the same values is what vLLM's own output would give.

// needPython returns a Python interpreter that has the msgpack module:
// the first python3 on PATH, or Debian's (which python3-msgpack installs
// into) when that one lacks it. It skips the test when neither has it.
func needPython(t *testing.T) string {
	t.Helper()
	for _, py := range []string{"python3", "/usr/bin/python3"} {
		if exec.Command(py, "-c", "import msgpack").Run() == nil {
			return py
		}
	}
	t.Skip("python3-msgpack is not installed (apt-get install -y python3-msgpack): skipping the Python interop test")
	return ""
}

func runPython(t *testing.T, py, script string, args ...string) {
	t.Helper()
	out, err := exec.Command(py, append([]string{"-c", script}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("python3: %v\n%s", err, out)
	}
	t.Logf("python3: %s", out)
}

// writeExpected writes batches as plain JSON (jsonBatch) to dir, for a
// Python peer to compare with what it decodes, and returns the file's path.
func writeExpected(t *testing.T, dir string, batches []*Batch) string {
	t.Helper()
	var want []any
	for _, b := range batches {
		want = append(want, jsonBatch(b))
	}
	j, err := json.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	expected := filepath.Join(dir, "expected.json")
	if err := os.WriteFile(expected, j, 0o644); err != nil {
		t.Fatal(err)
	}
	return expected
}

// jsonBatch is a batch as plain JSON, independent of either msgpack
// encoding: hashes are numbers, or {"hex": ...} for byte strings.
func jsonBatch(b *Batch) map[string]any {
	hash := func(h Hash) any {
		if h.IsBytes() {
			return map[string]string{"hex": hex.EncodeToString(h.Bytes())}
		}
		if v, ok := h.Uint64(); ok {
			return v
		}
		v, _ := h.Int64()
		return v
	}
	hashes := func(hs []Hash) []any {
		out := []any{}
		for _, h := range hs {
			out = append(out, hash(h))
		}
		return out
	}
	var evs []any
	for _, ev := range b.Events {
		switch ev := ev.(type) {
		case *BlockStored:
			var parent any
			if ev.ParentBlockHash != nil {
				parent = hash(*ev.ParentBlockHash)
			}
			evs = append(evs, map[string]any{"type": TagBlockStored, "block_hashes": hashes(ev.BlockHashes),
				"parent_block_hash": parent, "token_ids": ev.TokenIDs, "block_size": ev.BlockSize,
				"lora_id": ev.LoraID, "medium": ev.Medium})
		case *BlockRemoved:
			evs = append(evs, map[string]any{"type": TagBlockRemoved, "block_hashes": hashes(ev.BlockHashes), "medium": ev.Medium})
		case *AllBlocksCleared:
			evs = append(evs, map[string]any{"type": TagAllBlocksCleared})
		}
	}
	return map[string]any{"ts": b.TS, "events": evs, "data_parallel_rank": b.DataParallelRank}
}

// checkScript builds, from the JSON description, the structure vLLM's
// msgspec classes produce in the named encoding, and checks that each
// payload unpacks to it and that packing it gives the payload's bytes.
const checkScript = `
import json, sys, msgpack
enc, payloads, expected = sys.argv[1], sys.argv[2], json.load(open(sys.argv[3]))
FIELDS = {"BlockStored": ["block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium"],
          "BlockRemoved": ["block_hashes", "medium"], "AllBlocksCleared": []}
def h(v):
    if v is None: return None
    if isinstance(v, dict): return bytes.fromhex(v["hex"])
    return v
def value(ev, f):
    v = ev[f]
    if f == "block_hashes": return [h(x) for x in v]
    if f == "parent_block_hash": return h(v)
    return v
def event(ev):
    t = ev["type"]
    if enc == "arrays": return [t] + [value(ev, f) for f in FIELDS[t]]
    return dict([("type", t)] + [(f, value(ev, f)) for f in FIELDS[t]])
raw = open(payloads, "rb").read()
n = 0
while raw:
    size = int.from_bytes(raw[:4], "big"); p, raw = raw[4:4+size], raw[4+size:]
    e = expected[n]
    want = [float(e["ts"]), [event(ev) for ev in e["events"] or []]]
    want.append(e["data_parallel_rank"])  # vLLM writes its None default too
    got = msgpack.unpackb(p, raw=False, strict_map_key=False)
    assert got == want, "batch %d: got %r, want %r" % (n, got, want)
    assert msgpack.packb(want) == p, "batch %d: bytes differ from Python's packing: %s vs %s" % (n, msgpack.packb(want).hex(), p.hex())
    n += 1
assert n == len(expected), "%d payloads for %d batches" % (n, len(expected))
print(enc, "ok:", n, "batches")
`

func TestPythonDecodesOurBatches(t *testing.T) {
	py := needPython(t)
	dir := t.TempDir()
	batches := sampleBatches()
	expected := writeExpected(t, dir, batches)
	for _, enc := range []Encoding{TaggedArrays, Maps} {
		var stream []byte
		for _, b := range batches {
			p, err := Encode(b, enc)
			if err != nil {
				t.Fatal(err)
			}
			stream = binary.BigEndian.AppendUint32(stream, uint32(len(p)))
			stream = append(stream, p...)
		}
		payloads := filepath.Join(dir, enc.String()+".bin")
		if err := os.WriteFile(payloads, stream, 0o644); err != nil {
			t.Fatal(err)
		}
		runPython(t, py, checkScript, enc.String(), payloads, expected)
	}
}

// vllmScript packs batches in every shape vLLM has published, each
// payload length-prefixed, into the file it is given.
const vllmScript = `
import hashlib, sys, msgpack
sha = lambda s: hashlib.sha256(s).digest()
batches = [
    # Tagged arrays, as vLLM with array_like=True: int hashes, medium, rank.
    [1764621000.5, [["BlockStored", [-7, 2**64 - 1, 3], None, list(range(12)), 4, None, "GPU"],
                    ["BlockRemoved", [3], "GPU"], ["AllBlocksCleared"]], 0],
    # Older vLLM: no medium, no rank.
    [12.0, [["BlockStored", [11], 10, [5, 6], 2, 3], ["BlockRemoved", [11]]]],
    # Newer vLLM with fields this package does not know (lora_name, extra_keys, group_idx).
    [13.25, [["BlockStored", [sha(b"a")], sha(b"p"), [1], 1, None, "CPU", "adapter", [["mm", 1]], 0]], 1],
    # Maps with a "type" key, in a batch array.
    [14.0, [{"type": "BlockStored", "block_hashes": [sha(b"x"), sha(b"y")], "parent_block_hash": None,
             "token_ids": [7, 8, 9, 10], "block_size": 2, "lora_id": 4, "medium": "GPU", "lora_name": None},
            {"type": "BlockRemoved", "block_hashes": [sha(b"x")], "medium": None, "group_idx": 2},
            {"type": "AllBlocksCleared"}], 5],
    # The batch itself a map, as the newest vLLM writes it.
    {"ts": 15.5, "events": [{"type": "BlockRemoved", "block_hashes": [1, 2], "medium": "GPU"}], "data_parallel_rank": 2},
    # The newest vLLM's every field: extra_keys (tuples, None), KV cache
    # groups and their spec, lora_name.
    {"ts": 16.0, "events": [
        {"type": "BlockStored", "block_hashes": [sha(b"n1"), sha(b"n2")], "parent_block_hash": sha(b"n0"),
         "token_ids": [1, 2, 3, 4], "block_size": 2, "lora_id": None, "medium": "GPU", "lora_name": None,
         "extra_keys": [[["mm-hash", 0], "salt"], None], "group_idx": 1, "kv_cache_spec_kind": "sliding_window",
         "kv_cache_spec_sliding_window": 4096},
        {"type": "BlockRemoved", "block_hashes": [sha(b"n1")], "medium": "GPU", "group_idx": 1},
        {"type": "AllBlocksCleared"}], "data_parallel_rank": 0},
]
with open(sys.argv[1], "wb") as f:
    for b in batches:
        p = msgpack.packb(b)
        f.write(len(p).to_bytes(4, "big") + p)
print(len(batches), "batches")
`

func TestGoDecodesPythonBatches(t *testing.T) {
	py := needPython(t)
	path := filepath.Join(t.TempDir(), "vllm.bin")
	runPython(t, py, vllmScript, path)
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	sh := func(s string) string { return sha(s).String() }
	want := []string{
		`ts=1.7646210005e+09 rank=0 Stored{[-7 18446744073709551615 3] parent=nil tokens=[0 1 2 3 4 5 6 7 8 9 10 11] size=4 lora=nil medium="GPU"} Removed{[3] medium="GPU"} Cleared{}`,
		`ts=12 rank=nil Stored{[11] parent=10 tokens=[5 6] size=2 lora=3 medium=nil} Removed{[11] medium=nil}`,
		`ts=13.25 rank=1 Stored{[` + sh("a") + `] parent=` + sh("p") + ` tokens=[1] size=1 lora=nil medium="CPU"}`,
		`ts=14 rank=5 Stored{[` + sh("x") + ` ` + sh("y") + `] parent=nil tokens=[7 8 9 10] size=2 lora=4 medium="GPU"} Removed{[` + sh("x") + `] medium=nil} Cleared{}`,
		`ts=15.5 rank=2 Removed{[1 2] medium="GPU"}`,
		`ts=16 rank=0 Stored{[` + sh("n1") + ` ` + sh("n2") + `] parent=` + sh("n0") + ` tokens=[1 2 3 4] size=2 lora=nil medium="GPU"} Removed{[` + sh("n1") + `] medium="GPU"} Cleared{}`,
	}
	for i := 0; len(raw) > 0; i++ {
		n := int(binary.BigEndian.Uint32(raw))
		p := raw[4 : 4+n]
		raw = raw[4+n:]
		if i >= len(want) {
			t.Fatalf("more than %d batches", len(want))
		}
		b, err := Decode(p)
		if err != nil {
			t.Errorf("batch %d: %v", i, err)
			continue
		}
		if got := describe(b); got != want[i] {
			t.Errorf("batch %d:\n got %s\nwant %s", i, got, want[i])
		}
	}
}
