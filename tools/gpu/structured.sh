#!/bin/bash
# Issue 32's bar on the GPU: what a json_schema request costs a token against
# free text, one stream through dpl-server --device cuda -np 1 (after
# tools/gpu/stage.sh; needs dpl-server, dpl-synth, dpl-convert):
#   bash tools/gpu/structured.sh SUITE_DIR [MODEL.dpl]
# (DPL_DEVICE=cpu runs it against the CPU device: a check of the script on a
# machine without a GPU, with a small dpl-synth model given as MODEL.dpl.)
# Each request is /v1/completions with response_format, temperature 1,
# max_tokens 400, ignore_eos, one of three seeds; the figure is the
# request's wall time over its usage.completion_tokens (ms a token, HTTP
# included); the first 200 characters of each answer are printed once (the
# check that the schema held).
set -u
suite=${1:?usage: structured.sh SUITE_DIR [MODEL.dpl]}
cd "$suite" || exit 1
[[ -f bin.tar.gz && ! -x dpl-server ]] && tar -xzf bin.tar.gz
source ./env.sh
m=${2:-$(q7_model)} || exit 1
port=18081
./dpl-server -m "$m" --device "${DPL_DEVICE:-cuda}" --port $port -c 4096 -np 1 2>structured.err &
pid=$!
for _ in $(seq 1 240); do
  curl -sf http://127.0.0.1:$port/health >/dev/null && break
  sleep 0.5
done
# minItems keeps a random-weight model's answer open (it would close an
# array at once: "[]"), so every request runs its 400 tokens.
schema_strings='{"type":"array","items":{"type":"string"},"minItems":200}'
schema_ints='{"type":"array","items":{"type":"integer"},"minItems":200}'
schema_objects='{"type":"array","items":{"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"}},"required":["name","age"]},"minItems":100}'
# request KIND SEED: prints "ms_per_token tokens"
request() {
  local fmt=
  case $1 in
    free) ;;
    strings) fmt=",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"a\",\"schema\":$schema_strings}}" ;;
    ints) fmt=",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"a\",\"schema\":$schema_ints}}" ;;
    objects) fmt=",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"a\",\"schema\":$schema_objects}}" ;;
  esac
  local body="{\"prompt\":\"List some things:\",\"max_tokens\":400,\"temperature\":1,\"seed\":$2,\"ignore_eos\":true$fmt}"
  local t0=$EPOCHREALTIME
  local r; r=$(curl -s http://127.0.0.1:$port/v1/completions -H 'Content-Type: application/json' -d "$body")
  local t1=$EPOCHREALTIME
  local n; n=$(grep -o '"completion_tokens":[0-9]*' <<<"$r" | cut -d: -f2)
  [[ -z $n ]] && { echo "error: ${r:0:300}"; return; }
  awk -v a="$t0" -v b="$t1" -v n="$n" 'BEGIN{printf "%.3f ms/token over %d tokens", (b-a)*1000/n, n}'
  [[ $2 == 1 ]] && printf ' | %s' "$(grep -o '"text":"[^"\\]*\(\\.[^"\\]*\)*' <<<"$r" | head -c 200)"
  echo
}
# The first request of each kind warms the graph and the vocabulary's trie
# (built on a thread at engine start), then three seeds, kinds interleaved.
for k in free strings ints objects; do request $k 0 >/dev/null; done
for s in 1 2 3; do
  for k in free strings ints objects; do
    echo "seed $s $k: $(request $k $s)"
  done
done
kill -TERM $pid; wait $pid; echo "dpl-server exit status $?"
tail -3 structured.err
