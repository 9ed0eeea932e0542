// Kernel families and launch geometry of the matvec kernels: plain constants
// shared by the CUDA side (matvec_kernels.cu) and the CPU-side planner.
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

// Launch geometry shared by every matvec kernel: 8 lanes cooperate on one row
// (so the 8 lanes of a row read 128 contiguous bytes per step and the 4 rows
// of a warp share every activation load), a warp holds 4 rows, a 128-thread
// CTA 16 rows. The multi-token variant tiles tokens by kTokenTile along
// grid.x, the fastest-varying index, so the CTAs that read the same weight
// rows for different token tiles run together and re-hit L2.
inline constexpr int kLanesPerRow = 8;
inline constexpr int kRowsPerWarp = 32 / kLanesPerRow;
inline constexpr int kThreadsPerCta = 128;
inline constexpr int kRowsPerCta = kThreadsPerCta / 32 * kRowsPerWarp;
inline constexpr int kTokenTile = 8;

// K-split: matrices with few rows (n_rows < kKSplitRowLimit) would give too
// few CTAs to keep 132 SMs' worth of loads in flight (3584x18944 ffn_down:
// 224 CTAs, ~7 warps per SM). There the 4 warps of a CTA share the same 4
// rows, each warp taking every 4th pair of steps along the row, and the CTA
// adds the 4 partial sums in shared memory in warp order (fixed order, so
// results stay deterministic). The limit is measured (H200, bench of
// 2025-11-30): 13824x5120 q4_K 18.8 us with k-split vs 19.8 without,
// 18944x3584 q4_K 17.9 vs 16.8. The token-tiled kernel never splits (its CTAs
// are numerous already; 512-token q4_K 18944x3584: 7.3 ms vs 11.4 ms split).
inline constexpr int kKSplit = 4;
inline constexpr int64_t kKSplitRowLimit = 16384;
inline int KSplitFor(int64_t n_rows) { return n_rows < kKSplitRowLimit ? kKSplit : 1; }
inline int RowsPerCta(int ksplit) { return kRowsPerCta / ksplit; }

// Steps of weight loads each lane keeps in flight in the single-token kernel
// (2 or 4; the token-tiled kernel uses 2). Measured: 4 helps only the
// many-wave lm-head shapes (152064x3584 q6_K dpl ~112-119 us vs 120), and
// costs 5-30% on the one-wave FFN shapes (it lowers occupancy).
inline int DecodeDepthFor(int64_t n_rows) { return n_rows >= 65536 ? 4 : 2; }

// The v2 single-token kernel (matvec_kernels.cu, MatVecDecodeT) generalizes
// the k-split to KS in {1, 2, 4, 8} warps per 4-row group, in CTAs of
// max(4, KS) warps (KS = 8: 256 threads, so a 512-row matrix gets 8 warps per
// SM instead of 4), and can software-pipeline: the next D steps of weights
// are loaded into registers before the current D are dotted, so loads stay in
// flight while the lane computes. Per lane the steps are still summed in
// ascending order and the warps of a group added in warp order, so for KS 1
// and 4 its results are bit-identical to the legacy kernel's.
inline int DecodeWarpsPerCta(int ksplit) { return ksplit < 4 ? 4 : ksplit; }
inline int DecodeRowsPerCta(int ksplit) { return kRowsPerWarp * DecodeWarpsPerCta(ksplit) / ksplit; }
inline constexpr int64_t kMaxGridY = 65535;

// Activations are quantized in blocks of this many values (int8 + f32 scale).
inline constexpr int kActBlock = 32;

}  // namespace dpl::kernels
