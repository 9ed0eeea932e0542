#!/bin/bash
# Decode and prompt speed of the weight-type mixes and architectures of
# issue 9, on the GPU machine (after tools/gpu/stage.sh):
#   bash .gpu/suite/types.sh OUT_DIR [SPEC...]
# SPEC = PRESET:FTYPE[:LAYOUT] (default: the issue's files: Qwen2.5-7B shape in
# Q4_K_M, Q5_K_M, Q6_K and Q8_0 -- the last in both layouts -- and Qwen3-8B in
# Q4_K_M). Each model is dpl-synth'd with the qwen2 vocabulary, converted
# (--layout LAYOUT, default auto), benchmarked with `dpl-bench -r 3`
# (pp512, tg128, tg128 @ d3254) and deleted; with base/dpl-bench packed
# (stage.sh BASE_BIN_DIR), the baseline build runs the same file first.
set -u
cd "$(dirname "$0")"
out=${1:-/tmp/types-out}; shift || true
mkdir -p "$out"
[[ -f bin.tar.gz ]] && tar -xzf bin.tar.gz
source ./env.sh
mkdir -p base && [[ -f base.tar.gz ]] && tar -C base -xzf base.tar.gz
specs=("$@")
((${#specs[@]})) || specs=(qwen2.5-7b:q4_k_m qwen2.5-7b:q5_k_m qwen2.5-7b:q6_k qwen2.5-7b:q8_0:raw
                          qwen2.5-7b:q8_0:dpl qwen3-8b:q4_k_m)
T=/tmp/types; mkdir -p $T
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
for spec in "${specs[@]}"; do
  IFS=: read -r preset ftype layout <<<"$spec"
  layout=${layout:-auto}
  m=$T/$preset-$ftype-$layout.dpl
  ./dpl-synth "$preset" $T/m.gguf --ftype "$ftype" --vocab shared/vocab/ggml-vocab-qwen2.gguf >/dev/null &&
    ./dpl-convert -q --layout "$layout" $T/m.gguf "$m" >/dev/null && rm -f $T/m.gguf
  echo "== $spec ($(stat -c %s "$m") bytes)"
  if [[ -x base/dpl-bench && $layout == auto ]]; then
    echo "-- base"; ./base/dpl-bench -m "$m" -r 3 2>&1 | grep -E "^\||model:|error"
  fi
  echo "-- this build"; ./dpl-bench -m "$m" -r 3 2>&1 | grep -E "^\||model:|tuning:|error"
  rm -f "$m"
done 2>&1 | tee "$out/types.log"
