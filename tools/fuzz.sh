#!/usr/bin/env bash
# Builds the libFuzzer targets (formats/fuzz) and runs each for a bounded time,
# seeded with llama.cpp's files in ../shared and their .dpl conversions.
# Exits non-zero on any finding (crash, leak, sanitizer report, timeout, OOM).
#
#   tools/fuzz.sh [SECONDS_PER_TARGET]     (default 60)
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
shared=${DPL_SHARED_DIR:-$(cd .. && pwd)/shared}
work=$(mktemp -d /tmp/dpl-fuzz.XXXXXX)
trap 'rm -rf "$work"' EXIT

bazel build --config=fuzz //formats/fuzz:gguf_fuzz //formats/fuzz:dpl_fuzz 2>&1 |
  grep -v "Cannot export local symbol" | grep -E "ERROR|error:|Build completed" || true
bazel build //converter:dpl-convert >/dev/null 2>&1
fuzz_bin=$(bazel info --config=fuzz bazel-bin 2>/dev/null)/formats/fuzz
if [[ ! -x $fuzz_bin/gguf_fuzz || ! -x $fuzz_bin/dpl_fuzz ]]; then
  echo "fuzz: build failed" >&2
  echo "fuzz-result: gguf FAILED"; echo "fuzz-result: dpl FAILED"
  exit 1
fi
bazel build //tools:dpl-synth >/dev/null 2>&1
convert=$(bazel info bazel-bin 2>/dev/null)/converter/dpl-convert
synth=$(bazel info bazel-bin 2>/dev/null)/tools/dpl-synth

mkdir -p "$work/gguf" "$work/dpl" "$work/artifacts"
for f in "$shared"/oracle/*.gguf "$shared"/vocab/*.gguf; do
  cp "$f" "$work/gguf/"
  base=$(basename "$f" .gguf)
  "$convert" -q "$f" "$work/dpl/$base.dpl" >/dev/null
  "$convert" -q --compress --frame-mib 1 "$f" "$work/dpl/$base.z.dpl" >/dev/null
done

# Whole small models too: the shared files are longer than -max_len, so the
# fuzzer sees only their heads; these fit entirely.
for preset in micro-qwen2 tiny-llama tiny-qwen2; do
  "$synth" "$preset" "$work/gguf/synth-$preset.gguf" >/dev/null
  "$convert" -q "$work/gguf/synth-$preset.gguf" "$work/dpl/synth-$preset.dpl" >/dev/null
  "$convert" -q --compress --frame-mib 1 "$work/gguf/synth-$preset.gguf" "$work/dpl/synth-$preset.z.dpl" >/dev/null
done

status=0
for target in gguf dpl; do
  echo "fuzz: $target for ${secs}s on $(ls "$work/$target" | wc -l) seeds"
  if ! "$fuzz_bin/${target}_fuzz" "$work/$target" -max_total_time="$secs" -timeout=20 \
      -rss_limit_mb=4096 -max_len=$((2 << 20)) -print_final_stats=1 \
      -artifact_prefix="$work/artifacts/" >"$work/$target.log" 2>&1; then
    echo "fuzz: $target FOUND A PROBLEM:" >&2
    grep -E "ERROR|SUMMARY|Test unit written" "$work/$target.log" | head -20 >&2
    echo "fuzz-result: $target FAILED"
    status=1
  else
    echo "fuzz-result: $target passed"
    grep -E "stat::number_of_executed_units|Done " "$work/$target.log" | tr '\n' ' '
    echo
  fi
done
exit $status
