// Kernel families and launch geometry of the matvec kernels: plain constants
// and structs shared by the CUDA side (matvec_kernels.cu) and the CPU-side
// planner (matvec_plan.cc), which CI tests without a GPU.
#pragma once

#include <cstdint>

namespace dpl::kernels {

// Which kernel family reads a matrix (resolved once per matrix by PlanMatVec).
enum class MatVecKernel : int {
  kF32 = 0,    // f32 weights, f32 x, 16-byte vector loads
  kF32Scalar,  // f32 rows not 16-byte aligned or n_cols % 4 != 0
  kF16,        // f16 weights, f32 x, 16-byte vector loads
  kF16Scalar,  // f16 rows not 16-byte aligned or n_cols % 8 != 0
  kQ8_0,       // q8_0 raw blocks (34 B, 2-byte aligned), q8 activations
  kQ5_0,       // q5_0 raw blocks (22 B, 2-byte aligned), q8 activations
  kQ4K,        // q4_K raw blocks (144 B, 16-byte aligned), q8 activations
  kQ6KRaw,     // q6_K raw GGUF blocks (210 B, 2-byte aligned), q8 activations
  kQ6KDpl,     // q6_K dense split-plane rows (16-byte aligned), q8 activations
};

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

// The instantiated combinations: token_tile 1 with ksplit 1/2/4/8, depth
// 1/2/4, pipe on or off; token_tile kTokenTile with ksplit 1/4, depth 2, no
// pipe (prompt CTAs are numerous already: 512-token q4_K 18944x3584 takes
// 7.3 ms unsplit vs 11.4 ms split).
inline bool IsCompiledGeometry(const MatVecGeometry& g) {
  if (g.token_tile == 1) {
    return (g.ksplit == 1 || g.ksplit == 2 || g.ksplit == 4 || g.ksplit == 8) &&
           (g.depth == 1 || g.depth == 2 || g.depth == 4);
  }
  return g.token_tile == kTokenTile && (g.ksplit == 1 || g.ksplit == 4) && g.depth == 2 && !g.pipe;
}

}  // namespace dpl::kernels
