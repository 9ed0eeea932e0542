// Kernel families and launch geometry of the matvec kernels: plain constants
// and structs shared by the CUDA side (matvec_kernels.cu) and the CPU-side
// planner (matvec_plan.cc), which CI tests without a GPU.
#pragma once

#include <cstdint>

namespace dpl::kernels {

// Which kernel family reads a matrix (resolved once per matrix by PlanMatVec).
enum class MatVecKernel : int {
  kF32 = 0,     // f32 weights, f32 x, 16-byte vector loads
  kF32Scalar,   // f32 rows not 16-byte aligned or n_cols % 4 != 0
  kF16,         // f16 weights, f32 x, 16-byte vector loads
  kF16Scalar,   // f16 rows not 16-byte aligned or n_cols % 8 != 0
  kBF16,        // bf16 weights, f32 x, 16-byte vector loads
  kBF16Scalar,  // bf16 rows not 16-byte aligned or n_cols % 8 != 0
  // Quantized weights with q8 activations. "Dpl": the dpl split-plane rows
  // (16-byte aligned planes); the others read raw GGUF blocks. A type's raw
  // and dpl kernels share their math and give bit-identical results.
  kQ8_0,        // q8_0 raw (34 B blocks, 2-byte aligned)
  kQ8_0Dpl,
  kQ4_0,        // q4_0 raw (18 B)
  kQ4_0Dpl,
  kQ4_1,        // q4_1 raw (20 B)
  kQ4_1Dpl,
  kQ5_0,        // q5_0 raw (22 B)
  kQ5_0Dpl,
  kQ5_1,        // q5_1 raw (24 B)
  kQ5_1Dpl,
  kIQ4NL,       // iq4_nl raw (18 B)
  kIQ4NLDpl,
  kQ2K,         // q2_K raw (84 B)
  kQ2KDpl,
  kQ3K,         // q3_K raw (110 B)
  kQ3KDpl,
  kQ4K,         // q4_K raw (144 B, 16-byte aligned)
  kQ5K,         // q5_K raw (176 B, 16-byte aligned)
  kQ6KRaw,      // q6_K raw (210 B)
  kQ6KDpl,
  kIQ4XS,       // iq4_xs raw (136 B, 8-byte aligned)
  kIQ4XSDpl,
};
inline constexpr int kNumMatVecKernels = static_cast<int>(MatVecKernel::kIQ4XSDpl) + 1;

// Geometry shared by every matvec kernel: 8 lanes cooperate on one row (so
// the 8 lanes of a row read 128 contiguous bytes per step, one cache line, and
// the 4 rows of a warp share every activation load: L1 broadcasts it once per
// warp). A warp holds one group of 4 rows.
inline constexpr int kLanesPerRow = 8;
inline constexpr int kRowsPerWarp = 32 / kLanesPerRow;
// Prompts: tokens that share each weight load in the tiled launch. Token
// tiles are the fastest-varying grid index (grid.x), so the CTAs that read
// the same weight rows for different tiles run together and re-hit L2.
inline constexpr int kTokenTile = 8;
inline constexpr int64_t kMaxGridY = 65535;
// Activations are quantized in blocks of this many values (int8 + f32 scale).
inline constexpr int kActBlock = 32;
// Matrices one launch may cover (they read the same x with the same kernel
// and geometry; their row blocks follow each other along grid.y): Q, K and
// V, or gate and up. Why: each launch pays a ramp (CTAs starting, the first
// loads in flight) and a tail (the last CTAs draining); one grid over three
// matrices pays them once, and the 512-row K and V matrices, launch-bound
// alone (~4.9 us for 1 MB on the H200), ride along with Q.
inline constexpr int kMaxMatVecParts = 3;

// Products of 2..kMmaMaxTokens tokens whose kernel has a tensor-core form
// (MatVecMmaSupports, matvec_plan.h) run it (matvec_mma.cu): int8 mma.sync,
// a CTA of 4 warps over kMmaCtaRows rows and all the tokens, every weight
// read once for all the tokens.
inline constexpr int kMmaMaxTokens = 64;
inline constexpr int kMmaCtaRows = 64;
// The mma form splits k over CTAs (grid.z) when a matrix has few row blocks,
// so that about kMmaTargetCtas CTAs cover it: each split's partial sums go
// to a scratch and a second kernel adds them in split order (deterministic)
// with the bias and residual. Why (H200 probe, docs/PERF.md "activations
// staged once per CTA"): 7B ffn_down (56 row blocks) at 4 tokens takes 85.6
// us unsplit, 25.7 us in 8 splits; 18944-row gate/up (296) gains nothing
// past 2. The count depends on the matrix alone (not on the launch it rides
// in), so a group launch gives the same bits as one launch per matrix.
inline constexpr int kMmaTargetCtas = 448;
inline constexpr int kMmaMaxSplits = 8;
inline constexpr int MmaSplits(int64_t n_rows, int64_t n_cols) {
  const int64_t row_ctas = (n_rows + kMmaCtaRows - 1) / kMmaCtaRows;
  int64_t s = (kMmaTargetCtas + row_ctas - 1) / row_ctas;
  if (s > kMmaMaxSplits) s = kMmaMaxSplits;
  if (s > n_cols / 256) s = n_cols / 256;
  return s < 1 ? 1 : static_cast<int>(s);
}
// The f16 form of q4_K (matvec_mma_f16.cu): a CTA of 4 warps over
// kMmaF16CtaRows rows, k split like MmaSplits over half as many CTAs of
// twice the rows (so splits x rows stays within kMmaMaxPartialRows), at
// most one split per 128 columns.
inline constexpr int kMmaF16CtaRows = 128;
// Its weight copies address a matrix with 32-bit byte offsets, so matrices
// of 4 GiB or more keep the int8 form (RunMatVecGroup).
inline constexpr int64_t kMmaF16MaxMatrixBytes = int64_t{1} << 32;
// target_ctas: about how many CTAs cover a matrix (DecodeTuning::
// mma_f16_target_ctas; kMmaTargetCtas / 2 by default).
inline constexpr int MmaF16Splits(int64_t n_rows, int64_t n_cols, int target_ctas = kMmaTargetCtas / 2) {
  const int64_t row_ctas = (n_rows + kMmaF16CtaRows - 1) / kMmaF16CtaRows;
  int64_t s = (target_ctas + row_ctas - 1) / row_ctas;
  if (s > kMmaMaxSplits) s = kMmaMaxSplits;
  if (s > n_cols / 128) s = n_cols / 128;
  return s < 1 ? 1 : static_cast<int>(s);
}
// Partial-sum rows a launch may need, per token: a split matrix has fewer
// than kMmaTargetCtas row blocks, so splits x row blocks < 2 kMmaTargetCtas,
// for each of up to kMaxMatVecParts matrices.
inline constexpr int64_t kMmaMaxPartialRows =
    int64_t{kMaxMatVecParts} * 2 * kMmaTargetCtas * kMmaCtaRows;

// How one launch walks a matrix. One kernel skeleton (MatVecT in
// matvec_kernels.cu) takes all four knobs as template parameters:
//  - token_tile: tokens per CTA, 1 (decode) or kTokenTile (prompt).
//  - ksplit: warps that share one group of 4 rows, each taking every
//    ksplit-th run of `depth` steps along the row; their partial sums are
//    added in warp order through shared memory (fixed order: deterministic).
//    Why: a one-wave matrix with few rows (3584x18944 ffn_down: 224 CTAs of
//    16 rows, ~7 warps per SM) cannot keep enough loads in flight otherwise.
//    A CTA holds max(4, ksplit) warps, so ksplit 8 gives a 512-row matrix 8
//    warps per SM instead of 4.
//  - depth: steps of weight loads each lane issues before dotting them.
//  - pipe: register double buffer: the next `depth` steps are loaded before
//    the current ones are dotted, so loads stay in flight while the lane
//    computes (one-wave mid-size matrices are latency-bound: each warp walks
//    its row in a few serial round trips to HBM).
// Per row the sum order is fixed whatever the geometry's pipe: steps
// ascending per lane, lanes by xor-shuffles 4/2/1, warps of a group in
// order. So the q6_K raw and dpl layouts (same Dot) are bit-identical for
// every geometry, and pipe on/off never changes a result.
struct MatVecGeometry {
  int token_tile = 1;
  int ksplit = 1;
  int depth = 2;
  bool pipe = false;

  bool operator==(const MatVecGeometry& o) const {
    return token_tile == o.token_tile && ksplit == o.ksplit && depth == o.depth && pipe == o.pipe;
  }
};

inline constexpr int WarpsPerCta(int ksplit) { return ksplit < 4 ? 4 : ksplit; }
inline constexpr int RowsPerCta(int ksplit) { return kRowsPerWarp * WarpsPerCta(ksplit) / ksplit; }

// The instantiated combinations: token_tile 1 with ksplit 1/2/4/8 and depth
// 1/2/4 without pipe, or depth 1 with pipe (the planner pipelines depth 1
// only, and every instantiation is built for each of the 28 kernels:
// deeper pipelined ones are left out to bound the build); token_tile
// kTokenTile with ksplit 1/4, depth 2, no
// pipe (prompt CTAs are numerous already: 512-token q4_K 18944x3584 takes
// 7.3 ms unsplit vs 11.4 ms split).
inline bool IsCompiledGeometry(const MatVecGeometry& g) {
  if (g.token_tile == 1) {
    return (g.ksplit == 1 || g.ksplit == 2 || g.ksplit == 4 || g.ksplit == 8) &&
           (g.depth == 1 || g.depth == 2 || g.depth == 4) && (!g.pipe || g.depth == 1);
  }
  return g.token_tile == kTokenTile && (g.ksplit == 1 || g.ksplit == 4) && g.depth == 2 && !g.pipe;
}

// One more token tile, compiled for the f32 vector kernel alone: k split 8
// ways, 4 steps deep (a MoE router at 2-16 tokens: 128 x 2048 f32 in 32
// CTAs of 4 rows, whose plain tile (k split 4, depth 2) took 21.9 us a call
// at up to 8 tokens where the one-token kernel at (8, 4) takes 4.5; ncu,
// H100, docs/PERF.md).
inline constexpr MatVecGeometry kF32WideTile{kTokenTile, 8, 4, false};

// Whether the kernel family has geometry g compiled.
inline bool IsCompiledFor(MatVecKernel k, const MatVecGeometry& g) {
  return IsCompiledGeometry(g) || (k == MatVecKernel::kF32 && g == kF32WideTile);
}
// Whether some kernel family has it (what a grid needs to be sized).
inline bool IsCompiledForSome(const MatVecGeometry& g) { return IsCompiledFor(MatVecKernel::kF32, g); }

// Geometries a mixed launch (two kernels, matvec_skeleton.cuh) is compiled
// for: one token, k-split 1, 2 or 4, depth 1, pipelined.
inline bool IsMixedGeometry(const MatVecGeometry& g) {
  return g.token_tile == 1 && (g.ksplit == 1 || g.ksplit == 2 || g.ksplit == 4) && g.depth == 1 &&
         g.pipe;
}

}  // namespace dpl::kernels
