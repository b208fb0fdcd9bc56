#!/usr/bin/env bash
# gpu.sh — block copies between HBM and DRAM through the tiers, side by side
# with the CUDA driver's own copies of the same bytes between device memory
# and pinned host memory, and block reads from files into HBM beside a
# pread of the same bytes, on one GPU, in one run of under five minutes:
#
#  1. BenchmarkHBMDRAMCopy (tiers/hbm, built with -tags cuda) at 64 KiB,
#     1 MiB and 4 MiB: demotion (the HBM tier's copy into a DRAM
#     reservation), promotion (from DRAM's arena to the device) and a
#     round trip through the Hierarchy, each against cuMemcpyDtoHAsync /
#     cuMemcpyHtoDAsync of pinned memory; it prints the median MB/s of
#     COUNT runs and the ratio tier ÷ raw.
#  2. BenchmarkSSDToHBM (tiers/hbm) at 1 MiB and 4 MiB: a block read from
#     its file into device memory by the HBM tier's FillFromFile (a
#     promotion out of the SSD tier) — through cuFile where libcufile.so.0
#     loads (GPUDirect Storage, or cuFile's compatibility mode without the
#     nvidia-fs module), else through pinned staging buffers — against a
#     pread of the same bytes into host memory (SSD to DRAM), each read with
#     the file's pages dropped from the page cache; it prints the median
#     MB/s and the ratio fill ÷ pread. The file lies in $TMPDIR: point it at
#     the SSD (TMPDIR=/mnt/nvme/tmp).
#  3. nvidia-smi, before and after.
#  4. A kvstrata node with an HBM tier, loaded past its HBM capacity so
#     that blocks are demoted into DRAM: its kvstrata_gpu_* metrics
#     (go-nvml; they need a cgo build) and the HBM tier's counters
#     (kvstrata_tier_detail{tier="hbm"}: dma_bytes, staged_bytes,
#     pinned_host_bytes, and gds_mode with the bytes read from files each
#     way: gds_bytes, gds_compat_bytes, file_staged_bytes).
#
# Without a GPU (nvidia-smi finds none) it says so and exits 0; FAKE=1 runs
# it all on the stand-in driver the tests build from C (needs cc), to test
# the script: its numbers are memcpy's and say nothing of a GPU.
#
# It needs curl, python3 and go to build; on a machine without network, the
# module cache or a vendor directory (go mod vendor) must be there already,
# or BIN names a directory of binaries built elsewhere with -tags cuda:
# hbm.test (go test -c -tags cuda ./tiers/hbm), kvstrata and kvctl. The
# benchmarks need only hbm.test; without kvstrata and kvctl the node part
# is skipped.
#
# Usage: bench/gpu.sh
# Environment: BENCHTIME (1s), COUNT (3), FAKE (1: no GPU, the stand-in),
#              BIN (prebuilt binaries: no build),
#              HBM_MIB (512, the node's HBM tier in MiB), KEEP (1: keep the logs).
set -euo pipefail
cd "$(dirname "$0")/.."

BENCHTIME=${BENCHTIME:-1s} COUNT=${COUNT:-3} HBM_MIB=${HBM_MIB:-512}

. "$(dirname "$0")/lib.sh"

if command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
	gpu=1
	# The tests look for libcuda.so.1 in the usual directories only; name
	# the one the loader finds, wherever the driver put it.
	lib=$(ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1 / { print $NF; exit }')
	if [[ -n $lib ]]; then export KVSTRATA_LIBCUDA=$lib; fi
elif [[ ${FAKE:-0} == 1 ]]; then
	gpu=0
	need cc
	export KVSTRATA_FAKE_CUDA=1
else
	echo "gpu.sh: skipped: no GPU here (nvidia-smi finds none); FAKE=1 runs it on the stand-in driver"
	exit 0
fi
need curl python3
[[ -n ${BIN:-} ]] || need go
bench_workdir gpu

if ((gpu)); then
	echo "== nvidia-smi"
	nvidia-smi
	nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current,clocks.max.mem --format=csv
else
	echo "== NO GPU: the stand-in driver (device memory in host memory); the numbers are memcpy's"
	cc -shared -fPIC -O1 -o "$work/libfakecuda.so" gpu/cuda/cudatest/testdata/fakecuda.c
	# hbm.test builds the stand-in cuFile library itself (cufiletest); the
	# node below gets this one.
	cc -shared -fPIC -O1 -o "$work/libfakecufile.so" gpu/cufile/cufiletest/testdata/fakecufile.c
fi

if [[ -n ${BIN:-} ]]; then
	echo "== the binaries in $BIN"
	for f in hbm.test kvstrata kvctl; do
		if [[ -x $BIN/$f ]]; then ln -s "$(realpath "$BIN/$f")" "$work/$f"; fi
	done
else
	echo "== building (-tags cuda)"
	go test -c -tags cuda -o "$work/hbm.test" ./tiers/hbm
	go build -tags cuda -o "$work/" ./cmd/kvstrata ./cmd/kvctl ||
		echo "(kvstrata did not build: no node, no metrics; BIN= takes prebuilt binaries)"
	[[ $(go env CGO_ENABLED) == 1 ]] || echo "note: CGO_ENABLED=0: the node has no go-nvml metrics (kvstrata_gpu_*)"
fi
[[ -x $work/hbm.test ]] || { echo "gpu.sh: no hbm.test" >&2; exit 1; }

echo "== BenchmarkHBMDRAMCopy, -benchtime $BENCHTIME -count $COUNT"
(cd tiers/hbm && "$work/hbm.test" -test.run '^$' -test.bench 'HBMDRAMCopy' -test.benchtime "$BENCHTIME" \
	-test.count "$COUNT" -test.benchmem) | tee "$work/bench.txt"
if grep -q -e '^--- FAIL' -e '^FAIL' "$work/bench.txt"; then
	echo "gpu.sh: a benchmark failed" >&2
	exit 1
fi
if ((gpu)) && grep -q '^hbm tests run on a stand-in' "$work/bench.txt"; then
	echo "gpu.sh: the benchmarks ran on the stand-in driver although nvidia-smi sees a GPU: set KVSTRATA_LIBCUDA" >&2
	exit 1
fi

echo
echo "== MB/s, median of $COUNT (tier ÷ raw: the share of the driver's copy the tiers get)"
awk '
	/^BenchmarkHBMDRAMCopy\// {
		n = split($1, p, "/"); op = p[3]; sub(/-[0-9]+$/, "", op)
		for (i = 1; i <= NF; i++) if ($(i + 1) == "MB/s") v[p[2], op] = v[p[2], op] " " $i
		if (!(p[2] in seen)) { seen[p[2]] = 1; order[++sizes] = p[2] }
	}
	function median(s,   a, k, i, j, t) {
		k = split(s, a, " ")
		for (i = 1; i <= k; i++) for (j = i + 1; j <= k; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
		return k == 0 ? 0 : (k % 2 ? a[(k + 1) / 2] : (a[k / 2] + a[k / 2 + 1]) / 2)
	}
	END {
		printf "%-9s %-10s %10s %10s %7s\n", "size", "copy", "tier", "raw", "ratio"
		for (s = 1; s <= sizes; s++) {
			split("demote promote roundtrip", ops, " ")
			for (o = 1; o <= 3; o++) {
				t = median(v[order[s], ops[o] "-tier"]); r = median(v[order[s], ops[o] "-raw"])
				printf "%-9s %-10s %10.0f %10.0f %7s\n", order[s], ops[o], t, r, (r > 0 ? sprintf("%.2f", t / r) : "-")
			}
		}
	}' "$work/bench.txt"

echo
echo "== BenchmarkSSDToHBM, -benchtime $BENCHTIME -count $COUNT (block files in ${TMPDIR:-/tmp})"
(cd tiers/hbm && "$work/hbm.test" -test.run '^$' -test.bench 'SSDToHBM' -test.benchtime "$BENCHTIME" \
	-test.count "$COUNT" -test.benchmem) | tee "$work/bench-ssd.txt"
if grep -q -e '^--- FAIL' -e '^FAIL' "$work/bench-ssd.txt"; then
	echo "gpu.sh: a benchmark failed" >&2
	exit 1
fi
grep -E '^hbm tests of cuFile reads' "$work/bench-ssd.txt" | head -n 1 || true

echo
echo "== MB/s, median of $COUNT (fill ÷ pread: a block file into HBM against the same bytes into DRAM)"
awk '
	/^BenchmarkSSDToHBM\// {
		n = split($1, p, "/"); op = p[3]; sub(/-[0-9]+$/, "", op)
		for (i = 1; i <= NF; i++) if ($(i + 1) == "MB/s") v[p[2], op] = v[p[2], op] " " $i
		if (!(p[2] in seen)) { seen[p[2]] = 1; order[++sizes] = p[2] }
		if (op != "pread" && !((p[2], op) in known)) { known[p[2], op] = 1; ops[p[2]] = ops[p[2]] " " op }
	}
	function median(s,   a, k, i, j, t) {
		k = split(s, a, " ")
		for (i = 1; i <= k; i++) for (j = i + 1; j <= k; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
		return k == 0 ? 0 : (k % 2 ? a[(k + 1) / 2] : (a[k / 2] + a[k / 2 + 1]) / 2)
	}
	END {
		printf "%-9s %-20s %10s %10s %7s\n", "size", "read", "fill", "pread", "ratio"
		for (s = 1; s <= sizes; s++) {
			r = median(v[order[s], "pread"])
			k = split(ops[order[s]], o, " ")
			for (i = 1; i <= k; i++) {
				t = median(v[order[s], o[i]])
				printf "%-9s %-20s %10.0f %10.0f %7s\n", order[s], o[i], t, r, (r > 0 ? sprintf("%.2f", t / r) : "-")
			}
		}
	}' "$work/bench-ssd.txt"

echo
echo "== a node with a $HBM_MIB MiB HBM tier, loaded with 1 MiB blocks past it"
if [[ ! -x $work/kvstrata || ! -x $work/kvctl ]]; then
	echo "(skipped: no kvstrata and kvctl built with -tags cuda)"
	exit 0
fi
grpc=127.0.0.1:$(free_port) http=127.0.0.1:$(free_port)
((gpu)) || export KVSTRATA_LIBCUDA=$work/libfakecuda.so KVSTRATA_LIBCUFILE=$work/libfakecufile.so
"$work/kvstrata" serve --data-dir "$work/node" --hbm-capacity "${HBM_MIB}MiB" --dram-capacity 1GiB --ssd-capacity 1GiB \
	--listen-grpc "$grpc" --listen-data "127.0.0.1:$(free_port)" --listen-resp "" --listen-http "$http" \
	--cluster-raft-addr "127.0.0.1:$(free_port)" >"$work/node.log" 2>&1 &
pids+=($!)
wait_ready "$http"
keys=$((HBM_MIB * 3 / 2 / 16 * 16)) # half as much again as the HBM tier holds
timeout 120 "$work/kvctl" --addr "$grpc" bench --op put --size 1MiB --keys "$keys" --batch 16 \
	--requests $((keys / 16)) -c 2 | tail -n 3 || echo "(kvctl bench failed: see the node's log)"
curl -fs "http://$http/metrics" >"$work/metrics.txt"
grep -E '^kvstrata_gpu_' "$work/metrics.txt" || echo "(no kvstrata_gpu_* metrics: no NVML here, or a binary built without cgo)"
grep -E '^kvstrata_tier_detail\{[^}]*tier="hbm"' "$work/metrics.txt" || echo "(no HBM tier counters: see the node's log)"
grep -E '^kvstrata_tier_(evictions|demotions|promotions)_total\{[^}]*tier="(hbm|dram)"' "$work/metrics.txt" || true
grep -F 'hbm tier:' "$work/node.log" || true

if ((gpu)); then
	echo
	echo "== nvidia-smi after"
	nvidia-smi --query-gpu=name,utilization.gpu,memory.used,memory.total,power.draw,temperature.gpu,pcie.link.gen.current,pcie.link.width.current --format=csv
fi
