#!/usr/bin/env bash
# resp-cpu.sh — CPU per request of a RESP server and of redis-benchmark,
# and the machine's idle time per request, around redis-benchmark runs.
#
# Usage: bench/resp-cpu.sh -p PORT -s PID [-t OPS] [-n REQUESTS] [-c CLIENTS]
#                          [-d SIZE] [-r RUNS]
#
#   -p PORT   the server's RESP port on 127.0.0.1
#   -s PID    the server's process (a kvstrata node, redis-server, …)
#   -t OPS    redis-benchmark tests, one run each (default "set get")
#   -n N      requests per run (default 20000)
#   -c N      parallel clients (default 8)
#   -d SIZE   value size in bytes (default 65536)
#   -r RUNS   runs per test (default 3); each is printed, then the median
#
# Server and client CPU are utime+stime from /proc (of PID, and of
# redis-benchmark as time(1) reports it); idle is what /proc/stat counts
# idle or waiting for IO on all CPUs, during the run. All three are in µs
# per request. With a single-threaded client on few cores, the client's
# CPU per request, not the server's, can set the rate: compare the three
# columns, not only ops/s. Other processes' CPU shows in none of them.
set -euo pipefail

port="" pid="" ops="set get" requests=20000 clients=8 size=65536 runs=3
while getopts "p:s:t:n:c:d:r:" opt; do
	case $opt in
	p) port=$OPTARG ;;
	s) pid=$OPTARG ;;
	t) ops=$OPTARG ;;
	n) requests=$OPTARG ;;
	c) clients=$OPTARG ;;
	d) size=$OPTARG ;;
	r) runs=$OPTARG ;;
	*) sed -n '2,22p' "$0" >&2; exit 2 ;;
	esac
done
[[ -n $port && -n $pid ]] || { sed -n '2,22p' "$0" >&2; exit 2; }
. "$(dirname "$0")/lib.sh"
need redis-benchmark
[[ -r /proc/$pid/stat ]] || { echo "resp-cpu: no process $pid" >&2; exit 1; }
tck=$(getconf CLK_TCK)

# ticks of PID (utime + stime), and idle ticks of all CPUs (idle + iowait).
server_ticks() { awk '{ print $14 + $15 }' "/proc/$pid/stat"; }
idle_ticks() { awk '/^cpu / { print $5 + $6 }' /proc/stat; }

echo "redis-benchmark -p $port -t OP -n $requests -c $clients -d $size -q; µs per request"
printf "%-4s %10s %10s %10s %12s\n" op server client idle ops/s
for op in $ops; do
	rows=()
	for _ in $(seq "$runs"); do
		s0=$(server_ticks) i0=$(idle_ticks)
		out=$({ TIMEFORMAT='client %U %S'; time redis-benchmark -p "$port" -t "$op" -n "$requests" -c "$clients" -d "$size" -q; } 2>&1 | tr '\r' '\n')
		s1=$(server_ticks) i1=$(idle_ticks)
		row=$(echo "$out" | awk -v s=$((s1 - s0)) -v i=$((i1 - i0)) -v n="$requests" -v t="$tck" -v op="$op" '
			/requests per second/ && $2 ~ /^[0-9.]+$/ { rate = $2 }
			/^client / { c = $2 + $3 }
			END { if (rate == "") exit 1; printf "%-4s %10.1f %10.1f %10.1f %12.0f\n", op, s * 1e6 / t / n, c * 1e6 / n, i * 1e6 / t / n, rate }') ||
			{ echo "resp-cpu: redis-benchmark failed:" >&2; echo "$out" >&2; exit 1; }
		echo "$row"
		rows+=("$row")
	done
	for col in 2 3 4 5; do printf "%s\n" "${rows[@]}" | awk -v c=$col '{ print $c }' | median; done |
		paste -sd' ' | awk -v op="$op" '{ printf "%-4s %10.1f %10.1f %10.1f %12.0f  (median)\n", op, $1, $2, $3, $4 }'
done
