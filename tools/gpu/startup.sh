#!/usr/bin/env bash
# Start-up and first-token times of dpl-run, on the GPU machine (issues 8, 33):
#   bash startup.sh DIR [ub]   (DIR: an unpacked .gpu/suite, see stage.sh)
# 1. start to exit of `dpl-run -m M -p Hello -n 1` for the 7B and the 14B,
#    the file in page cache (read once before), the weights uploaded each way
#    (--weights-upload auto, pin, staged; the baseline build's dpl-run when
#    packed), interleaved, three rounds: wall seconds and the load line of
#    the timing block for each run (it names the measured host copy speed and
#    which chunks were pinned or staged);
# 2. the same with the 7B's file dropped from the page cache first (cold);
# 3. dpl-server: launch to healthy and to its first token, 7B and 14B;
# 4. a 3254-token prompt file on the 7B (`-f PROMPT -n 1`), three runs;
# 5. with `ub`: that prompt at chunk sizes (-ub) 256..4096 (dpl-bench pp rows).
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
once() {  # LABEL CMD...: one run, wall seconds and the load line
  local label=$1; shift
  local t0=$(date +%s.%N)
  "$@" >/dev/null 2>$T/err.txt
  local t1=$(date +%s.%N)
  echo "$label $(awk "BEGIN{printf \"%.3f\", $t1 - $t0}") s | $(grep 'load:' $T/err.txt | sed 's/^ *//')"
}
drop() {  # the file out of the page cache
  python3 -c "import os,sys; fd=os.open(sys.argv[1], os.O_RDONLY); os.posix_fadvise(fd,0,0,os.POSIX_FADV_DONTNEED)" "$1"
}
for r in 1 2 3; do
  for m in 7 14; do
    [[ -x base/dpl-run ]] && once "base   q$m" ./base/dpl-run -m $T/q$m.dpl -p Hello -n 1 --temp 0
    for how in auto pin staged; do
      once "$(printf '%-6s' $how) q$m" ./dpl-run -m $T/q$m.dpl -p Hello -n 1 --temp 0 --weights-upload $how
    done
  done
done
for how in auto pin staged; do
  drop $T/q7.dpl
  once "cold $(printf '%-6s' $how) q7" ./dpl-run -m $T/q7.dpl -p Hello -n 1 --temp 0 --weights-upload $how
done
cat $T/q7.dpl >/dev/null
# dpl-server: launch to a healthy /health (the model loaded), then one
# 1-token completion; three rounds a model.
port=18081
for r in 1 2 3; do
  for m in 7 14; do
    t0=$(date +%s.%N)
    ./dpl-server -m $T/q$m.dpl --device cuda --port $port -c 4096 2>$T/server.err &
    pid=$!
    for _ in $(seq 1 3000); do curl -sf http://127.0.0.1:$port/health >/dev/null && break; sleep 0.01; done
    t1=$(date +%s.%N)
    curl -sf http://127.0.0.1:$port/v1/completions -H 'Content-Type: application/json' \
      -d '{"prompt":"Hello","max_tokens":1,"temperature":0}' >/dev/null
    t2=$(date +%s.%N)
    kill -TERM $pid; wait $pid
    echo "server q$m: healthy $(awk "BEGIN{printf \"%.3f\", $t1 - $t0}") s, first token $(awk "BEGIN{printf \"%.3f\", $t2 - $t0}") s | $(grep 'loaded:' $T/server.err | sed 's/^ *//')"
  done
done
wall "7B -f prompt-3254 -n 1" ./dpl-run -m $T/q7.dpl -f $prompt -n 1 --temp 0 -c 4096
[[ ${2:-} == ub ]] || exit 0
for ub in 256 512 1024 2048 4096; do
  ./dpl-bench -m $T/q7.dpl -p 3254 -n 0 -d 0 -r 3 -ub $ub | grep "| pp" | sed "s/^/ub $ub: /"
done
