#!/usr/bin/env bash
# ucx-vs-perftest.sh — the UCX data plane against its limit, ucx_perftest on
# the same transports, side by side in one run; then the TCP data plane
# against iperf3 (bench/transfer-vs-iperf3.sh).
#
# For each block SIZE, each round runs, one after the other so that all see
# the same machine:
#   ucx_perftest -t tag_bw -s SIZE   UCX_TLS=posix,cma,self  (cma rendezvous)
#   ucx_perftest -t tag_bw -s SIZE -e  UCX_TLS=posix,cma,self
#       UCX_MM_ERROR_HANDLING=y      (endpoints with peer-failure handling,
#                                     as kvstrata makes them: UCX then leaves
#                                     cma out and moves bulk data through
#                                     posix shared memory)
#   BenchmarkGet (transfer/ucx) tls=sm, one connection, 16 blocks a Get,
#       every block checksummed
#   ucx_perftest -t tag_bw -s SIZE (-e)  UCX_TLS=tcp
#   BenchmarkGet (transfer/ucx) tls=tcp
#   BenchmarkGet (transfer/tcp), the pure-Go TCP data plane
# and prints the medians over ROUNDS rounds in MB/s (10^6 bytes a second, as
# `go test -bench` prints them; ucx_perftest's MB/s are 2^20 bytes a second
# and are converted). Both sides of every test run on this host: the Go
# benchmark serves and fetches in one process, over two UCX workers, as two
# nodes would; ucx_perftest runs a server and a client process.
#
# Then the latency of one 64 KiB Get (BenchmarkGetLatency, p50/p99) over
# UCX sm, UCX tcp and the TCP data plane, with ucx_perftest -t tag_lat
# (a one-way figure: half a round trip) for reference; and, unless
# IPERF=0, bench/transfer-vs-iperf3.sh for each size.
#
# Usage: bench/ucx-vs-perftest.sh
# Environment: SIZES ("1MiB 4MiB"), ROUNDS (3), BENCHTIME (2s), PORT
#              (random, 40000-49999), IPERF (1).
set -euo pipefail

SIZES=${SIZES:-1MiB 4MiB}
ROUNDS=${ROUNDS:-3}
BENCHTIME=${BENCHTIME:-2s}
PORT=${PORT:-$((40000 + RANDOM % 10000))}
IPERF=${IPERF:-1}

cd "$(dirname "$0")/.."
. "$(dirname "$0")/lib.sh"
need ucx_perftest
bench_workdir ucx-vs-perftest
server=
trap '[[ -z $server ]] || kill "$server" 2>/dev/null; bench_cleanup' EXIT

echo "building the transfer/ucx and transfer/tcp benchmarks..."
go test -c -tags ucx -o "$work/ucx.test" ./transfer/ucx
go test -c -o "$work/tcp.test" ./transfer/tcp

bytes() { # 1MiB -> 1048576
	case $1 in
	*MiB) echo $((${1%MiB} << 20)) ;;
	*KiB) echo $((${1%KiB} << 10)) ;;
	*) echo "$1" ;;
	esac
}

# perftest TLS TEST SIZE ITERS [FLAGS...] prints ucx_perftest's overall
# figure: bandwidth in MB/s (10^6) for *_bw tests, latency in µs for *_lat.
perftest() {
	local tls=$1 test=$2 size=$3 iters=$4
	shift 4
	local env=(UCX_TLS="$tls")
	if [[ " $* " == *" -e "* && $tls == *posix* ]]; then
		env+=(UCX_MM_ERROR_HANDLING=y) # as kvstrata sets it: see transfer/ucx/options.go
	fi
	env "${env[@]}" ucx_perftest -p "$PORT" "$@" >/dev/null 2>&1 &
	server=$!
	local line=
	for _ in $(seq 50); do # the server needs a moment to listen
		if line=$(env "${env[@]}" ucx_perftest 127.0.0.1 -p "$PORT" -t "$test" -s "$size" \
			-n "$iters" -w $((iters / 10 + 1)) -f "$@" 2>/dev/null | tail -1) && [[ -n $line ]]; then
			break
		fi
		sleep 0.1
	done
	wait "$server" 2>/dev/null || true
	server=
	[[ -n $line ]] || { echo "ucx_perftest gave no result" >&2; exit 1; }
	# iterations, overhead p50, avg, overall (µs), bandwidth avg, overall
	# (MiB/s), message rate avg, overall
	case $test in
	*_bw) awk '{ printf "%.0f", $6 * 1.048576 }' <<<"$line" ;;
	*) awk '{ printf "%.1f", $3 }' <<<"$line" ;;
	esac
}

# gobench BINARY PATTERN FIELD... runs one Go benchmark and prints the
# values before each FIELD ("MB/s", "p50-µs", "p99-µs"), on one line.
gobench() {
	local bin=$1 pattern=$2
	shift 2
	"$bin" -test.run '^$' -test.bench "$pattern" -test.benchtime "$BENCHTIME" 2>/dev/null |
		awk -v fields="$*" '/^Benchmark/ {
			n = split(fields, f, " ")
			for (k = 1; k <= n; k++) for (i = 1; i < NF; i++) if ($(i+1) == f[k]) printf "%s%s", (k > 1 ? " " : ""), $i
			print ""
		}'
}


for size in $SIZES; do
	n=$(bytes "$size")
	iters=$((2048 * 1048576 / n)) # 2 GiB a perftest run
	for f in pt_sm pt_sm_e go_sm pt_tcp pt_tcp_e go_tcp go_plain; do : >"$work/$f"; done
	echo
	echo "== ${size} blocks: ucx_perftest tag_bw vs transfer/ucx Get (MB/s)"
	for round in $(seq "$ROUNDS"); do
		a=$(perftest posix,cma,self tag_bw "$n" "$iters")
		b=$(perftest posix,cma,self tag_bw "$n" "$iters" -e)
		c=$(gobench "$work/ucx.test" "^BenchmarkGet\$/^tls=sm\$/^size=${size}\$/^conns=1\$" MB/s)
		d=$(perftest tcp tag_bw "$n" "$iters")
		e=$(perftest tcp tag_bw "$n" "$iters" -e)
		f=$(gobench "$work/ucx.test" "^BenchmarkGet\$/^tls=tcp\$/^size=${size}\$/^conns=1\$" MB/s)
		g=$(gobench "$work/tcp.test" "^BenchmarkGet\$/^size=${size}\$/^conns=1\$" MB/s)
		echo "$g" >>"$work/go_plain"
		echo "$a" >>"$work/pt_sm"
		echo "$b" >>"$work/pt_sm_e"
		echo "$c" >>"$work/go_sm"
		echo "$d" >>"$work/pt_tcp"
		echo "$e" >>"$work/pt_tcp_e"
		echo "$f" >>"$work/go_tcp"
		printf 'round %d: sm: perftest %6s, -e %6s, kvstrata %6.0f | tcp: perftest %6s, -e %6s, kvstrata %6.0f | transfer/tcp %6.0f\n' \
			"$round" "$a" "$b" "$c" "$d" "$e" "$f" "$g"
	done
	a=$(median <"$work/pt_sm")
	b=$(median <"$work/pt_sm_e")
	c=$(median <"$work/go_sm")
	d=$(median <"$work/pt_tcp")
	e=$(median <"$work/pt_tcp_e")
	f=$(median <"$work/go_tcp")
	g=$(median <"$work/go_plain")
	echo "medians of $ROUNDS rounds, ${size}:"
	printf '  shared memory  ucx_perftest %6s   ucx_perftest -e %6s   kvstrata ucx %6s   ratio %s (vs -e: %s)\n' \
		"$a" "$b" "$c" "$(ratio "$c" "$a")" "$(ratio "$c" "$b")"
	printf '  tcp            ucx_perftest %6s   ucx_perftest -e %6s   kvstrata ucx %6s   ratio %s (vs -e: %s)\n' \
		"$d" "$e" "$f" "$(ratio "$f" "$d")" "$(ratio "$f" "$e")"
	printf '  kvstrata over UCX shared memory : kvstrata tcp backend (%s MB/s)   %s\n' "$g" "$(ratio "$c" "$g")"
done

echo
echo "== one 64 KiB block: Get round trip (µs, p50 / p99) and ucx_perftest tag_lat (one way, µs)"
lsm=$(perftest posix,cma,self tag_lat 65536 20000 -e)
ltcp=$(perftest tcp tag_lat 65536 20000 -e)
read -r sm50 sm99 < <(gobench "$work/ucx.test" '^BenchmarkGetLatency$/^tls=sm$' p50-µs p99-µs)
read -r tc50 tc99 < <(gobench "$work/ucx.test" '^BenchmarkGetLatency$/^tls=tcp$' p50-µs p99-µs)
read -r pl50 pl99 < <(gobench "$work/tcp.test" '^BenchmarkGetLatency$' p50-µs p99-µs)
printf '  ucx sm   Get p50 %6s  p99 %6s   (ucx_perftest tag_lat -e %s)\n' "$sm50" "$sm99" "$lsm"
printf '  ucx tcp  Get p50 %6s  p99 %6s   (ucx_perftest tag_lat -e %s)\n' "$tc50" "$tc99" "$ltcp"
printf '  tcp      Get p50 %6s  p99 %6s\n' "$pl50" "$pl99"

if [[ $IPERF != 0 ]]; then
	for size in $SIZES; do
		echo
		echo "== the TCP data plane against iperf3, ${size} blocks"
		BLOCK=$size ROUNDS=$ROUNDS bench/transfer-vs-iperf3.sh | tail -3
	done
fi
