#!/usr/bin/env bash
# node-vs-iperf3-redis.sh — a kvstrata node's gets and puts of 1 MiB values,
# measured with kvctl bench, side by side with redis-server driven by the
# same client and with iperf3, the limit, on loopback, in one run.
#
# It builds kvstrata and kvctl, starts on free ports a node
#   kvstrata serve --dram-capacity 4GiB --ssd-capacity 4GiB
# (data plane, gRPC and RESP on) and a
#   redis-server --port P --save '' --appendonly no
# then runs, in turn:
#   iperf3 -s -1 -p P2 & iperf3 -c 127.0.0.1 -p P2 -t IPERF_SECS   (one stream)
#   kvctl bench --op get --size SIZE --concurrency C --duration DURATION
# against the node's data plane, its gRPC API, its Redis-protocol endpoint and
# redis-server, and the same with --op put against the node's data plane and
# redis-server. It prints one table: MB/s (10^6 bytes a second), latency, and
# the ratio of each to iperf3 and to redis-server doing the same.
#
# Usage: bench/node-vs-iperf3-redis.sh
# Environment: SIZE (1MiB), CONCURRENCY (8), DURATION (10s), IPERF_SECS (5),
#              KEEP (1: leave the work directory, with the servers' logs).
set -euo pipefail

SIZE=${SIZE:-1MiB}
CONCURRENCY=${CONCURRENCY:-8}
DURATION=${DURATION:-10s}
IPERF_SECS=${IPERF_SECS:-5}

cd "$(dirname "$0")/.."
. "$(dirname "$0")/lib.sh"
need iperf3 redis-server jq
bench_workdir node-vs-iperf3-redis

echo "building kvstrata and kvctl..." >&2
go build -o "$work/kvstrata" ./cmd/kvstrata
go build -o "$work/kvctl" ./cmd/kvctl
kvctl=$work/kvctl

grpc=$(free_port) data=$(free_port) resp=$(free_port) redis=$(free_port) iperf=$(free_port)
mkdir "$work/node"
(cd "$work/node" && exec setsid nohup "$work/kvstrata" serve --dram-capacity 4GiB --ssd-capacity 4GiB \
	--data-dir "$work/node/data" --listen-grpc "127.0.0.1:$grpc" --listen-data "127.0.0.1:$data" \
	--listen-resp "127.0.0.1:$resp" --listen-http "" >"$work/node.log" 2>&1) &
pids+=($!)
(cd "$work" && exec setsid nohup redis-server --port "$redis" --bind 127.0.0.1 --save '' --appendonly no \
	>"$work/redis.log" 2>&1) &
pids+=($!)
wait_for "$kvctl" --addr "127.0.0.1:$grpc" --timeout 1s stats
wait_for redis-cli -p "$redis" ping

# bench NAME OP TARGET [FLAGS...] runs kvctl bench and appends a row
# "NAME OP MB/S P50_MS P99_MS ERRORS" to $work/rows.
bench() {
	local name=$1 op=$2 target=$3
	shift 3
	echo "kvctl bench --op $op --size $SIZE --concurrency $CONCURRENCY --duration $DURATION --target $target $*" >&2
	"$kvctl" --addr "127.0.0.1:$grpc" bench --op "$op" --size "$SIZE" --concurrency "$CONCURRENCY" \
		--duration "$DURATION" --target "$target" "$@" -o json >"$work/$name-$op.json" ||
		{ echo "kvctl bench failed; see $work/$name-$op.json" >&2; KEEP=1; exit 1; }
	jq -r --arg name "$name" --arg op "$op" \
		'[$name, $op, (.run.mb_per_sec * 10 | round / 10), (.run.latency_ns.p50 / 1e4 | round / 100),
		  (.run.latency_ns.p99 / 1e4 | round / 100), .run.errors] | @tsv' \
		"$work/$name-$op.json" >>"$work/rows"
}

echo "iperf3 -c 127.0.0.1 -t $IPERF_SECS (one stream)..." >&2
limit=$(iperf3_mbs "$iperf" "$IPERF_SECS")
: >"$work/rows"
bench node-data-plane get "kvstrata://127.0.0.1:$grpc"
bench node-grpc get "kvstrata://127.0.0.1:$grpc" --grpc
bench node-resp get "redis://127.0.0.1:$resp"
bench redis-server get "redis://127.0.0.1:$redis"
bench node-data-plane put "kvstrata://127.0.0.1:$grpc"
bench redis-server put "redis://127.0.0.1:$redis"

echo
echo "$SIZE values, $CONCURRENCY workers, $DURATION a run; iperf3: one stream, $IPERF_SECS s; MB = 10^6 bytes"
{
	printf 'TARGET\tOP\tMB/S\tP50_MS\tP99_MS\tERRORS\tx_IPERF3\tx_REDIS\n'
	printf 'iperf3\tstream\t%s\t-\t-\t-\t1.00\t-\n' "$limit"
	awk -F'\t' -v limit="$limit" '
		{ rows[NR] = $0; if ($1 == "redis-server") redis[$2] = $3 }
		END {
			for (i = 1; i <= NR; i++) {
				split(rows[i], f, "\t")
				vs = (f[2] in redis && redis[f[2]] > 0) ? sprintf("%.2f", f[3] / redis[f[2]]) : "-"
				printf "%s\t%.2f\t%s\n", rows[i], f[3] / limit, vs
			}
		}' "$work/rows"
} | column -t -s $'\t'
