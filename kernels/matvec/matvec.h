// Quantized matrix-times-vector for the decode step (and a token-tiled
// variant for prompt processing):
//   y[t] = W x[t] (+ bias) (+ residual[t])      for t < n_tokens
// W is a device WeightMatrix of type f32, f16, bf16, q8_0, q4_0, q4_1, q5_0,
// q5_1, iq4_nl, q2_K, q3_K, q6_K, iq4_xs (raw GGUF blocks or dpl planes),
// q4_K or q5_K (raw). Quantized types read an int8 copy of x
// (QuantizeActivations: per 32 values d = max|x|/127, q = rint(x/d)), so
// their result is W x~ with x~ = d q: ~0.5% relative error vs exact x, see
// matvec_traits.cuh for why. Float weights use x exactly.
//
// No launcher allocates, synchronizes or copies from the host: everything is
// preallocated (MatVecScratchIn at init) and launched on `stream`, so
// the calls can be captured into a CUDA graph.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/act_quant.h"
#include "kernels/matvec/matvec_plan.h"
#include "kernels/matvec/matvec_rope.h"

namespace dpl::kernels {

// Device buffers for the int8 copy of up to max_tokens activation vectors of
// up to max_cols values (max_cols a multiple of 32), and the mma form's
// k-split partial sums (matvec_geometry.h, MmaSplits).
struct MatVecScratch {
  int8_t* q = nullptr;  // (max_tokens, max_cols) int8
  float* d = nullptr;   // (max_tokens, max_cols / 32) block scales
  float* s = nullptr;   // (max_tokens, max_cols / 32) d * sum(q) per block
  // (f16_max_tokens, max_cols) f16 copy of the activations for the f16 mma
  // form (F16Index, act_quant.h), written with q when
  // f16_min_tokens..f16_max_tokens tokens are quantized; null when
  // max_tokens < 2.
  __half* h = nullptr;
  // Fewest tokens whose quantization also writes h: the owner sets what its
  // plans' mma_f16_min_tokens read (the decoder: DecodeTuning's), so no step
  // writes a copy that nothing reads. MatVecScratchIn: 2 (always).
  int64_t f16_min_tokens = 2;
  // Most tokens h holds: min(max_tokens, the f16_max_tokens asked of
  // MatVecScratchIn, at least kMmaMaxTokens).
  int64_t f16_max_tokens = 0;
  float* partial = nullptr;    // (partial_floats): min(max_tokens, kMmaMaxTokens)
  int64_t partial_floats = 0;  // x kMmaMaxPartialRows floats when max_tokens >= 2
  int64_t max_cols = 0;
  int64_t max_tokens = 0;
  // Shape of the activations last quantized into this scratch (host-side
  // record, set when QuantizeActivations enqueues; checked by RunMatVec).
  int64_t n_cols = 0;
  int64_t n_tokens = 0;
};

// Device bytes a scratch for (max_tokens, max_cols) needs (max_cols a
// multiple of 32), and the scratch laid out in `mem`, which holds that many
// bytes, is 256-byte aligned and stays owned by the caller (allocated once,
// at init: never inside a step). Its f16 copy holds up to f16_max_tokens
// tokens (at least kMmaMaxTokens; more for products on the f16 form's wide
// tiles, MatVecPlan::mma_f16_max_tokens).
absl::StatusOr<uint64_t> MatVecScratchBytes(int64_t max_cols, int64_t max_tokens,
                                            int64_t f16_max_tokens = kMmaMaxTokens);
MatVecScratch MatVecScratchIn(void* mem, int64_t max_cols, int64_t max_tokens,
                              int64_t f16_max_tokens = kMmaMaxTokens);

// Quantizes x: (n_tokens, n_cols) f32 on the device into `scratch`, where
// every quantized matvec reading x then finds it (quantize once, use for Q, K
// and V). n_cols must be a multiple of 32. `pdl`: a programmatic dependent
// launch (kernels/launch.cuh), as the decode step's kernels are.
absl::Status QuantizeActivations(const float* x, int64_t n_cols, int64_t n_tokens,
                                 MatVecScratch* scratch, cudaStream_t stream, bool pdl = false);

// The scratch as the output of another kernel that writes quantized
// activations itself (the attention combine, DecodeAttention's `quant`):
// checks that (n_tokens, n_cols) fits, records that shape as
// QuantizeActivations does, and returns the device pointers to write.
absl::StatusOr<QuantOut> QuantizeInto(int64_t n_cols, int64_t n_tokens, MatVecScratch* scratch);

// h = x * w / sqrt(mean(x^2) + eps) per token row (RMSNorm), written as
// float32 (for float-weight kernels) and quantized into `scratch`, in one
// launch. x, h: (n_tokens, n_cols), h must not overlap x; w: (n_cols).
absl::Status NormQuantizeActivations(const float* x, const float* w, float eps, int64_t n_cols,
                                     int64_t n_tokens, float* h, MatVecScratch* scratch,
                                     cudaStream_t stream, bool pdl = false);

// g = silu(gate) * up (SwiGLU, full-precision expf), written as float32 and
// quantized into `scratch`, in one launch. gate, up, g: (n_tokens, n_cols);
// g may equal gate.
absl::Status SwiGluQuantizeActivations(const float* gate, const float* up, int64_t n_cols,
                                       int64_t n_tokens, float* g, MatVecScratch* scratch,
                                       cudaStream_t stream, bool pdl = false);

struct MatVecIo {
  const float* x = nullptr;             // (n_tokens, n_cols) f32 activations
  const MatVecScratch* qx = nullptr;    // x quantized (quantized kernels only)
  int64_t n_tokens = 1;
  float* y = nullptr;                   // (n_tokens, n_rows)
  const float* bias = nullptr;          // (n_rows) or null, added for every token
  const float* residual = nullptr;      // (n_tokens, n_rows) or null; may equal y
  MatVecRope rope;                      // for outputs whose role is not kPlain
};

// The matvec proper for a matrix planned by PlanMatVec (matvec_plan.h): one
// token runs plan.decode, more run plan.prompt (kTokenTile tokens share each
// weight load). For a quantized kernel, io.qx must hold io.x quantized (same
// n_cols, n_tokens).
absl::Status RunMatVec(const WeightMatrix& w, const MatVecPlan& plan, const MatVecIo& io,
                       cudaStream_t stream);

// Where one matrix of a group writes: y = W x (+ bias) (+ residual).
struct MatVecOut {
  float* y = nullptr;                // (n_tokens, n_rows)
  const float* bias = nullptr;       // (n_rows) or null
  const float* residual = nullptr;   // (n_tokens, n_rows) or null; may equal y
  // Not kPlain: RoPE and the KV-cache write in the epilogue (matvec_rope.h;
  // one token on the dp4a kernels, n_rows a multiple of rope.head_dim).
  MatVecRole role = MatVecRole::kPlain;
};

// One launch for the matrices of a group planned by PlanMatVecGroups
// (matvec_plan.h): ws[i] writes outs[i]; they read the same io.x / io.qx
// (io.y, io.bias, io.residual are ignored). Results are bit-identical to
// RunMatVec of each matrix with the group's plan.
absl::Status RunMatVecGroup(absl::Span<const WeightMatrix* const> ws, const MatVecPlan& plan,
                            absl::Span<const MatVecOut> outs, const MatVecIo& io,
                            cudaStream_t stream);

// CTAs of that kernel and geometry resident per SM on the current device
// (the CUDA occupancy API; what DecodeTuning::q6k_ctas_per_sm records).
absl::StatusOr<int> ResidentCtasPerSm(MatVecKernel kernel, const MatVecGeometry& g);

}  // namespace dpl::kernels
