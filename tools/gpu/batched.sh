#!/bin/bash
# Many sequences at once (issue 12), on the GPU machine after
# tools/gpu/stage.sh (DPL_STAGE_TOOLS_ONLY=1 is enough):
#   bash .gpu/suite/batched.sh [NPL]     (NPL default 1,4,16,64)
# On a dpl-synth qwen2.5-7b Q4_K_M with the qwen2 vocabulary:
#  1. dpl-bench's batched rows (llama-batched-bench's S_TG: -npp 128 -ntg 128);
#  2. one stream, 256 greedy tokens: dpl-run, then dpl-server -np 1 and -np 64;
#  3. dpl-server -np 64 under tools/server_load.sh: N streams of a 128-token
#     prompt and 128 generated tokens, for each N in NPL.
set -u
cd "$(dirname "$0")"
npl=${1:-1,4,16,64}
[[ -f bin.tar.gz && ! -x dpl-server ]] && tar -xzf bin.tar.gz
source ./env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
m=$(q7_model) || exit 1

echo "== dpl-bench -p 0 -n 128 -d 0 -npl $npl -npp 128 -r 3"
./dpl-bench -m "$m" -p 0 -n 128 -d 0 -npl "$npl" -npp 128 -r 3

port=18080
serve() {  # SLOTS: starts dpl-server, waits for /health
  ./dpl-server -m "$m" --device cuda --port $port -np "$1" -c 512 --queue 256 2>"server-$1.err" &
  pid=$!
  for _ in $(seq 1 240); do
    curl -sf http://127.0.0.1:$port/health >/dev/null && return 0
    sleep 0.5
  done
  echo "FAIL: dpl-server -np $1 did not come up"; tail -5 "server-$1.err"; return 1
}
stop() { kill -TERM "$pid"; wait "$pid"; echo "dpl-server exit status $?"; grep -E "cuda:" "server-$1.err" | head -2; }

echo "== one stream, 256 greedy tokens after \"Hello\""
for i in 1 2 3; do ./dpl-run -m "$m" -p Hello -n 256 --temp 0 2>&1 >/dev/null | grep -E "generated:"; done
body='{"prompt":"Hello","max_tokens":256,"temperature":0,"ignore_eos":true,"stream":true}'
for slots in 1 64; do
  serve $slots || exit 1
  for i in 1 2 3; do
    curl -sN http://127.0.0.1:$port/v1/completions -H 'Content-Type: application/json' -d "$body" |
      while IFS= read -r line; do [[ $line == data:* && $line != *DONE* ]] && echo "$EPOCHREALTIME"; done >times.txt
    awk -v s="$slots" 'NR==1{f=$1} {l=$1; c++} END{printf "  server -np %d: %d chunks, %.2f tokens/s between the first and the last\n", s, c, (c-1)/(l-f)}' times.txt
  done
  [[ $slots == 64 ]] || stop $slots
done

echo "== dpl-server -np 64 -c 512 under load: 128-token prompts, 128 tokens each"
for n in ${npl//,/ }; do
  echo "-- $n streams"
  bash ./server_load.sh --url http://127.0.0.1:$port -n "$n" --prompt 128 --gen 128 | grep -vE "^stream +([4-9]|[1-9][0-9])[0-9]*:"
done
curl -s http://127.0.0.1:$port/metrics | grep -vE "^#" | head -20
stop 64
