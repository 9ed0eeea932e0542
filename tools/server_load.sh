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
# --shared S puts the same S token ids before every stream's own prompt (a
# system prompt); --warm first runs one such request alone (not counted), so
# the shared start is in a slot's cache before the streams arrive. Each
# stream's line names the prompt tokens the server found cached.
# --turns K replays K-turn chats instead: each stream's turn resends its
# history (the previous prompt, its answer as the server tokenizes the
# text, then --prompt new ids); per turn, the time to first token (median,
# slowest) and the prompt tokens found cached.
#
#   tools/server_load.sh [--url http://127.0.0.1:8080] [-n 16] [--prompt 128] [--gen 128]
#                        [--shared 0] [--warm] [--turns 0] [--api-key KEY]
set -u
url=http://127.0.0.1:8080 n=16 prompt=128 gen=128 key= shared=0 warm= turns=0
while (($#)); do
  case $1 in
    --url) url=$2; shift 2 ;;
    -n) n=$2; shift 2 ;;
    --prompt) prompt=$2; shift 2 ;;
    --gen) gen=$2; shift 2 ;;
    --shared) shared=$2; shift 2 ;;
    --warm) warm=1; shift ;;
    --turns) turns=$2; shift 2 ;;
    --api-key) key=$2; shift 2 ;;
    *) echo "server_load: unknown argument $1" >&2; exit 1 ;;
  esac
done
for v in "$n" "$prompt" "$gen"; do
  [[ $v =~ ^[0-9]+$ && $v -ge 1 ]] || { echo "server_load: -n, --prompt and --gen take positive integers" >&2; exit 1; }
done
[[ $shared =~ ^[0-9]+$ ]] || { echo "server_load: --shared takes a count of tokens (0 or more)" >&2; exit 1; }
[[ $turns =~ ^[0-9]+$ ]] || { echo "server_load: --turns takes a count of turns (0 or more)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
auth=()
[[ -n $key ]] && auth=(-H "Authorization: Bearer $key")

# The shared start: the same ids for every stream (none with --shared 0).
shared_ids=$( ((shared > 0)) && seq 0 $((shared - 1)) | awk '{printf "%d,", 100 + (7 + $1 * 7727) % 20000}')
# PROMPT ids of stream I's own (turn T's), different for every stream and turn.
own_ids() {
  seq 0 $((prompt - 1)) | awk -v s="$1" -v t="${2:-0}" '{printf "%s%d", (NR > 1 ? "," : ""), 100 + (s * 7919 + t * 3571 + $1 * 104729) % 20000}'
}
# One request of stream I (its seed) under the name TAG with prompt IDS:
# $tmp/TAG.start, $tmp/TAG.log (one line per data chunk, "TIME" or "TIME
# usage N CACHED") and $tmp/TAG.txt (the answer, still JSON-escaped).
request() {
  local i=$1 tag=$2 ids=$3
  local body="{\"prompt\":[$ids],\"max_tokens\":$gen,\"ignore_eos\":true,\"stream\":true,\"seed\":$i,\"stream_options\":{\"include_usage\":true}}"
  : >"$tmp/$tag.txt"
  echo "$EPOCHREALTIME" >"$tmp/$tag.start"
  curl -sN "${auth[@]}" -H 'Content-Type: application/json' -d "$body" "$url/v1/completions" |
    while IFS= read -r line; do
      case $line in
        'data: [DONE]') ;;
        *'"completion_tokens":'*)
          local cached=0
          [[ $line == *'"cached_tokens":'* ]] && cached=$(sed 's/.*"cached_tokens":\([0-9]*\).*/\1/' <<<"$line")
          echo "$EPOCHREALTIME usage $(sed 's/.*"completion_tokens":\([0-9]*\).*/\1/' <<<"$line") $cached" ;;
        *'"error"'*) echo "$EPOCHREALTIME error $line" ;;
        data:*'"text":""'*) ;;  # an empty delta (the final finish_reason chunk)
        data:*) echo "$EPOCHREALTIME"
          echo "$line" >>"$tmp/$tag.raw" ;;
      esac
    done >"$tmp/$tag.log"
  # The answer's text from its chunks, once the stream has ended (a process
  # a chunk, as this once ran, is 8,192 forks for 64 x 128 tokens: on the
  # clients' cores beside the server's, and late timestamps).
  if [[ -f $tmp/$tag.raw ]]; then
    sed -E 's/.*"text":"(([^"\\]|\\.)*)".*/\1/' "$tmp/$tag.raw" | tr -d '\n' >"$tmp/$tag.txt"
  fi
}
stream() { request "$1" "$1" "$shared_ids$(own_ids "$1")"; }
# --turns: stream I's chat, each turn's prompt its history (the last prompt
# and its answer, tokenized by the server) and new ids.
chat() {
  local i=$1 ids=$shared_ids$(own_ids "$1" 0) answer
  for ((t = 0; t < turns; t++)); do
    request "$i" "$i.$t" "$ids"
    answer=$(curl -s "${auth[@]}" -H 'Content-Type: application/json' \
      -d "{\"content\":\"$(cat "$tmp/$i.$t.txt")\",\"add_special\":false}" "$url/tokenize" |
      sed -E 's/.*"tokens":\[([0-9,]*)\].*/\1/')
    ids=$ids${answer:+,$answer},$(own_ids "$i" $((t + 1)))
  done
}
if ((turns > 0)); then
  for ((i = 0; i < n; i++)); do chat "$i" & done
  wait
  # Per turn: every stream's time to first token and the prompt tokens the
  # server found cached (each turn after the first: its history).
  for ((t = 0; t < turns; t++)); do
    for ((i = 0; i < n; i++)); do
      awk -v s="$(cat "$tmp/$i.$t.start")" '$2 == "usage" {c = $4; u = 1} $2 == "error" {e = 1} NF == 1 && !f {f = $1}
        END {printf "%.1f %d %d\n", (f - s) * 1e3, c, (e || !u)}' "$tmp/$i.$t.log"
    done | sort -n | awk -v t="$t" '{ttft[NR] = $1; c += $2; bad += $3} END {
      printf "turn %d: ttft median %.1f ms, slowest %.1f ms; %d prompt tokens cached in all%s\n", t + 1,
        NR % 2 ? ttft[(NR + 1) / 2] : (ttft[NR / 2] + ttft[NR / 2 + 1]) / 2, ttft[NR], c, bad ? sprintf(" (%d failed)", bad) : ""}'
  done
  exit 0
fi
if [[ -n $warm ]]; then
  stream "$n" && awk '$2 == "usage" {found = 1} END {exit !found}' "$tmp/$n.log" ||
    { echo "server_load: the warm-up request failed" >&2; exit 1; }
fi
for ((i = 0; i < n; i++)); do stream "$i" & done
wait

awk -v n="$n" -v gen="$gen" -v dir="$tmp" 'BEGIN {
  t0 = 1e300; t1 = 0; total = 0; bad = 0
  for (i = 0; i < n; i++) {
    f = dir "/" i ".start"; getline s < f; close(f)
    first = 0; last = 0; toks = 0; cached = 0; err = ""
    f = dir "/" i ".log"
    while ((getline line < f) > 0) {
      split(line, w, " ")
      if (w[2] == "usage") { toks = w[3]; cached = w[4]; continue }
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
    ttft[++ok] = (first - s) * 1e3
    printf "stream %3d: ttft %8.1f ms, %4d tokens, %8.2f t/s, %d prompt tokens cached\n", i, (first - s) * 1e3, toks, tps, cached
  }
  for (i = 1; i <= ok; i++) for (j = i + 1; j <= ok; j++) if (ttft[j] < ttft[i]) { x = ttft[i]; ttft[i] = ttft[j]; ttft[j] = x }
  median = ok == 0 ? 0 : (ok % 2 ? ttft[(ok + 1) / 2] : (ttft[ok / 2] + ttft[ok / 2 + 1]) / 2)
  printf "aggregate: %d streams, %d tokens in %.2f s: %.1f t/s%s\n", n, total, t1 - t0, total / (t1 - t0), bad ? sprintf(" (%d failed)", bad) : ""
  printf "decode: sum of the streams'"'"' t/s %.1f (%.2f per stream), slowest ttft %.1f ms\n", sum_tps, sum_tps / n, max_ttft
  printf "ttft: median %.1f ms, slowest %.1f ms\n", median, max_ttft
  exit bad > 0
}'
