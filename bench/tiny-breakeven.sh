#!/usr/bin/env bash
# tiny-breakeven.sh — the break-even benchmark of the tiny model: for prompts
# of several lengths, tiny's prefill time (default config, real float32
# math) side by side in one run with restoring the same tokens' KV blocks
# from a kvstrata node's DRAM, SSD and object store (Lookup, then one
# GetFunc into one destination buffer, as an engine restores), and per tier
# the break-even prompt length: the shortest from which restoring beats
# recomputing. The restored bytes are checked against the computed ones.
# See bench/breakeven/main.go.
#
# It builds kvstrata and the benchmark, starts versitygw (an S3-compatible
# server: go install github.com/versity/versitygw/cmd/versitygw@v1.8.0) and
# a node on free ports in a temporary directory, runs, and stops both.
#
# Usage: bench/tiny-breakeven.sh [-o json]
# Environment: TOKENS (16,64,128,256,512,1024,2048,4096), RUNS (3),
#              WORKERS (goroutines of a tiny step, 0: GOMAXPROCS), KEEP (1: keep logs),
#              NODE_FLAGS (more kvstrata serve flags).
set -euo pipefail
cd "$(dirname "$0")/.."

TOKENS=${TOKENS:-16,64,128,256,512,1024,2048,4096} RUNS=${RUNS:-3} WORKERS=${WORKERS:-0}
. "$(dirname "$0")/lib.sh"
bench_workdir tiny-breakeven

echo "building..." >&2
go build -o "$work/kvstrata" ./cmd/kvstrata
go build -o "$work/breakeven" ./bench/breakeven

start_versitygw breakevenbench

grpc=$(free_port) data=$(free_port)
"$work/kvstrata" serve --data-dir "$work/node" --dram-capacity 256MiB --ssd-capacity 256MiB \
	--listen-grpc "127.0.0.1:$grpc" --listen-data "127.0.0.1:$data" --listen-resp "" \
	--s3-endpoint "127.0.0.1:$s3port" --s3-bucket kvstrata-breakeven --s3-flush-interval 100ms ${NODE_FLAGS:-} \
	>"$work/kvstrata.log" 2>&1 &
pids+=($!)
wait_port "$grpc"

"$work/breakeven" --addr "127.0.0.1:$grpc" --tokens "$TOKENS" --runs "$RUNS" --workers "$WORKERS" "$@"
