#!/usr/bin/env bash
# resp-vs-redis.sh — redis-benchmark against kvstrata's RESP server and
# against redis-server, with identical flags, side by side.
#
# Usage: bench/resp-vs-redis.sh [-p KVSTRATA_PORT] [-h HOST] [-n REQUESTS]
#                               [-c CLIENTS] [-P PIPELINE] [-d "SIZES"] [-r RUNS]
#
#   -p PORT   the RESP port of a running kvstrata node. Without it the script
#             builds and starts api/resp/internal/memserver: the RESP server
#             over an in-memory store, which measures the protocol layer alone.
#   -h HOST   host of the kvstrata node (default 127.0.0.1)
#   -n N      requests per test (default 2000)
#   -c N      parallel clients (default 8)
#   -P N      pipeline depth (default 1)
#   -d SIZES  value sizes in bytes (default "65536 1048576")
#   -r RUNS   runs per cell; the median is reported (default 3)
#
# It always starts its own redis-server (--save '' --appendonly no) on
# REDIS_PORT (default 16379). Needs redis-server and redis-benchmark
# (Debian: redis-server, redis-tools) and, without -p, the Go toolchain.
set -euo pipefail

host=127.0.0.1 port="" requests=2000 clients=8 pipeline=1 sizes="65536 1048576" runs=3
while getopts "p:h:n:c:P:d:r:" opt; do
	case $opt in
	p) port=$OPTARG ;;
	h) host=$OPTARG ;;
	n) requests=$OPTARG ;;
	c) clients=$OPTARG ;;
	P) pipeline=$OPTARG ;;
	d) sizes=$OPTARG ;;
	r) runs=$OPTARG ;;
	*) sed -n '2,20p' "$0" >&2; exit 2 ;;
	esac
done

for tool in redis-server redis-benchmark redis-cli; do
	command -v "$tool" >/dev/null || { echo "resp-vs-redis: $tool not found (apt-get install redis-server redis-tools)" >&2; exit 1; }
done

redis_port=${REDIS_PORT:-16379}
. "$(dirname "$0")/lib.sh"
bench_workdir resp-vs-redis
tmp=$work

# wait_up HOST PORT: wait until a RESP server answers PING.
wait_up() {
	for _ in $(seq 100); do
		if redis-cli -h "$1" -p "$2" PING 2>/dev/null | grep -q PONG; then return 0; fi
		sleep 0.1
	done
	echo "resp-vs-redis: nothing answers on $1:$2" >&2
	exit 1
}

if redis-cli -p "$redis_port" PING >/dev/null 2>&1; then
	echo "resp-vs-redis: port $redis_port is taken; set REDIS_PORT" >&2
	exit 1
fi
redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no --daemonize no \
	--dir "$tmp" --logfile "$tmp/redis.log" &
pids+=($!)
wait_up 127.0.0.1 "$redis_port"

if [[ -z $port ]]; then
	root=$(cd "$(dirname "$0")/.." && pwd)
	(cd "$root" && go build -o "$tmp/memserver" ./api/resp/internal/memserver)
	port=${KVSTRATA_PORT:-16390}
	"$tmp/memserver" -addr "127.0.0.1:$port" 2>"$tmp/memserver.log" &
	pids+=($!)
	kvstrata="kvstrata-resp (in-memory store)"
else
	kvstrata="kvstrata node $host:$port"
fi
wait_up "$host" "$port"

# rates HOST PORT SIZE: one redis-benchmark run; prints "SET-rate GET-rate".
rates() {
	redis-benchmark -h "$1" -p "$2" -t set,get -n "$requests" -d "$3" -c "$clients" -P "$pipeline" -q 2>&1 |
		tr '\r' '\n' | awk '/^SET: [0-9.]+ requests per second/ { s = $2 } /^GET: [0-9.]+ requests per second/ { g = $2 }
			END { if (s == "" || g == "") exit 1; print s, g }'
}


echo "redis-benchmark -t set,get -n $requests -c $clients -P $pipeline -q -d SIZE   (median of $runs runs)"
echo "redis-server $(redis-server --version | awk '{ print $3 }') on 127.0.0.1:$redis_port  vs  $kvstrata"
echo
printf "%-9s %-4s %16s %16s %8s\n" size op "redis ops/s" "kvstrata ops/s" ratio
for size in $sizes; do
	: >"$tmp/redis" && : >"$tmp/kvstrata"
	for _ in $(seq "$runs"); do
		rates 127.0.0.1 "$redis_port" "$size" >>"$tmp/redis" || { echo "resp-vs-redis: redis-benchmark failed against redis-server" >&2; exit 1; }
		rates "$host" "$port" "$size" >>"$tmp/kvstrata" || { echo "resp-vs-redis: redis-benchmark failed against kvstrata" >&2; exit 1; }
	done
	for col in 1 2; do
		op=$([[ $col == 1 ]] && echo SET || echo GET)
		r=$(cut -d' ' -f$col "$tmp/redis" | median)
		k=$(cut -d' ' -f$col "$tmp/kvstrata" | median)
		printf "%-9s %-4s %16.0f %16.0f %7.2fx\n" "$size" "$op" "$r" "$k" "$(awk -v a="$k" -v b="$r" 'BEGIN { print a / b }')"
	done
done
