#!/usr/bin/env bash
# The GPU test and benchmark suite, run on the GPU machine from a folder that
# holds the built binaries (see tools/gpu/stage.sh) and shared/oracle files:
#   tools/gpu/suite.sh DIR [kernels|e2e|bench|all]
# Prints one line per check ("ok"/"FAIL") and ends with "N passed, N failed".
set -u
dir=$(cd "${1:?DIR}" && pwd)
what=${2:-all}
cd "$dir"
[[ -f bin.tar.gz ]] && tar -xzf bin.tar.gz
export DPL_SHARED_DIR=$dir/shared
source ./env.sh
tmp=$(mktemp -d /tmp/dpl-gpu.XXXXXX)
passed=0 failed=0
check() {  # NAME CMD...: runs CMD (at most DPL_CHECK_TIMEOUT s, default 150), output to the log
  local name=$1; shift
  echo "---- $name: $*"
  if timeout "${DPL_CHECK_TIMEOUT:-150}" "$@"; then echo "ok   $name"; passed=$((passed + 1)); else echo "FAIL $name"; failed=$((failed + 1)); fi
}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader

if [[ $what == kernels || $what == all ]]; then
  for t in ./*_gpu_test; do check "$(basename "$t")" "$t"; done
fi

if [[ $what == e2e || $what == all ]]; then
  # NAME:LIMIT[:ROWS] (ROWS: the oracle holds the last ROWS positions only);
  # every layout: the converter's choice, and every type with planes in dpl.
  for spec in ora-llama-f32:0.005 ora-qwen2-f32:0.005 small-llama-q4km:0.04 small-qwen2-q4km:0.04 \
              small-qwen3-q4km:0.04 small-llama31-q4km:0.04:32 mini-llama-q5km:0.04 mini-llama-q6k:0.04 \
              mini-llama-q80:0.04 mini-llama-q40:0.04 mini-llama-iq4xs:0.04 mini-llama-q3km:0.04 \
              mini-qwen3moe-q4km:0.03; do
    IFS=: read -r name limit rows <<<"$spec"
    [[ -f shared/oracle/$name.gguf ]] || continue
    for layout in auto dpl; do
      ./dpl-convert -q --layout $layout "shared/oracle/$name.gguf" "$tmp/$name.dpl" >/dev/null
      tokens=$(tr -d ' \n' <"shared/oracle/$name.tokens")
      check "e2e $name --layout $layout (cuda vs llama.cpp, limit $limit)" bash -c \
        "./dpl-run -m $tmp/$name.dpl -c 4096 --tokens $tokens --all-logits --dump-logits $tmp/$name.f32 >/dev/null &&
         ./compare_logits $tmp/$name.f32 shared/oracle/$name.logits.f32 $limit $rows"
      rm -f "$tmp/$name.f32"
    done
  done
  v=shared/oracle/tiny-qwen2-vocab-q4km
  if [[ -f $v.gguf ]]; then
    ./dpl-convert -q "$v.gguf" "$tmp/v.dpl" >/dev/null
    ids=$(./dpl-tokenize -m "$tmp/v.dpl" -p "$(cat $v.prompt)" | tr -d '[] ')
    want=$(tr -d ' \n' <"$v.tokens")
    check "tiny-qwen2-vocab prompt ids" test "${want#"$ids",}" != "$want"
    check "tiny-qwen2-vocab logits (4 rows, limit 0.04)" bash -c \
      "./dpl-run -m $tmp/v.dpl --tokens $want --all-logits --dump-logits $tmp/v.f32 >/dev/null &&
       ./compare_logits $tmp/v.f32 $v.logits.f32 0.04 4"
    ./dpl-run -m "$tmp/v.dpl" -p "Hello" -n 24 -s 7 >"$tmp/a.txt" 2>/dev/null
    ./dpl-run -m "$tmp/v.dpl" -p "Hello" -n 24 -s 7 >"$tmp/b.txt" 2>/dev/null
    check "same seed, same tokens" cmp "$tmp/a.txt" "$tmp/b.txt"
  fi
  ./dpl-synth qwen2.5-7b "$tmp/q7.gguf" >/dev/null && ./dpl-convert -q "$tmp/q7.gguf" "$tmp/q7.dpl" >/dev/null
  rm -f "$tmp/q7.gguf"
  check "7B-shaped model vs the CPU reference" env DPL_TEST_BIG_MODEL="$tmp/q7.dpl" \
    ./cuda_decoder_gpu_test --test-case="*DPL_TEST_BIG_MODEL*"
fi

if [[ $what == bench || $what == all ]]; then
  for b in ./*_bench; do check "$(basename "$b")" "$b"; done
  [[ -f $tmp/q7.dpl ]] || { ./dpl-synth qwen2.5-7b "$tmp/q7.gguf" >/dev/null && ./dpl-convert -q "$tmp/q7.gguf" "$tmp/q7.dpl" >/dev/null; rm -f "$tmp/q7.gguf"; }
  check "dpl-bench 7B" ./dpl-bench -m "$tmp/q7.dpl" -r 3
  ./dpl-synth qwen2.5-14b "$tmp/q14.gguf" >/dev/null && ./dpl-convert -q "$tmp/q14.gguf" "$tmp/q14.dpl" >/dev/null
  rm -f "$tmp/q14.gguf"
  check "dpl-bench 14B" ./dpl-bench -m "$tmp/q14.dpl" -r 3
fi
rm -rf "$tmp"
echo "$passed passed, $failed failed"
