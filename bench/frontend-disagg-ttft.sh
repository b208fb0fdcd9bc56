#!/bin/bash
# TTFT of a long prompt through `kvstrata frontend`, aggregated vs disaggregated, with tiny.
# Usage: bench/frontend-disagg-ttft.sh [BIN]  (default: builds ./cmd/kvstrata into a temporary dir)
set -e
D=$(mktemp -d); trap 'kill $(jobs -p) 2>/dev/null; wait; rm -rf $D' EXIT
B=${1:-}
if [ -z "$B" ]; then go build -o "$D/kvstrata" ./cmd/kvstrata; B=$D/kvstrata; fi
$B serve --data-dir $D/n --dram-capacity 256MiB --ssd-capacity 512MiB --listen-grpc 127.0.0.1:41070 \
  --listen-data 127.0.0.1:41071 --listen-resp "" --listen-http 127.0.0.1:41090 --cluster-raft-addr 127.0.0.1:41072 >$D/n.log 2>&1 &
sleep 2
w() { $B worker --model tiny --role $1 --listen 127.0.0.1:$2 --cache 127.0.0.1:41070 --kv-events tcp://127.0.0.1:$3 --kv-events-replay tcp://127.0.0.1:$(($3+100)) --num-gpu-blocks 2048 >$D/$2.log 2>&1 & }
w aggregated 41001 41501; w prefill 41002 41502; w decode 41003 41503
for p in 41001 41002 41003; do n=0; until curl -sf 127.0.0.1:$p/health >/dev/null; do sleep 0.2; n=$((n+1)); [ $n -lt 600 ] || { echo "$p not healthy"; exit 1; }; done; done
$B frontend --model tiny --cache 127.0.0.1:41070 --listen 127.0.0.1:41080 --worker http://127.0.0.1:41001,events=tcp://127.0.0.1:41501 >$D/fa.log 2>&1 &
$B frontend --model tiny --cache 127.0.0.1:41070 --listen 127.0.0.1:41081 --worker http://127.0.0.1:41002,events=tcp://127.0.0.1:41502,role=prefill \
  --worker http://127.0.0.1:41003,events=tcp://127.0.0.1:41503,role=decode >$D/fd.log 2>&1 &
for p in 41080 41081; do n=0; until curl -sf 127.0.0.1:$p/health >/dev/null; do sleep 0.2; n=$((n+1)); [ $n -lt 600 ] || { echo "$p not healthy"; exit 1; }; done; done
words=$(python3 -c "import random; r=random.Random(7); print(' '.join(r.choice(['cache','block','tier','prefill','decode','worker','router','token','stream','layer']) for _ in range(1400)))")
for i in 1 2 3 4 5; do
  for fe in 41080 41081; do  # a prompt new to every pool and to the cache
    curl -s 127.0.0.1:$fe/v1/completions -H 'Content-Type: application/json' \
      -d "{\"model\": \"kvstrata-tiny\", \"prompt\": \"$fe $i $words\", \"max_tokens\": 16, \"ignore_eos\": true, \"stream\": true}" >/dev/null
  done
done
for fe in 41080 41081; do
  curl -s 127.0.0.1:$fe/metrics | grep -E '^kvstrata_frontend_(time_to_first_token_seconds|request_duration_seconds)_(sum|count)|^kvstrata_frontend_input_sequence_tokens_(sum|count)'
done
