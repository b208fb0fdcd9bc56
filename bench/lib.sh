# lib.sh — what the bench scripts share. A script sources it after
# `set -euo pipefail` and `cd` to the repository root:
#
#   . "$(dirname "$0")/lib.sh"
#   bench_workdir NAME     # $work, removed on exit with every process in $pids

# pids holds the processes a script started; they are killed and waited
# for on exit.
pids=()

# bench_workdir NAME makes $work, a fresh temporary directory (under
# $TMPDIR, or under BASE if given as a second argument), and arranges that
# on exit every process in $pids is killed and $work is removed — or kept,
# and its path said, with KEEP=1.
bench_workdir() {
	work=$(mktemp -d "${2:-${TMPDIR:-/tmp}}/kvstrata-$1.XXXXXX")
	trap bench_cleanup EXIT
}

bench_cleanup() {
	local pid
	for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
	for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
	if [[ ${KEEP:-0} == 1 ]]; then echo "work directory kept: $work" >&2; else rm -rf "$work"; fi
}

# need TOOL... fails, saying which, unless every tool is on the PATH.
need() {
	local tool
	for tool in "$@"; do
		command -v "$tool" >/dev/null || { echo "$(basename "$0"): $tool is not installed" >&2; exit 1; }
	done
}

# free_port prints a loopback TCP port nothing listens on.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'; }

# wait_for CMD... runs CMD until it succeeds, for up to WAIT_SECS seconds
# (120: a node with gigabytes of DRAM tier starts slowly on a busy machine).
wait_for() {
	for _ in $(seq $((${WAIT_SECS:-120} * 10))); do
		if "$@" >/dev/null 2>&1; then return 0; fi
		sleep 0.1
	done
	echo "timed out after ${WAIT_SECS:-120} s waiting for: $*" >&2
	exit 1
}

# wait_port PORT waits until something listens on 127.0.0.1:PORT.
wait_port() { wait_for bash -c "exec 3<>/dev/tcp/127.0.0.1/$1"; }

# wait_ready HOST:PORT waits until a node's /readyz there answers 200.
wait_ready() { wait_for curl -fs "http://$1/readyz"; }

# start_versitygw KEY starts versitygw (an S3-compatible server: go install
# github.com/versity/versitygw/cmd/versitygw@v1.8.0) on a free port over
# $work/s3, with credentials KEY / KEYsecret exported as AWS_ACCESS_KEY_ID and
# AWS_SECRET_ACCESS_KEY, and sets s3port once it listens.
start_versitygw() {
	local vgw
	vgw=$(command -v versitygw || echo "$(go env GOPATH)/bin/versitygw")
	[ -x "$vgw" ] || { echo "$(basename "$0"): versitygw not found; go install github.com/versity/versitygw/cmd/versitygw@v1.8.0" >&2; exit 1; }
	export AWS_ACCESS_KEY_ID=$1 AWS_SECRET_ACCESS_KEY=${1}secret
	s3port=$(free_port)
	mkdir -p "$work/s3"
	"$vgw" --access "$AWS_ACCESS_KEY_ID" --secret "$AWS_SECRET_ACCESS_KEY" --port "127.0.0.1:$s3port" posix "$work/s3" >"$work/versitygw.log" 2>&1 &
	pids+=($!)
	wait_port "$s3port"
}

# median prints the median of the numbers on stdin.
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

# ratio A B prints A/B to two decimals, or "-" when B is not positive.
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "-" }'; }

# iperf3_mbs PORT SECS runs one iperf3 stream against a fresh one-shot
# server on PORT and prints the receiver's rate in MB/s (10^6 bytes/s).
iperf3_mbs() {
	iperf3 -s -1 -p "$1" >/dev/null 2>&1 &
	local server=$! mbits=
	for _ in $(seq 50); do # the server needs a moment to listen
		if mbits=$(iperf3 -c 127.0.0.1 -p "$1" -t "$2" -f m 2>/dev/null |
			awk '/receiver/ {print $(NF-2)}') && [[ -n $mbits ]]; then
			break
		fi
		sleep 0.1
	done
	wait "$server" 2>/dev/null || true
	[[ -n $mbits ]] || { echo "iperf3 gave no result" >&2; exit 1; }
	awk -v m="$mbits" 'BEGIN { printf "%.1f", m / 8 }'
}
