#!/usr/bin/env bash
# The main job on an embedded default: install what is missing, build, then
# synthesize a small random-weight model, convert it to .dpl (verified bit for
# bit), inspect the result and generate text with it (CPU reference; random
# weights make random text). Files go to out/demo/.
#
#   tools/demo.sh [PRESET]     (default tiny-qwen2; `dpl-synth --list` shows presets)
set -euo pipefail
cd "$(dirname "$0")/.."
preset=${1:-tiny-qwen2}
tools/setup.sh
bazel build //converter:dpl-convert //converter:dpl-inspect //tools:dpl-synth //runtime:dpl-run 2>&1 |
  grep -E "ERROR|error:" && exit 1
bin=$(bazel info bazel-bin 2>/dev/null)
out=out/demo
mkdir -p "$out"

vocab=()
shared=${DPL_SHARED_DIR:-../shared}
if [[ -f $shared/vocab/ggml-vocab-qwen2.gguf && $preset == *qwen2* ]]; then
  vocab=(--vocab "$shared/vocab/ggml-vocab-qwen2.gguf")
fi

echo "== dpl-synth $preset"
"$bin/tools/dpl-synth" "$preset" "$out/$preset.gguf" "${vocab[@]}"
echo "== dpl-convert --verify"
"$bin/converter/dpl-convert" "$out/$preset.gguf" "$out/$preset.dpl" --verify
echo "== dpl-inspect"
"$bin/converter/dpl-inspect" "$out/$preset.dpl" --verify-checksums
echo "== dpl-run --device cpu (random weights: expect nonsense text)"
if [[ ${#vocab[@]} -gt 0 ]]; then
  "$bin/runtime/dpl-run" -m "$out/$preset.dpl" --device cpu -p "Once upon a time" -n 24 -s 1
else
  "$bin/runtime/dpl-run" -m "$out/$preset.dpl" --device cpu --tokens 1,2,3,4
fi
