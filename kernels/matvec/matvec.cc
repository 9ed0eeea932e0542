#include "kernels/matvec/matvec.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "kernels/cuda_check.h"
#include "kernels/matvec/matvec_kernels.h"

namespace dpl::kernels {
namespace {

// DPL_MATVEC_LEGACY=1: the single-token path runs the legacy kernel (A/B).
bool LegacyDecodeDefault() {
  static const bool legacy = [] {
    const char* e = std::getenv("DPL_MATVEC_LEGACY");
    return e != nullptr && e[0] == '1';
  }();
  return legacy;
}

struct DecodeChoice {
  bool legacy;  // true: the legacy kernel with its own defaults
  int ksplit;
  int depth;
  bool pipe;
};

// Geometry of the single-token kernel per type and matrix height, from the
// H200 sweep of matvec_bench (2025-11-30, every v2 k-split/depth/pipe, one
// binary; see matvec_geometry.h for the knobs). Legacy where v2 measured no
// better: lm heads (>= 65536 rows, many waves, 82-91% already), 512-row
// attn_k/v (~4.9 us either way: launch-bound), and the other types.
//  q4_K: depth 1 pipelined (48 registers: 10 CTAs/SM, so 18944 rows = 1184
//   CTAs is one wave, with 2 steps in flight per lane): 18944x3584 16.95 ->
//   14.8 us, 13824x5120 18.9 -> 16.8; below 8192 rows k-split 4, same depth:
//   5120x13824 25.3 -> 16.2, 3584x18944 20.4 -> 17.7, 5120^2 12.5 -> 8.1.
//  q6_K: depth 1 pipelined uses 72 registers (7 CTAs/SM, 924 CTA slots), so
//   the k-split is the largest whose grid is one wave: 3584 rows k-split 4
//   (896 CTAs): 24.7 -> 19.3 us; 5120 rows k-split 2 (640 CTAs): 20.9 ->
//   20.6 (k-split 4 there is 1.4 waves: 25 us). Raw and dpl q6_K must take
//   the same geometry (their outputs are compared bit for bit).
DecodeChoice ChooseDecode(MatVecKernel kernel, int64_t n_rows) {
  const DecodeChoice legacy = {true, 0, 0, false};
  if (n_rows >= 65536 || n_rows < 2048) return legacy;
  if (kernel == MatVecKernel::kQ4K) {
    return n_rows >= 8192 ? DecodeChoice{false, 1, 1, true} : DecodeChoice{false, 4, 1, true};
  }
  if (kernel == MatVecKernel::kQ6KDpl || kernel == MatVecKernel::kQ6KRaw) {
    constexpr int64_t kQ6CtaSlots = 7 * 132;
    if (n_rows <= DecodeRowsPerCta(4) * kQ6CtaSlots) return {false, 4, 1, true};
    if (n_rows <= DecodeRowsPerCta(2) * kQ6CtaSlots) return {false, 2, 1, true};
    return legacy;
  }
  return legacy;
}

}  // namespace

absl::Status AllocateMatVecScratch(int64_t max_cols, int64_t max_tokens, MatVecScratch* scratch) {
  if (max_cols <= 0 || max_cols % kActBlock != 0 || max_tokens <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("matvec scratch: max_cols ", max_cols,
                                                   " (multiple of 32 needed), max_tokens ",
                                                   max_tokens));
  }
  FreeMatVecScratch(scratch);
  const int64_t n = max_cols * max_tokens;
  DPL_CUDA_CHECK(cudaMalloc(&scratch->q, static_cast<size_t>(n)));
  DPL_CUDA_CHECK(cudaMalloc(&scratch->d, static_cast<size_t>(n / kActBlock) * sizeof(float)));
  DPL_CUDA_CHECK(cudaMalloc(&scratch->s, static_cast<size_t>(n / kActBlock) * sizeof(float)));
  scratch->max_cols = max_cols;
  scratch->max_tokens = max_tokens;
  scratch->n_cols = 0;
  scratch->n_tokens = 0;
  return absl::OkStatus();
}

void FreeMatVecScratch(MatVecScratch* scratch) {
  cudaFree(scratch->q);
  cudaFree(scratch->d);
  cudaFree(scratch->s);
  *scratch = MatVecScratch{};
}

absl::Status QuantizeActivations(const float* x, int64_t n_cols, int64_t n_tokens,
                                 MatVecScratch* scratch, cudaStream_t stream) {
  if (scratch == nullptr || scratch->q == nullptr) {
    return absl::FailedPreconditionError("quantize activations: scratch not allocated");
  }
  if (x == nullptr || n_cols <= 0 || n_tokens <= 0 || n_cols % kActBlock != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "quantize activations: bad input (n_cols ", n_cols, " must be a positive multiple of 32, ",
        "n_tokens ", n_tokens, ")"));
  }
  if (n_cols * n_tokens > scratch->max_cols * scratch->max_tokens || n_tokens > scratch->max_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "quantize activations: ", n_tokens, " x ", n_cols, " exceeds the scratch's ",
        scratch->max_tokens, " x ", scratch->max_cols));
  }
  absl::Status st = LaunchQuantizeActivations(x, n_cols * n_tokens / kActBlock, scratch->q,
                                              scratch->d, scratch->s, stream);
  if (!st.ok()) return st;
  scratch->n_cols = n_cols;
  scratch->n_tokens = n_tokens;
  return absl::OkStatus();
}

absl::Status RunMatVec(const WeightMatrix& w, MatVecKernel kernel, const MatVecIo& io,
                       cudaStream_t stream) {
  const std::string what = absl::StrCat("matvec ", MatVecKernelName(kernel), " ", w.n_rows, "x",
                                        w.n_cols);
  if (io.y == nullptr || io.n_tokens <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": null y or no tokens"));
  }
  MatVecArgs a;
  a.w = static_cast<const uint8_t*>(w.data);
  a.row_stride = w.row_stride;
  a.n_rows = static_cast<int>(w.n_rows);
  a.n_cols = static_cast<int>(w.n_cols);
  a.n_tokens = static_cast<int>(io.n_tokens);
  a.y = io.y;
  a.bias = io.bias;
  a.residual = io.residual;
  if (UsesQuantizedActivations(kernel)) {
    if (io.qx == nullptr || io.qx->q == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": needs quantized activations"));
    }
    if (io.qx->n_cols != w.n_cols || io.qx->n_tokens < io.n_tokens) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": scratch holds ", io.qx->n_tokens, " x ", io.qx->n_cols,
          " quantized activations, need ", io.n_tokens, " x ", w.n_cols));
    }
    a.xq = io.qx->q;
    a.xd = io.qx->d;
    a.xs = io.qx->s;
  } else {
    if (io.x == nullptr) return absl::InvalidArgumentError(absl::StrCat(what, ": null x"));
    a.x = io.x;
    // The vector kernels load x with 16-byte loads: fall back when x is not
    // 16-byte aligned.
    if (reinterpret_cast<uintptr_t>(io.x) % 16 != 0) {
      if (kernel == MatVecKernel::kF32) kernel = MatVecKernel::kF32Scalar;
      if (kernel == MatVecKernel::kF16) kernel = MatVecKernel::kF16Scalar;
    }
  }
  // Defaults measured on the H200 (matvec_geometry.h). The tiled kernel
  // never splits k, so for short matrices it sums in a different order than
  // the single-token kernel (agreement ~1e-7, not bitwise).
  const int tile = io.n_tokens == 1 ? 1 : kTokenTile;
  const DecodeOverride& ov = DecodeOverrideForTesting();
  const int variant = ov.variant >= 0 ? ov.variant : (LegacyDecodeDefault() ? 0 : 1);
  const DecodeChoice c = ChooseDecode(kernel, w.n_rows);
  // v2 runs when it is the measured choice, or when an override asks for it.
  if (tile == 1 && variant == 1 && (!c.legacy || ov.variant == 1)) {
    // With no v2 geometry measured for this matrix, the legacy defaults.
    const int def_ks = c.legacy ? KSplitFor(w.n_rows) : c.ksplit;
    const int def_depth = c.legacy ? DecodeDepthFor(w.n_rows) : c.depth;
    const int ks = ov.ksplit != 0 ? ov.ksplit : (io.force_ksplit != 0 ? io.force_ksplit : def_ks);
    const int depth = ov.depth != 0 ? ov.depth : (io.force_depth != 0 ? io.force_depth : def_depth);
    const bool pipe = ov.pipe >= 0 ? ov.pipe != 0 : c.pipe;
    if (ks != 1 && ks != 2 && ks != 4 && ks != 8) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": k-split ", ks, " not compiled"));
    }
    const int64_t rows = DecodeRowsPerCta(ks);
    const int64_t grid_y = (w.n_rows + rows - 1) / rows;
    if (grid_y > kMaxGridY) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": ", grid_y, " row blocks, more than ",
                                                     kMaxGridY));
    }
    return LaunchMatVecDecode(kernel, a, ks, depth, pipe, grid_y, stream);
  }
  const int ksplit = io.force_ksplit != 0 ? io.force_ksplit
                                          : (tile == 1 ? KSplitFor(w.n_rows) : 1);
  MatVecGrid grid;
  absl::Status st = MatVecGridFor(w.n_rows, io.n_tokens, tile, ksplit, &grid);
  if (!st.ok()) return st;
  const int depth = io.force_depth != 0 ? io.force_depth : DecodeDepthFor(w.n_rows);
  return LaunchMatVec(kernel, a, tile, ksplit, depth, grid.x, grid.y, stream);
}

absl::Status MatMulTokens(const WeightMatrix& w, const float* x, int64_t n_tokens, float* y,
                          const float* bias, const float* residual, MatVecScratch* scratch,
                          cudaStream_t stream) {
  MatVecKernel kernel;
  absl::Status st = PlanMatVec(w, &kernel);
  if (!st.ok()) return st;
  MatVecIo io;
  io.x = x;
  io.n_tokens = n_tokens;
  io.y = y;
  io.bias = bias;
  io.residual = residual;
  if (UsesQuantizedActivations(kernel)) {
    if (scratch == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("matvec ", MatVecKernelName(kernel),
                                                     ": quantized type needs a scratch"));
    }
    st = QuantizeActivations(x, w.n_cols, n_tokens, scratch, stream);
    if (!st.ok()) return st;
    io.qx = scratch;
  }
  return RunMatVec(w, kernel, io, stream);
}

absl::Status MatVec(const WeightMatrix& w, const float* x, float* y, const float* bias,
                    const float* residual, MatVecScratch* scratch, cudaStream_t stream) {
  return MatMulTokens(w, x, 1, y, bias, residual, scratch, stream);
}

}  // namespace dpl::kernels
