// Launchers of the matvec CUDA kernels (implemented in matvec_kernels.cu).
// Internal to kernels/matvec: callers use matvec.h, which validates shapes
// and picks the kernel (PlanMatVec) before anything here runs.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/act_quant.h"
#include "kernels/matvec/matvec_geometry.h"
#include "kernels/matvec/matvec_rope.h"

namespace dpl::kernels {

// One matrix of a launch. A launch covers up to kMaxMatVecParts
// (matvec_geometry.h) matrices that read the same x with the same kernel and
// geometry: their row blocks follow each other along grid.y, part k's first
// at row_block0.
struct MatVecPart {
  const uint8_t* w = nullptr;  // device, (n_rows, row_stride) bytes
  int64_t row_stride = 0;      // bytes
  int n_rows = 0;
  int row_block0 = 0;               // grid.y index of this part's first row block
  float* y = nullptr;               // (n_tokens, n_rows)
  const float* bias = nullptr;      // (n_rows) or null: added to every token
  const float* residual = nullptr;  // (n_tokens, n_rows) or null; may alias y
  MatVecRole role = MatVecRole::kPlain;  // single token only (matvec_rope.h)
  // The mma form's k-split (MmaSplits): with splits > 1 its CTAs write
  // partial sums here, (splits, n_tokens, n_rows), and a second kernel adds
  // them with bias and residual into y.
  int splits = 1;
  float* partial = nullptr;
};

struct MatVecArgs {
  MatVecPart part[kMaxMatVecParts];
  int n_parts = 1;
  int n_cols = 0;
  int n_tokens = 1;
  const float* x = nullptr;    // (n_tokens, n_cols) f32: read by the f32/f16/bf16 kernels
  const int8_t* xq = nullptr;  // (n_tokens, n_cols) int8: read by the quantized kernels
  const float* xd = nullptr;   // (n_tokens, n_cols / 32) block scales of xq
  const float* xs = nullptr;   // (n_tokens, n_cols / 32) xd * sum(xq) per block
  const __half* xh = nullptr;  // f16 copy of x at F16Index (act_quant.h): read by the f16 mma form
  MatVecRope rope;             // for the parts whose role is not kPlain
};

// y = W x (+ bias) (+ residual) for n_tokens tokens and every part, with the
// kernel of `kernel` and geometry `g` (token_tile 1 needs n_tokens == 1);
// grid.x = token tiles, grid.y = all parts' row blocks (MatVecGridFor per
// part). `pdl`: a programmatic dependent launch (kernels/launch.cuh); the
// kernel loads its first weights before waiting for the previous kernel.
// Errors for a geometry that is not compiled (IsCompiledGeometry). `last`
// != kernel: a mixed launch, whose last part is read by kernel `last`
// (MatVecMixedSupports and IsMixedGeometry; one token).
absl::Status LaunchMatVec(MatVecKernel kernel, const MatVecArgs& args, const MatVecGeometry& g,
                          int64_t grid_x, int64_t grid_y, bool pdl, cudaStream_t stream,
                          MatVecKernel last);

// The tensor-core form of `kernel` (MatVecMmaSupports) for 1..kMmaMaxTokens
// tokens: grid.y = all parts' row blocks of kMmaCtaRows rows (part k's first
// at row_block0), grid.z = the largest of the parts' splits (with its
// partial scratch). Needs the int8 activations and n_cols % 256 == 0.
absl::Status LaunchMatVecMma(MatVecKernel kernel, const MatVecArgs& args, int64_t grid_y, bool pdl,
                             cudaStream_t stream);

// The same form over tiles of a mixture of experts' routes (moe.h's
// RouteGroups): CTA (x, y) multiplies tile x's routes (at most tile_tokens,
// a multiple of 8 up to kMmaMaxTokens) by its expert's rows: part m's w is
// expert 0's rows, expert e's at e * expert_stride[m] bytes; route r reads
// activation row r / x_div and writes output row r of each part's y. Every
// part's splits must be 1; grid.x = max_tiles, and the CTAs past n_tiles[0]
// exit. Each token's sums are those of LaunchMatVecMma's unsplit form.
struct MmaGroupArgs {
  const int* n_tiles = nullptr;  // (1)
  const int* order = nullptr;    // route ids, expert by expert
  const int* tiles = nullptr;    // (max_tiles, 3): expert, first index into order, count
  int64_t expert_stride[kMaxMatVecParts] = {};
  int n_expert = 0;
  int x_div = 1;
};
absl::Status LaunchMatVecMmaGrouped(MatVecKernel kernel, const MatVecArgs& args, int64_t grid_y,
                                    const MmaGroupArgs& groups, int tile_tokens, int64_t max_tiles, bool pdl,
                                    cudaStream_t stream);

// The f16 tensor-core form (matvec_mma_f16.cu) of q4_K, q5_K, q6_K dpl and
// q8_0 dpl: grid.x = token tiles (one up to 64 tokens; past 64, the wide
// launch: 64-token tiles, k unsplit or summed in clusters), grid.y = all
// parts' row blocks of kMmaF16CtaRows rows, grid.z = the largest of the
// parts' splits (MmaF16Splits, with partial scratch). Needs the f16
// activations (xh, F16Index), n_cols % 256 == 0 and 16-byte row strides.
struct MmaF16Options {
  // CTAs a SM up to 16 tokens, 2, 3 or 4 (DecodeTuning::
  // mma_f16_small_ctas_per_sm); other values mean 2.
  int ctas_per_sm = 2;
  // A k-split launch whose parts all split alike, 2 to 8 ways, adds its
  // splits inside clusters of a row tile's CTAs (distributed shared
  // memory: no partials, no MmaSumSplits launch; the same bits).
  // DecodeTuning::mma_f16_cluster_sum.
  bool cluster_sum = false;
};
absl::Status LaunchMatVecMmaF16(MatVecKernel kernel, const MatVecArgs& args, int64_t grid_y,
                                bool pdl, cudaStream_t stream, const MmaF16Options& options);

// The second kernel of a k-split mma launch (either form): for the parts
// with splits > 1, y = sum of the partials in split order (+ bias)
// (+ residual). Launches nothing when no part splits.
absl::Status LaunchMmaSumSplits(const MatVecArgs& args, bool pdl, cudaStream_t stream);

// CTAs of that kernel and geometry resident per SM on the current device
// (the CUDA occupancy API): what DecodeTuning records at load.
absl::StatusOr<int> MatVecCtasPerSm(MatVecKernel kernel, const MatVecGeometry& g);

// The int8 activations every quantized kernel reads: QuantOut
// (kernels/act_quant.h), one warp per block of 32 values (QuantizeBlock32).
// v = x: n_blocks consecutive blocks of 32 floats.
absl::Status LaunchQuantizeActivations(const float* x, int64_t n_blocks, const QuantOut& out,
                                       bool pdl, cudaStream_t stream);
// v = h = x * w / sqrt(mean(x^2) + eps) per token row (RMSNorm), h also
// written as float32 (n_tokens, n_cols): the f32/f16 kernels read it.
absl::Status LaunchNormQuantize(const float* x, const float* w, float eps, int64_t n_cols,
                                int64_t n_tokens, float* h, const QuantOut& out, bool pdl,
                                cudaStream_t stream);
// v = g = silu(gate) * up (SwiGLU, full-precision expf), g also written as
// float32 (n_tokens, n_cols); g may alias gate.
absl::Status LaunchSwiGluQuantize(const float* gate, const float* up, int64_t n_cols,
                                  int64_t n_tokens, float* g, const QuantOut& out, bool pdl,
                                  cudaStream_t stream);

}  // namespace dpl::kernels
