#!/usr/bin/env bash
# floods.sh — clients that stall mid-command, against a fresh node:
# the node's RSS growth under 12 unfinished 7 × 16 MiB MSETs (mset), or a
# well-behaved client's latency under 1,024 stalled SETs (lockout).
#
# Usage: bench/floods.sh KVSTRATA_BINARY mset|lockout [N]
#
#   N   lockout only: how many fresh-connection SET+GET pairs to time
#       (default 200); each is retried while the node answers "max number
#       of clients reached", for up to 5 s.
#
# The node runs with --dram-capacity 256MiB --ssd-capacity 512MiB and every
# other setting at its default, on ports 16380 (RESP), 17070-17072 and
# 19090, in a temporary data directory removed afterwards. Needs python3.
set -euo pipefail

bin=$1 what=$2 n=${3:-200}
d=$(mktemp -d)
"$bin" serve --data-dir "$d" --dram-capacity 256MiB --ssd-capacity 512MiB --listen-grpc 127.0.0.1:17070 \
	--listen-data 127.0.0.1:17071 --listen-resp 127.0.0.1:16380 --listen-http 127.0.0.1:19090 \
	--cluster-raft-addr 127.0.0.1:17072 >"$d/log" 2>&1 &
pid=$!
sleep 4
python3 "$(dirname "$0")/floods.py" "$pid" 127.0.0.1:16380 "$what" "$n" || true
kill "$pid"
wait "$pid" 2>/dev/null || true
rm -rf "$d"
