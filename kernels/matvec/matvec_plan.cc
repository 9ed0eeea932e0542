#include "kernels/matvec/matvec_plan.h"

#include "absl/strings/str_cat.h"
#include "formats/tensor_layout.h"

namespace dpl::kernels {

using formats::GgmlType;
using formats::TensorLayout;

const char* MatVecKernelName(MatVecKernel k) {
  switch (k) {
    case MatVecKernel::kF32: return "f32";
    case MatVecKernel::kF32Scalar: return "f32_scalar";
    case MatVecKernel::kF16: return "f16";
    case MatVecKernel::kF16Scalar: return "f16_scalar";
    case MatVecKernel::kQ8_0: return "q8_0";
    case MatVecKernel::kQ5_0: return "q5_0";
    case MatVecKernel::kQ4K: return "q4_K";
    case MatVecKernel::kQ6KRaw: return "q6_K_raw";
    case MatVecKernel::kQ6KDpl: return "q6_K_dpl";
  }
  return "?";
}

bool UsesQuantizedActivations(MatVecKernel k) {
  switch (k) {
    case MatVecKernel::kQ8_0:
    case MatVecKernel::kQ5_0:
    case MatVecKernel::kQ4K:
    case MatVecKernel::kQ6KRaw:
    case MatVecKernel::kQ6KDpl:
      return true;
    default:
      return false;
  }
}

int64_t MinRowStride(GgmlType type, TensorLayout layout, int64_t n_cols) {
  if (n_cols <= 0) return 0;
  if (layout == TensorLayout::kDpl && type != GgmlType::kQ6_K) return 0;
  const formats::GgmlTypeTraits tr = formats::TraitsOf(type);
  if (n_cols % tr.block_elems != 0) return 0;
  return static_cast<int64_t>(
      formats::LayoutRowStride(layout, static_cast<uint64_t>(n_cols / tr.block_elems), tr.block_bytes));
}

namespace {

bool Aligned(const void* p, uintptr_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; }

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
  if (w.layout == TensorLayout::kDpl && w.type != GgmlType::kQ6_K) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": layout dpl_q6k is only defined for q6_K"));
  }
  if (w.layout != TensorLayout::kRaw && w.layout != TensorLayout::kDpl) {
    return absl::UnimplementedError(absl::StrCat(what, ": unsupported layout"));
  }
  MatVecKernel k;
  // Alignment each kernel's loads need: of the base and of every row.
  uintptr_t align = 2;
  switch (w.type) {
    case GgmlType::kF32: {
      const bool vec = w.n_cols % 4 == 0 && w.row_stride % 16 == 0 && Aligned(w.data, 16);
      k = vec ? MatVecKernel::kF32 : MatVecKernel::kF32Scalar;
      align = vec ? 16 : 4;
      break;
    }
    case GgmlType::kF16: {
      const bool vec = w.n_cols % 8 == 0 && w.row_stride % 16 == 0 && Aligned(w.data, 16);
      k = vec ? MatVecKernel::kF16 : MatVecKernel::kF16Scalar;
      align = vec ? 16 : 2;
      break;
    }
    case GgmlType::kQ8_0: k = MatVecKernel::kQ8_0; break;
    case GgmlType::kQ5_0: k = MatVecKernel::kQ5_0; break;
    case GgmlType::kQ4_K: k = MatVecKernel::kQ4K; align = 16; break;
    case GgmlType::kQ6_K:
      if (w.layout == TensorLayout::kDpl) {
        k = MatVecKernel::kQ6KDpl;
        align = 16;
      } else {
        k = MatVecKernel::kQ6KRaw;
      }
      break;
    default:
      return absl::UnimplementedError(absl::StrCat(what, ": no matvec kernel for type ", tname));
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
  plan.decode = DecodeGeometryFor(k, w.n_rows, tuning);
  plan.prompt = MatVecGeometry{kTokenTile, 1, 2, false};
  return plan;
}

MatVecGeometry DecodeGeometryFor(MatVecKernel kernel, int64_t n_rows, const DecodeTuning& tuning) {
  const MatVecGeometry plain = {1, n_rows < 16384 ? 4 : 1, n_rows >= 65536 ? 4 : 2, false};
  if (n_rows >= 65536 || n_rows < 2048) return plain;
  if (kernel == MatVecKernel::kQ4K) return {1, n_rows >= 8192 ? 1 : 4, 1, true};
  if (kernel == MatVecKernel::kQ6KDpl || kernel == MatVecKernel::kQ6KRaw) {
    const int64_t slots = static_cast<int64_t>(tuning.q6k_ctas_per_sm) * tuning.num_sms;
    if (n_rows <= RowsPerCta(4) * slots) return {1, 4, 1, true};
    if (n_rows <= RowsPerCta(2) * slots) return {1, 2, 1, true};
  }
  return plain;
}

absl::StatusOr<MatVecGrid> MatVecGridFor(int64_t n_rows, int64_t n_tokens, const MatVecGeometry& g) {
  if (!IsCompiledGeometry(g)) {
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
