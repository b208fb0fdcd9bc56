"""redis-py against a kvstrata RESP server with a users file (auth_test.go):
username and password, a redis:// URL with credentials as LMCache passes
it, and refusals without or with wrong credentials. Prints "ok"."""
import sys

import redis

host, port = sys.argv[1], int(sys.argv[2])

r = redis.Redis(host=host, port=port, username="alice", password="alice-pw")
assert r.set("k", b"v")
assert r.get("k") == b"v"
assert r.execute_command("ACL WHOAMI") in (b"alice", "alice")

u = redis.Redis.from_url(f"redis://alice:alice-pw@{host}:{port}/0")
assert u.get("k") == b"v"
assert u.execute_command("ACL WHOAMI") in (b"alice", "alice")

d = redis.Redis(host=host, port=port, password="default-pw")
assert d.execute_command("ACL WHOAMI") in (b"default", "default")

for kwargs in ({}, {"username": "alice", "password": "wrong"}, {"password": "wrong"}):
    try:
        redis.Redis(host=host, port=port, **kwargs).get("k")
    except redis.exceptions.AuthenticationError:
        pass  # NOAUTH, or the WRONGPASS of the handshake
    except redis.exceptions.ResponseError as e:
        assert str(e).startswith(("NOAUTH", "WRONGPASS")), e
    else:
        raise AssertionError(f"{kwargs}: GET succeeded")

try:
    redis.Redis(host=host, port=port, username="reader", password="reader-pw").set("k", "w")
except redis.exceptions.NoPermissionError as e:
    assert "no permissions to run the 'set' command" in str(e), e
else:
    raise AssertionError("a reader could SET")

print("ok")
