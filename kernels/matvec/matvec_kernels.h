// Launchers of the matvec CUDA kernels (implemented in matvec_kernels.cu).
// Internal to kernels/matvec: callers use matvec.h, which validates shapes
// and picks the kernel (PlanMatVec) before anything here runs.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
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

// y = W x (+ bias) (+ residual) for n_tokens tokens, in tiles of token_tile
// (1 or kTokenTile) tokens per CTA, ksplit (1 or kKSplit) warps per row
// group, depth (2 or 4; the token-tiled kernel always uses 2) steps of weight
// loads in flight per lane. grid_x/grid_y from MatVecGridFor with the same
// token_tile/ksplit.
absl::Status LaunchMatVec(MatVecKernel kernel, const MatVecArgs& args, int token_tile, int ksplit,
                          int depth, int64_t grid_x, int64_t grid_y, cudaStream_t stream);

// The v2 single-token kernel (n_tokens == 1): ksplit in {1, 2, 4, 8}, depth
// in {1, 2, 4}, pipe: prefetch the next depth steps before dotting the
// current ones. grid_y = ceil(n_rows / DecodeRowsPerCta(ksplit)).
absl::Status LaunchMatVecDecode(MatVecKernel kernel, const MatVecArgs& args, int ksplit, int depth,
                                bool pipe, int64_t grid_y, cudaStream_t stream);

// Overrides of the single-token kernel choice, for the GPU test and the bench
// (A/B in one binary). variant: -1 default, 0 legacy kernel, 1 v2 kernel;
// ksplit/depth 0 and pipe -1 keep the chosen value. Not thread-safe: set it
// only in single-threaded test/bench code. DPL_MATVEC_LEGACY=1 in the
// environment makes the legacy kernel the default.
struct DecodeOverride {
  int variant = -1;
  int ksplit = 0;
  int depth = 0;
  int pipe = -1;
};
DecodeOverride& DecodeOverrideForTesting();

// Quantizes n_blocks consecutive blocks of 32 floats (x: (n_blocks * 32)):
// q: (n_blocks * 32) int8, d: (n_blocks) scales, s: (n_blocks) d * sum(q).
absl::Status LaunchQuantizeActivations(const float* x, int64_t n_blocks, int8_t* q, float* d,
                                       float* s, cudaStream_t stream);

}  // namespace dpl::kernels
