#!/usr/bin/env bash
# ssd-fio.sh — the SSD tier against its limit, fio, on the same disk, side
# by side in one run.
#
# Each round runs fio sequential 1 MiB writes and reads of SIZE bytes
# (O_DIRECT, and buffered: the buffered write ends with an fsync, the
# buffered read starts with the file dropped from the page cache), then the
# Go benchmarks of tiers/ssd once each: BenchmarkPut1MiB in both durability
# modes and BenchmarkPlainFileWrite1MiB (the same bytes, sequential writes
# to one os.File, then fsync), BenchmarkGet1MiB and
# BenchmarkPlainFileRead1MiB (round-robin over 256 MiB written just before,
# so from the page cache), and BenchmarkGetCold1MiB and
# BenchmarkPlainFileReadCold1MiB (the same, with every file's pages dropped
# from the page cache before each pass: reads from the disk), and
# BenchmarkChainCold1MiB (chains of 64 blocks restored from the disk, each
# with one GetMany where the tier has it). Beside the cold Gets, which are
# random reads (block hashes scatter the blocks), fio reads 1 MiB blocks at
# random offsets (--rw=randread, psync: one read at a time), buffered from a
# cold cache and O_DIRECT. "Cold" is the same for all: the files' pages are
# dropped from the page cache (posix_fadvise DONTNEED; fio's --invalidate=1
# does the same) before each pass. Rounds alternate so that all see the same
# machine; the figures printed are the medians over ROUNDS rounds, in MB/s
# (10^6 bytes a second, as `go test -bench` prints them), with the tier's
# write amplification (bytes written to disk / bytes put).
#
# Usage: bench/ssd-fio.sh [DIR]
#   DIR   a directory on the disk to measure (default: a new one under
#         ${TMPDIR:-/tmp}); the script works in a subdirectory it removes.
# Environment: SIZE (1g, fio's file size), BENCHTIME (1024x: 1 GiB a write
#              benchmark), ROUNDS (3), READS_ONLY (unset; 1 skips the write
#              benchmarks, whose rows then print as 0).
set -euo pipefail

SIZE=${SIZE:-1g}
BENCHTIME=${BENCHTIME:-1024x}
ROUNDS=${ROUNDS:-3}
READS_ONLY=${READS_ONLY:-}

cd "$(dirname "$0")/.."
. "$(dirname "$0")/lib.sh"
need fio
base=${1:-${TMPDIR:-/tmp}}
mkdir -p "$base"
bench_workdir ssd-fio "$base"

go test -c -o "$work/ssd.test" ./tiers/ssd

# fio_mbs JOBNAME FIO-ARGS...: one fio job on $work/fio.dat; prints MB/s.
fio_mbs() {
	local name=$1
	shift
	fio --name="$name" --filename="$work/fio.dat" --size="$SIZE" --bs=1M --ioengine=psync \
		--numjobs=1 "$@" |
		sed -nE 's/.*(READ|WRITE): bw=[^(]*\(([0-9.]+)([kMG]?)B\/s\).*/\2 \3/p' |
		awk '{ m = ($2 == "G") ? 1000 : ($2 == "k") ? 0.001 : ($2 == "") ? 0.000001 : 1; printf "%.1f\n", $1 * m; found = 1 }
			END { if (!found) exit 1 }'
}

: >"$work/results"
for round in $(seq "$ROUNDS"); do
	echo "round $round of $ROUNDS" >&2
	{
		if [ -z "$READS_ONLY" ]; then
			echo "fio-write-direct $(fio_mbs write-direct --rw=write --direct=1)"
			echo "fio-write-buffered $(fio_mbs write-buffered --rw=write --direct=0 --end_fsync=1)"
		else
			fio_mbs lay-out --rw=write --direct=0 --end_fsync=1 >/dev/null
		fi
		echo "fio-read-direct $(fio_mbs read-direct --rw=read --direct=1)"
		echo "fio-read-buffered $(fio_mbs read-buffered --rw=read --direct=0 --invalidate=1)"
		echo "fio-randread-direct $(fio_mbs randread-direct --rw=randread --direct=1)"
		echo "fio-randread-buffered $(fio_mbs randread-buffered --rw=randread --direct=0 --invalidate=1)"
		rm -f "$work/fio.dat"
		benches='Get1MiB|PlainFileRead1MiB|GetCold1MiB|PlainFileReadCold1MiB|ChainCold1MiB'
		[ -n "$READS_ONLY" ] || benches="Put1MiB|PlainFileWrite1MiB|$benches"
		KVSTRATA_BENCH_DIR=$work "$work/ssd.test" -test.run '^$' \
			-test.bench "^Benchmark($benches)\$" \
			-test.benchtime "$BENCHTIME" |
			awk '/^Benchmark/ {
				name = $1; sub(/-[0-9]+$/, "", name); sub(/^Benchmark/, "", name)
				for (i = 2; i < NF; i++) {
					if ($(i + 1) == "MB/s") print name, $i
					if ($(i + 1) == "write-amp") print name "/write-amp", $i
				}
			}'
	} | tee -a "$work/results" >&2
done

xratio() { echo "$(ratio "$1" "$2")x"; }
get() { awk -v k="$1" '$1 == k { print $2 }' "$work/results" | median; }

fwd=$(get fio-write-direct) fwb=$(get fio-write-buffered) frd=$(get fio-read-direct) frb=$(get fio-read-buffered)
pw=$(get PlainFileWrite1MiB) pr=$(get PlainFileRead1MiB)
pf=$(get Put1MiB/durability=flush) pwal=$(get Put1MiB/durability=wal) g=$(get Get1MiB)
gc=$(get GetCold1MiB) prc=$(get PlainFileReadCold1MiB) cc=$(get ChainCold1MiB)
frrd=$(get fio-randread-direct) frrb=$(get fio-randread-buffered)
: "${fwd:=0}" "${fwb:=0}" "${pw:=0}" "${pf:=0}" "${pwal:=0}"

echo
echo "disk: $(df -h "$work" | awk 'NR == 2 { print $1, $2 }')  dir: $base  fio size: $SIZE  Go benchtime: $BENCHTIME  (median of $ROUNDS rounds, MB/s)"
printf "%-40s %10s %12s %12s\n" "" MB/s "vs plain" "vs fio buf"
printf "%-40s %10.0f\n" "fio seq write 1M, O_DIRECT" "$fwd"
printf "%-40s %10.0f\n" "fio seq write 1M, buffered + fsync" "$fwb"
printf "%-40s %10.0f %12s %12s\n" "plain file write (Go), + fsync" "$pw" "" "$(xratio "$pw" "$fwb")"
printf "%-40s %10.0f %12s %12s   write-amp %s\n" "ssd Put, durability=flush (default)" "$pf" "$(xratio "$pf" "$pw")" "$(xratio "$pf" "$fwb")" "$(get Put1MiB/durability=flush/write-amp)"
printf "%-40s %10.0f %12s %12s   write-amp %s\n" "ssd Put, durability=wal" "$pwal" "$(xratio "$pwal" "$pw")" "$(xratio "$pwal" "$fwb")" "$(get Put1MiB/durability=wal/write-amp)"
printf "%-40s %10.0f\n" "fio seq read 1M, O_DIRECT" "$frd"
printf "%-40s %10.0f\n" "fio seq read 1M, buffered, cold cache" "$frb"
printf "%-40s %10.0f\n" "plain file read (Go), page cache" "$pr"
printf "%-40s %10.0f %12s\n" "ssd Get, page cache, block cache missed" "$g" "$(xratio "$g" "$pr")"
printf "%-40s %10.0f %12s %12s\n" "plain file read (Go), cold cache" "$prc" "" "$(xratio "$prc" "$frb")"
printf "%-40s %10.0f %12s %12s\n" "ssd Get, cold cache" "$gc" "$(xratio "$gc" "$prc")" "$(xratio "$gc" "$frb")"
printf "%-40s %10.0f %12s %12s\n" "ssd chain of 64 (GetMany), cold cache" "$cc" "$(xratio "$cc" "$prc")" "$(xratio "$cc" "$frb")"
printf "%-40s %10.0f %12s %12s\n" "fio randread 1M, O_DIRECT" "$frrd" "" "$(xratio "$frrd" "$frrb")"
printf "%-40s %10.0f %12s %12s\n" "fio randread 1M, buffered, cold cache" "$frrb" "" ""
printf "%-40s %10.0f %12s %12s\n" "ssd Get vs fio randread, buffered" "$gc" "" "$(xratio "$gc" "$frrb")"
printf "%-40s %10.0f %12s %12s\n" "ssd Get vs fio randread, O_DIRECT" "$gc" "" "$(xratio "$gc" "$frrd")"
