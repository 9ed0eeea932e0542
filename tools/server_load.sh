#!/usr/bin/env bash
# Load test for dpl-server with curl alone (for machines without Node, such as
# the GPU machine; tools/server_load.js is the same test through the OpenAI
# chat endpoint): N concurrent streaming /v1/completions requests, each a
# prompt of exactly PROMPT token ids and exactly GEN generated tokens
# (ignore_eos), then every stream's time to first token and decode t/s
# (usage.completion_tokens - 1 over the time from its first to its last
# chunk), the aggregate (all generated tokens over the time from the first
# request to the last answer: prompts included) and the decode rate (the
# sum of the streams' t/s, which counts decoding only).
#
#   tools/server_load.sh [--url http://127.0.0.1:8080] [-n 16] [--prompt 128] [--gen 128] [--api-key KEY]
set -u
url=http://127.0.0.1:8080 n=16 prompt=128 gen=128 key=
while (($#)); do
  case $1 in
    --url) url=$2; shift 2 ;;
    -n) n=$2; shift 2 ;;
    --prompt) prompt=$2; shift 2 ;;
    --gen) gen=$2; shift 2 ;;
    --api-key) key=$2; shift 2 ;;
    *) echo "server_load: unknown argument $1" >&2; exit 1 ;;
  esac
done
for v in "$n" "$prompt" "$gen"; do
  [[ $v =~ ^[0-9]+$ && $v -ge 1 ]] || { echo "server_load: -n, --prompt and --gen take positive integers" >&2; exit 1; }
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
auth=()
[[ -n $key ]] && auth=(-H "Authorization: Bearer $key")

# Stream I: its prompt ids differ from the others' (no shared prefix), its
# seed is I; one line per data chunk, "TIME" or "TIME usage N".
stream() {
  local i=$1 ids
  ids=$(seq 0 $((prompt - 1)) | awk -v s="$i" '{printf "%s%d", (NR > 1 ? "," : ""), 100 + (s * 7919 + $1 * 104729) % 20000}')
  local body="{\"prompt\":[$ids],\"max_tokens\":$gen,\"ignore_eos\":true,\"stream\":true,\"seed\":$i,\"stream_options\":{\"include_usage\":true}}"
  echo "$EPOCHREALTIME" >"$tmp/$i.start"
  curl -sN "${auth[@]}" -H 'Content-Type: application/json' -d "$body" "$url/v1/completions" |
    while IFS= read -r line; do
      case $line in
        'data: [DONE]') ;;
        *'"completion_tokens":'*) echo "$EPOCHREALTIME usage $(sed 's/.*"completion_tokens":\([0-9]*\).*/\1/' <<<"$line")" ;;
        *'"error"'*) echo "$EPOCHREALTIME error $line" ;;
        data:*'"text":""'*) ;;  # an empty delta (the final finish_reason chunk)
        data:*) echo "$EPOCHREALTIME" ;;
      esac
    done >"$tmp/$i.log"
}
for ((i = 0; i < n; i++)); do stream "$i" & done
wait

awk -v n="$n" -v gen="$gen" -v dir="$tmp" 'BEGIN {
  t0 = 1e300; t1 = 0; total = 0; bad = 0
  for (i = 0; i < n; i++) {
    f = dir "/" i ".start"; getline s < f; close(f)
    first = 0; last = 0; toks = 0; err = ""
    f = dir "/" i ".log"
    while ((getline line < f) > 0) {
      split(line, w, " ")
      if (w[2] == "usage") { toks = w[3]; continue }
      if (w[2] == "error") { err = line; continue }
      if (first == 0) first = w[1]
      last = w[1]
    }
    close(f)
    if (s < t0) t0 = s
    if (last > t1) t1 = last
    if (err != "" || toks == 0) { printf "stream %3d: FAILED %s\n", i, err; bad++; continue }
    total += toks
    tps = last > first ? (toks - 1) / (last - first) : 0
    sum_tps += tps
    if ((first - s) * 1e3 > max_ttft) max_ttft = (first - s) * 1e3
    printf "stream %3d: ttft %8.1f ms, %4d tokens, %8.2f t/s\n", i, (first - s) * 1e3, toks, tps
  }
  printf "aggregate: %d streams, %d tokens in %.2f s: %.1f t/s%s\n", n, total, t1 - t0, total / (t1 - t0), bad ? sprintf(" (%d failed)", bad) : ""
  printf "decode: sum of the streams'"'"' t/s %.1f (%.2f per stream), slowest ttft %.1f ms\n", sum_tps, sum_tps / n, max_ttft
  exit bad > 0
}'
