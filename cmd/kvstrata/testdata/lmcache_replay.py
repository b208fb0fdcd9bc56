#!/usr/bin/env python3
"""Replays LMCache's redis:// remote backend, command for command, through
redis-py against a kvstrata node (large_e2e_test.go runs it).

LMCache stores one value per 256-token chunk under two keys (its
RedisConnector): put is SET <key>kv_bytes, SET <key>metadata; contains is
EXISTS <key>metadata; get is GET <key>metadata then GET <key>kv_bytes,
and DEL <key>metadata when the bytes are gone.

  lmcache_replay.py HOST PORT put  SIZE_MIB... : store chunks of those sizes
  lmcache_replay.py HOST PORT get  SIZE_MIB... : read every chunk back, byte for byte
  lmcache_replay.py HOST PORT survivors SIZE_MIB... : each chunk reads whole or as a miss
  lmcache_replay.py HOST PORT lose SIZE_MIB    : a chunk whose bytes are gone is a miss
  lmcache_replay.py HOST PORT over SIZE_MIB    : a value over the node's limit is refused,
                                                 and the connection goes on

Prints "ok ..." lines; exits non-zero, saying why, on the first mismatch.
"""

import hashlib
import random
import struct
import sys

import redis

MIB = 1 << 20


def chunk_key(size_mib, i):
    # LMCache's CacheEngineKey string: fmt@model@world_size@worker_id@chunk_hash.
    h = hashlib.sha256(b"%d:%d" % (size_mib, i)).hexdigest()[:16]
    return "vllm@meta-llama/Llama-3.1-8B@1@0@" + h


def chunk_bytes(size_mib, i):
    return random.Random(size_mib * 1000 + i).randbytes(size_mib * MIB)


def metadata(size_mib):
    # LMCache's RemoteMetadata: length, shape (4 ints), dtype, fmt.
    return struct.pack("<iiiiiii", size_mib * MIB, 2, 32, 256, size_mib * MIB // (2 * 32 * 256 * 2), 1, 0)


def fail(msg):
    print("FAIL " + msg)
    sys.exit(1)


def put(r, sizes):
    for size in sizes:
        for i in range(2):
            key = chunk_key(size, i)
            r.set(key + "kv_bytes", chunk_bytes(size, i))
            r.set(key + "metadata", metadata(size))
            if r.exists(key + "metadata") != 1:
                fail("EXISTS %smetadata after its SET" % key)
        print("ok put 2 chunks of %d MiB" % size)


def get_chunk(r, key):
    """LMCache's get: the metadata, then the bytes; no bytes, no metadata."""
    meta = r.get(key + "metadata")
    if meta is None:
        return None, None
    kv = r.get(key + "kv_bytes")
    if kv is None:
        r.delete(key + "metadata")
        return meta, None
    return meta, kv


def get(r, sizes):
    for size in sizes:
        for i in range(2):
            key = chunk_key(size, i)
            if r.exists(key + "metadata") != 1:
                fail("EXISTS %smetadata: the chunk of %d MiB is gone" % (key, size))
            meta, kv = get_chunk(r, key)
            if meta != metadata(size):
                fail("metadata of %s: %r" % (key, meta))
            if kv is None:
                fail("GET %skv_bytes: a miss, want %d MiB" % (key, size))
            if kv != chunk_bytes(size, i):
                fail("GET %skv_bytes: %d bytes that differ from the %d MiB stored" % (key, len(kv), size))
        print("ok get 2 chunks of %d MiB, byte for byte" % size)


def survivors(r, sizes):
    """After a restart: each chunk reads whole, or as a miss (its bytes were
    in DRAM only) — never as other bytes."""
    whole = missing = 0
    for size in sizes:
        for i in range(2):
            key = chunk_key(size, i)
            meta, kv = get_chunk(r, key)
            if kv is None:
                missing += 1
                if r.exists(key + "metadata") != 0:
                    fail("the metadata of %s outlived its bytes" % key)
                continue
            if meta != metadata(size) or kv != chunk_bytes(size, i):
                fail("chunk %s read back as other bytes (%d of them)" % (key, len(kv)))
            whole += 1
    print("ok whole %d missing %d" % (whole, missing))


def lose(r, size):
    key = chunk_key(size, 0)
    r.set(key + "kv_bytes", chunk_bytes(size, 0))
    r.set(key + "metadata", metadata(size))
    r.delete(key + "kv_bytes")  # as eviction would
    meta, kv = get_chunk(r, key)
    if meta is None or kv is not None:
        fail("a chunk without its bytes: metadata %r, %r bytes" % (meta, kv and len(kv)))
    if r.exists(key + "metadata") != 0:
        fail("the metadata of a chunk whose bytes are gone was not deleted")
    print("ok a lost chunk of %d MiB reads as a miss and its metadata goes" % size)


def over(r, size):
    try:
        r.set("too-big", b"x" * (size * MIB))
        fail("a SET of %d MiB was accepted" % size)
    except redis.exceptions.ResponseError as e:
        if "limits.max-value-size" not in str(e):
            fail("refusal does not name the limit: %s" % e)
        print("ok refused: %s" % e)
    # The same connection goes on.
    if not r.ping() or r.exists("too-big") != 0:
        fail("the connection did not go on after the refusal")
    r.set("after", b"fine")
    if r.get("after") != b"fine":
        fail("GET after the refusal")
    print("ok the connection goes on")


def main():
    host, port, cmd = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    sizes = [int(s) for s in sys.argv[4:]]
    # One connection, as a pooled client's would be reused after an error.
    r = redis.Redis(host=host, port=port, single_connection_client=True, socket_timeout=120)
    {"put": put, "get": get, "survivors": survivors}.get(cmd, lambda r, s: {"lose": lose, "over": over}[cmd](r, s[0]))(r, sizes)


if __name__ == "__main__":
    main()
