#!/bin/bash
# What the thirteenth session (2026-12-07) wrote without a GPU, in one call
# (docs/PERF.md names each and its prediction). After tools/gpu/stage.sh, on
# the device, from the repository root:
#   bash tools/gpu/pending.sh .gpu/suite OUT_DIR
#  1. tools/perf/persistent_probe.cu (issue 34): a 7B layer's four products as
#     one persistent kernel vs a graph of kernels; ~1 s;
#  2. tools/perf/wgmma_rate_probe.cu's third round (issue 29): two warpgroups
#     taking turns at the tensor cores; its first 7 lines;
#  3. cuda_decoder_gpu_test, the MoE sum left to the next norm (issue 31),
#     and cuda_engine_gpu_test, the API's n on the device (issue 32);
#  4. DPL_MOE_FUSE=0/1 on a dpl-synth Qwen3-30B-A3B, tg128 and batched rows,
#     interleaved twice (~40 s of synthesis first);
#  5. (before 4) q6_K's int8 form with integer scales (issue 29): its test
#     and DPL_Q6K_INT=0/1 in matvec_bench and dpl-bench at 4 and 8.
set -u
root=$PWD
suite=${1:?usage: pending.sh SUITE_DIR OUT_DIR}
out=${2:-/tmp/pending}
mkdir -p "$out"
exec > >(tee "$out/pending.log") 2>&1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
(cd tools/perf && nvcc -O3 -std=c++17 -arch=sm_90a -o "$out/persistprobe" persistent_probe.cu &&
  nvcc -O3 -std=c++17 -arch=sm_90a -o "$out/wgmmaprobe" wgmma_rate_probe.cu) || exit 1
cd "$suite" || exit 1
[[ -f bin.tar.gz && ! -x dpl-bench ]] && tar -xzf bin.tar.gz
source ./env.sh
export DPL_SHARED_DIR=$PWD/shared
T=${TMPDIR:-/tmp}
( [[ -f $T/q30.dpl ]] || { ./dpl-synth qwen3-30b-a3b "$T/q30.gguf" --vocab shared/vocab/ggml-vocab-qwen2.gguf >/dev/null &&
    ./dpl-convert -q "$T/q30.gguf" "$T/q30.dpl" >/dev/null; rm -f "$T/q30.gguf"; } ) &
synth=$!
echo "== persistent probe (issue 34)"
timeout 120 "$out/persistprobe"
echo "== wgmma probe, third round (issue 29)"
timeout 60 "$out/wgmmaprobe" | head -8
echo "== cuda_decoder_gpu_test: the MoE sum left to the next norm"
timeout 120 ./cuda_decoder_gpu_test --test-case="*next layer's norm*" 2>&1 | grep -E "ERROR|values|test cases|assertions"
echo "== matvec_gpu_test: q6_K's int8 form with integer scales (issue 29)"
timeout 120 ./matvec_gpu_test --test-case="*token-tiled*" 2>&1 | grep -E "int scales|ERROR|values|test cases|assertions" | tail -12
echo "== DPL_Q6K_INT 0 / 1: matvec_bench 7B q6_K at 4 and 8 tokens, dpl-bench 4 and 8 sequences"
m7=$(q7_model)
for r in 1 2; do
  for f in 0 1; do
    echo "-- DPL_Q6K_INT=$f"
    DPL_Q6K_INT=$f DPL_MATVEC_BENCH_ONLY="q6_K dpl" timeout 60 ./matvec_bench 2>&1 | grep -E "(4|8)tok +int8 form"
    echo "   $(DPL_Q6K_INT=$f timeout 60 ./dpl-bench -m "$m7" -p 0 -n 128 -d 0 -npl 4,8 -npp 128 -r 1 2>&1 | grep -E '^\| tg128 x' | awk -F'|' '{printf "%s %s;", $2, $3}')"
  done
done
echo "== cuda_engine_gpu_test: samples of one prompt"
timeout 120 ./cuda_engine_gpu_test --test-case="*samples of one prompt*" 2>&1 | grep -E "ERROR|values|test cases|assertions"
wait $synth
echo "== 30B-A3B, DPL_MOE_FUSE 0 / 1 (issue 31)"
for r in 1 2; do
  for f in 0 1; do
    echo "-- DPL_MOE_FUSE=$f: $(DPL_MOE_FUSE=$f DPL_CUDA_MOE=1 timeout 100 ./dpl-bench -m "$T/q30.dpl" -p 0 -n 128 -d 0 \
      -npl 4,16,64 -npp 128 -r 1 2>&1 | grep -E '^\| tg|rror' | awk -F'|' '{printf "%s %s;", $2, $3}')"
  done
done
