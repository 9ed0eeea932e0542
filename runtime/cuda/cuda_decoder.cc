#include "runtime/cuda/cuda_decoder.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/cuda_check.h"
#include "kernels/sampling/sampling_util.h"
#include "kernels/step/step.h"

namespace dpl::runtime {
namespace {

#define DPL_RETURN_IF_ERROR(expr)            \
  do {                                       \
    const absl::Status dpl_status_ = (expr); \
    if (!dpl_status_.ok()) return dpl_status_; \
  } while (0)

bool EnvEager() {
  const char* e = std::getenv("DPL_EAGER");
  return e != nullptr && std::strcmp(e, "0") != 0 && *e != '\0';
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaDecoder>> CudaDecoder::Create(const std::string& path,
                                                                 const CudaDecoderOptions& options) {
  int devices = 0;
  const cudaError_t e = cudaGetDeviceCount(&devices);
  if (e != cudaSuccess || devices == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("no CUDA device available (", cudaGetErrorString(e),
                     "); use --device cpu for the CPU reference"));
  }
  std::unique_ptr<CudaDecoder> d(new CudaDecoder());
  absl::Status s = d->Init(path, options);
  if (!s.ok()) return s;
  return d;
}

CudaDecoder::~CudaDecoder() {
  if (graph_exec_) cudaGraphExecDestroy(graph_exec_);
  if (graph_) cudaGraphDestroy(graph_);
  if (gen_graph_exec_) cudaGraphExecDestroy(gen_graph_exec_);
  if (gen_graph_) cudaGraphDestroy(gen_graph_);
  for (cudaEvent_t e : token_ready_) {
    if (e) cudaEventDestroy(e);
  }
  if (h_tokens_) cudaFreeHost(h_tokens_);
  kernels::FreeMatVecScratch(&scratch_);
  for (void* p : allocations_) cudaFree(p);
  if (stream_) cudaStreamDestroy(stream_);
}

absl::Status CudaDecoder::Init(const std::string& path, const CudaDecoderOptions& options) {
  auto index = formats::ModelFile::OpenIndex(path);
  if (!index.ok()) return index.status();
  index_ = *index;
  if (index_->container() != "dpl") {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": the CUDA runtime loads .dpl files only; convert it first with "
              "`dpl-convert MODEL.gguf MODEL.dpl`"));
  }
  auto hp = reference::ReadHparams(*index_);
  if (!hp.ok()) return hp.status();
  hp_ = *hp;
  n_ctx_ = options.n_ctx > 0 ? options.n_ctx : (hp_.n_ctx_train > 0 ? hp_.n_ctx_train : 4096);
  max_batch_ = std::max(1, options.max_batch);
  eager_ = options.eager || EnvEager();
  auto weights = DeviceWeights::Load(path, options.load);
  if (!weights.ok()) return weights.status();
  weights_ = std::move(*weights);
  report_.weight_bytes = weights_->device_bytes();
  report_.load = weights_->stats();
  DPL_RETURN_IF_ERROR(BindWeights());
  DPL_RETURN_IF_ERROR(Allocate(options));
  if (!eager_) DPL_RETURN_IF_ERROR(CaptureStepGraph());
  return absl::OkStatus();
}

absl::Status CudaDecoder::BindWeights() {
  const uint8_t* base = weights_->device_base();
  auto matrix = [&](const std::string& name, int64_t n_cols, int64_t n_rows,
                    kernels::WeightMatrix* w, kernels::MatVecKernel* k) -> absl::Status {
    auto t = index_->Require(name);
    if (!t.ok()) return t.status();
    const formats::TensorView& v = **t;
    if (static_cast<int64_t>(v.ne[0]) != n_cols || static_cast<int64_t>(v.n_rows) != n_rows) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "tensor '%s' has shape [%d, %d], expected [%d, %d]", name, v.ne[0], v.n_rows, n_cols, n_rows));
    }
    w->data = base + v.data_offset;
    w->type = v.type;
    w->layout = v.layout;
    w->n_rows = n_rows;
    w->n_cols = n_cols;
    w->row_stride = static_cast<int64_t>(v.row_stride);
    absl::Status s = kernels::PlanMatVec(*w, k);
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat("tensor '", name, "': ", s.message()));
    bytes_per_token_ += v.n_bytes;
    return absl::OkStatus();
  };
  auto vec = [&](const std::string& name, int64_t n, bool optional,
                 const float** out) -> absl::Status {
    const formats::TensorView* t = index_->Find(name);
    if (t == nullptr) {
      if (optional) return absl::OkStatus();
      return absl::NotFoundError(absl::StrCat("tensor '", name, "' is missing"));
    }
    if (t->type != formats::GgmlType::kF32 || static_cast<int64_t>(t->ne[0] * t->n_rows) != n) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", name, "' must be f32 with ", n, " elements"));
    }
    *out = reinterpret_cast<const float*>(base + t->data_offset);
    bytes_per_token_ += t->n_bytes;
    return absl::OkStatus();
  };

  const int64_t E = hp_.n_embd, F = hp_.n_ff, Q = hp_.q_dim(), KV = hp_.kv_dim();
  auto embd = index_->Require("token_embd.weight");
  if (!embd.ok()) return embd.status();
  embed_.type = (*embd)->type;
  embed_.layout = (*embd)->layout;
  embed_.data = base + (*embd)->data_offset;
  embed_.row_stride = (*embd)->row_stride;
  embed_.n_rows = static_cast<int64_t>((*embd)->n_rows);
  embed_.n_cols = static_cast<int64_t>((*embd)->ne[0]);
  if (embed_.n_cols != E) return absl::InvalidArgumentError("token_embd.weight width != n_embd");

  layers_.resize(hp_.n_layer);
  for (int64_t l = 0; l < hp_.n_layer; ++l) {
    Layer& L = layers_[l];
    const std::string p = absl::StrCat("blk.", l, ".");
    DPL_RETURN_IF_ERROR(vec(p + "attn_norm.weight", E, false, &L.attn_norm));
    DPL_RETURN_IF_ERROR(vec(p + "ffn_norm.weight", E, false, &L.ffn_norm));
    DPL_RETURN_IF_ERROR(matrix(p + "attn_q.weight", E, Q, &L.wq, &L.kq));
    DPL_RETURN_IF_ERROR(matrix(p + "attn_k.weight", E, KV, &L.wk, &L.kk));
    DPL_RETURN_IF_ERROR(matrix(p + "attn_v.weight", E, KV, &L.wv, &L.kv));
    DPL_RETURN_IF_ERROR(matrix(p + "attn_output.weight", Q, E, &L.wo, &L.ko));
    DPL_RETURN_IF_ERROR(matrix(p + "ffn_gate.weight", E, F, &L.wgate, &L.kgate));
    DPL_RETURN_IF_ERROR(matrix(p + "ffn_up.weight", E, F, &L.wup, &L.kup));
    DPL_RETURN_IF_ERROR(matrix(p + "ffn_down.weight", F, E, &L.wdown, &L.kdown));
    DPL_RETURN_IF_ERROR(vec(p + "attn_q.bias", Q, true, &L.bq));
    DPL_RETURN_IF_ERROR(vec(p + "attn_k.bias", KV, true, &L.bk));
    DPL_RETURN_IF_ERROR(vec(p + "attn_v.bias", KV, true, &L.bv));
    DPL_RETURN_IF_ERROR(vec(p + "attn_output.bias", E, true, &L.bo));
  }
  DPL_RETURN_IF_ERROR(vec("output_norm.weight", E, false, &output_norm_));
  // Untied models have output.weight; tied ones reuse the embedding table.
  const std::string head = index_->Find("output.weight") ? "output.weight" : "token_embd.weight";
  DPL_RETURN_IF_ERROR(matrix(head, E, hp_.n_vocab, &w_out_, &k_out_));
  return absl::OkStatus();
}

absl::Status CudaDecoder::Allocate(const CudaDecoderOptions& options) {
  const int64_t T = max_batch_, E = hp_.n_embd, F = hp_.n_ff, Q = hp_.q_dim(), KV = hp_.kv_dim();
  if (hp_.n_ctx_train > 0 && n_ctx_ > (int64_t{1} << 30)) return absl::InvalidArgumentError("-c too large");
  auto kv = kernels::MakeKvCacheLayout(static_cast<int>(hp_.n_layer), static_cast<int>(hp_.n_head_kv),
                                       static_cast<int>(n_ctx_), static_cast<int>(hp_.head_dim));
  if (!kv.ok()) return kv.status();
  kv_layout_ = *kv;
  int sms = 0;
  DPL_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  auto plan = kernels::PlanDecodeAttention(static_cast<int>(hp_.n_head), static_cast<int>(hp_.n_head_kv),
                                           static_cast<int>(hp_.head_dim), static_cast<int>(n_ctx_), sms);
  if (!plan.ok()) return plan.status();
  attn_plan_ = *plan;
  rope_style_ = hp_.rope_style == reference::RopeStyle::kNeox ? kernels::RopeStyle::kNeox
                                                              : kernels::RopeStyle::kAdjacent;
  rope_shape_.n_head = static_cast<int>(hp_.n_head);
  rope_shape_.n_head_kv = static_cast<int>(hp_.n_head_kv);
  rope_shape_.head_dim = static_cast<int>(hp_.head_dim);
  rope_shape_.n_rot = static_cast<int>(hp_.n_rot);
  rope_shape_.n_ctx = static_cast<int>(n_ctx_);

  // Everything this decoder allocates, checked against free memory first.
  const uint64_t floats = static_cast<uint64_t>(T) * (2 * E + 2 * Q + 2 * KV + 2 * F + hp_.n_vocab) +
                          attn_plan_.workspace_floats;
  const uint64_t scratch_bytes = floats * 4 + T * 8 + hp_.n_rot * 8 +
                                 static_cast<uint64_t>(T) * std::max({E, F, Q}) * 2;
  report_.kv_cache_bytes = kv_layout_.TotalBytes();
  report_.scratch_bytes = scratch_bytes;
  auto mem = DeviceMemoryInfo();
  if (!mem.ok()) return mem.status();
  if (report_.kv_cache_bytes + scratch_bytes > mem->first) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "not enough device memory: KV cache %.2f GiB (-c %d) + buffers %.2f GiB needed, %.2f GiB free",
        report_.kv_cache_bytes / 1073741824.0, n_ctx_, scratch_bytes / 1073741824.0,
        mem->first / 1073741824.0));
  }
  DPL_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  auto alloc = [&](uint64_t bytes, auto** ptr) -> absl::Status {
    void* p = nullptr;
    DPL_CUDA_CHECK(cudaMalloc(&p, std::max<uint64_t>(bytes, 16)));
    allocations_.push_back(p);
    *ptr = static_cast<std::remove_reference_t<decltype(*ptr)>>(p);
    return absl::OkStatus();
  };
  DPL_RETURN_IF_ERROR(alloc(T * sizeof(int), &d_tokens_));
  DPL_RETURN_IF_ERROR(alloc(T * sizeof(int), &d_positions_));
  DPL_RETURN_IF_ERROR(alloc(hp_.n_rot / 2 * sizeof(double), &d_inv_freq_));
  DPL_RETURN_IF_ERROR(alloc(T * E * 4, &d_x_));
  DPL_RETURN_IF_ERROR(alloc(T * E * 4, &d_h_));
  DPL_RETURN_IF_ERROR(alloc(T * Q * 4, &d_q_));
  DPL_RETURN_IF_ERROR(alloc(T * KV * 4, &d_k_));
  DPL_RETURN_IF_ERROR(alloc(T * KV * 4, &d_v_));
  DPL_RETURN_IF_ERROR(alloc(T * Q * 4, &d_att_));
  DPL_RETURN_IF_ERROR(alloc(T * F * 4, &d_gate_));
  DPL_RETURN_IF_ERROR(alloc(T * F * 4, &d_up_));
  DPL_RETURN_IF_ERROR(alloc(static_cast<uint64_t>(T) * hp_.n_vocab * 4, &d_logits_));
  DPL_RETURN_IF_ERROR(alloc(attn_plan_.workspace_floats * 4, &d_attn_ws_));
  DPL_RETURN_IF_ERROR(alloc(kv_layout_.TotalBytes(), &d_kv_));
  DPL_RETURN_IF_ERROR(kernels::AllocateMatVecScratch(std::max({E, F, Q}), T, &scratch_));
  DPL_RETURN_IF_ERROR(alloc(sizeof(kernels::SamplerState), &d_sampler_state_));
  DPL_CUDA_CHECK(cudaMemset(d_sampler_state_, 0, sizeof(kernels::SamplerState)));
  void* ws = nullptr;
  DPL_RETURN_IF_ERROR(alloc(kernels::SamplingWorkspaceBytes(), &ws));
  d_sampling_ws_ = ws;
  DPL_CUDA_CHECK(cudaHostAlloc(&h_tokens_, 2 * sizeof(int), cudaHostAllocDefault));
  for (cudaEvent_t& e : token_ready_) {
    DPL_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }

  // RoPE frequencies (float64), with llama 3's per-frequency factors if present.
  auto inv = kernels::RopeInvFreq(hp_.rope_freq_base, static_cast<int>(hp_.n_rot), hp_.rope_freq_scale);
  if (!inv.ok()) return inv.status();
  if (const formats::TensorView* f = index_->Find("rope_freqs.weight"); f != nullptr) {
    std::vector<float> factors(inv->size());
    if (f->type != formats::GgmlType::kF32 || f->ne[0] != factors.size()) {
      return absl::InvalidArgumentError("rope_freqs.weight must be f32 with n_rot/2 elements");
    }
    DPL_CUDA_CHECK(cudaMemcpy(factors.data(), weights_->device_base() + f->data_offset,
                              factors.size() * 4, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < factors.size(); ++i) (*inv)[i] /= factors[i];
  }
  DPL_CUDA_CHECK(cudaMemcpy(d_inv_freq_, inv->data(), inv->size() * 8, cudaMemcpyHostToDevice));
  return absl::OkStatus();
}

absl::Status CudaDecoder::EnqueueForward(int n, bool all_logits) {
  using kernels::MatVecIo;
  const int E = static_cast<int>(hp_.n_embd), F = static_cast<int>(hp_.n_ff);
  const int Q = static_cast<int>(hp_.q_dim()), KV = static_cast<int>(hp_.kv_dim());
  const float eps = static_cast<float>(hp_.rms_eps);
  cudaStream_t s = stream_;
  // y = W x for the n tokens in x, reading the int8 copy in scratch_.
  auto mm = [&](const kernels::WeightMatrix& w, kernels::MatVecKernel k, const float* x, float* y,
                const float* bias, const float* residual, int rows) {
    MatVecIo io;
    io.x = x;
    io.qx = &scratch_;
    io.n_tokens = rows;
    io.y = y;
    io.bias = bias;
    io.residual = residual;
    return kernels::RunMatVec(w, k, io, s);
  };

  for (int t = 0; t < n; ++t) {
    DPL_RETURN_IF_ERROR(kernels::EmbedRow(embed_, d_tokens_ + t, d_x_ + t * E, s));
  }
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Layer& L = layers_[l];
    uint16_t* k_cache = d_kv_ + kv_layout_.KOffset(static_cast<int>(l));
    uint16_t* v_cache = d_kv_ + kv_layout_.VOffset(static_cast<int>(l));
    // Attention block.
    DPL_RETURN_IF_ERROR(kernels::RmsNorm(d_x_, L.attn_norm, d_h_, n, E, eps, s));
    DPL_RETURN_IF_ERROR(kernels::QuantizeActivations(d_h_, E, n, &scratch_, s));
    DPL_RETURN_IF_ERROR(mm(L.wq, L.kq, d_h_, d_q_, L.bq, nullptr, n));
    DPL_RETURN_IF_ERROR(mm(L.wk, L.kk, d_h_, d_k_, L.bk, nullptr, n));
    DPL_RETURN_IF_ERROR(mm(L.wv, L.kv, d_h_, d_v_, L.bv, nullptr, n));
    for (int t = 0; t < n; ++t) {
      DPL_RETURN_IF_ERROR(kernels::RopeWriteKv(rope_shape_, rope_style_, d_positions_ + t,
                                               d_inv_freq_, d_q_ + t * Q, d_k_ + t * KV,
                                               d_v_ + t * KV, k_cache, v_cache, s));
    }
    for (int t = 0; t < n; ++t) {
      DPL_RETURN_IF_ERROR(kernels::DecodeAttention(attn_plan_, d_q_ + t * Q, k_cache, v_cache,
                                                   d_positions_ + t, d_attn_ws_, d_att_ + t * Q, s));
    }
    DPL_RETURN_IF_ERROR(kernels::QuantizeActivations(d_att_, Q, n, &scratch_, s));
    DPL_RETURN_IF_ERROR(mm(L.wo, L.ko, d_att_, d_x_, L.bo, d_x_, n));  // x += Wo a
    // Feed-forward block.
    DPL_RETURN_IF_ERROR(kernels::RmsNorm(d_x_, L.ffn_norm, d_h_, n, E, eps, s));
    DPL_RETURN_IF_ERROR(kernels::QuantizeActivations(d_h_, E, n, &scratch_, s));
    DPL_RETURN_IF_ERROR(mm(L.wgate, L.kgate, d_h_, d_gate_, nullptr, nullptr, n));
    DPL_RETURN_IF_ERROR(mm(L.wup, L.kup, d_h_, d_up_, nullptr, nullptr, n));
    DPL_RETURN_IF_ERROR(kernels::SwiGlu(d_gate_, d_up_, d_gate_, static_cast<int64_t>(n) * F, s));
    DPL_RETURN_IF_ERROR(kernels::QuantizeActivations(d_gate_, F, n, &scratch_, s));
    DPL_RETURN_IF_ERROR(mm(L.wdown, L.kdown, d_gate_, d_x_, nullptr, d_x_, n));  // x += Wdown g
  }
  // LM head: every token's logits, or the last token's only.
  const int first = all_logits ? 0 : n - 1;
  const int rows = n - first;
  DPL_RETURN_IF_ERROR(kernels::RmsNorm(d_x_ + first * E, output_norm_, d_h_, rows, E, eps, s));
  DPL_RETURN_IF_ERROR(kernels::QuantizeActivations(d_h_, E, rows, &scratch_, s));
  return mm(w_out_, k_out_, d_h_, d_logits_, nullptr, nullptr, rows);
}

// The single-token step, captured once. Its inputs (d_tokens_[0],
// d_positions_[0]) are device memory the host or a sampler writes before each
// replay, so the same graph serves every position.
absl::Status CudaDecoder::CaptureStepGraph() {
  DPL_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  absl::Status s = EnqueueForward(1, false);
  // The graph moves its own position on, so back-to-back replays decode
  // consecutive positions (dpl-bench); Eval writes the position anyway.
  if (s.ok()) s = kernels::AdvancePosition(d_positions_, stream_);
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(stream_, &graph);
  if (!s.ok()) {
    if (graph) cudaGraphDestroy(graph);
    return s;
  }
  DPL_CUDA_CHECK(end);
  graph_ = graph;
  DPL_CUDA_CHECK(cudaGraphInstantiate(&graph_exec_, graph_, 0));
  return absl::OkStatus();
}

absl::Status CudaDecoder::RunChunk(absl::Span<const int32_t> tokens, bool all_logits) {
  const int n = static_cast<int>(tokens.size());
  std::vector<int> positions(n);
  for (int t = 0; t < n; ++t) positions[t] = static_cast<int>(n_past_ + t);
  DPL_CUDA_CHECK(cudaMemcpyAsync(d_tokens_, tokens.data(), n * sizeof(int), cudaMemcpyHostToDevice, stream_));
  DPL_CUDA_CHECK(cudaMemcpyAsync(d_positions_, positions.data(), n * sizeof(int),
                                 cudaMemcpyHostToDevice, stream_));
  if (n == 1 && !all_logits && graph_exec_ != nullptr) {
    DPL_CUDA_CHECK(cudaGraphLaunch(graph_exec_, stream_));
  } else {
    DPL_RETURN_IF_ERROR(EnqueueForward(n, all_logits));
  }
  // The host vectors above must outlive the async copies.
  DPL_CUDA_CHECK(cudaStreamSynchronize(stream_));
  n_past_ += n;
  return absl::OkStatus();
}

absl::Status CudaDecoder::Eval(absl::Span<const int32_t> tokens, std::vector<float>* last,
                               std::vector<float>* all) {
  if (tokens.empty()) return absl::InvalidArgumentError("no tokens to evaluate");
  if (n_past_ + static_cast<int64_t>(tokens.size()) > n_ctx_) {
    return absl::OutOfRangeError(absl::StrCat(n_past_ + tokens.size(), " tokens do not fit in the context of ",
                                              n_ctx_, " (use -c to enlarge it)"));
  }
  for (int32_t t : tokens) {
    if (t < 0 || t >= hp_.n_vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat("token id ", t, " is outside the vocabulary [0, ", hp_.n_vocab, ")"));
    }
  }
  const int64_t V = hp_.n_vocab;
  if (all != nullptr) all->clear();
  for (size_t at = 0; at < tokens.size(); at += max_batch_) {
    const auto chunk = tokens.subspan(at, std::min<size_t>(max_batch_, tokens.size() - at));
    DPL_RETURN_IF_ERROR(RunChunk(chunk, all != nullptr));
    if (all != nullptr) {
      const size_t old = all->size();
      all->resize(old + chunk.size() * V);
      DPL_CUDA_CHECK(cudaMemcpy(all->data() + old, d_logits_, chunk.size() * V * 4, cudaMemcpyDeviceToHost));
    }
  }
  if (last != nullptr) {
    last->resize(V);
    if (all != nullptr) {
      std::copy(all->end() - V, all->end(), last->begin());
    } else {
      DPL_CUDA_CHECK(cudaMemcpy(last->data(), d_logits_, V * 4, cudaMemcpyDeviceToHost));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<double> CudaDecoder::TimeDecodeSteps(int n) {
  if (graph_exec_ == nullptr) return absl::FailedPreconditionError("no captured graph (eager mode)");
  if (n_past_ + n > n_ctx_) return absl::OutOfRangeError("decode steps past the context");
  const int pos = static_cast<int>(n_past_);
  DPL_CUDA_CHECK(cudaMemcpyAsync(d_positions_, &pos, sizeof(int), cudaMemcpyHostToDevice, stream_));
  cudaEvent_t start, stop;
  DPL_CUDA_CHECK(cudaEventCreate(&start));
  DPL_CUDA_CHECK(cudaEventCreate(&stop));
  DPL_CUDA_CHECK(cudaEventRecord(start, stream_));
  for (int i = 0; i < n; ++i) DPL_CUDA_CHECK(cudaGraphLaunch(graph_exec_, stream_));
  DPL_CUDA_CHECK(cudaEventRecord(stop, stream_));
  DPL_CUDA_CHECK(cudaEventSynchronize(stop));
  float ms = 0;
  DPL_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
  DPL_CUDA_CHECK(cudaEventDestroy(start));
  DPL_CUDA_CHECK(cudaEventDestroy(stop));
  n_past_ += n;
  return ms / 1e3;
}

absl::Status CudaDecoder::PrepareGenerationGraph(const kernels::SamplingParams& p) {
  const bool same = gen_params_valid_ && p.temperature == gen_params_.temperature &&
                    p.top_k == gen_params_.top_k && p.top_p == gen_params_.top_p &&
                    p.min_p == gen_params_.min_p && p.repeat_penalty == gen_params_.repeat_penalty &&
                    p.repeat_last_n == gen_params_.repeat_last_n && p.seed == gen_params_.seed;
  if (same) return absl::OkStatus();
  if (p.repeat_last_n > ring_capacity_) {
    void* ring = nullptr;
    DPL_CUDA_CHECK(cudaMalloc(&ring, p.repeat_last_n * sizeof(int)));
    allocations_.push_back(ring);
    d_ring_ = static_cast<int*>(ring);
    ring_capacity_ = p.repeat_last_n;
  }
  if (gen_graph_exec_) cudaGraphExecDestroy(gen_graph_exec_);
  if (gen_graph_) cudaGraphDestroy(gen_graph_);
  gen_graph_exec_ = nullptr;
  gen_graph_ = nullptr;
  gen_params_valid_ = false;
  if (!eager_) {
    DPL_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    absl::Status st = EnqueueForward(1, false);
    if (st.ok()) {
      st = kernels::SampleToken(p, d_logits_, static_cast<int>(hp_.n_vocab), d_ring_, d_sampler_state_,
                                d_sampling_ws_, d_tokens_, stream_);
    }
    if (st.ok()) st = kernels::AdvancePosition(d_positions_, stream_);
    cudaGraph_t graph = nullptr;
    const cudaError_t end = cudaStreamEndCapture(stream_, &graph);
    if (!st.ok()) {
      if (graph) cudaGraphDestroy(graph);
      return st;
    }
    DPL_CUDA_CHECK(end);
    gen_graph_ = graph;
    DPL_CUDA_CHECK(cudaGraphInstantiate(&gen_graph_exec_, gen_graph_, 0));
  }
  gen_params_ = p;
  gen_params_valid_ = true;
  return absl::OkStatus();
}

absl::Status CudaDecoder::SampleLoop(const generate::SamplerParams& params,
                                     absl::Span<const int32_t> history, int32_t max_tokens,
                                     const std::function<bool(int32_t)>& on_token) {
  if (n_past_ == 0) return absl::FailedPreconditionError("SampleLoop needs a prompt first");
  kernels::SamplingParams p;
  p.temperature = params.temperature;
  p.top_k = params.top_k;
  p.top_p = params.top_p;
  p.min_p = params.min_p;
  p.repeat_penalty = params.repeat_penalty;
  p.repeat_last_n = params.repeat_penalty != 1.0f ? std::max(0, params.repeat_last_n) : 0;
  p.seed = params.seed;
  DPL_RETURN_IF_ERROR(PrepareGenerationGraph(p));
  // The penalty ring from the history; the RNG counter carries on.
  if (p.repeat_last_n > 0) {
    const kernels::RecentRing ring = kernels::MakeRecentRing(history, p.repeat_last_n);
    DPL_CUDA_CHECK(cudaMemcpyAsync(d_ring_, ring.tokens.data(), ring.tokens.size() * sizeof(int),
                                   cudaMemcpyHostToDevice, stream_));
    const int32_t head_count[2] = {ring.head, ring.count};
    DPL_CUDA_CHECK(cudaMemcpyAsync(&d_sampler_state_->ring_head, head_count, sizeof(head_count),
                                   cudaMemcpyHostToDevice, stream_));
  }
  const int pos = static_cast<int>(n_past_);
  DPL_CUDA_CHECK(cudaMemcpyAsync(d_positions_, &pos, sizeof(int), cudaMemcpyHostToDevice, stream_));
  // The first token comes from the prompt's logits, still in d_logits_.
  DPL_RETURN_IF_ERROR(kernels::SampleToken(p, d_logits_, static_cast<int>(hp_.n_vocab), d_ring_,
                                           d_sampler_state_, d_sampling_ws_, d_tokens_, stream_));
  DPL_CUDA_CHECK(cudaMemcpyAsync(&h_tokens_[0], d_tokens_, sizeof(int), cudaMemcpyDeviceToHost, stream_));
  DPL_CUDA_CHECK(cudaEventRecord(token_ready_[0], stream_));
  // Pipeline: the GPU runs step i (feeding token i, sampling token i + 1)
  // while the host waits for token i and streams it: one wait per token.
  for (int32_t i = 0; max_tokens < 0 || i < max_tokens; ++i) {
    const bool more = (max_tokens < 0 || i + 1 < max_tokens) && n_past_ < n_ctx_;
    if (more) {
      if (gen_graph_exec_ != nullptr) {
        DPL_CUDA_CHECK(cudaGraphLaunch(gen_graph_exec_, stream_));
      } else {  // eager (DPL_EAGER): the same kernels, launched one by one
        DPL_RETURN_IF_ERROR(EnqueueForward(1, false));
        DPL_RETURN_IF_ERROR(kernels::SampleToken(p, d_logits_, static_cast<int>(hp_.n_vocab), d_ring_,
                                                 d_sampler_state_, d_sampling_ws_, d_tokens_, stream_));
        DPL_RETURN_IF_ERROR(kernels::AdvancePosition(d_positions_, stream_));
      }
      const int slot = (i + 1) & 1;
      DPL_CUDA_CHECK(cudaMemcpyAsync(&h_tokens_[slot], d_tokens_, sizeof(int), cudaMemcpyDeviceToHost, stream_));
      DPL_CUDA_CHECK(cudaEventRecord(token_ready_[slot], stream_));
    }
    DPL_CUDA_CHECK(cudaEventSynchronize(token_ready_[i & 1]));
    const int32_t token = h_tokens_[i & 1];
    if (!on_token(token)) {
      DPL_CUDA_CHECK(cudaStreamSynchronize(stream_));  // the step already queued finishes
      if (more) ++n_past_;  // its KV row holds the refused token; callers rewind past it
      return absl::OkStatus();
    }
    if (!more) {
      DPL_CUDA_CHECK(cudaStreamSynchronize(stream_));
      return absl::OkStatus();
    }
    ++n_past_;  // token i is now in the cache (step i ran)
  }
  DPL_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

std::string CudaDecoder::LoadReport() const {
  return absl::StrFormat(
      "cuda: weights %.2f GiB loaded in %.2f s (%.1f GB/s); KV cache %.2f GiB (f16, %d positions); "
      "buffers %.2f GiB (prompt batch %d); decode step %s",
      report_.weight_bytes / 1073741824.0, report_.load.seconds, report_.load.gb_per_s(),
      report_.kv_cache_bytes / 1073741824.0, n_ctx_, report_.scratch_bytes / 1073741824.0,
      max_batch_, eager_ ? "eager (DPL_EAGER)" : "captured as one CUDA graph");
}

absl::Status CudaDecoder::Rewind(int64_t n) {
  if (n < 0 || n > n_past_) return absl::InvalidArgumentError(absl::StrCat("cannot rewind to ", n));
  n_past_ = n;  // later positions are overwritten before attention reads them
  return absl::OkStatus();
}

}  // namespace dpl::runtime
