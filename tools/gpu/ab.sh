#!/bin/bash
# Same-run A/B of this build against a baseline build (another commit's
# dpl-run and dpl-bench, packed by `tools/gpu/stage.sh BASE_BIN_DIR` into
# base/), on the GPU machine:
#   1. the GPU suite's kernel tests and end-to-end oracle checks (this build);
#   2. bitwise logits: both builds on the oracle models and a 7B-shaped model,
#      prompt path (--all-logits) and the captured decode step (one token);
#   3. dpl-bench, 7B and 14B shapes, baseline and this build interleaved, two
#      rounds each.
# Usage (device): bash .gpu/suite/ab.sh OUT_DIR [tests|bench|all]; each
# section's log lands in OUT_DIR (tests: 1 and 2, bench: 3; all by default).
set -u
cd "$(dirname "$0")"
out=${1:-/tmp/ab-out}; mkdir -p "$out"
what=${2:-all}
[[ -f bin.tar.gz ]] && tar -xzf bin.tar.gz
source ./env.sh
mkdir -p base && [[ -f base.tar.gz ]] && tar -C base -xzf base.tar.gz
T=/tmp/ab; mkdir -p $T
# Qwen2.5-7B/14B shapes with the qwen2 vocabulary (what llama.cpp was
# measured on; startup.sh tokenizes text with them too).
for m in 7b 14b; do
  [[ -f $T/q${m%b}.dpl ]] || { ./dpl-synth qwen2.5-$m $T/q.gguf --vocab shared/vocab/ggml-vocab-qwen2.gguf >/dev/null &&
    ./dpl-convert -q $T/q.gguf $T/q${m%b}.dpl >/dev/null && rm $T/q.gguf; }
done
if [[ $what != bench ]]; then
bash ./suite.sh . kernels >"$out/kernels.log" 2>&1; tail -1 "$out/kernels.log"
bash ./suite.sh . e2e >"$out/e2e.log" 2>&1; tail -1 "$out/e2e.log"
{
  same=0 differ=0
  bitwise() {  # MODEL TOKENS [--all-logits]
    ./base/dpl-run -m "$1" --tokens "$2" ${3:-} --dump-logits $T/a.f32 >/dev/null 2>&1
    ./dpl-run -m "$1" --tokens "$2" ${3:-} --dump-logits $T/b.f32 >/dev/null 2>&1
    if [[ -s $T/a.f32 ]] && cmp -s $T/a.f32 $T/b.f32; then
      echo "identical $(basename "$1") ${3:-one token} ($(stat -c %s $T/b.f32) bytes)"; same=$((same + 1))
    else
      echo "DIFFERENT $(basename "$1") ${3:-one token}"; differ=$((differ + 1))
    fi
    rm -f $T/a.f32 $T/b.f32
  }
  for m in ora-llama-f32 ora-qwen2-f32 small-llama-q4km small-qwen2-q4km; do
    ./dpl-convert -q shared/oracle/$m.gguf $T/$m.dpl >/dev/null
    tokens=$(tr -d ' \n' <shared/oracle/$m.tokens)
    bitwise $T/$m.dpl "$tokens" --all-logits
    bitwise $T/$m.dpl 17
  done
  for m in q7 q14; do
    bitwise $T/$m.dpl "$(seq -s, 11 40)" --all-logits
    bitwise $T/$m.dpl 7
  done
  echo "bitwise: $same identical, $differ different"
} >"$out/bitwise.log" 2>&1
tail -1 "$out/bitwise.log"
fi
[[ $what == tests ]] && exit 0
for m in q7 q14; do
  for round in 1 2; do
    echo "== $m base (round $round)"; ./base/dpl-bench -m $T/$m.dpl -r 3
    echo "== $m new (round $round)"; ./dpl-bench -m $T/$m.dpl -r 3
  done
done >"$out/bench.log" 2>&1
grep -E "^==|tuning|^\| (pp|tg)" "$out/bench.log"
