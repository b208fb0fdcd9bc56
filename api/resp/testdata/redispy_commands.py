"""Drives a kvstrata RESP server with redis-py as an application does:
the default pipeline() (MULTI ... EXEC), scans, expiry and the key
commands. Usage: redispy_commands.py HOST PORT MAX_VALUE_BYTES.
Exits non-zero, saying what differed, on the first surprise."""
import sys
import time

import redis

host, port, max_value = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
r = redis.Redis(host=host, port=port)


def check(what, got, want):
    if got != want:
        sys.exit(f"{what}: got {got!r}, want {want!r}")


# The default pipeline is a transaction.
pipe = r.pipeline()
pipe.set("a", b"1").set("b", b"2", ex=60).get("a").expire("a", 3600).ttl("a").delete("gone")
check("pipeline().execute()", pipe.execute(), [True, True, b"1", True, 3600, 0])
check("TTL b", r.ttl("b"), 60)

# A transaction the store refuses changes nothing.
pipe = r.pipeline()
pipe.set("a", b"changed").set("huge", b"x" * (max_value + 1))
try:
    pipe.execute()
    sys.exit("a transaction with a value over the limit succeeded")
except redis.ResponseError as e:
    check("the refusal names the limit", "limit" in str(e), True)
check("a after the refused transaction", r.get("a"), b"1")
check("huge after the refused transaction", r.exists("huge"), 0)

# A command refused while queueing discards the transaction (EXECABORT).
pipe = r.pipeline()
pipe.set("a", b"again").execute_command("LPUSH", "l", "x")
try:
    pipe.execute()
    sys.exit("a transaction with LPUSH succeeded")
except redis.ResponseError as e:
    check("EXECABORT", "EXECABORT" in str(e) or "LPUSH" in str(e), True)
check("a after EXECABORT", r.get("a"), b"1")

# A non-transactional pipeline, and the key commands.
pipe = r.pipeline(transaction=False)
for k in ["k1", "k2", "k3", "other"]:
    pipe.set(k, b"v")
pipe.execute()
check("MSET", r.mset({"m1": b"x", "m2": b"yy"}), True)
check("SCAN k*", sorted(r.scan_iter(match="k*", count=2)), [b"k1", b"k2", b"k3"])
check("KEYS m?", sorted(r.keys("m?")), [b"m1", b"m2"])
check("TYPE", r.type("m1"), b"string")
check("TYPE missing", r.type("nope"), b"none")
check("STRLEN", r.strlen("m2"), 2)
check("MEMORY USAGE missing", r.memory_usage("nope"), None)
check("MEMORY USAGE is a number", isinstance(r.memory_usage("m2"), int), True)
check("EXPIRE NX", r.expire("m1", 60, nx=True), True)
check("EXPIRE NX again", r.expire("m1", 90, nx=True), False)
check("PTTL", 59000 < r.pttl("m1") <= 60000, True)
check("PERSIST", r.persist("m1"), True)
check("TTL after PERSIST", r.ttl("m1"), -1)
check("TTL missing", r.ttl("nope"), -2)
check("SET PX", r.set("p", b"v", px=1500), True)
check("SET EXAT", r.set("p", b"v", exat=int(time.time()) + 100), True)
check("SET KEEPTTL", r.set("p", b"w", keepttl=True), True)
check("TTL after KEEPTTL", 98 <= r.ttl("p") <= 100, True)
secs, usecs = r.time()
check("TIME", abs(secs - time.time()) < 60, True)
check("CONFIG GET maxmemory", r.config_get("maxmemory"), {"maxmemory": "0"})
# r.info() parses the reply into a dict, which would hide a field listed
# twice: read the raw reply.
conn = r.connection_pool.get_connection("INFO")
conn.send_command("INFO", "memory")
mem = conn.read_response().decode()
r.connection_pool.release(conn)
names = [l.split(":")[0] for l in mem.split("\r\n") if ":" in l]
check("INFO memory fields listed once", len(names), len(set(names)))
check("FLUSHDB", r.flushdb(), True)
check("DBSIZE after FLUSHDB", r.dbsize(), 0)
print("ok")
