#!/usr/bin/env bash
# cluster.sh — the block directory of a 3-node kvstrata cluster on loopback:
# directory events committed a second (driven by block puts) with their
# commit latency, and lookups of a 256-block chain on a follower over gRPC.
# See bench/clusterbench/main.go for what is measured; the raw directory
# path (events published straight into the batchers, no block bytes) and
# in-process lookups are Go benchmarks:
#
#   go test -run '^$' -bench 'Publish|CommitLatency' -benchtime 10s ./api/membership
#   go test -run '^$' -bench Lookup256 -benchtime 200000x ./api/membership
#
# It builds kvstrata, kvctl and the benchmark, starts three nodes that
# bootstrap one cluster in a temporary directory, runs clusterbench, then
# kvctl bench --op lookup --batch 256 against a follower as a cross-check,
# and stops everything.
#
# Usage: bench/cluster.sh
# Environment: DURATION (10s, each phase), SIZE (4096, block bytes),
#              CONCURRENCY (2, put workers a node), DRAM (1GiB a node),
#              KEEP (1: keep the logs), NODE_FLAGS (more kvstrata serve flags).
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-10s} SIZE=${SIZE:-4096} CONCURRENCY=${CONCURRENCY:-2} DRAM=${DRAM:-1GiB}

. "$(dirname "$0")/lib.sh"
bench_workdir cluster

echo "building..." >&2
go build -o "$work/kvstrata" ./cmd/kvstrata
go build -o "$work/kvctl" ./cmd/kvctl
go build -o "$work/clusterbench" ./bench/clusterbench

declare -a grpc http raft
peers=""
for i in 1 2 3; do
	grpc[i]=127.0.0.1:$(free_port) http[i]=127.0.0.1:$(free_port) raft[i]=127.0.0.1:$(free_port)
	peers+="${peers:+,}$i=${raft[i]}"
done
for i in 1 2 3; do
	"$work/kvstrata" serve --node-id "$i" --data-dir "$work/node$i" --dram-capacity "$DRAM" --ssd-capacity 1GiB \
		--listen-grpc "${grpc[i]}" --listen-data "127.0.0.1:$(free_port)" --listen-resp "" --listen-http "${http[i]}" \
		--cluster-raft-addr "${raft[i]}" --cluster-bootstrap "$peers" ${NODE_FLAGS:-} >"$work/node$i.log" 2>&1 &
	pids+=($!)
done
for i in 1 2 3; do wait_ready "${http[i]}"; done

"$work/clusterbench" --addrs "${grpc[1]},${grpc[2]},${grpc[3]}" --duration "$DURATION" --size "$SIZE" \
	--concurrency "$CONCURRENCY" ${BENCH_FLAGS:-}

# The cross-check with kvctl's load generator: populate through the leader,
# look up on a follower.
leader=$("$work/kvctl" --addr "${grpc[1]}" cluster leader -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)["leader_id"])' 2>/dev/null || echo 1)
follower=1
[ "$leader" = 1 ] && follower=2
keys=16384
"$work/kvctl" --addr "${grpc[$leader]}" bench --op put --size "$SIZE" --keys "$keys" --batch 256 --requests $((keys / 256)) -c 1 -o json >/dev/null
dirkeys() { "$work/kvctl" --addr "$1" cluster members -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)["directory_keys"])'; }
want=$(dirkeys "${grpc[$leader]}")
for _ in $(seq 100); do # until the follower applied what the leader committed
	[ "$(dirkeys "${grpc[$follower]}")" -ge "$want" ] && break
	sleep 0.05
done
echo
echo "kvctl bench --op lookup --batch 256 on follower node $follower ($keys keys put on leader node $leader)"
for c in 1 8; do
	"$work/kvctl" --addr "${grpc[$follower]}" bench --op lookup --no-populate --size "$SIZE" --keys "$keys" --batch 256 \
		-c "$c" --duration "$DURATION" -o json |
		python3 -c 'import json,sys; r=json.load(sys.stdin)["run"]; l=r["latency_ns"]
print("  %d client(s)%s %.0f lookups/s  p50 %.3f ms  p99 %.3f ms  (%d errors, %d keys missed)" % ('"$c"', " "*24, r["requests_per_sec"], l["p50"]/1e6, l["p99"]/1e6, r["errors"], r["misses"]))'
done
