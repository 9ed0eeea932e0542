// The CUDA device: a .dpl model on one GPU. Weights are one device
// allocation (DeviceWeights); every activation buffer, the f16 KV cache and
// the kernels' scratch are one more, carved from one size table at load. A
// decode step is captured once as a CUDA graph and replayed for every token:
// the token and position live in device memory, so nothing is re-captured
// as the context grows.
//
// One step, top to bottom (llama / qwen2 / qwen3):
//   x = embed(token)
//   per layer:  h = rmsnorm(x) * attn_norm                (fused with h's int8 quantization)
//               q, k, v = Wq h + bq, Wk h + bk, Wv h + bv  (one launch per weight kernel)
//               qwen3: q, k = per-head rmsnorm(q) * q_norm, rmsnorm(k) * k_norm
//               rope(q, k, pos); cache[pos] = (k, v)     (one launch, norms included)
//               a = attention(q, cache[0..pos])          (sliding window: cache[pos-W+1..pos])
//               x = Wo a + x
//               h = rmsnorm(x) * ffn_norm
//               g, u = Wgate h, Wup h                    (one launch)
//               x = Wdown (silu(g) * u) + x              (SwiGLU fused with quantization)
//   logits = Wout (rmsnorm(x) * output_norm)
// Prompts run the same math over chunks of up to `max_batch` tokens: from
// tuning.gemm_min_tokens tokens on, each matrix product dequantizes W to f16
// and multiplies on tensor cores (cuBLAS, kernels/gemm), RoPE and the KV write
// are one launch for the chunk and attention is one causal flash-attention
// launch (kernels/attention/prompt_attention.h). Fewer tokens take the dp4a
// matvec in token tiles (MatVecPlan::prompt).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/attention/attention.h"
#include "kernels/attention/prompt_attention.h"
#include "kernels/cuda_handles.h"
#include "kernels/gemm/prompt_gemm.h"
#include "kernels/matvec/matvec.h"
#include "kernels/ops/kv_cache.h"
#include "kernels/ops/ops.h"
#include "kernels/sampling/sampling.h"
#include "kernels/tuning.h"
#include "model/hparams.h"
#include "model/model.h"
#include "runtime/cuda/device_weights.h"
#include "runtime/generate/decoder.h"

namespace dpl::runtime {

// Positions a KV cache may hold (the kernels index positions with int).
inline constexpr int64_t kMaxContext = int64_t{1} << 24;

struct CudaDecoderOptions {
  int64_t n_ctx = 4096;   // KV cache positions (0: the model's context length)
  int max_batch = 2048;   // prompt chunk: tokens per forward pass (llama.cpp's -ub)
  // Debugging: run every step eagerly instead of replaying the graph (dpl-run
  // sets it from DPL_EAGER=1). Same bits either way.
  bool eager = false;
  // Launch policy; unset: DecodeTuningForDevice() (benchmarks override fields).
  std::optional<kernels::DecodeTuning> tuning;
  LoadOptions load;
  // The file already opened by the caller (ModelFile::OpenIndex of the same
  // path), so that it is not parsed twice; null: Create opens it.
  std::shared_ptr<formats::ModelFile> index;
};

// What Create() reports: load speed, the memory it took and where its time
// went (seconds per stage, in order).
struct CudaMemoryReport {
  uint64_t weight_bytes = 0;
  uint64_t kv_cache_bytes = 0;
  uint64_t scratch_bytes = 0;
  LoadStats load;
  double init_seconds = 0;     // device query, file index (unless given), model binding
  double weights_seconds = 0;  // DeviceWeights::Load: allocation + upload (load.seconds)
  double setup_seconds = 0;    // matvec plans, buffers, cuBLAS handle, RoPE table
  double graph_seconds = 0;    // decode step captured and instantiated
};

class CudaDecoder : public generate::Decoder {
 public:
  static absl::StatusOr<std::unique_ptr<CudaDecoder>> Create(const std::string& path,
                                                             const CudaDecoderOptions& options);

  int32_t n_vocab() const override { return static_cast<int32_t>(hp_.n_vocab); }
  int64_t n_ctx() const override { return n_ctx_; }
  int64_t n_past() const override { return n_past_; }
  absl::Status Eval(absl::Span<const int32_t> tokens, std::vector<float>* last,
                    std::vector<float>* all) override;
  absl::Status Rewind(int64_t n) override;
  std::string LoadReport() const override;
  std::vector<std::pair<std::string, double>> LoadStages() const override;
  bool samples_on_device() const override { return true; }
  absl::Status SampleLoop(const generate::SamplerParams& params, absl::Span<const int32_t> history,
                          int32_t max_tokens,
                          const std::function<bool(int32_t)>& on_token) override;

  // Token at a time (the server's engine, which interleaves requests
  // between tokens): after Eval() of a prompt, BeginSampling samples the
  // first token from its last logits (`history`: the ids so far, for the
  // repetition penalty); each NextToken() then runs the pending token
  // through the step graph and samples the next one, which stays pending
  // (n_past() counts the tokens run). The draws start over (RNG counter 0),
  // so a seed repeats its tokens whatever ran before; SampleLoop carries the
  // counter on instead (one conversation). One host round trip per token,
  // where SampleLoop overlaps the host's wait with the next step.
  absl::StatusOr<int32_t> BeginSampling(const generate::SamplerParams& params,
                                        absl::Span<const int32_t> history);
  absl::StatusOr<int32_t> NextToken();

  const model::Hparams& hparams() const { return hp_; }
  const kernels::DecodeTuning& tuning() const { return tuning_; }
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
  // A weight matrix and how its matvec launches (planned once at load).
  struct Matrix {
    kernels::WeightMatrix w;
    kernels::MatVecPlan plan;
  };
  struct Layer {
    Matrix wq, wk, wv, wo, w_gate, w_up, w_down;
    // The matvec launches over {wq, wk, wv} and over {w_gate, w_up}: one per
    // weight kernel (PlanMatVecGroups; members index the braces).
    std::vector<kernels::MatVecGroupPlan> qkv, gate_up;
    kernels::HeadNorms head_norms;     // qwen3's q/k norms, or nulls
    const float* attn_norm = nullptr;  // (n_embd)
    const float* ffn_norm = nullptr;   // (n_embd)
    const float* bq = nullptr;         // (q_dim) or null
    const float* bk = nullptr;         // (kv_dim) or null
    const float* bv = nullptr;         // (kv_dim) or null
    const float* bo = nullptr;         // (n_embd) or null
  };
  // Device buffers of a forward pass, carved from one allocation (Allocate).
  // T = max_batch.
  struct Buffers {
    int* tokens = nullptr;       // (T) token ids of the current pass
    int* positions = nullptr;    // (T) their positions
    double* inv_freq = nullptr;  // (n_rot / 2) RoPE frequencies
    float* x = nullptr;          // (T, n_embd) residual stream
    float* h = nullptr;          // (T, n_embd) normed input of a block
    float* q = nullptr;          // (T, q_dim)
    float* k = nullptr;          // (T, kv_dim)
    float* v = nullptr;          // (T, kv_dim)
    float* att = nullptr;        // (T, q_dim) attention output
    float* gate = nullptr;       // (T, n_ff)
    float* up = nullptr;         // (T, n_ff)
    float* logits = nullptr;     // (logit_rows_, n_vocab)
    uint16_t* x_f16 = nullptr;   // (T, max width) f16 activations of the tensor-core path
    uint16_t* w_f16 = nullptr;   // (w_f16_elems_) f16 weight rows of the tensor-core path
    float* attn_ws = nullptr;    // (attn_plan_.workspace_floats)
    uint16_t* kv = nullptr;      // kv_layout_: per layer K then V, f16
    kernels::SamplerState* sampler = nullptr;  // (1), zeroed once: the RNG counter persists
    void* sampling_ws = nullptr;               // (SamplingWorkspaceBytes()) bytes
    kernels::MatVecScratch qx;                 // int8 activations (T, max width)
  };

  CudaDecoder() = default;
  absl::Status Init(const std::string& path, const CudaDecoderOptions& options);
  absl::Status BindWeights(const model::ModelDesc& desc);
  absl::Status Allocate();
  absl::Status InitRope(const model::ModelDesc& desc);
  // Enqueues the forward pass of the n tokens in buf_.tokens at
  // buf_.positions (first_pos, first_pos + 1, ... when n > 1; a single
  // token's position is read on the device, so the step graph serves every
  // position); logits of the last token (all_logits: of every token) land
  // in buf_.logits.
  absl::Status EnqueueForward(int n, int first_pos, bool all_logits);
  // One decode step of the token in buf_.tokens[0] at buf_.positions[0]:
  // the forward pass, then (with `sample`) the next token sampled into
  // buf_.tokens[0], then the position advanced. What the step graph and the
  // generation graph capture, and what eager mode runs.
  absl::Status EnqueueStep(const kernels::SamplingParams* sample);
  absl::Status RunChunk(absl::Span<const int32_t> tokens, bool all_logits);
  // The generation graph for these sampling parameters (kernel arguments,
  // so a change of parameters re-captures).
  absl::Status PrepareGenerationGraph(const kernels::SamplingParams& params);
  // Launches the generation step: its graph, or eagerly.
  absl::Status LaunchGenerationStep(const kernels::SamplingParams& params);
  // SampleLoop's and BeginSampling's start: the generation graph for
  // `params` (repeat_last_n normalized into *p), the penalty ring from
  // `history`, the RNG counter reset (restart_draws), the position, and the
  // first token sampled into
  // buf_.tokens and h_tokens_[0] (token_ready_[0] recorded).
  absl::Status StartSampling(const generate::SamplerParams& params,
                             absl::Span<const int32_t> history, bool restart_draws,
                             kernels::SamplingParams* p);

  std::unique_ptr<DeviceWeights> weights_;
  std::shared_ptr<formats::ModelFile> index_;  // metadata and tensor table
  model::Hparams hp_;
  kernels::DecodeTuning tuning_;
  int64_t n_ctx_ = 0;
  int64_t n_past_ = 0;
  int max_batch_ = 0;
  // Rows of buf_.logits: Eval asked for every token's logits runs chunks of
  // at most this many tokens (a 2048-token chunk's logits would take 1.2 GB
  // for a 152k vocabulary; one row is all a prompt needs otherwise).
  static constexpr int kMaxLogitRows = 512;
  int logit_rows_ = 0;
  bool eager_ = false;
  uint64_t bytes_per_token_ = 0;
  CudaMemoryReport report_;

  kernels::WeightMatrix embed_;
  Matrix out_;
  const float* output_norm_ = nullptr;  // (n_embd)
  std::vector<Layer> layers_;
  kernels::RopeKvShape rope_shape_;
  kernels::KvCacheLayout kv_layout_;
  kernels::DecodeAttentionPlan attn_plan_;
  kernels::PromptAttentionShape prompt_attn_;
  // Tensor-core path for chunks of >= tuning_.gemm_min_tokens tokens (unset
  // when max_batch is below that): the cuBLAS handle and the f16 weight
  // scratch size (the largest layer matrix; bigger ones go in row blocks).
  std::optional<kernels::PromptGemm> gemm_;
  int64_t w_f16_elems_ = 0;

  kernels::Stream stream_;
  kernels::DeviceBuffer<uint8_t> arena_;  // every buffer of buf_
  Buffers buf_;
  kernels::GraphExec step_graph_;

  // On-device sampling.
  kernels::DeviceBuffer<int> ring_;            // (repeat_last_n) recent tokens
  kernels::PinnedBuffer<int> h_tokens_;        // (2) sampled ids read by the host
  kernels::Event token_ready_[2];
  std::optional<kernels::SamplingParams> gen_params_;  // what gen_graph_ samples with
  kernels::GraphExec gen_graph_;
};

}  // namespace dpl::runtime
