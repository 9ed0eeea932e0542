// Launchers of the matvec CUDA kernels (implemented in matvec_kernels.cu).
// Internal to kernels/matvec: callers use matvec.h, which validates shapes
// and picks the kernel (PlanMatVec) before anything here runs.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/matvec/matvec_geometry.h"

namespace dpl::kernels {

struct MatVecArgs {
  const uint8_t* w = nullptr;  // device, (n_rows, row_stride) bytes
  int64_t row_stride = 0;      // bytes
  int n_rows = 0;
  int n_cols = 0;
  int n_tokens = 1;
  const float* x = nullptr;    // (n_tokens, n_cols) f32: read by the f32/f16 kernels
  const int8_t* xq = nullptr;  // (n_tokens, n_cols) int8: read by the quantized kernels
  const float* xd = nullptr;   // (n_tokens, n_cols / 32) block scales of xq
  const float* xs = nullptr;   // (n_tokens, n_cols / 32) xd * sum(xq) per block
  float* y = nullptr;          // (n_tokens, n_rows)
  const float* bias = nullptr;      // (n_rows) or null: added to every token
  const float* residual = nullptr;  // (n_tokens, n_rows) or null; may alias y
};

// y = W x (+ bias) (+ residual) for n_tokens tokens with the kernel of
// `kernel` and geometry `g` (token_tile 1 needs n_tokens == 1); grid from
// MatVecGridFor(n_rows, n_tokens, g). Errors for a geometry that is not
// compiled (IsCompiledGeometry).
absl::Status LaunchMatVec(MatVecKernel kernel, const MatVecArgs& args, const MatVecGeometry& g,
                          int64_t grid_x, int64_t grid_y, cudaStream_t stream);

// CTAs of that kernel and geometry resident per SM on the current device
// (the CUDA occupancy API): what DecodeTuning records at load.
absl::StatusOr<int> MatVecCtasPerSm(MatVecKernel kernel, const MatVecGeometry& g);

// Quantizes n_blocks consecutive blocks of 32 floats (x: (n_blocks * 32)):
// q: (n_blocks * 32) int8, d: (n_blocks) scales, s: (n_blocks) d * sum(q).
absl::Status LaunchQuantizeActivations(const float* x, int64_t n_blocks, int8_t* q, float* d,
                                       float* s, cudaStream_t stream);

}  // namespace dpl::kernels
