// The CPU reference forward pass for llama, qwen2, qwen3 and qwen3moe decoders: the ground
// truth every GPU kernel of this project is judged against, itself judged
// against llama.cpp's logits (shared/oracle).
//
// Exact math: weights are dequantized to float32 bit-exactly (formats/
// dequant.h), activations are float64 and every dot product accumulates in
// float64. The KV cache keeps K and V as float32 (llama.cpp keeps f16).
// Results are deterministic and independent of the thread count and of
// whether weights are resident or dequantized per row.
//
// One decode step (Forward) reads top to bottom:
//   x = token_embd[token]
//   per layer:  h = rmsnorm(x) * attn_norm
//               q, k, v = Wq h + bq, Wk h + bk, Wv h + bv
//               qwen3: every head of q and k RMS-normed (q_norm, k_norm)
//               rope(q, k, pos);  cache k, v at pos
//               a = softmax(q k^T / sqrt(head_dim)) v over keys 0..pos (GQA;
//                   with a sliding window W, keys pos - W + 1 .. pos)
//               x += Wo a
//               h = rmsnorm(x) * ffn_norm;  x += Wdown (silu(Wgate h) * (Wup h))
//               qwen3moe, instead: p = softmax(Wrouter h) over the experts,
//                   S = the n_expert_used largest p, w_e = p_e / sum_S p;
//                   x += sum_{e in S} w_e Wdown_e (silu(Wgate_e h) * (Wup_e h))
//   logits = Wout (rmsnorm(x) * output_norm)       (Wout = token_embd if tied)
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "formats/model_file.h"
#include "model/model.h"
#include "runtime/reference/thread_pool.h"

namespace dpl::reference {

struct ReferenceOptions {
  // Worker threads for matrix-vector products (0: hardware_concurrency).
  int threads = 0;
  // KV cache positions (0: min({arch}.context_length, 4096), or 4096 when the
  // model does not say).
  int64_t n_ctx = 0;
  // Weights are dequantized to float32 once at load when their float32 size
  // (beyond f32 tensors used in place) fits in this many bytes; otherwise each
  // thread dequantizes one row at a time into a small buffer inside the matvec
  // (a 7B model would need ~30 GB of float32).
  uint64_t max_resident_bytes = uint64_t{2} << 30;
};

class ReferenceModel {
 public:
  // Binds the model (model::BindModel: architecture, hyperparameters, every
  // tensor's presence and shape), checks that every matrix can be
  // dequantized (type, layout), and allocates the KV cache.
  static absl::StatusOr<std::unique_ptr<ReferenceModel>> Load(
      std::shared_ptr<formats::ModelFile> model, const ReferenceOptions& options);
  static absl::StatusOr<std::unique_ptr<ReferenceModel>> Load(
      std::shared_ptr<formats::ModelFile> model, int threads) {
    ReferenceOptions o;
    o.threads = threads;
    return Load(std::move(model), o);
  }
  ~ReferenceModel();

  // Runs `token` at position `pos` and returns n_vocab logits. The cache
  // holds positions [0, n_past()); `pos` must be <= n_past() (pos < n_past()
  // drops the cached positions >= pos first) and < n_ctx().
  absl::StatusOr<std::vector<float>> Forward(int32_t token, int64_t pos);
  // Same, in float64 (the logits as computed).
  absl::StatusOr<std::vector<double>> ForwardF64(int32_t token, int64_t pos);

  // Empties the KV cache (n_past() becomes 0).
  void Reset() { n_past_ = 0; }
  // Keeps the first n cached positions (n <= n_past()).
  void Truncate(int64_t n) { n_past_ = std::min(n_past_, std::max<int64_t>(n, 0)); }
  // The cache becomes the first n positions of `src`'s (a model of the same
  // file and n_ctx: a server's other slot), which is left as it was.
  // Errors: n outside [0, src.n_past()], a cache of another shape.
  absl::Status CopyPrefix(const ReferenceModel& src, int64_t n);

  const model::Hparams& hparams() const { return hp_; }
  int n_vocab() const { return static_cast<int>(hp_.n_vocab); }
  int64_t n_ctx() const { return n_ctx_; }
  int64_t n_past() const { return n_past_; }
  int threads() const { return pool_->size(); }
  // True when weights were dequantized at load (see max_resident_bytes).
  bool weights_resident() const { return resident_; }

  // Tests: of the last forward pass, per mixture-of-experts layer in order,
  // the router's margin at the top-k cut: the k-th largest probability
  // minus the (k+1)-th (infinity when every expert is used; empty for a
  // dense model). A small margin is a near-tie another implementation's
  // rounding may resolve the other way (a different expert).
  const std::vector<double>& router_margins() const { return router_margins_; }
  // Tests: the experts the next forward pass's MoE layers take instead of
  // their own top-k, per MoE layer in order (n_expert_used ids each): another
  // implementation's choices, so that where it resolved a near-tie the other
  // way the two compare the same arithmetic. The weights are still this
  // model's probabilities, renormalized over the forced set. Used by the next
  // forward pass only; empty: its own choice. own_experts() still reports the
  // model's own top-k.
  void ForceExperts(std::vector<std::vector<int>> per_layer) { forced_experts_ = std::move(per_layer); }
  // Of the last forward pass, per MoE layer in order, the experts its own
  // top-k chose (in probability order), forced or not.
  const std::vector<std::vector<int>>& own_experts() const { return own_experts_; }

  struct Matrix;  // a weight matrix (n_rows outputs x n_cols inputs)

 private:
  struct Layer;
  ReferenceModel() = default;

  absl::Status Init(std::shared_ptr<formats::ModelFile> file, const ReferenceOptions& options);
  absl::Status LoadWeights(const model::ModelDesc& desc, const ReferenceOptions& options);
  absl::StatusOr<const Matrix*> AddMatrix(const formats::TensorView& t);
  // Expert e of a 3-D expert tensor: its rows e ne[1] .. (e + 1) ne[1].
  absl::StatusOr<const Matrix*> AddExpert(const formats::TensorView& t, uint64_t e);
  // x += the layer's feed-forward of h_ (dense or mixture of experts).
  // forced: this MoE layer's experts (ForceExperts), or null for its own top-k.
  absl::Status FeedForward(const Layer& L, const std::vector<int>* forced);
  // Dequantizes every matrix that is not f32 into `owned` (see max_resident_bytes).
  absl::Status MakeResident();
  // y = W x, rows split across the pool; x: (n_cols), y: (n_rows).
  absl::Status MatVec(const Matrix& w, const double* x, double* y);
  absl::Status RowF32(const Matrix& w, uint64_t row, float* scratch, const float** out) const;
  void Attention(int il, int64_t pos);

  std::shared_ptr<formats::ModelFile> model_;
  model::Hparams hp_;
  std::unique_ptr<ThreadPool> pool_;
  bool resident_ = false;

  std::vector<std::unique_ptr<Matrix>> matrices_;  // owns every matrix
  const Matrix* token_embd_ = nullptr;
  const Matrix* output_ = nullptr;  // == token_embd_ when tied
  std::vector<double> output_norm_;
  std::vector<Layer> layers_;
  std::vector<double> rope_inv_freq_;  // (n_rot / 2) angle per position

  int64_t n_ctx_ = 0;
  int64_t n_past_ = 0;
  std::vector<float> k_cache_;  // (n_layer, n_ctx, kv_dim)
  std::vector<float> v_cache_;  // (n_layer, n_ctx, kv_dim)

  // Per-step activations (float64), allocated once.
  std::vector<double> x_, h_, q_, k_, v_, att_, tmp_, gate_, up_, logits_;
  std::vector<double> router_, moe_;  // (n_expert) router logits, (n_embd) expert sum
  std::vector<double> router_margins_;  // router_margins()
  std::vector<std::vector<int>> forced_experts_, own_experts_;  // ForceExperts(), own_experts()
  std::vector<std::vector<float>> scratch_;   // per worker: (max n_cols) row buffer
  std::vector<std::vector<double>> scores_;   // per worker: (n_ctx) attention scores
  std::vector<absl::Status> worker_status_;   // per worker: first dequant error
};

}  // namespace dpl::reference
