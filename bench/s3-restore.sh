#!/usr/bin/env bash
# s3-restore.sh — the long-context restore benchmark: a 100K-token context
# (12 KiB of KV a token, Qwen2.5-0.5B's layout: about 1.2 GB in 3 MiB blocks)
# is stored through a kvstrata node, moved down to the object store, and
# restored to a client; side by side in one run with the same bytes as one
# object fetched by one plain minio-go GET (the limit), as one object per
# block fetched in turn, and restored by the client straight from the store
# (api/client/s3direct). See bench/s3restore/main.go.
#
# It builds kvstrata and the benchmark, starts versitygw (an S3-compatible
# server: go install github.com/versity/versitygw/cmd/versitygw@v1.8.0) and
# a node on free ports in a temporary directory, runs, and stops both.
#
# Usage: bench/s3-restore.sh
# Environment: TOKENS (100000), BLOCK_TOKENS (256), RUNS (3), WARMUPS (1:
#              untimed runs of every method first; the first restore of a
#              process pays for memory it touches for the first time),
#              CONCURRENCY (the node's s3.concurrency, 16), FETCH_CONCURRENCY (the
#              node's fetch-concurrency, 16: a quarter of it is the restore's reads
#              in flight), KEEP (1: keep logs),
#              NODE_FLAGS (more kvstrata serve flags, e.g. "--pprof --listen-http 127.0.0.1:9099").
set -euo pipefail
cd "$(dirname "$0")/.."

TOKENS=${TOKENS:-100000} BLOCK_TOKENS=${BLOCK_TOKENS:-256} RUNS=${RUNS:-3} WARMUPS=${WARMUPS:-1} CONCURRENCY=${CONCURRENCY:-16} FETCH_CONCURRENCY=${FETCH_CONCURRENCY:-16}
. "$(dirname "$0")/lib.sh"
bench_workdir s3-restore

echo "building..." >&2
go build -o "$work/kvstrata" ./cmd/kvstrata
go build -o "$work/s3restore" ./bench/s3restore

start_versitygw restorebench

grpc=$(free_port) data=$(free_port)
"$work/kvstrata" serve --data-dir "$work/node" --dram-capacity 2GiB --ssd-capacity 2GiB \
	--listen-grpc "127.0.0.1:$grpc" --listen-data "127.0.0.1:$data" --listen-resp "" \
	--s3-endpoint "127.0.0.1:$s3port" --s3-bucket kvstrata-restore --s3-concurrency "$CONCURRENCY" --fetch-concurrency "$FETCH_CONCURRENCY" ${NODE_FLAGS:-} \
	>"$work/kvstrata.log" 2>&1 &
pids+=($!)
wait_port "$grpc"

"$work/s3restore" --addr "127.0.0.1:$grpc" --s3-endpoint "127.0.0.1:$s3port" \
	--tokens "$TOKENS" --block-tokens "$BLOCK_TOKENS" --runs "$RUNS" --warmups "$WARMUPS" ${BENCH_FLAGS:-} | sed '/^\[/,$d'
