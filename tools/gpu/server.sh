#!/bin/bash
# One stream through dpl-server --device cuda against dpl-run, on the GPU
# machine (after tools/gpu/stage.sh with DPL_STAGE_SERVER=1):
#   bash .gpu/suite/server.sh MODEL.dpl [N_TOKENS]
# The model needs a vocabulary (dpl-synth --vocab). Each side generates
# N_TOKENS (default 256) greedy tokens after the prompt "Hello", three
# times; dpl-run reports its own generation t/s, the server's t/s is taken
# from the streamed chunks' arrival times: (chunks - 1) / (last - first).
set -u
cd "$(dirname "$0")"
m=${1:?MODEL}; n=${2:-256}
[[ -f bin.tar.gz && ! -x dpl-server ]] && tar -xzf bin.tar.gz
source ./env.sh
for i in 1 2 3; do
  ./dpl-run -m "$m" -p Hello -n "$n" --temp 0 2>&1 >/dev/null | grep -E "generated:"
done
port=18080
./dpl-server -m "$m" --device cuda --port $port -c 4096 2>server.err &
pid=$!
for _ in $(seq 1 120); do
  curl -sf http://127.0.0.1:$port/health >/dev/null && break
  sleep 0.5
done
body=$(printf '{"prompt":"Hello","max_tokens":%d,"temperature":0,"ignore_eos":true,"stream":true}' "$n")
for i in 1 2 3; do
  curl -sN http://127.0.0.1:$port/v1/completions -H 'Content-Type: application/json' -d "$body" |
    while IFS= read -r line; do [[ $line == data:* && $line != *DONE* ]] && echo "$EPOCHREALTIME"; done >times.txt
  awk -v n="$n" 'NR==1{f=$1} {l=$1; c++} END{printf "  server:    %d chunks, %.2f tokens/s between the first and the last\n", c, (c-1)/(l-f)}' times.txt
done
kill -TERM $pid; wait $pid; echo "dpl-server exit status $?"
tail -3 server.err
