#!/usr/bin/env bash
# Builds everything the GPU suite needs and packs it into .gpu/suite/ (git-
# ignored), ready to be carried to the GPU machine (suite.sh unpacks it):
#   tools/gpu/stage.sh && (device) tools/gpu/suite.sh .gpu/suite all
#   tools/gpu/stage.sh BASE_BIN_DIR && (device) bash .gpu/suite/ab.sh OUT
#     (A/B against a baseline build's dpl-run and dpl-bench, see ab.sh)
set -euo pipefail
cd "$(dirname "$0")/../.."
tools=(
  //runtime:dpl-run //runtime:dpl-bench //runtime:dpl-tokenize //tools:dpl-synth
  //converter:dpl-convert //tests:compare_logits //runtime:dpl-server
)
tests=(
  //kernels/matvec:matvec_gpu_test //kernels/matvec:moe_gpu_test //kernels/matvec:matvec_bench
  //kernels/ops:ops_gpu_test //kernels/attention:attention_gpu_test //kernels/attention:attention_bench
  //kernels/attention:prompt_attention_gpu_test //kernels/gemm:prompt_gemm_gpu_test //kernels/gemm:gemm_bench
  //kernels/sampling:sampling_gpu_test //kernels:cuda_handles_gpu_test
  //runtime/cuda:device_weights_gpu_test //runtime/cuda:cuda_decoder_gpu_test
  //runtime/server:cuda_engine_gpu_test
)
# DPL_STAGE_TOOLS_ONLY=1: the tools alone (no test or bench binaries), to
# leave the carry's room for oracle models (e2e, dpl-bench, startup.sh).
targets=("${tools[@]}")
[[ -n ${DPL_STAGE_TOOLS_ONLY:-} ]] || targets+=("${tests[@]}")
# DPL_STAGE_BINS="a b ...": build (and pack) only those binaries.
if [[ -n ${DPL_STAGE_BINS:-} ]]; then
  picked=()
  for t in "${targets[@]}"; do
    [[ " $DPL_STAGE_BINS " == *" ${t##*:} "* ]] && picked+=("$t")
  done
  targets=("${picked[@]}")
fi
if ! log=$(bazel build "${targets[@]}" 2>&1); then
  echo "$log" | grep -E "ERROR|error:" >&2
  exit 1
fi
out=${DPL_STAGE_DIR:-.gpu/suite}
rm -rf "$out" && mkdir -p "$out/shared/oracle"
bin=$(bazel info bazel-bin 2>/dev/null)
mkdir -p "$out/bin"
for t in "${targets[@]}"; do
  p=${t#//}; cp "$bin/${p%%:*}/${p##*:}" "$out/bin/"
done
# Statically linked binaries with kernels for sm_90a, stripped of debug info
# and gzipped, which keeps a call under the 64 MiB it may carry.
chmod u+w "$out/bin"/* && strip "$out/bin"/*
# DPL_STAGE_BINS="a b ...": pack only those binaries (a call's 64 MiB holds
# about half of them).
tar -C "$out/bin" -czf "$out/bin.tar.gz" ${DPL_STAGE_BINS:-.} && rm -rf "$out/bin"
shared=${DPL_SHARED_DIR:-../shared}
# Under the 64 MiB a call may carry: the five small oracle models (the
# MoE one, 7 MB, for cuda_decoder_gpu_test's qwen3moe cases), and the
# vocabulary model only when asked (it is 39 MB).
# DPL_STAGE_ORACLES overrides the list (room for a baseline's binaries; ""
# packs none). DPL_STAGE_DIR: where (default .gpu/suite).
for m in ${DPL_STAGE_ORACLES-ora-llama-f32 ora-qwen2-f32 small-llama-q4km small-qwen2-q4km mini-qwen3moe-q4km} ${WITH_VOCAB_MODEL:+tiny-qwen2-vocab-q4km}; do
  cp "$shared/oracle/$m".* "$out/shared/oracle/"
done
if [[ -n ${1:-} ]]; then  # a baseline build's binaries for ab.sh
  mkdir -p "$out/base" && cp "$1/dpl-run" "$1/dpl-bench" "$out/base/"
  chmod u+w "$out/base"/* && strip "$out/base"/*
  tar -C "$out/base" -czf "$out/base.tar.gz" dpl-run dpl-bench && rm -rf "$out/base"
fi
# The qwen2 vocabulary (6 MB) for dpl-synth models that tokenize text, and
# the 3254-token prompt of startup.sh.
# (gzipped: 5.7 -> 2.5 MB of the 64 MiB; suite.sh and startup.sh unpack it).
mkdir -p "$out/shared/vocab" && gzip -c "$shared/vocab/ggml-vocab-qwen2.gguf" >"$out/shared/vocab/ggml-vocab-qwen2.gguf.gz"
cp tools/gpu/env.sh tools/gpu/suite.sh tools/gpu/ab.sh tools/gpu/startup.sh tools/gpu/types.sh \
   tools/gpu/server.sh tools/gpu/batched.sh tools/gpu/server_ab.sh tools/gpu/server_reuse.sh tools/gpu/prompt-3254.txt \
   tools/server_load.sh "$out/"
du -sh "$out"
# A device call carries at most 64 MiB: this folder plus the tracked tree.
# Say so here, not as a refused call (each refusal costs device time).
staged=$(du -sb "$out" | cut -f1)
tree=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
if (( staged + tree > 64 * 1024 * 1024 )); then
  echo "stage: $out ($staged bytes) and the tracked tree ($tree) exceed the 64 MiB a call" \
       "carries: stage fewer tools or oracles (DPL_STAGE_TOOLS_ONLY, DPL_STAGE_ORACLES)" >&2
  exit 1
fi
