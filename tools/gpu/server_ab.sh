#!/bin/bash
# dpl-server of this build against a base build's, interleaved, under
# tools/server_load.sh, on the GPU machine. After tools/gpu/stage.sh
# (DPL_STAGE_TOOLS_ONLY=1 is enough) with the base server copied to
# .gpu/suite/base-server/dpl-server (its shared libraries, if it needs any
# the machine lacks, in base-server/lib):
#   bash .gpu/suite/server_ab.sh [NPL] [ROUNDS]    (default 16,64 and 2)
# A dpl-synth qwen2.5-7b Q4_K_M with the qwen2 vocabulary; each server
# -np 64 -c 512 --queue 256, N streams of a 128-token prompt and 128
# generated tokens for each N in NPL; the servers alternate, ROUNDS times.
set -u
cd "$(dirname "$0")"
npl=${1:-16,64}; rounds=${2:-2}
[[ -f bin.tar.gz && ! -x dpl-server ]] && tar -xzf bin.tar.gz
source ./env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
m=$(q7_model) || exit 1
port=18080
run() {  # NAME BINARY [LIBDIR]
  LD_LIBRARY_PATH=${3:+$3:}${LD_LIBRARY_PATH:-} "$2" -m "$m" --device cuda --port $port -np 64 -c 512 --queue 256 \
    2>"server-$1.err" &
  local pid=$!
  for _ in $(seq 1 240); do curl -sf http://127.0.0.1:$port/health >/dev/null && break; sleep 0.5; done
  for n in ${npl//,/ }; do
    echo "-- $1, $n streams"
    bash ./server_load.sh --url http://127.0.0.1:$port -n "$n" --prompt 128 --gen 128 | grep -E "aggregate|decode|slowest"
  done
  kill -TERM $pid; wait $pid; echo "   $1 exit status $?"
}
for r in $(seq "$rounds"); do
  echo "== round $r"
  run build ./dpl-server
  [[ -x base-server/dpl-server ]] && run base base-server/dpl-server "$PWD/base-server/lib"
done
