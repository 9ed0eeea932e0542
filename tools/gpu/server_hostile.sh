#!/bin/bash
# dpl-server --device cuda (a dpl-synth qwen2.5-7b Q4_K_M, -np 64) under
# tools/server-test/hostile.js (its header, slowloris, body, memory and
# protocol groups, then SIGTERM with slow clients connected) while
# tools/server_load.sh keeps rounds of 32 streams going, on the GPU machine:
#   bash .gpu/suite/server_hostile.sh
# after tools/gpu/stage.sh (DPL_STAGE_TOOLS_ONLY=1 is enough) with
# tools/server-test/hostile.js copied beside it and a Node.js binary
# (the GPU machine has none) as node/node.xz or on PATH (NODE=...).
set -u
cd "$(dirname "$0")"
[[ -f bin.tar.gz && ! -x dpl-server ]] && tar -xzf bin.tar.gz
source ./env.sh
node=${NODE:-node}
if [[ -f node/node.xz ]]; then
  [[ -x node/node ]] || { xz -dc node/node.xz >node/node && chmod +x node/node; }
  node=node/node
fi
m=$(q7_model) || exit 1
port=18080 key=k
./dpl-server -m "$m" --device cuda --port $port -np 64 -c 512 --queue 256 --api-key $key \
  --header-timeout 2 --body-timeout 2 --max-connections 700 2>server-hostile.err &
pid=$!
for _ in $(seq 1 240); do curl -sf http://127.0.0.1:$port/health >/dev/null && break; sleep 0.5; done
rm -f hostile.done
(while [[ ! -f hostile.done ]]; do
   bash ./server_load.sh --url http://127.0.0.1:$port --api-key $key -n 32 --prompt 128 --gen 128 |
     grep -E "aggregate|FAILED"
 done) >load.log 2>&1 &
lpid=$!
"$node" hostile.js 127.0.0.1 $port $key $pid headers slowloris body memory protocol
echo "hostile.js exit status $?"
touch hostile.done
wait $lpid
echo "== the load through the abuse (rounds of 32 streams x 128 tokens)"
cat load.log
"$node" hostile.js 127.0.0.1 $port $key $pid shutdown
wait $pid; echo "dpl-server exit status $?"
tail -3 server-hostile.err
