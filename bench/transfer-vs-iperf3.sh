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
command -v iperf3 >/dev/null || { echo "iperf3 is not installed" >&2; exit 1; }

work=$(mktemp -d)
server=
cleanup() {
	if [[ -n $server ]]; then kill "$server" 2>/dev/null || true; fi
	rm -rf "$work"
}
trap cleanup EXIT

echo "building the transfer/tcp benchmark..."
go test -c -o "$work/tcp.test" ./transfer/tcp

# iperf3_mbs runs one iperf3 client against a fresh one-shot server and
# prints the receiver's rate in MB/s.
iperf3_mbs() {
	iperf3 -s -1 -p "$PORT" >/dev/null 2>&1 &
	server=$!
	local mbits=
	for _ in $(seq 50); do # the server needs a moment to listen
		if mbits=$(iperf3 -c 127.0.0.1 -p "$PORT" -t "$SECS" -f m 2>/dev/null |
			awk '/receiver/ {print $(NF-2)}') && [[ -n $mbits ]]; then
			break
		fi
		sleep 0.1
	done
	wait "$server" 2>/dev/null || true
	server=
	[[ -n $mbits ]] || { echo "iperf3 gave no result" >&2; exit 1; }
	awk -v m="$mbits" 'BEGIN { printf "%.0f", m / 8 }'
}

# go_mbs runs BenchmarkGet once and prints its MB/s.
go_mbs() {
	"$work/tcp.test" -test.run '^$' -test.bench "^BenchmarkGet\$/^size=${BLOCK}\$/^conns=${CONNS}\$" \
		-test.benchtime "$BENCHTIME" |
		awk '/MB\/s/ { for (i = 1; i <= NF; i++) if ($(i+1) == "MB/s") print $i }'
}

median() { sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2 }'; }

: >"$work/iperf3"
: >"$work/go"
for round in $(seq "$ROUNDS"); do
	i=$(iperf3_mbs)
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
