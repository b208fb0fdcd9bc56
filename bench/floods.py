#!/usr/bin/env python3
"""Floods against a running kvstrata node: prints the node's RSS growth
under 12 unfinished 7 x 16 MiB MSETs, and a well-behaved client's latency
under 1,024 stalled SETs.  usage: floods.py PID RESPADDR mset|lockout"""
import socket, sys, time, threading

pid, addr, what = int(sys.argv[1]), sys.argv[2], sys.argv[3]
N = int(sys.argv[4]) if len(sys.argv) > 4 else 200
host, port = addr.rsplit(":", 1); port = int(port)

def rss():
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024

keep = []
if what == "mset":
    before = rss()
    value = b"v" * (16 << 20)
    def flood():
        s = socket.create_connection((host, port)); keep.append(s)
        try:
            s.sendall(b"*15\r\n$4\r\nMSET\r\n")
            for k in range(7):
                s.sendall(b"$2\r\nk%d\r\n$%d\r\n" % (k, len(value)))
                if k == 6:
                    s.sendall(value[:-1]); return
                s.sendall(value + b"\r\n")
        except OSError:
            pass
    for _ in range(12):
        threading.Thread(target=flood, daemon=True).start()
    time.sleep(10)
    print(f"RSS before {before>>20} MiB, with 12 unfinished 7x16MiB MSETs {rss()>>20} MiB, grown {(rss()-before)>>20} MiB")
else:
    for i in range(1024):
        s = socket.create_connection((host, port)); keep.append(s)
        s.sendall(b"*3\r\n$3\r\nSET\r\n$6\r\nstall0\r\n$16777216\r\n")
    time.sleep(2)
    lat, failed = [], 0
    for i in range(N):
        t0 = time.monotonic(); ok = False
        while time.monotonic() - t0 < 5:
            try:
                s = socket.create_connection((host, port), timeout=5)
                s.settimeout(max(0.01, 5 - (time.monotonic() - t0)))
                s.sendall(b"*3\r\n$3\r\nSET\r\n$2\r\nkk\r\n$2\r\nok\r\n*2\r\n$3\r\nGET\r\n$2\r\nkk\r\n")
                buf = b""
                while buf.count(b"\r\n") < 3:
                    d = s.recv(4096)
                    if not d: break
                    buf += d
                s.close()
                if buf.startswith(b"-ERR max number of clients"):
                    time.sleep(0.05); continue
                ok = buf == b"+OK\r\n$2\r\nok\r\n"
            except OSError:
                pass
            break
        if ok: lat.append(time.monotonic() - t0)
        else: failed += 1
    lat.sort()
    if lat:
        print(f"answered {len(lat)}/{N}, failed {failed}; p50 {lat[len(lat)//2]*1e3:.1f} ms, p99 {lat[min(len(lat)-1, int(len(lat)*0.99))]*1e3:.1f} ms, max {lat[-1]*1e3:.1f} ms")
    else:
        print(f"answered 0/{N}, failed {failed} (each tried for 5 s)")
