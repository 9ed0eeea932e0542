#include "kernels/matvec/matvec.h"

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kernels/cuda_check.h"
#include "kernels/matvec/matvec_kernels.h"

namespace dpl::kernels {

namespace {
uint64_t Align256(uint64_t n) { return (n + 255) / 256 * 256; }
}  // namespace

// Layout: q at 0, d and s each at the next 256-byte boundary (the kernels
// read d and s with 8- and 16-byte loads).
absl::StatusOr<uint64_t> MatVecScratchBytes(int64_t max_cols, int64_t max_tokens) {
  if (max_cols <= 0 || max_cols % kActBlock != 0 || max_tokens <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("matvec scratch: max_cols ", max_cols,
                                                   " (multiple of 32 needed), max_tokens ",
                                                   max_tokens));
  }
  const uint64_t n = static_cast<uint64_t>(max_cols) * static_cast<uint64_t>(max_tokens);
  return Align256(n) + 2 * Align256(n / kActBlock * sizeof(float));
}

MatVecScratch MatVecScratchIn(void* mem, int64_t max_cols, int64_t max_tokens) {
  const uint64_t n = static_cast<uint64_t>(max_cols) * static_cast<uint64_t>(max_tokens);
  uint8_t* base = static_cast<uint8_t*>(mem);
  MatVecScratch s;
  s.q = reinterpret_cast<int8_t*>(base);
  s.d = reinterpret_cast<float*>(base + Align256(n));
  s.s = reinterpret_cast<float*>(base + Align256(n) + Align256(n / kActBlock * sizeof(float)));
  s.max_cols = max_cols;
  s.max_tokens = max_tokens;
  return s;
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
  DPL_RETURN_IF_ERROR(LaunchQuantizeActivations(x, n_cols * n_tokens / kActBlock, scratch->q,
                                                scratch->d, scratch->s, stream));
  scratch->n_cols = n_cols;
  scratch->n_tokens = n_tokens;
  return absl::OkStatus();
}

absl::Status RunMatVec(const WeightMatrix& w, const MatVecPlan& plan, const MatVecIo& io,
                       cudaStream_t stream) {
  MatVecKernel kernel = plan.kernel;
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
  // The prompt geometry never splits k, so for short matrices it sums in a
  // different order than the decode geometry (agreement ~1e-7, not bitwise).
  const MatVecGeometry& g = io.n_tokens == 1 ? plan.decode : plan.prompt;
  DPL_ASSIGN_OR_RETURN(const MatVecGrid grid, MatVecGridFor(w.n_rows, io.n_tokens, g));
  return Annotate(LaunchMatVec(kernel, a, g, grid.x, grid.y, stream), what);
}

absl::StatusOr<int> ResidentCtasPerSm(MatVecKernel kernel, const MatVecGeometry& g) {
  return MatVecCtasPerSm(kernel, g);
}

}  // namespace dpl::kernels
