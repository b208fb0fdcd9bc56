#!/usr/bin/env python3
"""Reproduce kvstrata's block hashes from hash_vectors.json with nothing but
the Python standard library: a from-scratch xxhash64, the canonical namespace
text and the chaining rule. Exit status 0 means every vector matched.

    python3 index/testdata/verify_vectors.py [index/testdata/hash_vectors.json]
"""
import json
import os
import struct
import sys

M = (1 << 64) - 1
P1, P2, P3, P4, P5 = (0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F,
                      0x165667B19E3779F9, 0x85EBCA77C2B2AE63, 0x27D4EB2F165667C5)


def rotl(x, r):
    return ((x << r) | (x >> (64 - r))) & M


def rnd(acc, lane):
    return (rotl((acc + lane * P2) & M, 31) * P1) & M


def merge(acc, val):
    return (((acc ^ rnd(0, val)) * P1) + P4) & M


def xxh64(data, seed=0):
    n, i = len(data), 0
    if n >= 32:
        v = [(seed + P1 + P2) & M, (seed + P2) & M, seed, (seed - P1) & M]
        while i + 32 <= n:
            for j in range(4):
                v[j] = rnd(v[j], struct.unpack_from("<Q", data, i + 8 * j)[0])
            i += 32
        h = (rotl(v[0], 1) + rotl(v[1], 7) + rotl(v[2], 12) + rotl(v[3], 18)) & M
        for x in v:
            h = merge(h, x)
    else:
        h = (seed + P5) & M
    h = (h + n) & M
    while i + 8 <= n:
        h = ((rotl(h ^ rnd(0, struct.unpack_from("<Q", data, i)[0]), 27) * P1) + P4) & M
        i += 8
    if i + 4 <= n:
        h = ((rotl(h ^ (struct.unpack_from("<I", data, i)[0] * P1 & M), 23) * P2) + P3) & M
        i += 4
    while i < n:
        h = (rotl(h ^ (data[i] * P5 & M), 11) * P1) & M
        i += 1
    h ^= h >> 33
    h = (h * P2) & M
    h ^= h >> 29
    h = (h * P3) & M
    return h ^ (h >> 32)


def canonical(ns):
    lay = ns["layout"]
    fields = [("model", ns["model"]), ("layers", lay["layers"]), ("kv_heads", lay["kv_heads"]),
              ("head_dim", lay["head_dim"]), ("dtype", lay["dtype"]), ("tp_rank", lay.get("tp_rank", 0)),
              ("tp_size", max(lay.get("tp_size", 0), 1)), ("block_tokens", ns["block_tokens"]),
              ("tenant_salt", ns.get("tenant_salt", ""))]
    return "kvstrata-namespace-v1\n" + "".join(f"{k}={v}\n" for k, v in fields)


def block_hashes(ns, tokens):
    prev = xxh64(canonical(ns).encode())
    seed, out, bt = prev, [], ns["block_tokens"]
    for b in range(len(tokens) // bt):
        block = tokens[b * bt:(b + 1) * bt]
        prev = xxh64(struct.pack("<Q", prev) + struct.pack(f"<{bt}I", *block))
        out.append(f"{prev:016x}")
    return f"{seed:016x}", out


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "hash_vectors.json")
    bad = 0
    for v in json.load(open(path))["vectors"]:
        seed, hashes = block_hashes(v["namespace"], v["tokens"])
        ok = canonical(v["namespace"]) == v["canonical"] and seed == v["seed"] and hashes == v["hashes"]
        bad += not ok
        print(("ok  " if ok else "FAIL"), v["name"])
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
