#include "runtime/cuda/cuda_decoder.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "kernels/cuda_check.h"
#include "kernels/device_tuning.h"
#include "kernels/sampling/sampling_util.h"
#include "kernels/step/step.h"

namespace dpl::runtime {

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
  DPL_RETURN_IF_ERROR(d->Init(path, options));
  return d;
}

absl::Status CudaDecoder::Init(const std::string& path, const CudaDecoderOptions& options) {
  // Seconds since the previous lap: the stages of CudaMemoryReport.
  auto mark = std::chrono::steady_clock::now();
  auto lap = [&mark] {
    const auto now = std::chrono::steady_clock::now();
    const double sec = std::chrono::duration<double>(now - mark).count();
    mark = now;
    return sec;
  };
  if (options.index != nullptr) {
    index_ = options.index;
  } else {
    DPL_ASSIGN_OR_RETURN(index_, formats::ModelFile::OpenIndex(path));
  }
  if (index_->container() != formats::Container::kDpl) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": the CUDA runtime loads .dpl files only; convert it first with "
              "`dpl-convert MODEL.gguf MODEL.dpl`"));
  }
  DPL_ASSIGN_OR_RETURN(const model::ModelDesc desc, model::BindModel(*index_));
  hp_ = desc.hp;
  bytes_per_token_ = desc.bytes_per_token;
  if (options.n_ctx < 0 || options.n_ctx > kMaxContext) {
    return absl::InvalidArgumentError(
        absl::StrCat("context size ", options.n_ctx, " is out of range [0, ", kMaxContext, "]"));
  }
  n_ctx_ = options.n_ctx > 0 ? options.n_ctx : (hp_.n_ctx_train > 0 ? hp_.n_ctx_train : 4096);
  n_ctx_ = std::min(n_ctx_, kMaxContext);
  max_batch_ = std::max(1, options.max_batch);
  eager_ = options.eager;
  if (options.tuning.has_value()) {
    tuning_ = *options.tuning;
  } else {
    DPL_ASSIGN_OR_RETURN(tuning_, kernels::DecodeTuningForDevice());
  }
  report_.init_seconds = lap();
  DPL_ASSIGN_OR_RETURN(weights_, DeviceWeights::Load(*index_, options.load));
  report_.weight_bytes = weights_->device_bytes();
  report_.load = weights_->stats();
  report_.weights_seconds = lap();
  DPL_RETURN_IF_ERROR(BindWeights(desc));
  DPL_RETURN_IF_ERROR(Allocate());
  DPL_RETURN_IF_ERROR(InitRope(desc));
  if (w_f16_elems_ > 0) {
    DPL_ASSIGN_OR_RETURN(gemm_, kernels::PromptGemm::Create(stream_.get()));
  }
  report_.setup_seconds = lap();
  if (!eager_) {
    DPL_ASSIGN_OR_RETURN(step_graph_, kernels::CaptureGraph(stream_.get(), [&] {
                           return EnqueueStep(nullptr);
                         }));
  }
  report_.graph_seconds = lap();
  return absl::OkStatus();
}

// Device views of the bound tensors (model::BindModel checked names, shapes
// and vector types); each matrix gets its kernel and geometry here, once.
absl::Status CudaDecoder::BindWeights(const model::ModelDesc& desc) {
  const uint8_t* base = weights_->device_base();
  auto view = [&](const formats::TensorView& t) {
    kernels::WeightMatrix w;
    w.data = base + t.data_offset;
    w.type = t.type;
    w.layout = t.layout;
    w.n_rows = static_cast<int64_t>(t.n_rows);
    w.n_cols = static_cast<int64_t>(t.ne[0]);
    w.row_stride = static_cast<int64_t>(t.row_stride);
    return w;
  };
  auto matrix = [&](const formats::TensorView* t, Matrix* m) -> absl::Status {
    m->w = view(*t);
    DPL_ASSIGN_OR_RETURN(m->plan, kernels::PlanMatVec(m->w, tuning_));
    return absl::OkStatus();
  };
  auto vec = [&](const formats::TensorView* t) {
    return t == nullptr ? nullptr : reinterpret_cast<const float*>(base + t->data_offset);
  };
  embed_ = view(*desc.token_embd);
  layers_.resize(desc.layers.size());
  for (size_t l = 0; l < layers_.size(); ++l) {
    const model::LayerTensors& t = desc.layers[l];
    Layer& L = layers_[l];
    for (auto [src, dst] : {std::pair{t.wq, &L.wq}, {t.wk, &L.wk}, {t.wv, &L.wv}, {t.wo, &L.wo},
                            {t.w_gate, &L.w_gate}, {t.w_up, &L.w_up}, {t.w_down, &L.w_down}}) {
      DPL_RETURN_IF_ERROR(Annotate(matrix(src, dst), absl::StrCat("tensor '", src->name, "'")));
    }
    L.attn_norm = vec(t.attn_norm);
    L.ffn_norm = vec(t.ffn_norm);
    L.bq = vec(t.bq);
    L.bk = vec(t.bk);
    L.bv = vec(t.bv);
    L.bo = vec(t.bo);
    L.head_norms = {vec(t.q_norm), vec(t.k_norm), static_cast<float>(hp_.rms_eps)};
    DPL_ASSIGN_OR_RETURN(L.qkv, kernels::PlanMatVecGroups({L.wq.w, L.wk.w, L.wv.w}, tuning_));
    DPL_ASSIGN_OR_RETURN(L.gate_up, kernels::PlanMatVecGroups({L.w_gate.w, L.w_up.w}, tuning_));
  }
  output_norm_ = vec(desc.output_norm);
  return Annotate(matrix(desc.output, &out_), absl::StrCat("tensor '", desc.output->name, "'"));
}

// Every buffer of a pass, sized from one table and carved from one
// allocation (256-byte aligned slices), after a check against free memory.
absl::Status CudaDecoder::Allocate() {
  const uint64_t T = max_batch_, E = hp_.n_embd, F = hp_.n_ff, Q = hp_.q_dim(),
                 KV = hp_.kv_dim(), V = hp_.n_vocab;
  logit_rows_ = std::min(max_batch_, kMaxLogitRows);
  const uint64_t W = std::max({E, F, Q});  // widest matvec input
  DPL_ASSIGN_OR_RETURN(kv_layout_, kernels::MakeKvCacheLayout(
                                       static_cast<int>(hp_.n_layer), static_cast<int>(hp_.n_head_kv),
                                       static_cast<int>(n_ctx_), static_cast<int>(hp_.head_dim)));
  DPL_ASSIGN_OR_RETURN(attn_plan_, kernels::PlanDecodeAttention(
                                       static_cast<int>(hp_.n_head), static_cast<int>(hp_.n_head_kv),
                                       static_cast<int>(hp_.head_dim), static_cast<int>(n_ctx_),
                                       static_cast<int>(hp_.sliding_window), tuning_));
  rope_shape_ = {static_cast<int>(hp_.n_head), static_cast<int>(hp_.n_head_kv),
                 static_cast<int>(hp_.head_dim), static_cast<int>(hp_.n_rot),
                 static_cast<int>(n_ctx_)};
  prompt_attn_ = {static_cast<int>(hp_.n_head), static_cast<int>(hp_.n_head_kv),
                  static_cast<int>(hp_.head_dim), static_cast<int>(n_ctx_),
                  static_cast<int>(hp_.sliding_window)};
  // The tensor-core path's f16 scratch: activations of a chunk, and the
  // largest layer matrix (the lm head, larger, goes through it in row blocks).
  w_f16_elems_ = 0;
  if (max_batch_ >= tuning_.gemm_min_tokens) {
    for (const Layer& L : layers_) {
      for (const Matrix* m : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down}) {
        w_f16_elems_ = std::max(w_f16_elems_, m->w.n_rows * m->w.n_cols);
      }
    }
  }
  const uint64_t x_f16_bytes = w_f16_elems_ > 0 ? T * W * 2 : 0;
  // The dp4a matvec's int8 activations: only for products below the
  // tensor-core threshold when that path exists.
  const uint64_t qx_tokens =
      w_f16_elems_ > 0 ? std::min<uint64_t>(T, std::max(1, tuning_.gemm_min_tokens - 1)) : T;
  DPL_ASSIGN_OR_RETURN(const uint64_t qx_bytes, kernels::MatVecScratchBytes(W, qx_tokens));
  Buffers& b = buf_;
  void* qx_mem = nullptr;  // int8 activations, laid out by MatVecScratchIn
  const struct {
    uint64_t bytes;
    void* slot;  // address of the Buffers pointer to set
  } table[] = {
      {T * 4, &b.tokens},          {T * 4, &b.positions},      {hp_.n_rot / 2 * 8, &b.inv_freq},
      {T * E * 4, &b.x},           {T * E * 4, &b.h},          {T * Q * 4, &b.q},
      {T * KV * 4, &b.k},          {T * KV * 4, &b.v},         {T * Q * 4, &b.att},
      {T * F * 4, &b.gate},        {T * F * 4, &b.up},         {static_cast<uint64_t>(logit_rows_) * V * 4, &b.logits},
      {attn_plan_.workspace_floats * 4, &b.attn_ws},           {kv_layout_.TotalBytes(), &b.kv},
      {sizeof(kernels::SamplerState), &b.sampler},             {kernels::SamplingWorkspaceBytes(), &b.sampling_ws},
      {qx_bytes, &qx_mem},
      {x_f16_bytes, &b.x_f16},     {static_cast<uint64_t>(w_f16_elems_) * 2, &b.w_f16},
  };
  auto align = [](uint64_t n) { return (n + 255) / 256 * 256; };
  uint64_t total = 0;
  for (const auto& e : table) total += align(e.bytes);
  report_.kv_cache_bytes = kv_layout_.TotalBytes();
  report_.scratch_bytes = total - report_.kv_cache_bytes;
  DPL_ASSIGN_OR_RETURN(const auto mem, DeviceMemoryInfo());
  if (total > mem.first) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "not enough device memory: KV cache %.2f GiB (-c %d) + buffers %.2f GiB needed, %.2f GiB free",
        report_.kv_cache_bytes / 1073741824.0, n_ctx_, report_.scratch_bytes / 1073741824.0,
        mem.first / 1073741824.0));
  }
  DPL_ASSIGN_OR_RETURN(arena_, kernels::DeviceBuffer<uint8_t>::Allocate(total));
  uint8_t* at = arena_.get();
  for (const auto& e : table) {
    std::memcpy(e.slot, &at, sizeof(void*));  // every slot is a pointer (a member of b, or qx_mem)
    at += align(e.bytes);
  }
  b.qx = kernels::MatVecScratchIn(qx_mem, static_cast<int64_t>(W), static_cast<int64_t>(qx_tokens));
  DPL_CUDA_CHECK(cudaMemset(b.sampler, 0, sizeof(kernels::SamplerState)));
  DPL_ASSIGN_OR_RETURN(stream_, kernels::CreateStream());
  DPL_ASSIGN_OR_RETURN(h_tokens_, kernels::PinnedBuffer<int>::Allocate(2));
  for (kernels::Event& e : token_ready_) {
    DPL_ASSIGN_OR_RETURN(e, kernels::CreateEvent());
  }
  return absl::OkStatus();
}

// RoPE frequencies (float64), with llama 3's per-frequency factors if present.
absl::Status CudaDecoder::InitRope(const model::ModelDesc& desc) {
  DPL_ASSIGN_OR_RETURN(std::vector<double> inv,
                       kernels::RopeInvFreq(hp_.rope_freq_base, static_cast<int>(hp_.n_rot),
                                            hp_.rope_freq_scale));
  if (desc.rope_freqs != nullptr) {
    std::vector<float> factors(inv.size());
    DPL_CUDA_CHECK(cudaMemcpy(factors.data(), weights_->device_base() + desc.rope_freqs->data_offset,
                              factors.size() * 4, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < factors.size(); ++i) inv[i] /= factors[i];
  }
  DPL_CUDA_CHECK(cudaMemcpy(buf_.inv_freq, inv.data(), inv.size() * 8, cudaMemcpyHostToDevice));
  return absl::OkStatus();
}

absl::Status CudaDecoder::EnqueueForward(int n, int first_pos, bool all_logits) {
  const int E = static_cast<int>(hp_.n_embd), F = static_cast<int>(hp_.n_ff);
  const int Q = static_cast<int>(hp_.q_dim());
  const float eps = static_cast<float>(hp_.rms_eps);
  cudaStream_t s = stream_.get();
  Buffers& b = buf_;
  // Products over `rows` tokens run on tensor cores from gemm_min_tokens on
  // (activations in f16), else on the dp4a matvec (activations in int8),
  // whose kernels go out as programmatic dependent launches when the tuning
  // says so (the decode step's chain).
  auto tensor_cores = [&](int rows) {
    return gemm_.has_value() && rows >= tuning_.gemm_min_tokens;
  };
  const bool pdl = tuning_.pdl && !tensor_cores(n);
  // Prepares x (rows tokens of `cols` values) once for the products that
  // read it: f16 for tensor cores, int8 blocks for the dp4a matvec.
  auto prepare = [&](const float* x, int cols, int rows) {
    if (tensor_cores(rows)) {
      return kernels::ConvertToF16(x, static_cast<int64_t>(rows) * cols, b.x_f16, s);
    }
    return kernels::QuantizeActivations(x, cols, rows, &b.qx, s, pdl);
  };
  // h = rmsnorm(x) * w, prepared (fused into one launch on the dp4a path).
  auto norm_prepare = [&](const float* x, const float* w, int rows) -> absl::Status {
    if (!tensor_cores(rows)) {
      return kernels::NormQuantizeActivations(x, w, eps, E, rows, b.h, &b.qx, s, pdl);
    }
    DPL_RETURN_IF_ERROR(kernels::RmsNorm(x, w, b.h, rows, E, eps, s));
    return prepare(b.h, E, rows);
  };
  // y = W x (+ bias) (+ residual) for the rows tokens in x (prepared).
  auto mm = [&](const Matrix& m, const float* x, const kernels::MatVecOut& out, int rows) {
    if (tensor_cores(rows)) {
      return gemm_->Run(m.w, b.x_f16, rows, out.y, out.bias, out.residual, b.w_f16, w_f16_elems_);
    }
    kernels::MatVecIo io;
    io.x = x;
    io.qx = &b.qx;
    io.n_tokens = rows;
    io.y = out.y;
    io.bias = out.bias;
    io.residual = out.residual;
    return kernels::RunMatVec(m.w, m.plan, io, s);
  };
  // The products of matrices that read the same x (Q/K/V, gate/up): on the
  // dp4a path one launch per group of equal kernels (PlanMatVecGroups).
  auto mm_group = [&](const std::vector<kernels::MatVecGroupPlan>& groups, const Matrix* const* ms,
                      const kernels::MatVecOut* outs, const float* x) -> absl::Status {
    for (const kernels::MatVecGroupPlan& g : groups) {
      if (tensor_cores(n)) {
        for (int i : g.members) DPL_RETURN_IF_ERROR(mm(*ms[i], x, outs[i], n));
        continue;
      }
      const kernels::WeightMatrix* ws[kernels::kMaxMatVecParts];
      kernels::MatVecOut os[kernels::kMaxMatVecParts];
      for (size_t k = 0; k < g.members.size(); ++k) {
        ws[k] = &ms[g.members[k]]->w;
        os[k] = outs[g.members[k]];
      }
      kernels::MatVecIo io;
      io.x = x;
      io.qx = &b.qx;
      io.n_tokens = n;
      DPL_RETURN_IF_ERROR(kernels::RunMatVecGroup(absl::MakeConstSpan(ws, g.members.size()), g.plan,
                                                  absl::MakeConstSpan(os, g.members.size()), io, s));
    }
    return absl::OkStatus();
  };

  DPL_RETURN_IF_ERROR(kernels::EmbedRows(embed_, b.tokens, n, b.x, s));
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Layer& L = layers_[l];
    uint16_t* k_cache = b.kv + kv_layout_.KOffset(static_cast<int>(l));
    uint16_t* v_cache = b.kv + kv_layout_.VOffset(static_cast<int>(l));
    // Attention block.
    DPL_RETURN_IF_ERROR(norm_prepare(b.x, L.attn_norm, n));
    const Matrix* qkv[3] = {&L.wq, &L.wk, &L.wv};
    const kernels::MatVecOut qkv_out[3] = {{b.q, L.bq, nullptr}, {b.k, L.bk, nullptr}, {b.v, L.bv, nullptr}};
    DPL_RETURN_IF_ERROR(mm_group(L.qkv, qkv, qkv_out, b.h));
    DPL_RETURN_IF_ERROR(kernels::RopeWriteKv(rope_shape_, hp_.rope_style, b.positions, b.inv_freq,
                                             L.head_norms, b.q, b.k, b.v, k_cache, v_cache, n, s,
                                             pdl));
    if (n == 1) {  // flash-decoding, its position read on the device
      // a, and on the dp4a path a's int8 blocks for Wo, from the combine.
      std::optional<kernels::QuantOut> aq;
      if (!tensor_cores(n) && tuning_.attn_quantize_output) {
        DPL_ASSIGN_OR_RETURN(aq, kernels::QuantizeInto(Q, n, &b.qx));
      }
      DPL_RETURN_IF_ERROR(kernels::DecodeAttention(attn_plan_, b.q, k_cache, v_cache, b.positions,
                                                   b.attn_ws, b.att, s, aq ? &*aq : nullptr));
      if (!aq) DPL_RETURN_IF_ERROR(prepare(b.att, Q, n));
    } else {  // causal flash attention over the chunk
      DPL_RETURN_IF_ERROR(kernels::PromptAttention(prompt_attn_, b.q, k_cache, v_cache, first_pos,
                                                   n, b.att, s));
      DPL_RETURN_IF_ERROR(prepare(b.att, Q, n));
    }
    DPL_RETURN_IF_ERROR(mm(L.wo, b.att, {b.x, L.bo, b.x}, n));  // x += Wo a
    // Feed-forward block.
    DPL_RETURN_IF_ERROR(norm_prepare(b.x, L.ffn_norm, n));
    const Matrix* gate_up[2] = {&L.w_gate, &L.w_up};
    const kernels::MatVecOut gate_up_out[2] = {{b.gate, nullptr, nullptr}, {b.up, nullptr, nullptr}};
    DPL_RETURN_IF_ERROR(mm_group(L.gate_up, gate_up, gate_up_out, b.h));
    if (tensor_cores(n)) {  // g = silu(gate) * up, in place
      DPL_RETURN_IF_ERROR(kernels::SwiGlu(b.gate, b.up, b.gate, static_cast<int64_t>(n) * F, s));
      DPL_RETURN_IF_ERROR(prepare(b.gate, F, n));
    } else {
      DPL_RETURN_IF_ERROR(kernels::SwiGluQuantizeActivations(b.gate, b.up, F, n, b.gate, &b.qx, s, pdl));
    }
    DPL_RETURN_IF_ERROR(mm(L.w_down, b.gate, {b.x, nullptr, b.x}, n));  // x += Wdown g
  }
  // LM head: every token's logits, or the last token's only.
  const int first = all_logits ? 0 : n - 1;
  const int rows = n - first;
  DPL_RETURN_IF_ERROR(norm_prepare(b.x + first * E, output_norm_, rows));
  return mm(out_, b.h, {b.logits, nullptr, nullptr}, rows);
}

absl::Status CudaDecoder::EnqueueStep(const kernels::SamplingParams* sample) {
  DPL_RETURN_IF_ERROR(EnqueueForward(1, /*first_pos=*/-1, false));
  if (sample != nullptr) {
    DPL_RETURN_IF_ERROR(kernels::SampleToken(*sample, buf_.logits, static_cast<int>(hp_.n_vocab),
                                             ring_.get(), buf_.sampler, buf_.sampling_ws,
                                             buf_.tokens, stream_.get()));
  }
  // The step moves its own position on, so back-to-back replays decode
  // consecutive positions (dpl-bench); Eval writes the position anyway.
  return kernels::AdvancePosition(buf_.positions, stream_.get());
}

absl::Status CudaDecoder::RunChunk(absl::Span<const int32_t> tokens, bool all_logits) {
  const int n = static_cast<int>(tokens.size());
  std::vector<int> positions(n);
  for (int t = 0; t < n; ++t) positions[t] = static_cast<int>(n_past_ + t);
  cudaStream_t s = stream_.get();
  DPL_CUDA_CHECK(cudaMemcpyAsync(buf_.tokens, tokens.data(), n * sizeof(int), cudaMemcpyHostToDevice, s));
  DPL_CUDA_CHECK(cudaMemcpyAsync(buf_.positions, positions.data(), n * sizeof(int),
                                 cudaMemcpyHostToDevice, s));
  if (n == 1 && !all_logits && step_graph_) {
    DPL_CUDA_CHECK(cudaGraphLaunch(step_graph_.get(), s));
  } else {
    DPL_RETURN_IF_ERROR(EnqueueForward(n, static_cast<int>(n_past_), all_logits));
  }
  // The host vectors above must outlive the async copies.
  DPL_CUDA_CHECK(cudaStreamSynchronize(s));
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
  // Every token's logits fit buf_.logits in chunks of logit_rows_ tokens.
  const size_t step = all != nullptr ? logit_rows_ : max_batch_;
  for (size_t at = 0; at < tokens.size(); at += step) {
    const auto chunk = tokens.subspan(at, std::min<size_t>(step, tokens.size() - at));
    DPL_RETURN_IF_ERROR(RunChunk(chunk, all != nullptr));
    if (all != nullptr) {
      const size_t old = all->size();
      all->resize(old + chunk.size() * V);
      DPL_CUDA_CHECK(cudaMemcpy(all->data() + old, buf_.logits, chunk.size() * V * 4, cudaMemcpyDeviceToHost));
    }
  }
  if (last != nullptr) {
    last->resize(V);
    if (all != nullptr) {
      std::copy(all->end() - V, all->end(), last->begin());
    } else {
      DPL_CUDA_CHECK(cudaMemcpy(last->data(), buf_.logits, V * 4, cudaMemcpyDeviceToHost));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<double> CudaDecoder::TimeDecodeSteps(int n) {
  if (!step_graph_) return absl::FailedPreconditionError("no captured graph (eager mode)");
  if (n_past_ + n > n_ctx_) return absl::OutOfRangeError("decode steps past the context");
  cudaStream_t s = stream_.get();
  const int pos = static_cast<int>(n_past_);
  DPL_CUDA_CHECK(cudaMemcpyAsync(buf_.positions, &pos, sizeof(int), cudaMemcpyHostToDevice, s));
  DPL_ASSIGN_OR_RETURN(const kernels::Event start, kernels::CreateEvent(cudaEventDefault));
  DPL_ASSIGN_OR_RETURN(const kernels::Event stop, kernels::CreateEvent(cudaEventDefault));
  DPL_CUDA_CHECK(cudaEventRecord(start.get(), s));
  for (int i = 0; i < n; ++i) DPL_CUDA_CHECK(cudaGraphLaunch(step_graph_.get(), s));
  DPL_CUDA_CHECK(cudaEventRecord(stop.get(), s));
  DPL_CUDA_CHECK(cudaEventSynchronize(stop.get()));
  float ms = 0;
  DPL_CUDA_CHECK(cudaEventElapsedTime(&ms, start.get(), stop.get()));
  n_past_ += n;
  return ms / 1e3;
}

absl::Status CudaDecoder::PrepareGenerationGraph(const kernels::SamplingParams& p) {
  const auto same = [](const kernels::SamplingParams& a, const kernels::SamplingParams& b) {
    return a.temperature == b.temperature && a.top_k == b.top_k && a.top_p == b.top_p &&
           a.min_p == b.min_p && a.repeat_penalty == b.repeat_penalty &&
           a.repeat_last_n == b.repeat_last_n && a.seed == b.seed;
  };
  if (gen_params_.has_value() && same(*gen_params_, p)) return absl::OkStatus();
  gen_params_.reset();
  gen_graph_.reset();
  if (p.repeat_last_n > static_cast<int>(ring_.size())) {
    DPL_ASSIGN_OR_RETURN(ring_, kernels::DeviceBuffer<int>::Allocate(p.repeat_last_n));
  }
  if (!eager_) {
    DPL_ASSIGN_OR_RETURN(gen_graph_, kernels::CaptureGraph(stream_.get(), [&] {
                           return EnqueueStep(&p);
                         }));
  }
  gen_params_ = p;
  return absl::OkStatus();
}

absl::Status CudaDecoder::LaunchGenerationStep(const kernels::SamplingParams& p) {
  if (gen_graph_) {
    DPL_CUDA_CHECK(cudaGraphLaunch(gen_graph_.get(), stream_.get()));
    return absl::OkStatus();
  }
  return EnqueueStep(&p);  // eager: the same kernels, launched one by one
}

absl::Status CudaDecoder::StartSampling(const generate::SamplerParams& params,
                                        absl::Span<const int32_t> history, bool restart_draws,
                                        kernels::SamplingParams* p) {
  if (n_past_ == 0) return absl::FailedPreconditionError("sampling needs a prompt first");
  *p = params;
  p->repeat_last_n = params.repeat_penalty != 1.0f ? std::max(0, params.repeat_last_n) : 0;
  DPL_RETURN_IF_ERROR(PrepareGenerationGraph(*p));
  cudaStream_t s = stream_.get();
  // The penalty ring from the history; the RNG counter carries on unless
  // the caller starts a new sequence of draws.
  if (restart_draws) DPL_CUDA_CHECK(cudaMemsetAsync(&buf_.sampler->step, 0, sizeof(buf_.sampler->step), s));
  if (p->repeat_last_n > 0) {
    const kernels::RecentRing ring = kernels::MakeRecentRing(history, p->repeat_last_n);
    DPL_CUDA_CHECK(cudaMemcpyAsync(ring_.get(), ring.tokens.data(), ring.tokens.size() * sizeof(int),
                                   cudaMemcpyHostToDevice, s));
    const int32_t head_count[2] = {ring.head, ring.count};
    DPL_CUDA_CHECK(cudaMemcpyAsync(&buf_.sampler->ring_head, head_count, sizeof(head_count),
                                   cudaMemcpyHostToDevice, s));
  }
  const int pos = static_cast<int>(n_past_);
  DPL_CUDA_CHECK(cudaMemcpyAsync(buf_.positions, &pos, sizeof(int), cudaMemcpyHostToDevice, s));
  // The first token comes from the prompt's logits, still in buf_.logits.
  DPL_RETURN_IF_ERROR(kernels::SampleToken(*p, buf_.logits, static_cast<int>(hp_.n_vocab), ring_.get(),
                                           buf_.sampler, buf_.sampling_ws, buf_.tokens, s));
  DPL_CUDA_CHECK(cudaMemcpyAsync(&h_tokens_.get()[0], buf_.tokens, sizeof(int), cudaMemcpyDeviceToHost, s));
  DPL_CUDA_CHECK(cudaEventRecord(token_ready_[0].get(), s));
  return absl::OkStatus();
}

absl::StatusOr<int32_t> CudaDecoder::BeginSampling(const generate::SamplerParams& params,
                                                   absl::Span<const int32_t> history) {
  kernels::SamplingParams p;
  DPL_RETURN_IF_ERROR(StartSampling(params, history, /*restart_draws=*/true, &p));
  DPL_CUDA_CHECK(cudaEventSynchronize(token_ready_[0].get()));
  return h_tokens_.get()[0];
}

absl::StatusOr<int32_t> CudaDecoder::NextToken() {
  if (!gen_params_.has_value()) return absl::FailedPreconditionError("NextToken before BeginSampling");
  if (n_past_ >= n_ctx_) {
    return absl::OutOfRangeError(absl::StrCat("the context of ", n_ctx_, " positions is full"));
  }
  cudaStream_t s = stream_.get();
  DPL_RETURN_IF_ERROR(LaunchGenerationStep(*gen_params_));
  DPL_CUDA_CHECK(cudaMemcpyAsync(&h_tokens_.get()[0], buf_.tokens, sizeof(int), cudaMemcpyDeviceToHost, s));
  DPL_CUDA_CHECK(cudaStreamSynchronize(s));
  ++n_past_;  // the pending token is now in the cache
  return h_tokens_.get()[0];
}

absl::Status CudaDecoder::SampleLoop(const generate::SamplerParams& params,
                                     absl::Span<const int32_t> history, int32_t max_tokens,
                                     const std::function<bool(int32_t)>& on_token) {
  kernels::SamplingParams p;
  DPL_RETURN_IF_ERROR(StartSampling(params, history, /*restart_draws=*/false, &p));
  cudaStream_t s = stream_.get();
  int* h_tokens = h_tokens_.get();
  // Pipeline: the GPU runs step i (feeding token i, sampling token i + 1)
  // while the host waits for token i and streams it: one wait per token.
  for (int32_t i = 0; max_tokens < 0 || i < max_tokens; ++i) {
    const bool more = (max_tokens < 0 || i + 1 < max_tokens) && n_past_ < n_ctx_;
    if (more) {
      DPL_RETURN_IF_ERROR(LaunchGenerationStep(p));
      const int slot = (i + 1) & 1;
      DPL_CUDA_CHECK(cudaMemcpyAsync(&h_tokens[slot], buf_.tokens, sizeof(int), cudaMemcpyDeviceToHost, s));
      DPL_CUDA_CHECK(cudaEventRecord(token_ready_[slot].get(), s));
    }
    DPL_CUDA_CHECK(cudaEventSynchronize(token_ready_[i & 1].get()));
    const int32_t token = h_tokens[i & 1];
    if (!on_token(token)) {
      DPL_CUDA_CHECK(cudaStreamSynchronize(s));  // the step already queued finishes
      if (more) ++n_past_;  // its KV row holds the refused token; callers rewind past it
      return absl::OkStatus();
    }
    if (!more) break;
    ++n_past_;  // token i is now in the cache (step i ran)
  }
  DPL_CUDA_CHECK(cudaStreamSynchronize(s));
  return absl::OkStatus();
}

std::string CudaDecoder::LoadReport() const {
  return absl::StrFormat(
      "cuda: weights %.2f GiB loaded in %.2f s (%.1f GB/s); KV cache %.2f GiB (f16, %d positions); "
      "buffers %.2f GiB (prompt chunk %d, tensor cores from %d tokens); decode step %s\n"
      "cuda load stages: init %.0f ms, weights %.0f ms, setup %.0f ms, graph %.0f ms",
      report_.weight_bytes / 1073741824.0, report_.load.seconds, report_.load.gb_per_s(),
      report_.kv_cache_bytes / 1073741824.0, n_ctx_, report_.scratch_bytes / 1073741824.0,
      max_batch_, gemm_.has_value() ? tuning_.gemm_min_tokens : max_batch_ + 1,
      eager_ ? "eager (DPL_EAGER)" : "captured as one CUDA graph", report_.init_seconds * 1e3,
      report_.weights_seconds * 1e3, report_.setup_seconds * 1e3, report_.graph_seconds * 1e3);
}

std::vector<std::pair<std::string, double>> CudaDecoder::LoadStages() const {
  return {{"cuda init", report_.init_seconds},
          {absl::StrFormat("weights (%.1f GB/s: staging filled %.0f ms, copies waited for %.0f ms)",
                           report_.load.gb_per_s(), report_.load.fill_seconds * 1e3,
                           report_.load.wait_seconds * 1e3),
           report_.weights_seconds},
          {"setup", report_.setup_seconds},
          {"graph", report_.graph_seconds}};
}

absl::Status CudaDecoder::Rewind(int64_t n) {
  if (n < 0 || n > n_past_) return absl::InvalidArgumentError(absl::StrCat("cannot rewind to ", n));
  n_past_ = n;  // later positions are overwritten before attention reads them
  return absl::OkStatus();
}

}  // namespace dpl::runtime
