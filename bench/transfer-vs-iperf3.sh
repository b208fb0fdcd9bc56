#!/usr/bin/env bash
# transfer-vs-iperf3.sh — the TCP data plane against its limit, iperf3, on
# loopback, side by side in one run.
#
# Each round runs iperf3 with one stream for SECS seconds, then
# BenchmarkGet (transfer/tcp) for BLOCK blocks over one connection, 16
# blocks a Get, checksums verified, for BENCHTIME. Rounds alternate so that
# both see the same machine; the figures printed are the medians over ROUNDS
# rounds, in MB/s (10^6 bytes a second, as `go test -bench` prints them).
#
# Usage: bench/transfer-vs-iperf3.sh
# Environment: PORT (random, 40000-49999), SECS (3), BENCHTIME (3s), ROUNDS (3),
#              BLOCK (1MiB; 64KiB or 4MiB also), CONNS (1; or 4).
set -euo pipefail

PORT=${PORT:-$((40000 + RANDOM % 10000))}
SECS=${SECS:-3}
BENCHTIME=${BENCHTIME:-3s}
ROUNDS=${ROUNDS:-3}
BLOCK=${BLOCK:-1MiB}
CONNS=${CONNS:-1}

cd "$(dirname "$0")/.."
. "$(dirname "$0")/lib.sh"
need iperf3
bench_workdir transfer-vs-iperf3

echo "building the transfer/tcp benchmark..."
go test -c -o "$work/tcp.test" ./transfer/tcp

# go_mbs runs BenchmarkGet once and prints its MB/s.
go_mbs() {
	"$work/tcp.test" -test.run '^$' -test.bench "^BenchmarkGet\$/^size=${BLOCK}\$/^conns=${CONNS}\$" \
		-test.benchtime "$BENCHTIME" |
		awk '/MB\/s/ { for (i = 1; i <= NF; i++) if ($(i+1) == "MB/s") print $i }'
}

: >"$work/iperf3"
: >"$work/go"
for round in $(seq "$ROUNDS"); do
	i=$(iperf3_mbs "$PORT" "$SECS")
	g=$(go_mbs)
	[[ -n $g ]] || { echo "the Go benchmark gave no result" >&2; exit 1; }
	echo "$i" >>"$work/iperf3"
	echo "$g" >>"$work/go"
	printf 'round %d: iperf3 %8.0f MB/s   transfer/tcp Get %s x%d conns %8.0f MB/s\n' \
		"$round" "$i" "$BLOCK" "$CONNS" "$g"
done

i=$(median <"$work/iperf3")
g=$(median <"$work/go")
echo
printf 'iperf3 single stream (median of %d):       %8.0f MB/s\n' "$ROUNDS" "$i"
printf 'transfer/tcp Get, %s blocks, %d conn(s):  %8.0f MB/s\n' "$BLOCK" "$CONNS" "$g"
awk -v g="$g" -v i="$i" 'BEGIN { printf "ratio (transfer/tcp : iperf3):            %8.2f\n", g / i }'
