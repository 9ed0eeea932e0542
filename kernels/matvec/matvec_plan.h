// CPU-side description of a weight matrix for the matvec kernels, the checks
// that decide which kernel may read it, and the launch geometry it gets. No
// CUDA here: this is what CI tests without a GPU (matvec_plan_test).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/matvec/matvec_geometry.h"
#include "kernels/tuning.h"
#include "kernels/weight_matrix.h"

namespace dpl::kernels {

const char* MatVecKernelName(MatVecKernel k);

// True when the kernel reads the int8 quantized copy of x (see matvec.h).
bool UsesQuantizedActivations(MatVecKernel k);

// True when products of 2..kMmaMaxTokens tokens with this kernel's weights
// run on the int8 tensor cores (matvec_mma.cu) for rows of whole 256-column
// blocks: q4_K, q5_K, q6_K and q8_0 (both layouts where the type has two,
// same bits), the types of Q4_K_M, Q5_K_M, Q6_K and Q8_0 files. Others (and
// q8_0 rows of other lengths) take the token tile.
bool MatVecMmaSupports(MatVecKernel k);
// The same for a matrix of n_cols columns: the form walks whole 256-column
// blocks. What RunMatVec and the decoder both decide by.
bool MatVecMmaSupports(MatVecKernel k, int64_t n_cols);

// True when the mma form of this kernel also has the f16 form
// (matvec_mma_f16.cu: weights dequantized to f16 fragments, f16
// activations): q4_K and q6_K in the dpl layout (16-byte aligned planes for
// 16-byte copies), rows of whole 256-column blocks.
bool MatVecMmaF16Supports(MatVecKernel k, int64_t n_cols);

// True when a launch may read its last part with `last` and the others with
// `kernel` (matvec_skeleton.cuh: the mixed MatVecT): q4_K with q6_K (either
// layout).
bool MatVecMixedSupports(MatVecKernel kernel, MatVecKernel last);

// True when the expert-indexed form (kernels/matvec/moe.h: a mixture of
// experts' gate/up/down products, each CTA reading the expert its route
// chose) is compiled for this kernel: q4_K, q5_K, q6_K and q8_0, both
// layouts where the type has two (model::GpuHasExpertKernelFor's types).
bool MatVecMoeSupports(MatVecKernel k);

// Smallest legal row stride (bytes) for `type`/`layout` rows of n_cols
// weights, or 0 when n_cols is not a whole number of blocks.
int64_t MinRowStride(formats::GgmlType type, formats::TensorLayout layout, int64_t n_cols);

// What RunMatVec launches for one matrix, resolved once at load.
struct MatVecPlan {
  MatVecKernel kernel = MatVecKernel::kF32;
  // A mixed group launch (PlanMatVecGroups): its last matrix is read by
  // last_kernel, the others by kernel.
  bool mixed = false;
  MatVecKernel last_kernel = MatVecKernel::kF32;
  MatVecGeometry decode;  // one token
  MatVecGeometry prompt;  // more tokens: token_tile kTokenTile
  bool pdl = false;       // launched as a programmatic dependent launch (DecodeTuning::pdl)
  // Products of this many tokens or more (up to kMmaMaxTokens) take the f16
  // mma form instead of the int8 one; 0: never (no f16 form for the kernel).
  // DecodeTuning::mma_f16_min_tokens (q4_K), mma_f16_min_tokens_q5k,
  // mma_f16_min_tokens_q6k (q6_K dpl) or mma_f16_min_tokens_q8_0 (q8_0 dpl)
  // where MatVecMmaF16Supports.
  int mma_f16_min_tokens = 0;
  // Products of more than kMmaMaxTokens and up to this many tokens take the
  // f16 form's wide launch (64-token tiles over grid.x) where the kernel has
  // an f16 form (DecodeTuning::mma_f16_max_tokens); 0: never.
  int mma_f16_max_tokens = 0;
  bool mma_f16_wide_split = false;  // DecodeTuning::mma_f16_wide_split
  // The f16 form's CTAs a SM up to 16 tokens
  // (DecodeTuning::mma_f16_small_ctas_per_sm), taken only by launches of
  // more CTAs than two a SM of num_sms hold; smaller launches keep 2 (see
  // DecodeTuning for why).
  int mma_f16_small_ctas = 2;
  // The f16 form's k splits summed in clusters (DecodeTuning::mma_f16_cluster_sum):
  // 0 never, 1 launches of more than one wave (num_sms x their CTAs a SM), 2 always.
  int mma_f16_cluster_sum = 0;
  // About how many CTAs cover one f16-form matrix (its k splits: MmaF16Splits).
  int mma_f16_target_ctas = kMmaTargetCtas / 2;
  int mma_f16_target_ctas_wide = kMmaTargetCtas / 2;  // over 16 tokens
  int num_sms = 0;  // the GPU's (DecodeTuning::num_sms): what "a wave" is above
};

// Checks shape, stride and alignment of `w`, picks its kernel and the
// measured geometry for this GPU (DecodeGeometryFor). Errors name the
// type/layout/field that is wrong (unsupported types included).
absl::StatusOr<MatVecPlan> PlanMatVec(const WeightMatrix& w, const DecodeTuning& tuning);

// The geometry of a mixed launch of n_rows rows in all whose first kernel
// is `kernel`: that kernel's own (DecodeGeometryFor), when it has a mixed
// form (IsMixedGeometry) and its grid is one wave at the q6_K kernel's
// residency (tuning.q6k_ctas_per_sm: the mixed kernel has its q6_K part's
// 72 registers). Else ksplit 0: no mixed launch. Why: measured on the H200
// (2026-12-03, dpl-bench, base and build interleaved, two rounds each):
// Qwen2.5-14B's q/k/v (7168 rows, k-split 2: 896 CTAs, one wave of 924) in
// one mixed launch gained 2.5% tg128 (263.7 -> 270.2 t/s) and 2.2% at depth
// 3254; the 7B's (4608 rows) lost 0.7% tg128 at q4_K's k-split 4 (1152
// CTAs, 1.25 waves: 507.5 -> 504.0), and at k-split 2 (one wave, but a
// slower split for Q) gained 0.2% tg128 and lost 0.8% at depth 3254.
MatVecGeometry MixedGeometryFor(MatVecKernel kernel, int64_t n_rows, const DecodeTuning& tuning);

// Matrices that read the same x, in launches: `members` index the input
// span; every member has the group's kernel, and the group's decode
// geometry is planned for the members' total rows (RunMatVecGroup launches
// them as one grid). Matrices with the same kernel share a launch, at most
// kMaxMatVecParts per launch, in their input order (tuning.group_matvecs
// false: one launch each). Then a group of one matrix joins another group
// as its last member when the pair has a mixed form (MatVecMixedSupports)
// and the joined height a mixed geometry (MixedGeometryFor): a Q4_K_M
// layer's q4_K Q, K and q6_K V in one launch (plan.mixed, last_kernel V's). Errors
// as PlanMatVec's, or matrices of different widths.
struct MatVecGroupPlan {
  std::vector<int> members;
  MatVecPlan plan;
};
absl::StatusOr<std::vector<MatVecGroupPlan>> PlanMatVecGroups(absl::Span<const WeightMatrix> ws,
                                                              const DecodeTuning& tuning);

// The single-token geometry per kernel and matrix height (launch height:
// a grouped launch's total rows), from H200 sweeps of every k-split, depth
// and pipe on one binary (matvec_bench 2026-11-30; the q4_K and q6_K rows
// re-swept 2026-12-02 on the grouped heights, docs/PERF.md):
//  q4_K, 2048..65535 rows: depth 1 pipelined (2 steps in flight per lane at
//   48 registers), k-split 1 from 32768 rows, 2 from 6144, else 4. In the
//   captured step (dpl-bench DPL_MATVEC_GEOM, 2026-12-03) the 7B's grouped
//   gate/up (37888 rows) at k-split 2 gained 1.7% at depth 3254 with the
//   RoPE kernel (478.6 vs 471.4 t/s) but nothing once RoPE folded into the
//   Q/K/V matvec (478.4 vs 478.6), and lost 1.6% at tg128 there (514.5 vs
//   522.4), so k-split 1 stays. matvec_bench:
//   27648x5120 (14B gate/up) ks1 35.9 / ks2 27.8 / ks4 28.7 us; 37888x3584
//   (7B gate/up) 27.1 / 27.0 / 29.2 (2026-12-03, matvec_bench twice, pipelined:
//   ks1 24.62 / 24.46, ks2 25.10 / 25.20; 14B ks1 30.6 / 30.5, ks2 26.2 /
//   26.1); 7168x5120 ks2 10.0 / ks4 11.9; 4608x3584 7.4 / 6.5; 5120x13824
//   20.4 / 16.1; 3584x18944 27.8 / 17.5.
//  q6_K (raw and dpl alike: their outputs are compared bit for bit),
//   2048..65535 rows: depth 1 pipelined, the largest k-split whose grid is
//   one wave (tuning.q6k_ctas_per_sm * num_sms CTAs): 3584 rows k-split 4
//   24.7 -> 19.3 us; 5120 rows k-split 2 20.9 -> 20.6 (k-split 4 there is
//   1.4 waves: 25 us). From 65536 rows (lm heads) depth 1, no split, no
//   pipe: 152064x3584 111 us vs 120 at depth 4 (91.6% of HBM), 152064x5120
//   172 vs 185.
//  q5_K (2026-12-02 sweep): from 8192 rows depth 1 without pipe (its
//   48-byte register step pipelined costs occupancy: 18944x3584 18.4 us vs
//   23.9 pipelined), below that as q4_K (3584x18944 ks4 d1 pipe 19.7 us).
//  q8_0 dpl from 16384 rows: depth 4 (18944x3584: 22.7 us vs 24.6 at 2).
//  Otherwise (lm heads of other types; 512-row attn_k/v: ~4.9 us whatever
//   the geometry, launch-bound; other types): k-split 4 below 16384 rows,
//   depth 4 from 65536 rows, else 2, no pipe. (13824x5120 q4_K 18.8 us with
//   k-split vs 19.8 without.)
MatVecGeometry DecodeGeometryFor(MatVecKernel kernel, int64_t n_rows, const DecodeTuning& tuning);

// Grid of a launch: x = token tiles, y = row blocks of RowsPerCta(ksplit)
// rows. Errors when the geometry is not compiled or the grid does not fit
// CUDA's limits (n_rows too large).
struct MatVecGrid {
  int64_t x = 0;
  int64_t y = 0;
};
absl::StatusOr<MatVecGrid> MatVecGridFor(int64_t n_rows, int64_t n_tokens, const MatVecGeometry& g);

}  // namespace dpl::kernels
