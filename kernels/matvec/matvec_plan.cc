#include "kernels/matvec/matvec_plan.h"

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "formats/tensor_layout.h"

namespace dpl::kernels {

using formats::GgmlType;
using formats::TensorLayout;

namespace {

// Every kernel: its name, the weight type and layout it reads, and whether
// it reads the int8 activations.
struct KernelInfo {
  MatVecKernel kernel;
  const char* name;
  GgmlType type;
  TensorLayout layout;
  bool quantized_x;
};
constexpr KernelInfo kKernels[] = {
    {MatVecKernel::kF32, "f32", GgmlType::kF32, TensorLayout::kRaw, false},
    {MatVecKernel::kF32Scalar, "f32_scalar", GgmlType::kF32, TensorLayout::kRaw, false},
    {MatVecKernel::kF16, "f16", GgmlType::kF16, TensorLayout::kRaw, false},
    {MatVecKernel::kF16Scalar, "f16_scalar", GgmlType::kF16, TensorLayout::kRaw, false},
    {MatVecKernel::kBF16, "bf16", GgmlType::kBF16, TensorLayout::kRaw, false},
    {MatVecKernel::kBF16Scalar, "bf16_scalar", GgmlType::kBF16, TensorLayout::kRaw, false},
    {MatVecKernel::kQ8_0, "q8_0", GgmlType::kQ8_0, TensorLayout::kRaw, true},
    {MatVecKernel::kQ8_0Dpl, "q8_0_dpl", GgmlType::kQ8_0, TensorLayout::kDpl, true},
    {MatVecKernel::kQ4_0, "q4_0", GgmlType::kQ4_0, TensorLayout::kRaw, true},
    {MatVecKernel::kQ4_0Dpl, "q4_0_dpl", GgmlType::kQ4_0, TensorLayout::kDpl, true},
    {MatVecKernel::kQ4_1, "q4_1", GgmlType::kQ4_1, TensorLayout::kRaw, true},
    {MatVecKernel::kQ4_1Dpl, "q4_1_dpl", GgmlType::kQ4_1, TensorLayout::kDpl, true},
    {MatVecKernel::kQ5_0, "q5_0", GgmlType::kQ5_0, TensorLayout::kRaw, true},
    {MatVecKernel::kQ5_0Dpl, "q5_0_dpl", GgmlType::kQ5_0, TensorLayout::kDpl, true},
    {MatVecKernel::kQ5_1, "q5_1", GgmlType::kQ5_1, TensorLayout::kRaw, true},
    {MatVecKernel::kQ5_1Dpl, "q5_1_dpl", GgmlType::kQ5_1, TensorLayout::kDpl, true},
    {MatVecKernel::kIQ4NL, "iq4_nl", GgmlType::kIQ4_NL, TensorLayout::kRaw, true},
    {MatVecKernel::kIQ4NLDpl, "iq4_nl_dpl", GgmlType::kIQ4_NL, TensorLayout::kDpl, true},
    {MatVecKernel::kQ2K, "q2_K", GgmlType::kQ2_K, TensorLayout::kRaw, true},
    {MatVecKernel::kQ2KDpl, "q2_K_dpl", GgmlType::kQ2_K, TensorLayout::kDpl, true},
    {MatVecKernel::kQ3K, "q3_K", GgmlType::kQ3_K, TensorLayout::kRaw, true},
    {MatVecKernel::kQ3KDpl, "q3_K_dpl", GgmlType::kQ3_K, TensorLayout::kDpl, true},
    {MatVecKernel::kQ4K, "q4_K", GgmlType::kQ4_K, TensorLayout::kRaw, true},
    {MatVecKernel::kQ5K, "q5_K", GgmlType::kQ5_K, TensorLayout::kRaw, true},
    {MatVecKernel::kQ6KRaw, "q6_K_raw", GgmlType::kQ6_K, TensorLayout::kRaw, true},
    {MatVecKernel::kQ6KDpl, "q6_K_dpl", GgmlType::kQ6_K, TensorLayout::kDpl, true},
    {MatVecKernel::kIQ4XS, "iq4_xs", GgmlType::kIQ4_XS, TensorLayout::kRaw, true},
    {MatVecKernel::kIQ4XSDpl, "iq4_xs_dpl", GgmlType::kIQ4_XS, TensorLayout::kDpl, true},
};
static_assert(sizeof(kKernels) / sizeof(kKernels[0]) == kNumMatVecKernels,
              "every MatVecKernel has a row");

const KernelInfo* InfoOf(MatVecKernel k) {
  for (const KernelInfo& i : kKernels) {
    if (i.kernel == k) return &i;
  }
  return nullptr;
}

// Largest power of two dividing n, at most 16.
int64_t Pow2Factor(int64_t n) {
  int64_t a = 1;
  while (a < 16 && n % (2 * a) == 0) a *= 2;
  return a;
}

}  // namespace

const char* MatVecKernelName(MatVecKernel k) {
  const KernelInfo* i = InfoOf(k);
  return i != nullptr ? i->name : "?";
}

bool MatVecMmaSupports(MatVecKernel k) {
  return k == MatVecKernel::kQ4K || k == MatVecKernel::kQ5K || k == MatVecKernel::kQ6KDpl ||
         k == MatVecKernel::kQ6KRaw || k == MatVecKernel::kQ8_0 || k == MatVecKernel::kQ8_0Dpl;
}

bool MatVecMmaSupports(MatVecKernel k, int64_t n_cols) {
  return MatVecMmaSupports(k) && n_cols > 0 && n_cols % 256 == 0;
}

bool MatVecMmaF16Supports(MatVecKernel k, int64_t n_cols) {
  return (k == MatVecKernel::kQ4K || k == MatVecKernel::kQ5K || k == MatVecKernel::kQ6KDpl ||
          k == MatVecKernel::kQ8_0Dpl) &&
         MatVecMmaSupports(k, n_cols);
}

bool MatVecMixedSupports(MatVecKernel kernel, MatVecKernel last) {
  return kernel == MatVecKernel::kQ4K &&
         (last == MatVecKernel::kQ6KDpl || last == MatVecKernel::kQ6KRaw);
}

bool MatVecMoeSupports(MatVecKernel k) {
  switch (k) {
    case MatVecKernel::kQ4K:
    case MatVecKernel::kQ5K:
    case MatVecKernel::kQ6KRaw:
    case MatVecKernel::kQ6KDpl:
    case MatVecKernel::kQ8_0:
    case MatVecKernel::kQ8_0Dpl:
      return true;
    default:
      return false;
  }
}

bool UsesQuantizedActivations(MatVecKernel k) {
  const KernelInfo* i = InfoOf(k);
  return i != nullptr && i->quantized_x;
}

int64_t MinRowStride(GgmlType type, TensorLayout layout, int64_t n_cols) {
  if (n_cols <= 0) return 0;
  if (layout == TensorLayout::kDpl && formats::DplPlanesOf(type).n == 0) return 0;
  const formats::GgmlTypeTraits tr = formats::TraitsOf(type);
  if (n_cols % tr.block_elems != 0) return 0;
  return static_cast<int64_t>(
      formats::LayoutRowStride(layout, static_cast<uint64_t>(n_cols / tr.block_elems), tr.block_bytes));
}

namespace {

bool Aligned(const void* p, uintptr_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; }

// DecodeGeometryFor, or the tuning's override for this kernel and shape.
MatVecGeometry PlannedDecodeGeometry(MatVecKernel kernel, int64_t n_rows, int64_t n_cols,
                                     const DecodeTuning& tuning) {
  for (const DecodeTuning::MatVecGeometryOverride& o : tuning.matvec_geometry) {
    if (o.kernel == MatVecKernelName(kernel) && o.n_rows == n_rows && o.n_cols == n_cols) {
      return MatVecGeometry{1, o.ksplit, o.depth, o.pipe};
    }
  }
  return DecodeGeometryFor(kernel, n_rows, tuning);
}

}  // namespace

absl::StatusOr<MatVecPlan> PlanMatVec(const WeightMatrix& w, const DecodeTuning& tuning) {
  const absl::string_view tname = formats::TraitsOf(w.type).name;
  const absl::string_view lname = formats::TensorLayoutName(w.layout);
  const std::string what = absl::StrCat("matvec: ", tname, "/", lname, " matrix ", w.n_rows, "x",
                                        w.n_cols, " (row_stride ", w.row_stride, ")");
  if (w.data == nullptr) return absl::InvalidArgumentError(absl::StrCat(what, ": null data"));
  if (w.n_rows <= 0 || w.n_cols <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": empty shape"));
  }
  if (w.n_cols > (int64_t{1} << 30) || w.n_rows > (int64_t{1} << 31) - 1) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": shape too large"));
  }
  if (w.layout != TensorLayout::kRaw && w.layout != TensorLayout::kDpl) {
    return absl::UnimplementedError(absl::StrCat(what, ": unsupported layout"));
  }
  if (w.layout == TensorLayout::kDpl && formats::DplPlanesOf(w.type).n == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": type ", tname, " has no dpl layout"));
  }
  // The kernel reading this type and layout, and the alignment its loads
  // need of the base and of every row: dpl rows are 16-byte aligned; raw
  // block rows as their blocks (BlockRow in kernels/block_row.cuh assumes
  // it); f32/f16/bf16 rows take the vector kernel when 16-byte aligned.
  const KernelInfo* info = nullptr;
  for (const KernelInfo& i : kKernels) {
    if (i.type == w.type && i.layout == w.layout) {
      info = &i;
      break;
    }
  }
  if (info == nullptr) {
    return absl::UnimplementedError(absl::StrCat(what, ": no matvec kernel for type ", tname));
  }
  MatVecKernel k = info->kernel;
  uintptr_t align = 16;
  if (w.type == GgmlType::kF32 || w.type == GgmlType::kF16 || w.type == GgmlType::kBF16) {
    const int64_t per16 = w.type == GgmlType::kF32 ? 4 : 8;
    const bool vec = w.n_cols % per16 == 0 && w.row_stride % 16 == 0 && Aligned(w.data, 16);
    if (!vec) {
      k = w.type == GgmlType::kF32   ? MatVecKernel::kF32Scalar
          : w.type == GgmlType::kF16 ? MatVecKernel::kF16Scalar
                                     : MatVecKernel::kBF16Scalar;
      align = w.type == GgmlType::kF32 ? 4 : 2;
    }
  } else if (w.layout == TensorLayout::kRaw) {
    align = static_cast<uintptr_t>(Pow2Factor(formats::TraitsOf(w.type).block_bytes));
  }
  const int64_t min_stride = MinRowStride(w.type, w.layout, w.n_cols);
  if (min_stride == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": n_cols is not a whole number of ", tname, " blocks"));
  }
  if (UsesQuantizedActivations(k) && w.n_cols % 32 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": n_cols must be a multiple of 32 (activation quantization)"));
  }
  if (w.row_stride < min_stride) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": row_stride below the ", min_stride, " bytes a row needs"));
  }
  if (w.row_stride % static_cast<int64_t>(align) != 0 || !Aligned(w.data, align)) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": data and row_stride must be ", align, "-byte aligned for kernel ",
        MatVecKernelName(k)));
  }
  MatVecPlan plan;
  plan.kernel = k;
  plan.decode = PlannedDecodeGeometry(k, w.n_rows, w.n_cols, tuning);
  // The token tile's k split: 4 (four rows a CTA) where row blocks of 16
  // would not give every SM one. Why: a MoE router (qwen3moe's 128 x 2048
  // f32) at 4 tokens took 70.8 us on 8 CTAs, 48 of them 3.4 ms of a 6.5 ms
  // 4-sequence step (ncu, H100, 30B-A3B, docs/PERF.md).
  const bool few_blocks = (w.n_rows + RowsPerCta(1) - 1) / RowsPerCta(1) < tuning.num_sms;
  plan.prompt = MatVecGeometry{kTokenTile, few_blocks ? 4 : 1, 2, false};
  // There, f32 matrices (a router) may take the deeper tile
  // (DecodeTuning::f32_wide_tile; kF32WideTile says why).
  if (few_blocks && k == MatVecKernel::kF32 && tuning.f32_wide_tile) plan.prompt = kF32WideTile;
  plan.pdl = tuning.pdl;
  plan.mma_f16_small_ctas = tuning.mma_f16_small_ctas_per_sm;
  plan.mma_f16_cluster_sum = tuning.mma_f16_cluster_sum;
  plan.mma_f16_target_ctas = tuning.mma_f16_target_ctas;
  plan.mma_f16_target_ctas_wide = tuning.mma_f16_target_ctas_wide;
  plan.num_sms = tuning.num_sms;
  if (MatVecMmaF16Supports(k, w.n_cols)) {
    plan.mma_f16_min_tokens = k == MatVecKernel::kQ4K      ? tuning.mma_f16_min_tokens
                              : k == MatVecKernel::kQ5K    ? tuning.mma_f16_min_tokens_q5k
                              : k == MatVecKernel::kQ6KDpl ? tuning.mma_f16_min_tokens_q6k
                                                           : tuning.mma_f16_min_tokens_q8_0;
    plan.mma_f16_max_tokens = tuning.mma_f16_max_tokens > kMmaMaxTokens ? tuning.mma_f16_max_tokens : 0;
    plan.mma_f16_wide_split = tuning.mma_f16_wide_split;
  }
  return plan;
}

absl::StatusOr<std::vector<MatVecGroupPlan>> PlanMatVecGroups(absl::Span<const WeightMatrix> ws,
                                                              const DecodeTuning& tuning) {
  std::vector<MatVecGroupPlan> groups;
  std::vector<int64_t> rows;  // per group
  for (size_t i = 0; i < ws.size(); ++i) {
    DPL_ASSIGN_OR_RETURN(const MatVecPlan own, PlanMatVec(ws[i], tuning));
    if (ws[i].n_cols != ws[0].n_cols) {
      return absl::InvalidArgumentError(absl::StrCat("matvec group: matrix ", i, " has ",
                                                     ws[i].n_cols, " columns, not ",
                                                     ws[0].n_cols));
    }
    size_t g = tuning.group_matvecs ? 0 : groups.size();
    while (g < groups.size() && (groups[g].plan.kernel != own.kernel ||
                                 groups[g].members.size() >= static_cast<size_t>(kMaxMatVecParts))) {
      ++g;
    }
    if (g == groups.size()) {
      groups.push_back({{}, own});
      rows.push_back(0);
    }
    groups[g].members.push_back(static_cast<int>(i));
    rows[g] += ws[i].n_rows;
  }
  // A group of one joins another as its mixed last member where the pair
  // has a mixed kernel and the joined height a mixed geometry.
  auto join_one = [&]() -> bool {
    for (size_t b = 0; b < groups.size(); ++b) {
      if (groups[b].members.size() != 1) continue;
      for (size_t a = 0; a < groups.size(); ++a) {
        MatVecGroupPlan& ga = groups[a];
        if (a == b || ga.plan.mixed || ga.members.size() >= static_cast<size_t>(kMaxMatVecParts) ||
            !MatVecMixedSupports(ga.plan.kernel, groups[b].plan.kernel) ||
            MixedGeometryFor(ga.plan.kernel, rows[a] + rows[b], tuning).ksplit == 0) {
          continue;
        }
        ga.members.push_back(groups[b].members[0]);
        ga.plan.mixed = true;
        ga.plan.last_kernel = groups[b].plan.kernel;
        rows[a] += rows[b];
        groups.erase(groups.begin() + static_cast<std::ptrdiff_t>(b));
        rows.erase(rows.begin() + static_cast<std::ptrdiff_t>(b));
        return true;
      }
    }
    return false;
  };
  while (tuning.group_matvecs && join_one()) {
  }
  // Each launch's geometry is that of one matrix of its total height, or
  // the mixed one.
  for (size_t g = 0; g < groups.size(); ++g) {
    groups[g].plan.decode = groups[g].plan.mixed
                                ? MixedGeometryFor(groups[g].plan.kernel, rows[g], tuning)
                                : PlannedDecodeGeometry(groups[g].plan.kernel, rows[g], ws[0].n_cols,
                                                        tuning);
  }
  return groups;
}

MatVecGeometry MixedGeometryFor(MatVecKernel kernel, int64_t n_rows, const DecodeTuning& tuning) {
  const MatVecGeometry g = DecodeGeometryFor(kernel, n_rows, tuning);
  const int64_t slots = static_cast<int64_t>(tuning.q6k_ctas_per_sm) * tuning.num_sms;
  if (!IsMixedGeometry(g) || (n_rows + RowsPerCta(g.ksplit) - 1) / RowsPerCta(g.ksplit) > slots) {
    return MatVecGeometry{1, 0, 0, false};
  }
  return g;
}

MatVecGeometry DecodeGeometryFor(MatVecKernel kernel, int64_t n_rows, const DecodeTuning& tuning) {
  const MatVecGeometry plain = {1, n_rows < 16384 ? 4 : 1, n_rows >= 65536 ? 4 : 2, false};
  // A MoE router (f32, experts x n_embd: 128 x 2048 on Qwen3-30B-A3B, 1 MB
  // in 32 CTAs) is read by few CTAs, each waiting on its loads: eight warps
  // a CTA splitting k, four loads deep. Measured in the captured step (H100,
  // 30B-A3B Q4_K_M, tg128, DPL_MATVEC_GEOM sweep, docs/PERF.md): 4,2 (the
  // plain rule) 414 t/s; 8,4 435; 8,2 427; 4,4 422; 2,2 384; 1,1 271.
  if (kernel == MatVecKernel::kF32 && n_rows < 2048) return {1, 8, 4, false};
  if (n_rows >= 65536 && (kernel == MatVecKernel::kQ6KDpl || kernel == MatVecKernel::kQ6KRaw)) {
    return {1, 1, 1, false};
  }
  if (n_rows >= 65536 || n_rows < 2048) return plain;
  if (kernel == MatVecKernel::kQ4K) return {1, n_rows >= 32768 ? 1 : n_rows >= 6144 ? 2 : 4, 1, true};
  if (kernel == MatVecKernel::kQ5K) return n_rows >= 8192 ? MatVecGeometry{1, 1, 1, false} : MatVecGeometry{1, 4, 1, true};
  if (kernel == MatVecKernel::kQ8_0Dpl && n_rows >= 16384) return {1, 1, 4, false};
  if (kernel == MatVecKernel::kQ6KDpl || kernel == MatVecKernel::kQ6KRaw) {
    const int64_t slots = static_cast<int64_t>(tuning.q6k_ctas_per_sm) * tuning.num_sms;
    if (n_rows <= RowsPerCta(4) * slots) return {1, 4, 1, true};
    if (n_rows <= RowsPerCta(2) * slots) return {1, 2, 1, true};
  }
  return plain;
}

absl::StatusOr<MatVecGrid> MatVecGridFor(int64_t n_rows, int64_t n_tokens, const MatVecGeometry& g) {
  if (!IsCompiledForSome(g)) {
    return absl::InvalidArgumentError(absl::StrCat("matvec: token tile ", g.token_tile, " / k-split ",
                                                   g.ksplit, " / depth ", g.depth, " / pipe ",
                                                   g.pipe, " is not compiled"));
  }
  if (n_rows <= 0 || n_tokens <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("matvec grid: bad sizes n_rows ", n_rows,
                                                   " n_tokens ", n_tokens));
  }
  const int64_t rows = RowsPerCta(g.ksplit);
  MatVecGrid grid;
  grid.y = (n_rows + rows - 1) / rows;
  grid.x = (n_tokens + g.token_tile - 1) / g.token_tile;
  if (grid.y > kMaxGridY) {
    return absl::InvalidArgumentError(absl::StrCat("matvec grid: ", n_rows, " rows need ", grid.y,
                                                   " row blocks, more than ", kMaxGridY));
  }
  if (grid.x > (int64_t{1} << 31) - 1) {
    return absl::InvalidArgumentError(absl::StrCat("matvec grid: too many tokens ", n_tokens));
  }
  return grid;
}

}  // namespace dpl::kernels
