#!/usr/bin/env bash
# resp-large.sh — one SET and one GET of large values (LMCache's 32 MiB
# chunks, and 512 MiB, the largest a value may be by default) through
# redis-py, against a kvstrata node and against redis-server side by side,
# with each server's peak resident memory (VmHWM) after each size.
#
# Usage: bench/resp-large.sh [-d "SIZES_MIB"] [-D DRAM]
#
#   -d SIZES  value sizes in MiB, in order (default "32 512")
#   -D DRAM   the node's --dram-capacity (default 2GiB), so that the
#             values stay in DRAM; its SSD tier is off
#
# It builds kvstrata (without -race) and starts it and a redis-server
# (--save '' --appendonly no) on free ports. Needs the Go toolchain,
# redis-server and python3 with redis-py (Debian: redis-server,
# python3-redis).
set -euo pipefail

sizes="32 512" dram=2GiB
while getopts "d:D:" opt; do
	case $opt in
	d) sizes=$OPTARG ;;
	D) dram=$OPTARG ;;
	*) sed -n '2,17p' "$0" >&2; exit 2 ;;
	esac
done

cd "$(dirname "$0")/.."
. bench/lib.sh
need go redis-server python3
py=""
for p in python3 /usr/bin/python3; do
	if "$p" -c 'import redis' 2>/dev/null; then py=$p; break; fi
done
[[ -n $py ]] || { echo "resp-large: no python3 with redis-py (apt-get install python3-redis)" >&2; exit 1; }
bench_workdir resp-large

go build -o "$work/kvstrata" ./cmd/kvstrata
rport=$(free_port) kport=$(free_port)
redis-server --port "$rport" --bind 127.0.0.1 --save '' --appendonly no --daemonize no \
	--dir "$work" --logfile "$work/redis.log" &
rpid=$!
pids+=($rpid)
"$work/kvstrata" serve --data-dir "$work/node" --dram-capacity "$dram" --ssd-enabled=false \
	--listen-grpc "127.0.0.1:$(free_port)" --listen-data "127.0.0.1:$(free_port)" \
	--listen-resp "127.0.0.1:$kport" --listen-http "127.0.0.1:$(free_port)" \
	--cluster-raft-addr "127.0.0.1:$(free_port)" >"$work/kvstrata.log" 2>&1 &
kpid=$!
pids+=($kpid)
wait_port "$rport"
wait_port "$kport"

hwm() { awk '/^VmHWM/ { printf "%d", $2 / 1024 }' "/proc/$1/status"; }

echo "one SET then one GET per size through redis-py 4 (single connection); seconds, and the server's peak RSS after it"
printf "%-8s %-9s %9s %9s %14s\n" size server "SET s" "GET s" "peak RSS MiB"
for size in $sizes; do
	for server in redis-server kvstrata; do
		port=$rport pid=$rpid
		[[ $server == kvstrata ]] && port=$kport pid=$kpid
		times=$("$py" - "$port" "$size" <<'PY'
import sys, time, redis
port, mib = int(sys.argv[1]), int(sys.argv[2])
r = redis.Redis(port=port, single_connection_client=True, socket_timeout=600)
v = bytes(range(256)) * (mib << 12)
t0 = time.perf_counter(); r.set("large", v); t1 = time.perf_counter()
got = r.get("large"); t2 = time.perf_counter()
assert got == v, "value read back differs"
r.delete("large")
print("%.3f %.3f" % (t1 - t0, t2 - t1))
PY
)
		printf "%-8s %-9s %9s %9s %14s\n" "${size}MiB" "${server%-server}" ${times} "$(hwm "$pid")"
	done
done
