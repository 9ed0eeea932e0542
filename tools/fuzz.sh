#!/usr/bin/env bash
# Builds the libFuzzer targets (formats/fuzz) and runs each for a bounded time,
# seeded with llama.cpp's files in ../shared, their .dpl conversions, small
# synthesized models, and issue 11's crafted hostile files with their twins
# (formats/fuzz:write_seeds). Exits non-zero on any finding (crash, leak,
# sanitizer report, timeout, OOM).
#
#   tools/fuzz.sh [SECONDS_PER_TARGET [TARGET ...]]
#     (default 60 s; targets gguf dpl dpl_compressed metadata, run one after
#     the other; each reports libFuzzer's final executions and coverage)
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
shift || true
shared=${DPL_SHARED_DIR:-$(cd .. && pwd)/shared}
work=$(mktemp -d /tmp/dpl-fuzz.XXXXXX)
trap 'rm -rf "$work"' EXIT
all_targets=(gguf dpl dpl_compressed metadata)
if (($#)); then targets=("$@"); else targets=("${all_targets[@]}"); fi

fuzz_labels=()
for t in "${targets[@]}"; do fuzz_labels+=("//formats/fuzz:${t}_fuzz"); done
bazel build --config=fuzz "${fuzz_labels[@]}" 2>&1 |
  grep -v "Cannot export local symbol" | grep -E "ERROR|error:|Build completed" || true
# Both configurations share bazel-bin (Bazel 4 does not split it by flags),
# and a default build links the same targets without libFuzzer: copy ours.
fuzz_bin=$work/bin
mkdir -p "$fuzz_bin"
for t in "${targets[@]}"; do
  built=$(bazel info --config=fuzz bazel-bin 2>/dev/null)/formats/fuzz/${t}_fuzz
  if [[ ! -x $built ]] || ! cp "$built" "$fuzz_bin/"; then
    echo "fuzz: build failed" >&2
    for u in "${targets[@]}"; do echo "fuzz-result: $u FAILED"; done
    exit 1
  fi
done
bazel build //converter:dpl-convert //tools:dpl-synth //formats/fuzz:write_seeds >/dev/null 2>&1
bin=$(bazel info bazel-bin 2>/dev/null)
convert=$bin/converter/dpl-convert
synth=$bin/tools/dpl-synth

for t in "${all_targets[@]}"; do mkdir -p "$work/$t"; done
mkdir -p "$work/artifacts"
for f in "$shared"/oracle/*.gguf "$shared"/vocab/*.gguf; do
  cp "$f" "$work/gguf/"
  base=$(basename "$f" .gguf)
  "$convert" -q "$f" "$work/dpl/$base.dpl" >/dev/null
  "$convert" -q --compress --frame-mib 1 "$f" "$work/dpl_compressed/$base.z.dpl" >/dev/null
done

# Whole small models too: the shared files are longer than -max_len, so the
# fuzzer sees only their heads; these fit entirely.
for preset in micro-qwen2 tiny-llama tiny-qwen2; do
  "$synth" "$preset" "$work/gguf/synth-$preset.gguf" >/dev/null
  "$convert" -q "$work/gguf/synth-$preset.gguf" "$work/dpl/synth-$preset.dpl" >/dev/null
  "$convert" -q --compress --frame-mib 1 "$work/gguf/synth-$preset.gguf" \
    "$work/dpl_compressed/synth-$preset.z.dpl" >/dev/null
done
cp "$work"/dpl_compressed/*.dpl "$work/dpl/"

# Issue 11's crafted files (each with its twin) and the key/value sections of
# every GGUF above.
"$bin/formats/fuzz/write_seeds" "$work" "$work"/gguf/*.gguf

status=0
for target in "${targets[@]}"; do
  echo "fuzz: $target for ${secs}s on $(ls "$work/$target" | wc -l) seeds"
  # The key/value parser needs no model-sized input: shorter inputs, ~10x the executions.
  max_len=$((2 << 20))
  [[ $target == metadata ]] && max_len=$((256 << 10))
  if ! "$fuzz_bin/${target}_fuzz" "$work/$target" -max_total_time="$secs" -timeout=20 \
      -rss_limit_mb=4096 -max_len=$max_len -print_final_stats=1 \
      -artifact_prefix="$work/artifacts/" >"$work/$target.log" 2>&1; then
    echo "fuzz: $target FOUND A PROBLEM:" >&2
    grep -E "ERROR|SUMMARY|Test unit written" "$work/$target.log" | head -20 >&2
    echo "fuzz-result: $target FAILED"
    status=1
  else
    echo "fuzz-result: $target passed"
    grep -E "stat::number_of_executed_units|Done " "$work/$target.log" | tr '\n' ' '
    grep -E "DONE" "$work/$target.log" | grep -oE "cov: [0-9]+ ft: [0-9]+" | tail -1
    echo
  fi
done
exit $status
