#include "kernels/matvec/matvec.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kernels/cuda_check.h"
#include "kernels/matvec/matvec_kernels.h"

namespace dpl::kernels {

namespace {
uint64_t Align256(uint64_t n) { return (n + 255) / 256 * 256; }

// Floats of the mma form's k-split partials for launches of up to
// max_tokens tokens (none when every launch is one token).
int64_t PartialFloats(int64_t max_tokens) {
  return max_tokens < 2 ? 0 : std::min<int64_t>(max_tokens, kMmaMaxTokens) * kMmaMaxPartialRows;
}

// Halves of the f16 activation copy (the f16 mma form's input) for up to
// f16_max_tokens of the scratch's max_tokens.
int64_t HalfValues(int64_t max_cols, int64_t max_tokens, int64_t f16_max_tokens) {
  const int64_t n = std::min(max_tokens, std::max<int64_t>(f16_max_tokens, kMmaMaxTokens));
  return n < 2 ? 0 : F16TokenSlots(static_cast<int>(n)) * max_cols;
}
}  // namespace

// Layout: q at 0, then d, s, the partials and the f16 copy each at the next
// 256-byte boundary (the kernels read d and s with 8- and 16-byte loads).
absl::StatusOr<uint64_t> MatVecScratchBytes(int64_t max_cols, int64_t max_tokens,
                                            int64_t f16_max_tokens) {
  if (max_cols <= 0 || max_cols % kActBlock != 0 || max_tokens <= 0 ||
      max_cols * max_tokens / kActBlock > (int64_t{1} << 31)) {
    return absl::InvalidArgumentError(absl::StrCat("matvec scratch: max_cols ", max_cols,
                                                   " (multiple of 32 needed), max_tokens ",
                                                   max_tokens, " (at most 2^31 blocks of 32)"));
  }
  const uint64_t n = static_cast<uint64_t>(max_cols) * static_cast<uint64_t>(max_tokens);
  return Align256(n) + 2 * Align256(n / kActBlock * sizeof(float)) +
         Align256(PartialFloats(max_tokens) * sizeof(float)) +
         Align256(HalfValues(max_cols, max_tokens, f16_max_tokens) * sizeof(__half));
}

MatVecScratch MatVecScratchIn(void* mem, int64_t max_cols, int64_t max_tokens, int64_t f16_max_tokens) {
  const uint64_t n = static_cast<uint64_t>(max_cols) * static_cast<uint64_t>(max_tokens);
  const uint64_t scales = Align256(n / kActBlock * sizeof(float));
  uint8_t* base = static_cast<uint8_t*>(mem);
  MatVecScratch s;
  s.q = reinterpret_cast<int8_t*>(base);
  s.d = reinterpret_cast<float*>(base + Align256(n));
  s.s = reinterpret_cast<float*>(base + Align256(n) + scales);
  s.partial_floats = PartialFloats(max_tokens);
  const uint64_t partial_at = Align256(n) + 2 * scales;
  if (s.partial_floats > 0) s.partial = reinterpret_cast<float*>(base + partial_at);
  if (HalfValues(max_cols, max_tokens, f16_max_tokens) > 0) {
    s.h = reinterpret_cast<__half*>(base + partial_at +
                                    Align256(s.partial_floats * sizeof(float)));
  }
  s.max_cols = max_cols;
  s.max_tokens = max_tokens;
  s.f16_max_tokens = std::min(max_tokens, std::max<int64_t>(f16_max_tokens, kMmaMaxTokens));
  return s;
}

namespace {

// The scratch can take (n_tokens, n_cols) activations.
absl::Status CheckScratch(const char* who, int64_t n_cols, int64_t n_tokens,
                          const MatVecScratch* scratch) {
  if (scratch == nullptr || scratch->q == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(who, ": scratch not allocated"));
  }
  if (n_cols <= 0 || n_tokens <= 0 || n_cols % kActBlock != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, ": bad input (n_cols ", n_cols, " must be a positive multiple of 32, ", "n_tokens ",
        n_tokens, ")"));
  }
  if (n_cols * n_tokens > scratch->max_cols * scratch->max_tokens || n_tokens > scratch->max_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(who, ": ", n_tokens, " x ", n_cols,
                                                   " exceeds the scratch's ", scratch->max_tokens,
                                                   " x ", scratch->max_cols));
  }
  return absl::OkStatus();
}

// Where (n_tokens, n_cols) quantized activations go: the f16 copy too for
// f16_min_tokens..f16_max_tokens tokens that fit it (what the f16 mma form
// may read).
QuantOut OutOf(const MatVecScratch& s, int64_t n_cols, int64_t n_tokens) {
  const bool f16 = s.h != nullptr && n_tokens >= std::max<int64_t>(2, s.f16_min_tokens) &&
                   n_tokens <= s.f16_max_tokens &&
                   F16TokenSlots(static_cast<int>(n_tokens)) * n_cols <=
                       HalfValues(s.max_cols, s.max_tokens, s.f16_max_tokens);
  if (!f16) return {s.q, s.d, s.s, nullptr};
  return {s.q, s.d, s.s, s.h, static_cast<int32_t>(n_cols), F16TokenSlots(static_cast<int>(n_tokens))};
}

}  // namespace

absl::Status QuantizeActivations(const float* x, int64_t n_cols, int64_t n_tokens,
                                 MatVecScratch* scratch, cudaStream_t stream, bool pdl) {
  DPL_RETURN_IF_ERROR(CheckScratch("quantize activations", n_cols, n_tokens, scratch));
  if (x == nullptr) return absl::InvalidArgumentError("quantize activations: null x");
  DPL_RETURN_IF_ERROR(LaunchQuantizeActivations(x, n_cols * n_tokens / kActBlock, OutOf(*scratch, n_cols, n_tokens),
                                                pdl, stream));
  scratch->n_cols = n_cols;
  scratch->n_tokens = n_tokens;
  return absl::OkStatus();
}

absl::StatusOr<QuantOut> QuantizeInto(int64_t n_cols, int64_t n_tokens, MatVecScratch* scratch) {
  DPL_RETURN_IF_ERROR(CheckScratch("quantized output", n_cols, n_tokens, scratch));
  scratch->n_cols = n_cols;
  scratch->n_tokens = n_tokens;
  return OutOf(*scratch, n_cols, n_tokens);
}

absl::Status NormQuantizeActivations(const float* x, const float* w, float eps, int64_t n_cols,
                                     int64_t n_tokens, float* h, MatVecScratch* scratch,
                                     cudaStream_t stream, bool pdl) {
  DPL_RETURN_IF_ERROR(CheckScratch("norm + quantize", n_cols, n_tokens, scratch));
  if (x == nullptr || w == nullptr || h == nullptr || x == h) {
    return absl::InvalidArgumentError("norm + quantize: null pointer, or h == x");
  }
  DPL_RETURN_IF_ERROR(
      LaunchNormQuantize(x, w, eps, n_cols, n_tokens, h, OutOf(*scratch, n_cols, n_tokens), pdl, stream));
  scratch->n_cols = n_cols;
  scratch->n_tokens = n_tokens;
  return absl::OkStatus();
}

absl::Status SwiGluQuantizeActivations(const float* gate, const float* up, int64_t n_cols,
                                       int64_t n_tokens, float* g, MatVecScratch* scratch,
                                       cudaStream_t stream, bool pdl) {
  DPL_RETURN_IF_ERROR(CheckScratch("SwiGLU + quantize", n_cols, n_tokens, scratch));
  if (gate == nullptr || up == nullptr || g == nullptr) {
    return absl::InvalidArgumentError("SwiGLU + quantize: null pointer");
  }
  DPL_RETURN_IF_ERROR(
      LaunchSwiGluQuantize(gate, up, n_cols, n_tokens, g, OutOf(*scratch, n_cols, n_tokens), pdl, stream));
  scratch->n_cols = n_cols;
  scratch->n_tokens = n_tokens;
  return absl::OkStatus();
}

namespace {

// The activation fields of the launch arguments (shared by every part),
// checked against the kernel; may switch a vector float kernel to its scalar
// form when x is not 16-byte aligned.
absl::Status SetActivations(const std::string& what, int64_t n_cols, const MatVecIo& io,
                            MatVecKernel* kernel, MatVecArgs* a) {
  if (io.n_tokens <= 0) return absl::InvalidArgumentError(absl::StrCat(what, ": no tokens"));
  a->n_cols = static_cast<int>(n_cols);
  a->n_tokens = static_cast<int>(io.n_tokens);
  if (UsesQuantizedActivations(*kernel)) {
    if (io.qx == nullptr || io.qx->q == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": needs quantized activations"));
    }
    if (io.qx->n_cols != n_cols || io.qx->n_tokens < io.n_tokens) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": scratch holds ", io.qx->n_tokens, " x ", io.qx->n_cols,
          " quantized activations, need ", io.n_tokens, " x ", n_cols));
    }
    a->xq = io.qx->q;
    a->xd = io.qx->d;
    a->xs = io.qx->s;
    // The f16 copy, if the last quantization into this scratch wrote one.
    a->xh = OutOf(*io.qx, io.qx->n_cols, io.qx->n_tokens).h;
    return absl::OkStatus();
  }
  if (io.x == nullptr) return absl::InvalidArgumentError(absl::StrCat(what, ": null x"));
  a->x = io.x;
  // The vector kernels load x with 16-byte loads: fall back when x is not
  // 16-byte aligned.
  if (reinterpret_cast<uintptr_t>(io.x) % 16 != 0) {
    if (*kernel == MatVecKernel::kF32) *kernel = MatVecKernel::kF32Scalar;
    if (*kernel == MatVecKernel::kF16) *kernel = MatVecKernel::kF16Scalar;
    if (*kernel == MatVecKernel::kBF16) *kernel = MatVecKernel::kBF16Scalar;
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RunMatVecGroup(absl::Span<const WeightMatrix* const> ws, const MatVecPlan& plan,
                            absl::Span<const MatVecOut> outs, const MatVecIo& io,
                            cudaStream_t stream) {
  MatVecKernel kernel = plan.kernel;
  if (ws.empty() || ws.size() > static_cast<size_t>(kMaxMatVecParts) || ws.size() != outs.size()) {
    return absl::InvalidArgumentError(absl::StrCat("matvec group: ", ws.size(), " matrices, ",
                                                   outs.size(), " outputs (1..",
                                                   kMaxMatVecParts, " each)"));
  }
  if (plan.mixed) {
    if (ws.size() < 2) {
      return absl::InvalidArgumentError("matvec group: a mixed plan needs two matrices");
    }
    // Several tokens: the mixed form is single-token only, so the last
    // matrix gets its own launch (same geometry, its own kernel).
    if (io.n_tokens != 1) {
      MatVecPlan head = plan, last = plan;
      head.mixed = last.mixed = false;
      last.kernel = plan.last_kernel;
      const size_t n = ws.size() - 1;
      DPL_RETURN_IF_ERROR(RunMatVecGroup(ws.first(n), head, outs.first(n), io, stream));
      return RunMatVecGroup(ws.last(1), last, outs.last(1), io, stream);
    }
  }
  const std::string what = absl::StrCat("matvec ", MatVecKernelName(kernel), " ", ws[0]->n_rows,
                                        "x", ws[0]->n_cols,
                                        ws.size() > 1 ? absl::StrCat(" (+", ws.size() - 1, ")") : "");
  MatVecArgs a;
  DPL_RETURN_IF_ERROR(SetActivations(what, ws[0]->n_cols, io, &kernel, &a));
  // The prompt geometry never splits k, so for short matrices it sums in a
  // different order than the decode geometry (agreement ~1e-7, not bitwise).
  const MatVecGeometry& g = io.n_tokens == 1 ? plan.decode : plan.prompt;
  // A few tokens on the tensor cores, where the type has that form (q8_0
  // rows that are not whole 256-column blocks keep the token tile).
  const bool f16_ok = MatVecMmaF16Supports(kernel, ws[0]->n_cols) && a.xh != nullptr &&
                      std::all_of(ws.begin(), ws.end(), [](const WeightMatrix* w) {
                        return w->n_rows * w->row_stride < kMmaF16MaxMatrixBytes;
                      });
  // More tokens, up to mma_f16_max_tokens, on the f16 form's wide launch
  // (64-token tiles over grid.x; k split only with mma_f16_wide_split).
  const bool wide = io.n_tokens > kMmaMaxTokens && io.n_tokens <= plan.mma_f16_max_tokens && f16_ok;
  const bool mma = wide || (io.n_tokens > 1 && io.n_tokens <= kMmaMaxTokens &&
                            MatVecMmaSupports(kernel, ws[0]->n_cols));
  // Of those, enough tokens on the f16 form (where the f16 copy exists).
  const bool f16 = wide || (mma && plan.mma_f16_min_tokens > 0 &&
                            io.n_tokens >= plan.mma_f16_min_tokens && f16_ok);
  a.n_parts = static_cast<int>(ws.size());
  a.rope = io.rope;
  int64_t grid_x = 0, blocks = 0, partial_used = 0;
  for (size_t i = 0; i < ws.size(); ++i) {
    const WeightMatrix& w = *ws[i];
    if (w.n_cols != ws[0]->n_cols) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": matrix ", i, " has ", w.n_cols,
                                                     " columns, not ", ws[0]->n_cols));
    }
    if (outs[i].y == nullptr) return absl::InvalidArgumentError(absl::StrCat(what, ": null y"));
    DPL_ASSIGN_OR_RETURN(MatVecGrid grid, MatVecGridFor(w.n_rows, io.n_tokens, g));
    MatVecPart& p = a.part[i];
    if (mma) {
      const int64_t cta_rows = f16 ? kMmaF16CtaRows : kMmaCtaRows;
      grid.y = (w.n_rows + cta_rows - 1) / cta_rows;
      p.splits = wide  ? 1  // set for the whole group below
                 : f16 ? MmaF16Splits(w.n_rows, w.n_cols,
                                      io.n_tokens > 16 ? plan.mma_f16_target_ctas_wide : plan.mma_f16_target_ctas)
                       : MmaSplits(w.n_rows, w.n_cols);
      if (p.splits > 1) {
        const int64_t need = int64_t{p.splits} * io.n_tokens * w.n_rows;
        if (io.qx->partial == nullptr || partial_used + need > io.qx->partial_floats) {
          return absl::InvalidArgumentError(absl::StrCat(
              what, ": the k-split partials need ", partial_used + need,
              " floats, the scratch holds ", io.qx->partial_floats));
        }
        p.partial = io.qx->partial + partial_used;
        partial_used += need;
      }
    }
    p.w = static_cast<const uint8_t*>(w.data);
    p.row_stride = w.row_stride;
    p.n_rows = static_cast<int>(w.n_rows);
    p.row_block0 = static_cast<int>(blocks);
    p.y = outs[i].y;
    p.bias = outs[i].bias;
    p.residual = outs[i].residual;
    p.role = outs[i].role;
    if (p.role != MatVecRole::kPlain) {
      const MatVecRope& r = io.rope;
      if (io.n_tokens != 1 || mma || !FoldsRope(kernel, plan.mixed ? plan.last_kernel : kernel, g) ||
          outs[i].residual != nullptr ||
          r.d_pos == nullptr || r.cos_sin == nullptr || r.head_dim <= 0 || r.head_dim % 2 != 0 ||
          w.n_rows % r.head_dim != 0 || r.n_ctx <= 0 || r.n_head_kv <= 0 ||
          (p.role == MatVecRole::kRopeK && r.k_cache == nullptr) ||
          (p.role == MatVecRole::kCacheV && r.v_cache == nullptr)) {
        return absl::InvalidArgumentError(absl::StrCat(
            what, ": matrix ", i, " folds RoPE / the cache write (role ", static_cast<int>(p.role),
            ") but the launch is not one token of a kernel and geometry FoldsRope names, or the rope "
            "fields are incomplete"));
      }
    }
    blocks += grid.y;
    grid_x = grid.x;
  }
  if (blocks > kMaxGridY) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", blocks, " row blocks, more than ", kMaxGridY));
  }
  // With mma_f16_wide_split the wide launch splits k alike for every part,
  // so that a row tile's splits add up inside a cluster (no partials through
  // global memory): about mma_f16_target_ctas_wide CTAs a token tile over
  // the group's row tiles. Why: unsplit, a 3584-row matrix (7B's Q, O, down) is 28 row tiles,
  // 56 CTAs at 128 tokens on 264 slots (H100, gemm_bench: 7B ffn_down at 128
  // tokens 199 us, 87 TFLOP/s, where gate/up took 78 us).
  if (wide && plan.mma_f16_wide_split) {
    const int64_t tiles = (io.n_tokens + kF16TileTokens - 1) / kF16TileTokens;
    const int target = static_cast<int>((plan.mma_f16_target_ctas_wide + tiles - 1) / tiles);
    const int splits = MmaF16Splits(blocks * kMmaF16CtaRows, ws[0]->n_cols, target);
    for (int i = 0; i < a.n_parts; ++i) a.part[i].splits = splits;
  }
  if (f16) {
    int splits = 1;
    for (int i = 0; i < a.n_parts; ++i) splits = std::max(splits, a.part[i].splits);
    MmaF16Options o;
    o.ctas_per_sm = blocks * splits > 2 * int64_t{plan.num_sms} ? plan.mma_f16_small_ctas : 2;
    o.cluster_sum = wide || plan.mma_f16_cluster_sum == 2 ||
                    (plan.mma_f16_cluster_sum == 1 &&
                     blocks * splits > int64_t{o.ctas_per_sm} * plan.num_sms);
    return Annotate(LaunchMatVecMmaF16(kernel, a, blocks, plan.pdl, stream, o), what);
  }
  if (mma) return Annotate(LaunchMatVecMma(kernel, a, blocks, plan.pdl, stream), what);
  return Annotate(LaunchMatVec(kernel, a, g, grid_x, blocks, plan.pdl, stream,
                               plan.mixed ? plan.last_kernel : kernel),
                  what);
}

absl::Status RunMatVec(const WeightMatrix& w, const MatVecPlan& plan, const MatVecIo& io,
                       cudaStream_t stream) {
  const WeightMatrix* ws[1] = {&w};
  const MatVecOut outs[1] = {{io.y, io.bias, io.residual}};
  return RunMatVecGroup(ws, plan, outs, io, stream);
}

absl::StatusOr<int> ResidentCtasPerSm(MatVecKernel kernel, const MatVecGeometry& g) {
  return MatVecCtasPerSm(kernel, g);
}

}  // namespace dpl::kernels
