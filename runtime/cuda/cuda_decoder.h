// The CUDA device: a .dpl model on one GPU. Weights are one device
// allocation (DeviceWeights); every activation buffer, the f16 KV cache and
// the kernels' scratch are allocated once here. A decode step is captured
// once as a CUDA graph and replayed for every token: the token and position
// live in device memory, so nothing is re-captured as the context grows.
//
// One step, top to bottom (llama / qwen2):
//   x = embed(token)
//   per layer:  h = rmsnorm(x) * attn_norm
//               q, k, v = Wq h + bq, Wk h + bk, Wv h + bv
//               rope(q, k, pos); cache[pos] = (k, v)
//               a = attention(q, cache[0..pos])
//               x = Wo a + x
//               h = rmsnorm(x) * ffn_norm
//               x = Wdown (silu(Wgate h) * (Wup h)) + x
//   logits = Wout (rmsnorm(x) * output_norm)
// Prompts run the same code over up to `max_batch` tokens at once: the
// matrix products read each weight once per batch (MatMulTokens).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/attention/attention.h"
#include "kernels/matvec/matvec.h"
#include "kernels/ops/kv_cache.h"
#include "kernels/ops/ops.h"
#include "kernels/sampling/sampling.h"
#include "runtime/cuda/device_weights.h"
#include "runtime/generate/decoder.h"
#include "runtime/reference/hparams.h"

namespace dpl::runtime {

struct CudaDecoderOptions {
  int64_t n_ctx = 4096;   // KV cache positions (0: the model's context length)
  int max_batch = 256;    // prompt tokens per forward pass
  // Debugging: run every step eagerly instead of replaying the graph
  // (also DPL_EAGER=1 in the environment). Same bits either way.
  bool eager = false;
  LoadOptions load;
};

// What Create() reports: load speed and the memory it took.
struct CudaMemoryReport {
  uint64_t weight_bytes = 0;
  uint64_t kv_cache_bytes = 0;
  uint64_t scratch_bytes = 0;
  LoadStats load;
};

class CudaDecoder : public generate::Decoder {
 public:
  static absl::StatusOr<std::unique_ptr<CudaDecoder>> Create(const std::string& path,
                                                             const CudaDecoderOptions& options);
  ~CudaDecoder() override;

  int32_t n_vocab() const override { return static_cast<int32_t>(hp_.n_vocab); }
  int64_t n_ctx() const override { return n_ctx_; }
  int64_t n_past() const override { return n_past_; }
  absl::Status Eval(absl::Span<const int32_t> tokens, std::vector<float>* last,
                    std::vector<float>* all) override;
  absl::Status Rewind(int64_t n) override;
  std::string LoadReport() const override;
  bool samples_on_device() const override { return true; }
  absl::Status SampleLoop(const generate::SamplerParams& params, absl::Span<const int32_t> history,
                          int32_t max_tokens,
                          const std::function<bool(int32_t)>& on_token) override;

  const reference::Hparams& hparams() const { return hp_; }
  const CudaMemoryReport& memory() const { return report_; }
  // Bytes of weights one decode step reads (every tensor but the embedding
  // table, which is read one row per token unless it is also the lm head).
  uint64_t weight_bytes_per_token() const { return bytes_per_token_; }
  bool uses_graph() const { return !eager_; }
  // Benchmarking: replays the step graph n times back to back from position
  // n_past() (feeding the token last written to the device), with one sync
  // at the end; returns the seconds between events around the replays.
  absl::StatusOr<double> TimeDecodeSteps(int n);

 private:
  struct Layer {
    kernels::WeightMatrix wq, wk, wv, wo, wgate, wup, wdown;
    kernels::MatVecKernel kq, kk, kv, ko, kgate, kup, kdown;
    const float* attn_norm = nullptr;  // (n_embd)
    const float* ffn_norm = nullptr;   // (n_embd)
    const float* bq = nullptr;         // (q_dim) or null
    const float* bk = nullptr;         // (kv_dim) or null
    const float* bv = nullptr;         // (kv_dim) or null
    const float* bo = nullptr;         // (n_embd) or null
  };

  CudaDecoder() = default;
  absl::Status Init(const std::string& path, const CudaDecoderOptions& options);
  absl::Status BindWeights();
  absl::Status Allocate(const CudaDecoderOptions& options);
  // Enqueues the forward pass of the n tokens in d_tokens_ at d_positions_;
  // logits of the last token (all_logits: of every token) land in d_logits_.
  absl::Status EnqueueForward(int n, bool all_logits);
  absl::Status CaptureStepGraph();
  absl::Status RunChunk(absl::Span<const int32_t> tokens, bool all_logits);
  // The generation step graph: forward of d_tokens_[0] at d_positions_[0],
  // sample the next token into d_tokens_[0], advance the position. Sampling
  // parameters are kernel arguments, so a change of parameters re-captures.
  absl::Status PrepareGenerationGraph(const kernels::SamplingParams& params);

  std::unique_ptr<DeviceWeights> weights_;
  std::shared_ptr<formats::ModelFile> index_;  // metadata and tensor table
  reference::Hparams hp_;
  int64_t n_ctx_ = 0;
  int64_t n_past_ = 0;
  int max_batch_ = 0;
  bool eager_ = false;
  uint64_t bytes_per_token_ = 0;
  CudaMemoryReport report_;

  kernels::EmbedTable embed_;
  kernels::WeightMatrix w_out_;
  kernels::MatVecKernel k_out_ = kernels::MatVecKernel::kF32;
  const float* output_norm_ = nullptr;  // (n_embd)
  std::vector<Layer> layers_;
  kernels::RopeStyle rope_style_ = kernels::RopeStyle::kNeox;
  kernels::RopeKvShape rope_shape_;
  kernels::KvCacheLayout kv_layout_;
  kernels::DecodeAttentionPlan attn_plan_;

  // Device buffers, allocated once. T = max_batch.
  cudaStream_t stream_ = nullptr;
  std::vector<void*> allocations_;
  int* d_tokens_ = nullptr;       // (T) token ids of the current pass
  int* d_positions_ = nullptr;    // (T) their positions
  double* d_inv_freq_ = nullptr;  // (n_rot / 2) RoPE frequencies
  float* d_x_ = nullptr;          // (T, n_embd) residual stream
  float* d_h_ = nullptr;          // (T, n_embd) normed input of a block
  float* d_q_ = nullptr;          // (T, q_dim)
  float* d_k_ = nullptr;          // (T, kv_dim)
  float* d_v_ = nullptr;          // (T, kv_dim)
  float* d_att_ = nullptr;        // (T, q_dim) attention output
  float* d_gate_ = nullptr;       // (T, n_ff)
  float* d_up_ = nullptr;         // (T, n_ff)
  float* d_logits_ = nullptr;     // (T, n_vocab)
  float* d_attn_ws_ = nullptr;    // (attn_plan_.workspace_floats)
  uint16_t* d_kv_ = nullptr;      // kv_layout_: per layer K then V, f16
  kernels::MatVecScratch scratch_;

  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t graph_exec_ = nullptr;

  // On-device sampling.
  kernels::SamplerState* d_sampler_state_ = nullptr;  // (1), zeroed once: the RNG counter persists
  void* d_sampling_ws_ = nullptr;                     // (SamplingWorkspaceBytes()) bytes
  int* d_ring_ = nullptr;                             // (ring_capacity_) recent tokens
  int ring_capacity_ = 0;
  int* h_tokens_ = nullptr;                           // (2) pinned: sampled ids read by the host
  cudaEvent_t token_ready_[2] = {nullptr, nullptr};
  bool gen_params_valid_ = false;
  kernels::SamplingParams gen_params_;
  cudaGraph_t gen_graph_ = nullptr;
  cudaGraphExec_t gen_graph_exec_ = nullptr;
};

}  // namespace dpl::runtime
