#include "runtime/reference/reference_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <new>
#include <string>
#include <system_error>
#include <thread>
#include <utility>

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "formats/dequant.h"
#include "formats/dpl_file.h"
#include "formats/ggml_types.h"

namespace dpl::reference {

using formats::GgmlType;
using formats::TensorLayout;
using formats::TensorView;

struct ReferenceModel::Matrix {
  const TensorView* view = nullptr;
  uint64_t n_cols = 0;           // ne[0]: the input dimension
  uint64_t n_rows = 0;           // ne[1]: the output dimension
  uint64_t row0 = 0;             // first row in the view (an expert of a 3-D tensor)
  const float* dense = nullptr;  // (n_rows, n_cols) float32, or null: per-row dequant
  std::vector<float> owned;      // backing store of `dense` when dequantized at load
};

struct ReferenceModel::Layer {
  std::vector<double> attn_norm;  // (n_embd)
  std::vector<double> ffn_norm;   // (n_embd)
  const Matrix* wq = nullptr;     // (q_dim, n_embd)
  const Matrix* wk = nullptr;     // (kv_dim, n_embd)
  const Matrix* wv = nullptr;     // (kv_dim, n_embd)
  const Matrix* wo = nullptr;     // (n_embd, q_dim)
  const Matrix* w_gate = nullptr;  // (n_ff, n_embd)
  const Matrix* w_up = nullptr;    // (n_ff, n_embd)
  const Matrix* w_down = nullptr;  // (n_embd, n_ff)
  // Mixture of experts (qwen3moe): the router and each expert's matrices.
  const Matrix* router = nullptr;                      // (n_expert, n_embd)
  std::vector<const Matrix*> gate_exps, up_exps;       // n_expert x (n_ff_exp, n_embd)
  std::vector<const Matrix*> down_exps;                // n_expert x (n_embd, n_ff_exp)
  std::vector<double> bq, bk, bv, bo;  // biases; empty when the file has none
  std::vector<double> q_norm, k_norm;  // (head_dim) per-head RMSNorm weights (qwen3) or empty
};

namespace {

// Below this many weights a matvec runs on the calling thread: waking the
// pool costs more than it saves.
constexpr uint64_t kMinParallelWeights = 1 << 16;
constexpr int64_t kDefaultCtx = 4096;
constexpr int kMaxThreads = 1024;
constexpr int64_t kMaxCtx = int64_t{1} << 24;

// Bytes of host memory the system can give without swapping (MemAvailable),
// or the physical memory when /proc/meminfo does not say.
uint64_t AvailableHostBytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  uint64_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024;
  }
  return static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<uint64_t>(sysconf(_SC_PAGE_SIZE));
}

// The KV cache (K and V, float32, every layer) and the per-thread attention
// scores a context of n_ctx positions needs, against what the host has.
absl::Status CheckHostMemory(const model::Hparams& h, int64_t n_ctx, int threads) {
  // Sizes are capped (model::ReadHparams, kMaxCtx, kMaxThreads): no overflow in double.
  const double kv = 2.0 * h.n_layer * static_cast<double>(n_ctx) * h.kv_dim() * sizeof(float);
  const double scores = static_cast<double>(threads) * n_ctx * sizeof(double);
  const double need = kv + scores;
  const uint64_t have = AvailableHostBytes();
  if (need > static_cast<double>(have)) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "a context of %d positions needs %.2f GiB of host memory (KV cache %.2f GiB), "
        "%.2f GiB available; use a smaller -c",
        n_ctx, need / 1073741824.0, kv / 1073741824.0, have / 1073741824.0));
  }
  return absl::OkStatus();
}

// sum_i w[i] * x[i] in float64. Four independent accumulators (a fixed order,
// so results do not depend on threads); float*float products are exact in
// float64, double*float products are rounded once.
double Dot(const float* w, const double* x, uint64_t n) {
  double a0 = 0, a1 = 0, a2 = 0, a3 = 0;
  uint64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    a0 += static_cast<double>(w[i + 0]) * x[i + 0];
    a1 += static_cast<double>(w[i + 1]) * x[i + 1];
    a2 += static_cast<double>(w[i + 2]) * x[i + 2];
    a3 += static_cast<double>(w[i + 3]) * x[i + 3];
  }
  for (; i < n; ++i) a0 += static_cast<double>(w[i]) * x[i];
  return (a0 + a1) + (a2 + a3);
}

// y = x * w / sqrt(mean(x^2) + eps)
void RmsNorm(const double* x, const std::vector<double>& w, double eps, double* y) {
  const size_t n = w.size();
  double ss = 0;
  for (size_t i = 0; i < n; ++i) ss += x[i] * x[i];
  const double scale = 1.0 / std::sqrt(ss / static_cast<double>(n) + eps);
  for (size_t i = 0; i < n; ++i) y[i] = x[i] * scale * w[i];
}

void AddBias(const std::vector<double>& b, double* y) {
  for (size_t i = 0; i < b.size(); ++i) y[i] += b[i];
}

// RMSNorm of each of the n_heads heads of v (w.size() values each) in place;
// nothing when w is empty (no q/k norm in the file).
void HeadNorm(const std::vector<double>& w, int64_t n_heads, double eps, double* v) {
  for (int64_t hd = 0; !w.empty() && hd < n_heads; ++hd) {
    double* x = v + hd * static_cast<int64_t>(w.size());
    RmsNorm(x, w, eps, x);
  }
}

// Checks a tensor's type, layout and byte geometry for row-wise dequantization.
absl::Status CheckDequantizable(const TensorView& t) {
  if (!formats::IsDequantSupported(t.type)) {
    return absl::UnimplementedError(absl::StrCat(t.name, ": unsupported tensor type ",
                                                 formats::TraitsOf(t.type).name));
  }
  absl::StatusOr<uint64_t> min_stride = formats::RowStrideFor(t.type, t.layout, t.ne[0]);
  DPL_RETURN_IF_ERROR(Annotate(min_stride.status(), t.name));
  const uint64_t row_bytes = *min_stride;
  if (t.row_stride < row_bytes || t.data == nullptr ||
      t.n_bytes < (t.n_rows == 0 ? 0 : (t.n_rows - 1) * t.row_stride + row_bytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat(t.name, ": row stride ", t.row_stride, " / size ", t.n_bytes,
                     " too small for ", t.n_rows, " rows of ", row_bytes, " bytes"));
  }
  return absl::OkStatus();
}

}  // namespace

ReferenceModel::~ReferenceModel() = default;

absl::StatusOr<std::unique_ptr<ReferenceModel>> ReferenceModel::Load(
    std::shared_ptr<formats::ModelFile> file, const ReferenceOptions& options) {
  if (file == nullptr) return absl::InvalidArgumentError("reference: null model file");
  if (options.n_ctx < 0 || options.n_ctx > kMaxCtx) {
    return absl::InvalidArgumentError(
        absl::StrCat("reference: context length ", options.n_ctx, " out of range [0, ", kMaxCtx, "]"));
  }
  const std::string path = file->path();
  std::unique_ptr<ReferenceModel> m(new ReferenceModel());
  DPL_RETURN_IF_ERROR(dpl::Annotate(m->Init(std::move(file), options), path));
  return m;
}

absl::Status ReferenceModel::Init(std::shared_ptr<formats::ModelFile> file,
                                  const ReferenceOptions& options) {
  model_ = std::move(file);
  DPL_ASSIGN_OR_RETURN(const model::ModelDesc desc, model::BindModel(*model_));
  hp_ = desc.hp;
  if (options.threads < 0 || options.threads > kMaxThreads) {
    return absl::InvalidArgumentError(absl::StrCat("threads = ", options.threads,
                                                   " is out of range [0, ", kMaxThreads, "]"));
  }
  const int threads =
      options.threads > 0 ? options.threads
                          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  n_ctx_ = options.n_ctx > 0         ? options.n_ctx
           : hp_.n_ctx_train > 0 ? std::min(hp_.n_ctx_train, kDefaultCtx)
                                 : kDefaultCtx;
  DPL_RETURN_IF_ERROR(CheckHostMemory(hp_, n_ctx_, threads));
  try {
    pool_ = std::make_unique<ThreadPool>(threads);
  } catch (const std::system_error& e) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot start ", threads, " worker threads (", e.what(), "); use -t"));
  }
  DPL_RETURN_IF_ERROR(LoadWeights(desc, options));

  const model::Hparams& h = hp_;
  const size_t cache = static_cast<size_t>(h.n_layer * n_ctx_ * h.kv_dim());
  try {  // CheckHostMemory counted these; an address-space limit can still refuse them
    k_cache_.assign(cache, 0.0f);
    v_cache_.assign(cache, 0.0f);
    x_.resize(h.n_embd);
    h_.resize(h.n_embd);
    q_.resize(h.q_dim());
    k_.resize(h.kv_dim());
    v_.resize(h.kv_dim());
    att_.resize(h.q_dim());
    tmp_.resize(h.n_embd);
    gate_.resize(std::max(h.n_ff, h.n_ff_exp));
    up_.resize(std::max(h.n_ff, h.n_ff_exp));
    router_.resize(h.n_expert);
    moe_.resize(h.n_embd);
    logits_.resize(h.n_vocab);
    scores_.assign(threads, std::vector<double>(n_ctx_));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot allocate the KV cache and buffers for a context of ", n_ctx_, " (use a smaller -c)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<const ReferenceModel::Matrix*> ReferenceModel::AddMatrix(const TensorView& t) {
  DPL_RETURN_IF_ERROR(CheckDequantizable(t));
  auto mat = std::make_unique<Matrix>();
  mat->view = &t;
  mat->n_cols = t.ne[0];
  mat->n_rows = t.ne[1];
  matrices_.push_back(std::move(mat));
  return matrices_.back().get();
}

absl::StatusOr<const ReferenceModel::Matrix*> ReferenceModel::AddExpert(const TensorView& t,
                                                                        uint64_t e) {
  DPL_RETURN_IF_ERROR(CheckDequantizable(t));
  auto mat = std::make_unique<Matrix>();
  mat->view = &t;
  mat->n_cols = t.ne[0];
  mat->n_rows = t.ne[1];
  mat->row0 = e * t.ne[1];
  matrices_.push_back(std::move(mat));
  return matrices_.back().get();
}

namespace {

// A bound f32 vector (model::BindModel checked its type and length) as
// float64; a null one (an absent bias) leaves `out` empty.
absl::Status VectorF64(const TensorView* t, std::vector<double>* out) {
  if (t == nullptr) return absl::OkStatus();
  DPL_RETURN_IF_ERROR(CheckDequantizable(*t));
  std::vector<float> f(t->ne[0]);
  DPL_RETURN_IF_ERROR(dpl::Annotate(
      formats::DequantizeRow(t->type, t->layout, t->data, t->ne[0], f.data()), t->name));
  out->assign(f.begin(), f.end());
  return absl::OkStatus();
}

}  // namespace

absl::Status ReferenceModel::LoadWeights(const model::ModelDesc& desc,
                                         const ReferenceOptions& options) {
  const model::Hparams& h = hp_;
  DPL_ASSIGN_OR_RETURN(token_embd_, AddMatrix(*desc.token_embd));
  if (desc.tied) {
    output_ = token_embd_;
  } else {
    DPL_ASSIGN_OR_RETURN(output_, AddMatrix(*desc.output));
  }
  DPL_RETURN_IF_ERROR(VectorF64(desc.output_norm, &output_norm_));

  layers_.resize(h.n_layer);
  for (int64_t il = 0; il < h.n_layer; ++il) {
    const model::LayerTensors& t = desc.layers[il];
    Layer& L = layers_[il];
    DPL_RETURN_IF_ERROR(VectorF64(t.attn_norm, &L.attn_norm));
    DPL_RETURN_IF_ERROR(VectorF64(t.ffn_norm, &L.ffn_norm));
    DPL_ASSIGN_OR_RETURN(L.wq, AddMatrix(*t.wq));
    DPL_ASSIGN_OR_RETURN(L.wk, AddMatrix(*t.wk));
    DPL_ASSIGN_OR_RETURN(L.wv, AddMatrix(*t.wv));
    DPL_ASSIGN_OR_RETURN(L.wo, AddMatrix(*t.wo));
    if (h.moe()) {
      DPL_ASSIGN_OR_RETURN(L.router, AddMatrix(*t.router));
      for (int64_t e = 0; e < h.n_expert; ++e) {
        DPL_ASSIGN_OR_RETURN(const Matrix* g, AddExpert(*t.gate_exps, e));
        DPL_ASSIGN_OR_RETURN(const Matrix* u, AddExpert(*t.up_exps, e));
        DPL_ASSIGN_OR_RETURN(const Matrix* d, AddExpert(*t.down_exps, e));
        L.gate_exps.push_back(g);
        L.up_exps.push_back(u);
        L.down_exps.push_back(d);
      }
    } else {
      DPL_ASSIGN_OR_RETURN(L.w_gate, AddMatrix(*t.w_gate));
      DPL_ASSIGN_OR_RETURN(L.w_up, AddMatrix(*t.w_up));
      DPL_ASSIGN_OR_RETURN(L.w_down, AddMatrix(*t.w_down));
    }
    DPL_RETURN_IF_ERROR(VectorF64(t.bq, &L.bq));
    DPL_RETURN_IF_ERROR(VectorF64(t.bk, &L.bk));
    DPL_RETURN_IF_ERROR(VectorF64(t.bv, &L.bv));
    DPL_RETURN_IF_ERROR(VectorF64(t.bo, &L.bo));
    DPL_RETURN_IF_ERROR(VectorF64(t.q_norm, &L.q_norm));
    DPL_RETURN_IF_ERROR(VectorF64(t.k_norm, &L.k_norm));
  }

  // RoPE angles per position: base^(-2i/n_rot) * freq_scale / freq_factor[i]
  // (rope_freqs.weight: llama 3's per-frequency factors, when present).
  std::vector<double> freq_factors;
  DPL_RETURN_IF_ERROR(VectorF64(desc.rope_freqs, &freq_factors));
  rope_inv_freq_.resize(h.n_rot / 2);
  for (int64_t i = 0; i < h.n_rot / 2; ++i) {
    double f = std::pow(h.rope_freq_base, -2.0 * static_cast<double>(i) / h.n_rot) *
               h.rope_freq_scale;
    if (!freq_factors.empty()) f /= freq_factors[i];
    rope_inv_freq_[i] = f;
  }

  // f32 rows are used in place; everything else is dequantized once when it
  // fits in max_resident_bytes, else row by row inside MatVec.
  uint64_t dequant_bytes = 0;
  uint64_t max_cols = 0;
  for (auto& mat : matrices_) {
    const TensorView& v = *mat->view;
    max_cols = std::max(max_cols, mat->n_cols);
    if (v.type == GgmlType::kF32 && v.layout == TensorLayout::kRaw &&
        v.row_stride == mat->n_cols * 4 && reinterpret_cast<uintptr_t>(v.data) % 4 == 0) {
      mat->dense = reinterpret_cast<const float*>(v.data) + mat->row0 * mat->n_cols;
    } else {
      dequant_bytes += mat->n_rows * mat->n_cols * 4;
    }
  }
  scratch_.assign(pool_->size(), std::vector<float>(max_cols));
  worker_status_.assign(pool_->size(), absl::OkStatus());
  resident_ = dequant_bytes <= options.max_resident_bytes;
  return resident_ ? MakeResident() : absl::OkStatus();
}

absl::Status ReferenceModel::MakeResident() {
  for (auto& mat : matrices_) {
    if (mat->dense != nullptr) continue;
    mat->owned.resize(mat->n_rows * mat->n_cols);
    Matrix* mp = mat.get();
    pool_->ParallelFor(mp->n_rows, [&](int worker, uint64_t begin, uint64_t end) {
      for (uint64_t r = begin; r < end && worker_status_[worker].ok(); ++r) {
        worker_status_[worker] =
            formats::DequantizeRow(mp->view->type, mp->view->layout,
                                   mp->view->data + (mp->row0 + r) * mp->view->row_stride,
                                   mp->n_cols, mp->owned.data() + r * mp->n_cols);
      }
    });
    for (absl::Status& s : worker_status_) DPL_RETURN_IF_ERROR(dpl::Annotate(s, mp->view->name));
    mat->dense = mat->owned.data();
  }
  return absl::OkStatus();
}

absl::Status ReferenceModel::RowF32(const Matrix& w, uint64_t row, float* scratch,
                                    const float** out) const {
  if (w.dense != nullptr) {
    *out = w.dense + row * w.n_cols;
    return absl::OkStatus();
  }
  *out = scratch;
  return formats::DequantizeRow(w.view->type, w.view->layout,
                                w.view->data + (w.row0 + row) * w.view->row_stride, w.n_cols,
                                scratch);
}

absl::Status ReferenceModel::MatVec(const Matrix& w, const double* x, double* y) {
  auto rows = [&](int worker, uint64_t begin, uint64_t end) {
    float* scratch = scratch_[worker].data();
    for (uint64_t r = begin; r < end; ++r) {
      const float* row = nullptr;
      absl::Status s = RowF32(w, r, scratch, &row);
      if (!s.ok()) {
        worker_status_[worker] = std::move(s);
        return;
      }
      y[r] = Dot(row, x, w.n_cols);
    }
  };
  if (w.n_rows * w.n_cols < kMinParallelWeights) {
    rows(0, 0, w.n_rows);
  } else {
    pool_->ParallelFor(w.n_rows, rows);
  }
  for (absl::Status& s : worker_status_) {
    if (!s.ok()) {
      absl::Status err(s.code(), absl::StrCat(w.view->name, ": ", s.message()));
      s = absl::OkStatus();
      return err;
    }
  }
  return absl::OkStatus();
}

// Rotates each head_dim-sized head of `v` (n_heads of them) by the position's
// angles: pairs (x[2i], x[2i+1]) for llama, (x[i], x[i + n_rot/2]) for NEOX.
static void Rope(const model::Hparams& h, const std::vector<double>& inv_freq, int64_t pos,
                 int64_t n_heads, double* v) {
  const int64_t half = h.n_rot / 2;
  for (int64_t i = 0; i < half; ++i) {
    const double theta = static_cast<double>(pos) * inv_freq[i];
    const double c = std::cos(theta), s = std::sin(theta);
    const int64_t i0 = h.rope_style == model::RopeStyle::kNeox ? i : 2 * i;
    const int64_t i1 = h.rope_style == model::RopeStyle::kNeox ? i + half : 2 * i + 1;
    for (int64_t hd = 0; hd < n_heads; ++hd) {
      double* x = v + hd * h.head_dim;
      const double x0 = x[i0], x1 = x[i1];
      x[i0] = x0 * c - x1 * s;
      x[i1] = x0 * s + x1 * c;
    }
  }
}

absl::Status ReferenceModel::CopyPrefix(const ReferenceModel& src, int64_t n) {
  if (n < 0 || n > src.n_past_) {
    return absl::InvalidArgumentError(absl::StrCat("CopyPrefix: ", n, " positions, the source holds ", src.n_past_));
  }
  if (src.n_ctx_ != n_ctx_ || src.k_cache_.size() != k_cache_.size() || src.hp_.n_layer != hp_.n_layer) {
    return absl::InvalidArgumentError("CopyPrefix: the source's cache has another shape");
  }
  // Per layer, positions [0, n) are the first n * kv_dim floats of its (n_ctx, kv_dim) block.
  const size_t row = static_cast<size_t>(hp_.kv_dim()), block = static_cast<size_t>(n_ctx_) * row;
  for (size_t il = 0; il < static_cast<size_t>(hp_.n_layer); ++il) {
    std::copy_n(src.k_cache_.begin() + il * block, static_cast<size_t>(n) * row, k_cache_.begin() + il * block);
    std::copy_n(src.v_cache_.begin() + il * block, static_cast<size_t>(n) * row, v_cache_.begin() + il * block);
  }
  n_past_ = n;
  return absl::OkStatus();
}

void ReferenceModel::Attention(int il, int64_t pos) {
  const model::Hparams& h = hp_;
  const int64_t kv_dim = h.kv_dim();
  const int64_t group = h.n_head / h.n_head_kv;  // query heads per kv head
  const float* kc = k_cache_.data() + static_cast<size_t>(il) * n_ctx_ * kv_dim;  // (n_ctx, kv_dim)
  const float* vc = v_cache_.data() + static_cast<size_t>(il) * n_ctx_ * kv_dim;  // (n_ctx, kv_dim)
  const double scale = 1.0 / std::sqrt(static_cast<double>(h.head_dim));
  const int64_t first = h.sliding_window > 0 ? std::max<int64_t>(0, pos - h.sliding_window + 1) : 0;
  auto heads = [&](int worker, uint64_t begin, uint64_t end) {
    double* scores = scores_[worker].data();
    for (uint64_t hq = begin; hq < end; ++hq) {
      const int64_t hk = static_cast<int64_t>(hq) / group;
      const double* q = q_.data() + hq * h.head_dim;
      // softmax(q . k_t * scale) over t = first..pos (causal: nothing after
      // pos is cached; a sliding window drops keys older than W positions)
      double mx = -INFINITY;
      for (int64_t t = first; t <= pos; ++t) {
        scores[t] = Dot(kc + t * kv_dim + hk * h.head_dim, q, h.head_dim) * scale;
        mx = std::max(mx, scores[t]);
      }
      double sum = 0;
      for (int64_t t = first; t <= pos; ++t) {
        scores[t] = std::exp(scores[t] - mx);
        sum += scores[t];
      }
      double* out = att_.data() + hq * h.head_dim;
      std::fill(out, out + h.head_dim, 0.0);
      for (int64_t t = first; t <= pos; ++t) {
        const double p = scores[t] / sum;
        const float* vt = vc + t * kv_dim + hk * h.head_dim;
        for (int64_t d = 0; d < h.head_dim; ++d) out[d] += p * static_cast<double>(vt[d]);
      }
    }
  };
  if ((pos + 1) * h.q_dim() < static_cast<int64_t>(kMinParallelWeights)) {
    heads(0, 0, h.n_head);
  } else {
    pool_->ParallelFor(h.n_head, heads);
  }
}

absl::StatusOr<std::vector<double>> ReferenceModel::ForwardF64(int32_t token, int64_t pos) {
  // Forced experts (tests) are for this pass only, whatever it returns.
  const std::vector<std::vector<int>> forced = std::move(forced_experts_);
  forced_experts_.clear();
  const model::Hparams& h = hp_;
  if (token < 0 || token >= h.n_vocab) {
    return absl::OutOfRangeError(
        absl::StrCat("reference: token id ", token, " outside the vocabulary [0, ", h.n_vocab, ")"));
  }
  if (pos < 0 || pos >= n_ctx_) {
    return absl::OutOfRangeError(absl::StrCat("reference: position ", pos,
                                              " beyond the KV cache of ", n_ctx_, " positions"));
  }
  if (pos > n_past_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "reference: position ", pos, " skips ahead of the ", n_past_, " cached positions"));
  }
  // Forced experts: checked before anything of this pass changes the model's state.
  if (!forced.empty()) {
    int64_t moe_layers = 0;
    for (const Layer& L : layers_) moe_layers += L.router != nullptr;
    if (static_cast<int64_t>(forced.size()) != moe_layers) {
      return absl::InvalidArgumentError(absl::StrCat("reference: experts forced for ", forced.size(),
                                                     " layers, the model has ", moe_layers, " MoE layers"));
    }
    for (const std::vector<int>& ids : forced) {
      std::vector<int> sorted = ids;
      std::sort(sorted.begin(), sorted.end());
      if (static_cast<int64_t>(ids.size()) != h.n_expert_used || sorted.front() < 0 ||
          sorted.back() >= h.n_expert || std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
        return absl::InvalidArgumentError(absl::StrCat("reference: forced experts must be ", h.n_expert_used,
                                                       " distinct ids in [0, ", h.n_expert, ")"));
      }
    }
  }
  n_past_ = pos;  // drops any cached positions >= pos
  {
    const float* row = nullptr;
    DPL_RETURN_IF_ERROR(RowF32(*token_embd_, token, scratch_[0].data(), &row));
    for (int64_t i = 0; i < h.n_embd; ++i) x_[i] = row[i];
  }
  const int64_t kv_dim = h.kv_dim();
  router_margins_.clear();
  own_experts_.clear();
  for (int il = 0; il < h.n_layer; ++il) {
    const Layer& L = layers_[il];
    // Attention block.
    RmsNorm(x_.data(), L.attn_norm, h.rms_eps, h_.data());
    DPL_RETURN_IF_ERROR(MatVec(*L.wq, h_.data(), q_.data()));
    DPL_RETURN_IF_ERROR(MatVec(*L.wk, h_.data(), k_.data()));
    DPL_RETURN_IF_ERROR(MatVec(*L.wv, h_.data(), v_.data()));
    AddBias(L.bq, q_.data());
    AddBias(L.bk, k_.data());
    AddBias(L.bv, v_.data());
    HeadNorm(L.q_norm, h.n_head, h.rms_eps, q_.data());
    HeadNorm(L.k_norm, h.n_head_kv, h.rms_eps, k_.data());
    Rope(h, rope_inv_freq_, pos, h.n_head, q_.data());
    Rope(h, rope_inv_freq_, pos, h.n_head_kv, k_.data());
    const size_t slot = (static_cast<size_t>(il) * n_ctx_ + pos) * kv_dim;
    for (int64_t i = 0; i < kv_dim; ++i) {
      k_cache_[slot + i] = static_cast<float>(k_[i]);
      v_cache_[slot + i] = static_cast<float>(v_[i]);
    }
    Attention(il, pos);
    DPL_RETURN_IF_ERROR(MatVec(*L.wo, att_.data(), tmp_.data()));
    AddBias(L.bo, tmp_.data());
    for (int64_t i = 0; i < h.n_embd; ++i) x_[i] += tmp_[i];

    RmsNorm(x_.data(), L.ffn_norm, h.rms_eps, h_.data());
    // The MoE layers before this one each pushed a margin: this one's index.
    const std::vector<int>* ids =
        forced.empty() || L.router == nullptr ? nullptr : &forced[router_margins_.size()];
    DPL_RETURN_IF_ERROR(FeedForward(L, ids));
  }
  RmsNorm(x_.data(), output_norm_, h.rms_eps, h_.data());
  DPL_RETURN_IF_ERROR(MatVec(*output_, h_.data(), logits_.data()));
  n_past_ = pos + 1;
  return logits_;
}

absl::Status ReferenceModel::FeedForward(const Layer& L, const std::vector<int>* forced) {
  const model::Hparams& h = hp_;
  // down(silu(gate(h)) * up(h)) into tmp_, for one set of matrices of width n.
  const auto swiglu = [&](const Matrix& gate, const Matrix& up, const Matrix& down,
                          int64_t n) -> absl::Status {
    DPL_RETURN_IF_ERROR(MatVec(gate, h_.data(), gate_.data()));
    DPL_RETURN_IF_ERROR(MatVec(up, h_.data(), up_.data()));
    for (int64_t i = 0; i < n; ++i) {
      const double g = gate_[i];
      gate_[i] = g / (1.0 + std::exp(-g)) * up_[i];
    }
    return MatVec(down, gate_.data(), tmp_.data());
  };
  if (!h.moe()) {
    DPL_RETURN_IF_ERROR(swiglu(*L.w_gate, *L.w_up, *L.w_down, h.n_ff));
    for (int64_t i = 0; i < h.n_embd; ++i) x_[i] += tmp_[i];
    return absl::OkStatus();
  }
  // Router: softmax over the experts, the n_expert_used most probable
  // (ties: the lower index), their probabilities renormalized to sum 1
  // (qwen3moe's norm_topk_prob; llama.cpp clamps the sum at 2^-14).
  DPL_RETURN_IF_ERROR(MatVec(*L.router, h_.data(), router_.data()));
  const double top = *std::max_element(router_.begin(), router_.end());
  double z = 0;
  for (double& r : router_) z += (r = std::exp(r - top));
  for (double& r : router_) r /= z;
  std::vector<int> order(static_cast<size_t>(h.n_expert));
  for (int e = 0; e < h.n_expert; ++e) order[e] = e;
  std::partial_sort(order.begin(), order.begin() + h.n_expert_used, order.end(),
                    [&](int a, int b) { return router_[a] > router_[b] || (router_[a] == router_[b] && a < b); });
  if (h.n_expert_used < h.n_expert) {  // the best of the rest, for router_margins()
    double next = -INFINITY;
    for (int64_t j = h.n_expert_used; j < h.n_expert; ++j) next = std::max(next, router_[order[j]]);
    router_margins_.push_back(router_[order[h.n_expert_used - 1]] - next);
  } else {
    router_margins_.push_back(INFINITY);
  }
  own_experts_.emplace_back(order.begin(), order.begin() + h.n_expert_used);
  if (forced != nullptr) std::copy(forced->begin(), forced->end(), order.begin());
  double sum = 0;
  for (int64_t j = 0; j < h.n_expert_used; ++j) sum += router_[order[j]];
  sum = std::max(sum, 6.103515625e-5);
  std::fill(moe_.begin(), moe_.end(), 0.0);
  for (int64_t j = 0; j < h.n_expert_used; ++j) {
    const int e = order[j];
    DPL_RETURN_IF_ERROR(swiglu(*L.gate_exps[e], *L.up_exps[e], *L.down_exps[e], h.n_ff_exp));
    const double w = router_[e] / sum;
    for (int64_t i = 0; i < h.n_embd; ++i) moe_[i] += w * tmp_[i];
  }
  for (int64_t i = 0; i < h.n_embd; ++i) x_[i] += moe_[i];
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> ReferenceModel::Forward(int32_t token, int64_t pos) {
  DPL_ASSIGN_OR_RETURN(const std::vector<double> l, ForwardF64(token, pos));
  return std::vector<float>(l.begin(), l.end());
}

}  // namespace dpl::reference
