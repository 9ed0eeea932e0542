#!/bin/bash
# Final run: kernel tests, end to end, then an interleaved same-binary A/B of
# the new kernels against the legacy ones (DPL_MATVEC_LEGACY=1 DPL_ATTN_LEGACY=1).
# Usage: copy into a staged folder (tools/gpu/stage.sh) and run it there.
cd "$(dirname "$0")"
bash ./suite.sh . kernels
bash ./suite.sh . e2e
T=/tmp/fin; mkdir -p $T
./dpl-synth qwen2.5-7b $T/q7.gguf >/dev/null && ./dpl-convert -q $T/q7.gguf $T/q7.dpl >/dev/null && rm $T/q7.gguf
./dpl-synth qwen2.5-14b $T/q14.gguf >/dev/null && ./dpl-convert -q $T/q14.gguf $T/q14.dpl >/dev/null && rm $T/q14.gguf
for m in q7 q14; do
  for round in 1 2; do
    echo "== $m new (round $round)"; ./dpl-bench -m $T/$m.dpl -r 3
    echo "== $m legacy (round $round)"; DPL_MATVEC_LEGACY=1 DPL_ATTN_LEGACY=1 ./dpl-bench -m $T/$m.dpl -r 3
  done
done
