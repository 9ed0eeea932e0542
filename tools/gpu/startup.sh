#!/usr/bin/env bash
# Start-up and first-token times of dpl-run, on the GPU machine (issue 8):
#   bash startup.sh DIR   (DIR: an unpacked .gpu/suite, see stage.sh)
# 1. start to exit of `dpl-run -m 14B.dpl -p Hello -n 1` and of a 3254-token
#    prompt file on the 7B (`-f PROMPT -n 1`), three runs each, the file in
#    page cache (read once before); the timing block of the last run of each;
# 2. the same prompt at chunk sizes (-ub) 256..4096 (dpl-bench pp rows).
# Models: dpl-synth qwen2.5-7b / -14b with the qwen2 vocabulary (the prompt
# file is tokenized by it), converted; kept in /tmp/ab (shared with ab.sh).
set -u
dir=$(cd "${1:?DIR}" && pwd)
cd "$dir"
[[ -f bin.tar.gz ]] && tar -xzf bin.tar.gz
mkdir -p base && [[ -f base.tar.gz ]] && tar -C base -xzf base.tar.gz
source ./env.sh
T=/tmp/ab; mkdir -p $T
for m in 7b 14b; do  # the same models as ab.sh
  f=$T/q${m%b}.dpl
  [[ -f $f ]] || { ./dpl-synth qwen2.5-$m $T/q.gguf --vocab shared/vocab/ggml-vocab-qwen2.gguf >/dev/null &&
    ./dpl-convert -q $T/q.gguf $f >/dev/null && rm $T/q.gguf; }
  cat $f >/dev/null
done
prompt=prompt-3254.txt
echo "prompt tokens: $(./dpl-tokenize -m $T/q7.dpl -p "$(cat $prompt)" | tr "," "\n" | wc -l)"
wall() {  # LABEL CMD...: three runs, wall seconds each, then the last timing block
  local label=$1; shift
  local times=""
  for i in 1 2 3; do
    local t0=$(date +%s.%N)
    "$@" >/dev/null 2>$T/err.txt
    local t1=$(date +%s.%N)
    times+=" $(awk "BEGIN{printf \"%.2f\", $t1 - $t0}")"
  done
  echo "$label: start to exit$times s"
  grep -A4 "timings:" $T/err.txt | sed 's/^/    /'
  grep "cuda:" $T/err.txt | sed 's/^/    /'
}
wall "14B -p Hello -n 1" ./dpl-run -m $T/q14.dpl -p Hello -n 1 --temp 0
[[ -x base/dpl-run ]] && wall "14B -p Hello -n 1, baseline build" ./base/dpl-run -m $T/q14.dpl -p Hello -n 1 --temp 0
wall "7B -p Hello -n 1" ./dpl-run -m $T/q7.dpl -p Hello -n 1 --temp 0
wall "7B -f prompt-3254 -n 1" ./dpl-run -m $T/q7.dpl -f $prompt -n 1 --temp 0 -c 4096
for ub in 256 512 1024 2048 4096; do
  ./dpl-bench -m $T/q7.dpl -p 3254 -n 0 -d 0 -r 3 -ub $ub | grep "| pp" | sed "s/^/ub $ub: /"
done
