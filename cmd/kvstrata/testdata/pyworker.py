#!/usr/bin/env python3
"""pyworker: a small vLLM-like worker that is not kvstrata's, for interop tests.

It serves the part of vLLM's OpenAI API a router needs -- /v1/completions
(SSE streamed or not, prompts as token ids or text, return_token_ids,
stream_options.include_usage with cached_tokens), /v1/models, /health --
and publishes its block pool's KV events as vLLM's ZmqEventPublisher does:
multipart [topic, 8-byte big-endian sequence number, msgpack batch] on a
PUB socket, and a ROUTER replay socket that resends buffered batches from
a requested sequence number, then (-1, b"").

It has no model. A prompt's full blocks of --block-size tokens are hashed
as a chain with sha256 (each block's hash covers its parent's and its
tokens), like vLLM's default prefix-caching hash; the blocks a prompt does
not find in the pool are stored (BlockStored), the least recently used are
evicted past --num-blocks (BlockRemoved), and POST /admin/clear empties
the pool (AllBlocksCleared), as vLLM's reset_prefix_cache does. The
completion's tokens are made up from the prompt, deterministically. Blocks
of generated tokens are not stored (vLLM stores them too).

Encodings: --encoding arrays writes events as msgspec's array_like=True,
tag=True structs (["BlockStored", block_hashes, ...]) in an array batch
[ts, events, data_parallel_rank]; --encoding maps writes the newest
vLLM's shape, a map batch {"ts", "events", "data_parallel_rank"} of maps
with a "type" key. --hash bytes publishes the 32-byte sha256 digests (vLLM's
default); --hash int a signed 64-bit integer from them (older vLLM).

The PUB socket binds or connects as vLLM's does (--kv-events-mode auto:
bind when the endpoint has a wildcard "*" or "::", or is ipc:// or
inproc://, else connect); the replay socket always binds.

GET /admin/stats answers {"requests", "blocks", "published"}: requests
served, blocks held, and event batches published (or queued to be, as
soon as the request that made them has been answered).

Needs Python 3 with pyzmq and msgpack (Debian: python3-zmq python3-msgpack).
"""

import argparse
import collections
import hashlib
import json
import queue
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import msgpack
import zmq

END_SEQ = (-1).to_bytes(8, "big", signed=True)


class Pool:
    """A prefix-cached block pool that turns its changes into vLLM events."""

    def __init__(self, block_size, num_blocks, hash_form):
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.hash_form = hash_form
        self.blocks = collections.OrderedDict()  # digest -> None, least recently used first
        self.lock = threading.Lock()

    def engine_hash(self, digest):
        if self.hash_form == "int":
            return int.from_bytes(digest[-8:], "big", signed=True)
        return digest

    def chain(self, tokens):
        """The sha256 digests of the prompt's full blocks, each over its parent's."""
        digests, parent = [], b"pyworker"
        for i in range(len(tokens) // self.block_size):
            block = tokens[i * self.block_size:(i + 1) * self.block_size]
            parent = hashlib.sha256(parent + msgpack.packb(block)).digest()
            digests.append(parent)
        return digests

    def admit(self, tokens):
        """Finds the prompt's cached prefix and stores the rest.

        Returns the number of cached tokens and the events of the step."""
        digests = self.chain(tokens)
        events = []
        with self.lock:
            hit = 0
            while hit < len(digests) and digests[hit] in self.blocks:
                hit += 1
            for d in digests[:hit]:
                self.blocks.move_to_end(d)
            new = digests[hit:]
            # Evict what the new blocks need room for, least recently used first.
            evicted = []
            while self.blocks and len(self.blocks) + len(new) > self.num_blocks:
                d, _ = self.blocks.popitem(last=False)
                evicted.append(d)
            if evicted:
                events.append(("BlockRemoved", {"block_hashes": [self.engine_hash(d) for d in evicted], "medium": "GPU"}))
            new = new[:self.num_blocks]
            if new:
                for d in new:
                    self.blocks[d] = None
                parent = self.engine_hash(digests[hit - 1]) if hit > 0 else None
                bs = self.block_size
                events.append(("BlockStored", {
                    "block_hashes": [self.engine_hash(d) for d in new],
                    "parent_block_hash": parent,
                    "token_ids": list(tokens[hit * bs:(hit + len(new)) * bs]),
                    "block_size": bs,
                    "lora_id": None,
                    "medium": "GPU",
                    "lora_name": None,
                }))
        return hit * self.block_size, events

    def clear(self):
        with self.lock:
            self.blocks.clear()
        return [("AllBlocksCleared", {})]

    def size(self):
        with self.lock:
            return len(self.blocks)


# The fields of each event, in msgspec's order (array_like=True).
FIELDS = {
    "BlockStored": ["block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name"],
    "BlockRemoved": ["block_hashes", "medium"],
    "AllBlocksCleared": [],
}


def encode(events, encoding, rank):
    ts = time.time()
    if encoding == "arrays":
        evs = [[tag] + [fields[f] for f in FIELDS[tag]] for tag, fields in events]
        return msgpack.packb([ts, evs, rank])
    evs = [dict([("type", tag)] + [(f, fields[f]) for f in FIELDS[tag]]) for tag, fields in events]
    return msgpack.packb({"ts": ts, "events": evs, "data_parallel_rank": rank})


def binds(endpoint, mode):
    if mode != "auto":
        return mode == "bind"
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


class Publisher(threading.Thread):
    """vLLM's ZmqEventPublisher, in short: one thread owns both sockets."""

    def __init__(self, args):
        super().__init__(daemon=True, name="kv-events")
        self.args = args
        self.q = queue.Queue()
        self.buffer = collections.deque(maxlen=args.buffer_steps)
        self.seq = 0
        self.submitted = 0
        self.lock = threading.Lock()
        self.topic = args.kv_events_topic.encode()
        ctx = zmq.Context.instance()
        self.pub = ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.SNDHWM, 100000)
        if binds(args.kv_events, args.kv_events_mode):
            self.pub.bind(args.kv_events)
        else:
            self.pub.connect(args.kv_events)
        self.replay = None
        if args.kv_events_replay:
            self.replay = ctx.socket(zmq.ROUTER)
            self.replay.bind(args.kv_events_replay)

    def publish(self, events):
        if events:
            with self.lock:
                self.submitted += 1
            self.q.put(events)

    def published(self):
        """Batches published or queued to be: the sequence numbers they get."""
        with self.lock:
            return self.submitted

    def run(self):
        poller = zmq.Poller()
        if self.replay is not None:
            poller.register(self.replay, zmq.POLLIN)
        while True:
            if self.replay is not None and dict(poller.poll(0)):
                self.serve_replay()
            try:
                events = self.q.get(timeout=0.05)
            except queue.Empty:
                continue
            payload = encode(events, self.args.encoding, self.args.data_parallel_rank)
            self.pub.send_multipart([self.topic, self.seq.to_bytes(8, "big"), payload])
            self.buffer.append((self.seq, payload))
            self.seq += 1

    def serve_replay(self):
        frames = self.replay.recv_multipart()
        if len(frames) != 3:
            return  # as vLLM: an invalid request is ignored
        ident, _, start = frames
        start = int.from_bytes(start, "big")
        for seq, payload in list(self.buffer):
            if seq >= start:
                self.replay.send_multipart([ident, b"", seq.to_bytes(8, "big"), payload])
        self.replay.send_multipart([ident, b"", END_SEQ, b""])


class Worker:
    def __init__(self, args):
        self.args = args
        self.pool = Pool(args.block_size, args.num_blocks, args.hash)
        self.events = Publisher(args) if args.kv_events else None
        self.requests = 0
        self.lock = threading.Lock()

    def publish(self, events):
        if self.events is not None:
            self.events.publish(events)


class BadRequest(Exception):
    pass


def prompt_tokens(prompt):
    """Token ids from a prompt as vLLM accepts it (no tokenizer here: text is its UTF-8 bytes)."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (list, str)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return list(prompt.encode())
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in prompt):
        return prompt
    raise BadRequest("prompt must be a string or a non-empty list of token ids")


def made_up_tokens(prompt, n):
    """The completion: deterministic in the prompt, within the common vocabulary."""
    base = sum(prompt) * 31 + len(prompt)
    return [1000 + (base + 7919 * i) % 50000 for i in range(n)]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    worker = None  # set by main

    def log_message(self, fmt, *args):
        if self.worker.args.verbose:
            sys.stderr.write("pyworker: " + (fmt % args) + "\n")

    def reply(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def error(self, code, msg):
        self.reply(code, {"object": "error", "message": msg, "type": "BadRequestError", "code": code})

    def do_GET(self):
        w = self.worker
        if self.path == "/health":
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif self.path == "/v1/models":
            self.reply(200, {"object": "list", "data": [{"id": w.args.served_model_name, "object": "model",
                                                         "created": int(time.time()), "owned_by": "pyworker",
                                                         "max_model_len": w.args.max_model_len}]})
        elif self.path == "/admin/stats":
            with w.lock:
                n = w.requests
            self.reply(200, {"requests": n, "blocks": w.pool.size(),
                             "published": w.events.published() if w.events else 0})
        else:
            self.error(404, "not found: " + self.path)

    def do_POST(self):
        w = self.worker
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if self.path == "/admin/clear":
            w.publish(w.pool.clear())
            self.reply(200, {"cleared": True})
            return
        if self.path != "/v1/completions":
            self.error(404, "not found: " + self.path)
            return
        try:
            req = json.loads(raw or b"{}")
            if not isinstance(req, dict):
                raise BadRequest("the body is not a JSON object")
            model = req.get("model")
            if model not in (None, "", w.args.served_model_name):
                self.error(404, "The model `%s` does not exist." % model)
                return
            prompt = prompt_tokens(req.get("prompt"))
            max_tokens = req.get("max_tokens", 16)
            if not isinstance(max_tokens, int) or max_tokens < 1:
                raise BadRequest("max_tokens must be a positive integer")
            if len(prompt) + max_tokens > w.args.max_model_len:
                raise BadRequest("prompt plus max_tokens exceed max_model_len %d" % w.args.max_model_len)
        except (ValueError, BadRequest) as e:
            self.error(400, str(e))
            return
        with w.lock:
            w.requests += 1
        cached, events = w.pool.admit(prompt)
        w.publish(events)
        out = made_up_tokens(prompt, max_tokens)
        usage = {"prompt_tokens": len(prompt), "completion_tokens": len(out),
                 "total_tokens": len(prompt) + len(out), "prompt_tokens_details": {"cached_tokens": cached}}
        rid, created = "cmpl-" + uuid.uuid4().hex, int(time.time())
        ids = bool(req.get("return_token_ids"))

        def choice(tokens, finish, first):
            c = {"index": 0, "text": "".join("<%d>" % t for t in tokens), "logprobs": None,
                 "finish_reason": finish, "stop_reason": None}
            if ids:
                c["token_ids"] = tokens
                if first:
                    c["prompt_token_ids"] = prompt
            return c

        def chunk(choices, **extra):
            body = {"id": rid, "object": "text_completion", "created": created,
                    "model": w.args.served_model_name, "choices": choices}
            body.update(extra)
            return body

        if not req.get("stream"):
            self.reply(200, chunk([choice(out, "length", True)], usage=usage))
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True

        def sse(body):
            self.wfile.write(b"data: " + (body if isinstance(body, bytes) else json.dumps(body).encode()) + b"\n\n")
            self.wfile.flush()

        try:
            for i, t in enumerate(out):
                if w.args.token_delay > 0:
                    time.sleep(w.args.token_delay)
                sse(chunk([choice([t], "length" if i == len(out) - 1 else None, i == 0)]))
            if (req.get("stream_options") or {}).get("include_usage"):
                sse(chunk([], usage=usage))
            sse(b"[DONE]")
        except (BrokenPipeError, ConnectionResetError):
            pass


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--listen", default="127.0.0.1:8000", help="HTTP host:port")
    ap.add_argument("--served-model-name", default="pyworker")
    ap.add_argument("--max-model-len", type=int, default=8192)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--num-blocks", type=int, default=1024)
    ap.add_argument("--kv-events", default="", help='PUB endpoint, e.g. tcp://*:5557 ("": no events)')
    ap.add_argument("--kv-events-mode", choices=["auto", "bind", "connect"], default="auto")
    ap.add_argument("--kv-events-replay", default="", help="replay ROUTER endpoint (always bound)")
    ap.add_argument("--kv-events-topic", default="")
    ap.add_argument("--encoding", choices=["arrays", "maps"], default="arrays")
    ap.add_argument("--hash", choices=["bytes", "int"], default="bytes")
    ap.add_argument("--data-parallel-rank", type=int, default=0)
    ap.add_argument("--buffer-steps", type=int, default=10000)
    ap.add_argument("--token-delay", type=float, default=0.0, help="seconds before each streamed token")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args()

    w = Worker(args)
    if w.events is not None:
        w.events.start()
    Handler.worker = w
    host, port = args.listen.rsplit(":", 1)
    srv = ThreadingHTTPServer((host, int(port)), Handler)
    srv.daemon_threads = True
    sys.stderr.write("pyworker: serving on http://%s, kv events %s (%s, %s hashes, topic %r)\n"
                     % (args.listen, args.kv_events or "off", args.encoding, args.hash, args.kv_events_topic))
    sys.stderr.flush()
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
