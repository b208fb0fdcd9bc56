#!/usr/bin/env bash
# mixed-demotion.sh — tail latency of gets under a mixed load while the node
# demotes to its SSD tier, side by side with redis-server under the same
# load from the same client, in one run.
#
# It builds kvstrata and kvctl, starts on free ports a node whose DRAM tier
# is a quarter of the working set, so that puts keep it above its high
# watermark and the mover keeps demoting to the SSD:
#   kvstrata serve --dram-capacity DRAM --ssd-capacity 4GiB [--pprof]
# and a
#   redis-server --port P --save '' --appendonly no
# then, RUNS times, alternating the two targets:
#   kvctl bench --op mixed --get-ratio GET_RATIO --size SIZE --keys KEYS
#               --concurrency CONCURRENCY --duration DURATION
# against the node's data plane and against redis-server. It prints the
# median over the runs of the gets' p50, p99 and p99.9 latency (kvctl
# bench's get_latency_ns) and of the throughput, the node's ratio to
# redis-server for each, and how many blocks the node demoted meanwhile.
#
# Usage: bench/mixed-demotion.sh
# Environment: SIZE (64KiB), KEYS (4096: 256 MiB of 64 KiB values),
#              DRAM (64MiB), CONCURRENCY (16), GET_RATIO (0.9),
#              DURATION (10s), RUNS (3), PPROF (1: serve /debug/pprof/ on
#              the node's HTTP address and save a 5 s mutex and block
#              profile taken during the last run in the work directory),
#              KEEP (1: leave the work directory, with logs and profiles).
set -euo pipefail

SIZE=${SIZE:-64KiB}
KEYS=${KEYS:-4096}
DRAM=${DRAM:-64MiB}
CONCURRENCY=${CONCURRENCY:-16}
GET_RATIO=${GET_RATIO:-0.9}
DURATION=${DURATION:-10s}
RUNS=${RUNS:-3}
PPROF=${PPROF:-0}

cd "$(dirname "$0")/.."
. "$(dirname "$0")/lib.sh"
need redis-server redis-cli jq curl
bench_workdir mixed-demotion

echo "building kvstrata and kvctl..." >&2
go build -o "$work/kvstrata" ./cmd/kvstrata
go build -o "$work/kvctl" ./cmd/kvctl
kvctl=$work/kvctl

grpc=$(free_port) data=$(free_port) http=$(free_port) redis=$(free_port)
pprof_flags=()
if [[ $PPROF == 1 ]]; then
	pprof_flags=(--pprof)
	KEEP=1
fi
mkdir "$work/node"
(cd "$work/node" && exec setsid nohup "$work/kvstrata" serve --dram-capacity "$DRAM" --ssd-capacity 4GiB \
	--data-dir "$work/node/data" --listen-grpc "127.0.0.1:$grpc" --listen-data "127.0.0.1:$data" \
	--listen-resp "" --listen-http "127.0.0.1:$http" "${pprof_flags[@]}" >"$work/node.log" 2>&1) &
pids+=($!)
(cd "$work" && exec setsid nohup redis-server --port "$redis" --bind 127.0.0.1 --save '' --appendonly no \
	>"$work/redis.log" 2>&1) &
pids+=($!)
wait_for "$kvctl" --addr "127.0.0.1:$grpc" --timeout 1s stats
wait_for redis-cli -p "$redis" ping

# demotions prints how many blocks the node has demoted so far.
demotions() {
	curl -fs "http://127.0.0.1:$http/metrics" | awk '/^kvstrata_tier_demotions_total/ { n += $2 } END { printf "%d", n }'
}

# bench NAME TARGET RUN runs kvctl bench and appends a row
# "NAME RUN OPS/S GET_P50_US GET_P99_US GET_P999_US ERRORS MISSES" to $work/rows.
bench() {
	local name=$1 target=$2 run=$3 out=$work/$1-$3.json
	echo "kvctl bench --op mixed --get-ratio $GET_RATIO --size $SIZE --keys $KEYS --concurrency $CONCURRENCY --duration $DURATION --target $target" >&2
	"$kvctl" --addr "127.0.0.1:$grpc" bench --op mixed --get-ratio "$GET_RATIO" --size "$SIZE" --keys "$KEYS" \
		--concurrency "$CONCURRENCY" --duration "$DURATION" --target "$target" -o json >"$out" ||
		{ echo "kvctl bench failed; see $out" >&2; KEEP=1; exit 1; }
	jq -r --arg name "$name" --arg run "$run" \
		'[$name, $run, (.run.ops_per_sec | round), (.run.get_latency_ns.p50 / 1e3 | round),
		  (.run.get_latency_ns.p99 / 1e3 | round), (.run.get_latency_ns.p999 / 1e3 | round),
		  .run.errors, .run.misses] | @tsv' "$out" >>"$work/rows"
}

: >"$work/rows"
before=$(demotions)
for run in $(seq "$RUNS"); do
	if [[ $PPROF == 1 && $run == "$RUNS" ]]; then
		# Profile the node during its last run, from one second in.
		(sleep 1
			curl -fs "http://127.0.0.1:$http/debug/pprof/mutex?seconds=5" -o "$work/mutex.pprof"
			curl -fs "http://127.0.0.1:$http/debug/pprof/block?seconds=5" -o "$work/block.pprof") &
		profiler=$!
	fi
	bench node "kvstrata://127.0.0.1:$grpc" "$run"
	bench redis-server "redis://127.0.0.1:$redis" "$run"
done
[[ -z ${profiler:-} ]] || wait "$profiler"
demoted=$(($(demotions) - before))

echo
echo "mixed load: $SIZE values, $KEYS keys, ${GET_RATIO} gets, $CONCURRENCY workers, $DURATION a run, medians of $RUNS;"
echo "node: DRAM $DRAM over SSD 4GiB, $demoted blocks demoted during the runs; latency of gets in µs"
{
	printf 'TARGET\tOPS/S\tGET_P50\tGET_P99\tGET_P999\tERRORS\tMISSES\n'
	for name in node redis-server; do
		row=$name
		for col in 3 4 5 6 7 8; do
			row+=$'\t'$(awk -F'\t' -v n="$name" -v c="$col" '$1 == n { print $c }' "$work/rows" | median)
		done
		echo "$row"
	done >"$work/medians"
	cat "$work/medians"
	awk -F'\t' '{ for (c = 2; c <= 5; c++) v[$1, c] = $c }
		END { printf "node/redis"; for (c = 2; c <= 5; c++) printf "\t%.2f", v["node", c] / v["redis-server", c]; print "\t-\t-" }' \
		"$work/medians"
} | column -t -s $'\t'
if [[ $PPROF == 1 ]]; then
	echo
	echo "profiles: go tool pprof -top $work/kvstrata $work/mutex.pprof (and block.pprof)"
fi
