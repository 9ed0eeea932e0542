#!/bin/bash
# Issue 30's server loads on the GPU machine, A/B on one binary (after
# tools/gpu/stage.sh; DPL_STAGE_TOOLS_ONLY=1 is enough):
#   bash .gpu/suite/server_reuse.sh
# 1. a 2,000-token shared start (a system prompt) with 50 tokens of each
#    request's own, one request at a time (the first runs the start, the
#    others copy it): time to first token and cached tokens;
# 2. for -ub 512 with and without mixed steps (DPL_MIXED_STEPS) and -ub 2048
#    with them: 16 streams of that shared start after one warm-up request
#    (`server_load.sh --shared 2000 --prompt 50 --warm`), and 64 streams of
#    128-token prompts and 128 tokens each (`-np 64 -c 512`); after each
#    load the server's engine seconds on prompts and on decode steps.
# A dpl-synth qwen2.5-7b Q4_K_M with the qwen2 vocabulary (env.sh q7_model).
set -u
cd "$(dirname "$0")"
[[ -f bin.tar.gz && ! -x dpl-server ]] && tar -xzf bin.tar.gz
source ./env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
model=$(q7_model) || exit 1
port=18091
metrics() {
  curl -s http://127.0.0.1:$port/metrics | sed -n -E 's/^dpl_(prompt_seconds_total|tokens_predicted_seconds_total|prompt_tokens_total|prompt_tokens_copied_total) /\1 /p' | tr '\n' ' '
  echo
}
serve() {  # MIXED ARGS...: a server (DPL_MIXED_STEPS=MIXED) answering /health
  DPL_MIXED_STEPS=$1 ./dpl-server -m "$model" --device cuda --port $port "${@:2}" 2>server.err &
  pid=$!
  for _ in $(seq 1 3000); do curl -sf http://127.0.0.1:$port/health >/dev/null && break; sleep 0.01; done
}
shared=$(seq 0 1999 | awk '{printf "%d,", 100 + (7 + $1 * 7727) % 20000}')  # server_load.sh's --shared ids
one() {  # SEED: one streamed request, the shared start and 50 ids of its own
  local ids=$shared$(seq 0 49 | awk -v s="$1" '{printf "%s%d", (NR > 1 ? "," : ""), 100 + (s * 7919 + $1 * 104729) % 20000}')
  local t0=$EPOCHREALTIME first=
  while IFS= read -r line; do
    [[ -z $first && $line == data:* ]] && first=$EPOCHREALTIME
    echo "$line"
  done < <(curl -sN http://127.0.0.1:$port/v1/completions -H 'Content-Type: application/json' \
    -d "{\"prompt\":[$ids],\"max_tokens\":4,\"stream\":true,\"stream_options\":{\"include_usage\":true}}") >one.txt
  echo "request $1: first token $(awk "BEGIN{printf \"%.1f\", ($first - $t0) * 1e3}") ms, $(sed -n 's/.*"cached_tokens":\([0-9]*\).*/\1/p' one.txt) tokens cached"
}
echo "=== one request at a time, -np 16 -c 4096"
serve 0 -np 16 -c 4096
for s in 101 102 103 104; do one $s; done
metrics
kill -TERM $pid; wait $pid
for cfg in "512 1" "512 0" "2048 1"; do
  read -r ub mixed <<<"$cfg"
  echo "=== -ub $ub, DPL_MIXED_STEPS=$mixed: 16 streams, a shared 2000 + 50 own, warm (-np 16 -c 4096)"
  serve "$mixed" -np 16 -c 4096 -ub "$ub"
  timeout 60 bash server_load.sh --url http://127.0.0.1:$port -n 16 --gen 32 --shared 2000 --prompt 50 --warm | tail -3
  metrics
  kill -TERM $pid; wait $pid
  echo "--- 64 streams of 128 + 128 (-np 64 -c 512)"
  serve "$mixed" -np 64 -c 512 -ub "$ub"
  timeout 60 bash server_load.sh --url http://127.0.0.1:$port -n 64 --prompt 128 --gen 128 | tail -3
  metrics
  kill -TERM $pid; wait $pid
done
