#!/bin/bash
# What the fourteenth session (2026-12-07) wrote or left unmeasured when its
# device time ran out (docs/PERF.md names each and its prediction). Stage the binaries it uses (the suite's are too many for one
# call's 64 MiB):
#   DPL_STAGE_ORACLES="mini-qwen3moe-q4km" DPL_STAGE_BINS="moe_gpu_test cuda_decoder_gpu_test matvec_gpu_test \
#     cuda_engine_gpu_test matvec_bench dpl-bench dpl-synth dpl-convert" tools/gpu/stage.sh
# and on the device, from the repository root (all five are ~15 min, more
# than one call's 10: ITEMS picks, e.g. two calls of ITEMS="1 2 4" and "3 5"):
#   ITEMS="1 2 4" bash tools/gpu/pending.sh .gpu/suite OUT_DIR
#  1. issue 31: the MoE accuracy cases against the reference on the GPU's own
#     expert choices (ForceExperts, record_routes), MoE prompts' dense
#     products on cuBLAS (moe_prompt_mma_max_rows 8), RouteTopK's ids copy;
#     the whole cuda_decoder_gpu_test. If every case passes, the
#     DPL_CUDA_MOE gate can go.
#  2. issue 31: a 30B-A3B's prompts of 16 and 48 tokens and pp512,
#     DPL_MOE_PROMPT_MMA 8 / 64 interleaved (the cost of the cuBLAS rule).
#  3. issue 29: q6_K on the f16 form from 4 tokens (DPL_MMA_F16_MIN_Q6K 4 / 9)
#     at 4 and 8 sequences, interleaved twice; then cuda_engine_gpu_test (its
#     three-slot case keeps the int8 form either way: 3 rows).
#  4. issue 29: ncu of the int8 form's q6_K down at 4 tokens and the
#     one-token kernel on the same matrix (why 1.4 TB/s against 2.3).
#  5. issue 29: q5_K and q8_0 on the f16 form (off by default): matvec_gpu_test,
#     matvec_bench, Q8_0 and Q5_K_M 7B steps at 16-64 sequences, each threshold 65 / 9.
#  6. issue 31 (fifteenth session): the down launch's own sum (MoeSum,
#     DPL_MOE_SUM) and the gate/up launch's own SwiGLU (MoeSwiGlu,
#     DPL_MOE_SWIGLU) against the separate launches: moe_gpu_test's and
#     cuda_decoder_gpu_test's same-bits cases, then 30B-A3B 1 / 4 / 8
#     sequences, off / sum / + SwiGLU / + router, interleaved twice.
#  7. issue 32: tools/gpu/structured.sh (json_schema against free text, -np 1).
set -u
suite=${1:?usage: pending.sh SUITE_DIR OUT_DIR}
out=${2:-/tmp/pending}
mkdir -p "$out"
exec > >(tee "$out/pending.log") 2>&1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
root=$PWD
cd "$suite" || exit 1
[[ -f bin.tar.gz && ! -x dpl-bench ]] && tar -xzf bin.tar.gz
source ./env.sh
export DPL_SHARED_DIR=$PWD/shared
T=${TMPDIR:-/tmp}
want() { [[ " ${ITEMS:-1 2 3 4 5 6 7} " == *" $1 "* ]]; }
synth=
( want 2 || want 6 ) && ( [[ -f $T/q30.dpl ]] || { ./dpl-synth qwen3-30b-a3b "$T/q30.gguf" --vocab shared/vocab/ggml-vocab-qwen2.gguf >/dev/null &&
    ./dpl-convert -q "$T/q30.gguf" "$T/q30.dpl" >/dev/null; rm -f "$T/q30.gguf"; } ) &
( want 2 || want 6 ) && synth=$!  # waited for by pid: a bare `wait` also waits for the tee above
if want 1; then
echo "[${SECONDS}s] == 1. MoE accuracy on the GPU's own routes (issue 31)"
timeout 100 ./moe_gpu_test --test-case="RouteTopK*" 2>&1 | grep -E "ERROR|test cases|assertions" | tail -4
timeout 300 ./cuda_decoder_gpu_test --test-case="*qwen3moe*,*MoE*" 2>&1 |
  grep -E "ERROR|RMS|chose other|excused|test cases|assertions" | head -60
timeout 300 ./cuda_decoder_gpu_test --test-case-exclude="*qwen3moe*,*MoE*" 2>&1 | grep -E "ERROR|test cases|assertions" | tail -5
fi
if want 2; then
wait $synth
echo "[${SECONDS}s] == 2. 30B-A3B prompts, DPL_MOE_PROMPT_MMA 8 / 64 (issue 31)"
for r in 1 2; do
  for v in 8 64; do
    for p in 16 48 512; do
      echo "-- $v pp$p: $(DPL_MOE_PROMPT_MMA=$v DPL_CUDA_MOE=1 timeout 60 ./dpl-bench -m "$T/q30.dpl" -p $p -n 0 -d 0 -r 3 2>&1 |
        grep -E '^\| pp|rror' | awk -F'|' '{printf "%s %s;", $2, $3}')"
    done
  done
done
fi
if want 3; then
echo "[${SECONDS}s] == 3. q6_K on the f16 form from 4 tokens (issue 29)"
m7=$(q7_model)
for r in 1 2; do
  for v in 9 4; do
    echo "-- DPL_MMA_F16_MIN_Q6K=$v: $(DPL_MMA_F16_MIN_Q6K=$v timeout 100 ./dpl-bench -m "$m7" -p 0 -n 128 -d 0 -npl 4,8 -npp 128 -r 1 2>&1 |
      grep -E '^\| tg|rror' | awk -F'|' '{printf "%s %s;", $2, $3}')"
  done
done
timeout 300 ./cuda_engine_gpu_test 2>&1 | grep -E "ERROR|test cases|assertions" | tail -5
fi
if want 4; then
echo "[${SECONDS}s] == 4. ncu: the int8 form's q6_K down at 4 tokens, then the one-token kernel (issue 29)"
S="--section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats"
DPL_MATVEC_BENCH_ONLY="mma 7B ffn_down q6_K dpl 4tok" timeout 60 ncu --clock-control none -k regex:MatVecMmaKernel \
  --launch-skip 5 --launch-count 1 $S ./matvec_bench 2>&1 | grep -vE "^==PROF==|^ +-+$|^$" | tail -80
DPL_MATVEC_BENCH_ONLY="7B ffn_down q6_K dpl" timeout 60 ncu --clock-control none -k regex:"MatVecKernel" \
  --launch-skip 3 --launch-count 1 $S ./matvec_bench 2>&1 | grep -vE "^==PROF==|^ +-+$|^$" | tail -80
fi
if want 5; then
echo "[${SECONDS}s] == 5. q5_K and q8_0 on the f16 form (issue 29): the GPU test, the products, the step"
timeout 300 ./matvec_gpu_test --test-case="*f16 mma form*" 2>&1 | grep -E "q5_K|q8_0|ERROR|test cases|assertions" | tail -40
DPL_MATVEC_BENCH_ONLY="mma 7B ffn_gate/up q" timeout 120 ./matvec_bench 2>&1 | grep -E "(q5_K|q8_0).*int8 form"
for f in q8_0 q5_k_m; do
  ( cd "${TMPDIR:-/tmp}" && [[ -f 7b-$f.dpl ]] || { "$OLDPWD/dpl-synth" qwen2.5-7b 7b-$f.gguf --ftype $f >/dev/null &&
      "$OLDPWD/dpl-convert" -q 7b-$f.gguf 7b-$f.dpl >/dev/null; rm -f 7b-$f.gguf; } )
  for r in 1 2; do
    for v in 65 9; do
      echo "-- $f, f16 form from $v: $(DPL_MMA_F16_MIN_Q5K=$v DPL_MMA_F16_MIN_Q8_0=$v timeout 150 ./dpl-bench -m "${TMPDIR:-/tmp}/7b-$f.dpl" -p 0 -n 128 -d 0 -npl 16,32,64 -npp 128 -r 1 2>&1 |
        grep -E '^\| tg|rror' | awk -F'|' '{printf "%s %s;", $2, $3}')"
    done
  done
done
fi
if want 6; then
echo "[${SECONDS}s] == 6. the down launch's own sum (MoeSum) against MoeCombine (issue 31)"
timeout 200 ./moe_gpu_test --test-case="*fused sum*,*fused SwiGLU*,RouteLogitsTopK*" 2>&1 | grep -E "ERROR|test cases|assertions" | tail -4
timeout 120 ./cuda_decoder_gpu_test --test-case="*fused tails*" 2>&1 | grep -E "ERROR|test cases|assertions" | tail -4
[[ -n $synth ]] && wait $synth && synth=
for r in 1 2; do
  for v in "0 0 0" "1 0 0" "1 1 0" "1 1 1"; do
    read -r su sw ro <<<"$v"
    b() { DPL_MOE_SUM=$su DPL_MOE_SWIGLU=$sw DPL_MOE_ROUTER=$ro DPL_CUDA_MOE=1 timeout 100 ./dpl-bench -m "$T/q30.dpl" -p 0 -n 128 -d 0 "$@" 2>&1 |
      grep -E '^\| tg|rror' | awk -F'|' '{printf "%s %s;", $2, $3}'; }
    echo "-- DPL_MOE_SUM=$su DPL_MOE_SWIGLU=$sw DPL_MOE_ROUTER=$ro: $(b -npl 1,4,8 -npp 128 -r 1)"
  done
done
fi
if want 7; then
echo "[${SECONDS}s] == 7. json_schema against free text through dpl-server (issue 32)"
timeout 240 bash "$root/tools/gpu/structured.sh" "$PWD"
fi
echo "[${SECONDS}s] done"
