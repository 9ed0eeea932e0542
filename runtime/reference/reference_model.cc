#include "runtime/reference/reference_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "formats/dequant.h"
#include "formats/ggml_types.h"
#include "formats/q6k_dpl.h"

namespace dpl::reference {

using formats::GgmlType;
using formats::TensorLayout;
using formats::TensorView;

struct ReferenceModel::Matrix {
  const TensorView* view = nullptr;
  uint64_t n_cols = 0;           // ne[0]: the input dimension
  uint64_t n_rows = 0;           // ne[1]: the output dimension
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
  std::vector<double> bq, bk, bv, bo;  // biases; empty when the file has none
};

namespace {

// Below this many weights a matvec runs on the calling thread: waking the
// pool costs more than it saves.
constexpr uint64_t kMinParallelWeights = 1 << 16;
constexpr int64_t kDefaultCtx = 4096;
constexpr int64_t kMaxCtx = int64_t{1} << 24;

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

// Bytes one row of `n_cols` weights occupies in `layout` (before padding).
absl::StatusOr<uint64_t> MinRowBytes(const TensorView& t) {
  const formats::GgmlTypeTraits tr = formats::TraitsOf(t.type);
  if (t.ne[0] % tr.block_elems != 0) {
    return absl::InvalidArgumentError(absl::StrCat(t.name, ": row length ", t.ne[0],
                                                   " is not a whole number of ", tr.name,
                                                   " blocks"));
  }
  if (t.layout == TensorLayout::kDplQ6K) {
    if (t.type != GgmlType::kQ6_K) {
      return absl::InvalidArgumentError(
          absl::StrCat(t.name, ": layout dpl_q6k with type ", tr.name, " (only q6_K)"));
    }
    return formats::DplQ6KRowStride(t.ne[0] / tr.block_elems);
  }
  if (t.layout != TensorLayout::kRaw) {
    return absl::UnimplementedError(absl::StrCat(t.name, ": unsupported tensor layout ",
                                                 formats::TensorLayoutName(t.layout)));
  }
  return t.ne[0] / tr.block_elems * tr.block_bytes;
}

// Checks a tensor's type, layout and byte geometry for row-wise dequantization.
absl::Status CheckDequantizable(const TensorView& t) {
  if (!formats::IsDequantSupported(t.type)) {
    return absl::UnimplementedError(absl::StrCat(t.name, ": unsupported tensor type ",
                                                 formats::TraitsOf(t.type).name));
  }
  absl::StatusOr<uint64_t> row_bytes = MinRowBytes(t);
  if (!row_bytes.ok()) return row_bytes.status();
  if (t.row_stride < *row_bytes || t.data == nullptr ||
      t.n_bytes < (t.n_rows == 0 ? 0 : (t.n_rows - 1) * t.row_stride + *row_bytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat(t.name, ": row stride ", t.row_stride, " / size ", t.n_bytes,
                     " too small for ", t.n_rows, " rows of ", *row_bytes, " bytes"));
  }
  return absl::OkStatus();
}

std::string ShapeString(const TensorView& t) {
  std::string s = "[";
  for (uint32_t d = 0; d < std::max<uint32_t>(t.n_dims, 1); ++d) {
    absl::StrAppend(&s, d ? ", " : "", t.ne[d]);
  }
  return s + "]";
}

}  // namespace

ReferenceModel::~ReferenceModel() = default;

absl::StatusOr<std::unique_ptr<ReferenceModel>> ReferenceModel::Load(
    std::shared_ptr<formats::ModelFile> model, const ReferenceOptions& options) {
  if (model == nullptr) return absl::InvalidArgumentError("reference: null model file");
  absl::StatusOr<Hparams> hp = ReadHparams(*model);
  if (!hp.ok()) {
    return absl::Status(hp.status().code(), absl::StrCat(model->path(), ": ", hp.status().message()));
  }
  std::unique_ptr<ReferenceModel> m(new ReferenceModel());
  m->model_ = std::move(model);
  m->hp_ = *hp;
  const int threads =
      options.threads > 0 ? options.threads
                          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  m->pool_ = std::make_unique<ThreadPool>(threads);

  if (options.n_ctx < 0 || options.n_ctx > kMaxCtx) {
    return absl::InvalidArgumentError(
        absl::StrCat("reference: context length ", options.n_ctx, " out of range [0, ", kMaxCtx, "]"));
  }
  m->n_ctx_ = options.n_ctx > 0 ? options.n_ctx
              : m->hp_.n_ctx_train > 0 ? std::min(m->hp_.n_ctx_train, kDefaultCtx)
                                       : kDefaultCtx;

  absl::Status s = m->LoadWeights(options);
  if (!s.ok()) return absl::Status(s.code(), absl::StrCat(m->model_->path(), ": ", s.message()));

  const Hparams& h = m->hp_;
  const size_t cache = static_cast<size_t>(h.n_layer * m->n_ctx_ * h.kv_dim());
  m->k_cache_.assign(cache, 0.0f);
  m->v_cache_.assign(cache, 0.0f);
  m->x_.resize(h.n_embd);
  m->h_.resize(h.n_embd);
  m->q_.resize(h.q_dim());
  m->k_.resize(h.kv_dim());
  m->v_.resize(h.kv_dim());
  m->att_.resize(h.q_dim());
  m->tmp_.resize(h.n_embd);
  m->gate_.resize(h.n_ff);
  m->up_.resize(h.n_ff);
  m->logits_.resize(h.n_vocab);
  m->scores_.assign(threads, std::vector<double>(m->n_ctx_));
  return m;
}

absl::Status ReferenceModel::LoadWeights(const ReferenceOptions& options) {
  const Hparams& h = hp_;
  const formats::ModelFile& file = *model_;
  absl::flat_hash_set<std::string> used;

  auto add_matrix = [&](const std::string& name, int64_t n_cols,
                        int64_t n_rows) -> absl::StatusOr<const Matrix*> {
    absl::StatusOr<const TensorView*> t = file.Require(name);
    if (!t.ok()) return t.status();
    const TensorView& v = **t;
    if (v.ne[0] != static_cast<uint64_t>(n_cols) || v.ne[1] != static_cast<uint64_t>(n_rows) ||
        v.ne[2] != 1 || v.ne[3] != 1) {
      return absl::InvalidArgumentError(absl::StrCat(name, " has shape ", ShapeString(v),
                                                     ", expected [", n_cols, ", ", n_rows, "]"));
    }
    absl::Status s = CheckDequantizable(v);
    if (!s.ok()) return s;
    used.insert(name);
    auto mat = std::make_unique<Matrix>();
    mat->view = &v;
    mat->n_cols = v.ne[0];
    mat->n_rows = v.ne[1];
    matrices_.push_back(std::move(mat));
    return matrices_.back().get();
  };
  // A 1-D tensor of n values as float64; `optional` ones may be absent.
  auto add_vector = [&](const std::string& name, int64_t n, bool optional,
                        std::vector<double>* out) -> absl::Status {
    const TensorView* t = file.Find(name);
    if (t == nullptr) {
      if (optional) return absl::OkStatus();
      return file.Require(name).status();
    }
    if (t->ne[0] != static_cast<uint64_t>(n) || t->n_rows != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, " has shape ", ShapeString(*t), ", expected [", n, "]"));
    }
    absl::Status s = CheckDequantizable(*t);
    if (!s.ok()) return s;
    std::vector<float> f(n);
    s = formats::DequantizeRow(t->type, t->layout, t->data, n, f.data());
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat(name, ": ", s.message()));
    out->assign(f.begin(), f.end());
    used.insert(name);
    return absl::OkStatus();
  };

#define DPL_RETURN_IF_ERROR(expr)      \
  do {                                 \
    absl::Status s_ = (expr);          \
    if (!s_.ok()) return s_;           \
  } while (0)
#define DPL_MATRIX(lhs, name, cols, rows)                                 \
  do {                                                                   \
    absl::StatusOr<const Matrix*> m_ = add_matrix((name), (cols), (rows)); \
    if (!m_.ok()) return m_.status();                                    \
    lhs = *m_;                                                           \
  } while (0)

  DPL_MATRIX(token_embd_, "token_embd.weight", h.n_embd, h.n_vocab);
  if (file.Find("output.weight") != nullptr) {
    DPL_MATRIX(output_, "output.weight", h.n_embd, h.n_vocab);
  } else {
    output_ = token_embd_;  // tied lm head
  }
  DPL_RETURN_IF_ERROR(add_vector("output_norm.weight", h.n_embd, false, &output_norm_));

  layers_.resize(h.n_layer);
  for (int64_t il = 0; il < h.n_layer; ++il) {
    Layer& L = layers_[il];
    const std::string p = absl::StrCat("blk.", il, ".");
    DPL_RETURN_IF_ERROR(add_vector(p + "attn_norm.weight", h.n_embd, false, &L.attn_norm));
    DPL_RETURN_IF_ERROR(add_vector(p + "ffn_norm.weight", h.n_embd, false, &L.ffn_norm));
    DPL_MATRIX(L.wq, p + "attn_q.weight", h.n_embd, h.q_dim());
    DPL_MATRIX(L.wk, p + "attn_k.weight", h.n_embd, h.kv_dim());
    DPL_MATRIX(L.wv, p + "attn_v.weight", h.n_embd, h.kv_dim());
    DPL_MATRIX(L.wo, p + "attn_output.weight", h.q_dim(), h.n_embd);
    DPL_MATRIX(L.w_gate, p + "ffn_gate.weight", h.n_embd, h.n_ff);
    DPL_MATRIX(L.w_up, p + "ffn_up.weight", h.n_embd, h.n_ff);
    DPL_MATRIX(L.w_down, p + "ffn_down.weight", h.n_ff, h.n_embd);
    DPL_RETURN_IF_ERROR(add_vector(p + "attn_q.bias", h.q_dim(), true, &L.bq));
    DPL_RETURN_IF_ERROR(add_vector(p + "attn_k.bias", h.kv_dim(), true, &L.bk));
    DPL_RETURN_IF_ERROR(add_vector(p + "attn_v.bias", h.kv_dim(), true, &L.bv));
    DPL_RETURN_IF_ERROR(add_vector(p + "attn_output.bias", h.n_embd, true, &L.bo));
  }

  // RoPE angles per position: base^(-2i/n_rot) * freq_scale / freq_factor[i]
  // (rope_freqs.weight: llama 3's per-frequency factors, when present).
  std::vector<double> freq_factors;
  DPL_RETURN_IF_ERROR(add_vector("rope_freqs.weight", h.n_rot / 2, true, &freq_factors));
  rope_inv_freq_.resize(h.n_rot / 2);
  for (int64_t i = 0; i < h.n_rot / 2; ++i) {
    double f = std::pow(h.rope_freq_base, -2.0 * static_cast<double>(i) / h.n_rot) *
               h.rope_freq_scale;
    if (!freq_factors.empty()) f /= freq_factors[i];
    rope_inv_freq_[i] = f;
  }
#undef DPL_MATRIX
#undef DPL_RETURN_IF_ERROR

  // A tensor this pass would not use means semantics it does not implement.
  for (const TensorView& t : file.tensors()) {
    if (!used.contains(t.name)) {
      return absl::UnimplementedError(absl::StrCat(
          "tensor '", t.name, "' is not part of the ", h.arch, " graph the reference implements"));
    }
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
      mat->dense = reinterpret_cast<const float*>(v.data);
    } else {
      dequant_bytes += mat->n_rows * mat->n_cols * 4;
    }
  }
  scratch_.assign(pool_->size(), std::vector<float>(max_cols));
  worker_status_.assign(pool_->size(), absl::OkStatus());
  resident_ = dequant_bytes <= options.max_resident_bytes;
  if (resident_) {
    for (auto& mat : matrices_) {
      if (mat->dense != nullptr) continue;
      mat->owned.resize(mat->n_rows * mat->n_cols);
      Matrix* mp = mat.get();
      pool_->ParallelFor(mp->n_rows, [&](int worker, uint64_t begin, uint64_t end) {
        for (uint64_t r = begin; r < end && worker_status_[worker].ok(); ++r) {
          worker_status_[worker] =
              formats::DequantizeRow(mp->view->type, mp->view->layout,
                                     mp->view->data + r * mp->view->row_stride, mp->n_cols,
                                     mp->owned.data() + r * mp->n_cols);
        }
      });
      for (absl::Status& s : worker_status_) {
        if (!s.ok()) return absl::Status(s.code(), absl::StrCat(mp->view->name, ": ", s.message()));
      }
      mat->dense = mat->owned.data();
    }
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
                                w.view->data + row * w.view->row_stride, w.n_cols, scratch);
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
static void Rope(const Hparams& h, const std::vector<double>& inv_freq, int64_t pos,
                 int64_t n_heads, double* v) {
  const int64_t half = h.n_rot / 2;
  for (int64_t i = 0; i < half; ++i) {
    const double theta = static_cast<double>(pos) * inv_freq[i];
    const double c = std::cos(theta), s = std::sin(theta);
    const int64_t i0 = h.rope_style == RopeStyle::kNeox ? i : 2 * i;
    const int64_t i1 = h.rope_style == RopeStyle::kNeox ? i + half : 2 * i + 1;
    for (int64_t hd = 0; hd < n_heads; ++hd) {
      double* x = v + hd * h.head_dim;
      const double x0 = x[i0], x1 = x[i1];
      x[i0] = x0 * c - x1 * s;
      x[i1] = x0 * s + x1 * c;
    }
  }
}

void ReferenceModel::Attention(int il, int64_t pos) {
  const Hparams& h = hp_;
  const int64_t kv_dim = h.kv_dim();
  const int64_t group = h.n_head / h.n_head_kv;  // query heads per kv head
  const float* kc = k_cache_.data() + static_cast<size_t>(il) * n_ctx_ * kv_dim;  // (n_ctx, kv_dim)
  const float* vc = v_cache_.data() + static_cast<size_t>(il) * n_ctx_ * kv_dim;  // (n_ctx, kv_dim)
  const double scale = 1.0 / std::sqrt(static_cast<double>(h.head_dim));
  auto heads = [&](int worker, uint64_t begin, uint64_t end) {
    double* scores = scores_[worker].data();
    for (uint64_t hq = begin; hq < end; ++hq) {
      const int64_t hk = static_cast<int64_t>(hq) / group;
      const double* q = q_.data() + hq * h.head_dim;
      // softmax(q . k_t * scale) over t = 0..pos (causal: nothing after pos is cached)
      double mx = -INFINITY;
      for (int64_t t = 0; t <= pos; ++t) {
        scores[t] = Dot(kc + t * kv_dim + hk * h.head_dim, q, h.head_dim) * scale;
        mx = std::max(mx, scores[t]);
      }
      double sum = 0;
      for (int64_t t = 0; t <= pos; ++t) {
        scores[t] = std::exp(scores[t] - mx);
        sum += scores[t];
      }
      double* out = att_.data() + hq * h.head_dim;
      std::fill(out, out + h.head_dim, 0.0);
      for (int64_t t = 0; t <= pos; ++t) {
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
  const Hparams& h = hp_;
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
  n_past_ = pos;  // drops any cached positions >= pos
#define DPL_RETURN_IF_ERROR(expr) \
  do {                            \
    absl::Status s_ = (expr);     \
    if (!s_.ok()) return s_;      \
  } while (0)

  {
    const float* row = nullptr;
    DPL_RETURN_IF_ERROR(RowF32(*token_embd_, token, scratch_[0].data(), &row));
    for (int64_t i = 0; i < h.n_embd; ++i) x_[i] = row[i];
  }
  const int64_t kv_dim = h.kv_dim();
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

    // Feed-forward block: down(silu(gate(h)) * up(h)).
    RmsNorm(x_.data(), L.ffn_norm, h.rms_eps, h_.data());
    DPL_RETURN_IF_ERROR(MatVec(*L.w_gate, h_.data(), gate_.data()));
    DPL_RETURN_IF_ERROR(MatVec(*L.w_up, h_.data(), up_.data()));
    for (int64_t i = 0; i < h.n_ff; ++i) {
      const double g = gate_[i];
      gate_[i] = g / (1.0 + std::exp(-g)) * up_[i];
    }
    DPL_RETURN_IF_ERROR(MatVec(*L.w_down, gate_.data(), tmp_.data()));
    for (int64_t i = 0; i < h.n_embd; ++i) x_[i] += tmp_[i];
  }
  RmsNorm(x_.data(), output_norm_, h.rms_eps, h_.data());
  DPL_RETURN_IF_ERROR(MatVec(*output_, h_.data(), logits_.data()));
#undef DPL_RETURN_IF_ERROR
  n_past_ = pos + 1;
  return logits_;
}

absl::StatusOr<std::vector<float>> ReferenceModel::Forward(int32_t token, int64_t pos) {
  absl::StatusOr<std::vector<double>> l = ForwardF64(token, pos);
  if (!l.ok()) return l.status();
  return std::vector<float>(l->begin(), l->end());
}

}  // namespace dpl::reference
