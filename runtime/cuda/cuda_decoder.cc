#include "runtime/cuda/cuda_decoder.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <tuple>

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
  DPL_RETURN_IF_ERROR(model::CheckGpuArch(desc));
  hp_ = desc.hp;
  bytes_per_token_ = desc.bytes_per_token;
  prompt_macs_per_token_ = desc.prompt_macs_per_token;
  if (options.n_ctx < 0 || options.n_ctx > kMaxContext) {
    return absl::InvalidArgumentError(
        absl::StrCat("context size ", options.n_ctx, " is out of range [0, ", kMaxContext, "]"));
  }
  n_ctx_ = options.n_ctx > 0 ? options.n_ctx : (hp_.n_ctx_train > 0 ? hp_.n_ctx_train : 4096);
  n_ctx_ = std::min(n_ctx_, kMaxContext);
  max_batch_ = std::max(1, options.max_batch);
  kv_block_ = options.kv_block;
  kv_pool_blocks_ = options.kv_pool_blocks;
  if (kv_block_ < 0 || kv_pool_blocks_ < 0 || (kv_block_ == 0 && kv_pool_blocks_ > 0)) {
    return absl::InvalidArgumentError(absl::StrCat("paged KV: kv_block ", kv_block_, " and kv_pool_blocks ",
                                                   kv_pool_blocks_, ": a pool needs a block size"));
  }
  if (kv_block_ > 0 && kv_pool_blocks_ == 0) {  // the pool is one sequence's whole context
    kv_pool_blocks_ = static_cast<int>(std::min<int64_t>((n_ctx_ + kv_block_ - 1) / kv_block_, INT32_MAX));
  }
  if (options.n_seq < 1 || options.n_seq > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("sequences (-np) ", options.n_seq, " out of range [1, 65535]"));
  }
  n_past_.assign(options.n_seq, 0);
  sampling_.assign(options.n_seq, false);
  last_step_.assign(options.n_seq, 0);
  last_logits_row_.assign(options.n_seq, 0);
  keep_draw_logits_.assign(options.n_seq, false);
  draw_logits_ready_.assign(options.n_seq, false);
  eager_ = options.eager;
  record_routes_ = options.record_routes;
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
    if (tuning_.gemm_dequant_ahead) {
      DPL_ASSIGN_OR_RETURN(ahead_, kernels::F16WeightsAhead::Create(tuning_.gemm_ahead_side_first,
                                                                    tuning_.gemm_ahead_dequant_ctas));
      DPL_RETURN_IF_ERROR(gemm_->SetSmCountTarget(tuning_.gemm_ahead_sm_target));
    }
  }
  report_.setup_seconds = lap();
  // Every step graph a server needs, now: none is captured while serving.
  if (!eager_) {
    for (Bucket& b : buckets_) {
      DPL_ASSIGN_OR_RETURN(b.generate, kernels::CaptureGraph(stream_.get(), [&] {
                             return EnqueueStep(b, /*sample=*/true);
                           }));
    }
    Bucket& one = buckets_.front();
    DPL_ASSIGN_OR_RETURN(one.forward, kernels::CaptureGraph(stream_.get(), [&] {
                           return EnqueueStep(one, /*sample=*/false);
                         }));
  }
  report_.graph_seconds = lap();
  DPL_RETURN_IF_ERROR(Warmup());
  report_.warmup_seconds = lap();
  return absl::OkStatus();
}

// Why: a server's first request paid for what nothing had run yet: its
// 128-token prompt took 130 ms against ~7 once warm and a 512-token one 104
// against 22.5 (H100, dpl-server's step trace, docs/PERF.md), the kernels'
// modules loaded lazily at their first launch and cuBLAS's first GEMMs
// choosing and loading theirs, and the first replay of each step graph
// uploading it. So: every step graph uploaded, and prompt passes of 8, 16,
// 64 and max_batch tokens (the int8 and f16 tensor-core forms and the cuBLAS
// path) run through sequence 0 and rewound. What they leave in the cache is
// past the sequence's end (overwritten before anything reads it), and its
// pending token and position are those of a fresh sequence again.
absl::Status CudaDecoder::Warmup() {
  cudaStream_t s = stream_.get();
  for (Bucket& b : buckets_) {
    if (b.generate) DPL_CUDA_CHECK(cudaGraphUpload(b.generate.get(), s));
    if (b.forward) DPL_CUDA_CHECK(cudaGraphUpload(b.forward.get(), s));
  }
  int64_t most = std::min<int64_t>(max_batch_, n_ctx_);
  if (kv_layout_.paged()) most = std::min<int64_t>(most, int64_t{kv_layout_.n_blocks} * kv_layout_.block());
  const std::vector<int32_t> tokens(static_cast<size_t>(std::max<int64_t>(most, 0)), 0);
  int done = 0;
  for (const int n : {8, 16, 64, max_batch_}) {
    if (n < 2 || n > most || n == done) continue;
    if (kv_layout_.paged()) {
      std::vector<int> blocks((n + kv_layout_.block() - 1) / kv_layout_.block());
      for (size_t i = 0; i < blocks.size(); ++i) blocks[i] = static_cast<int>(i);
      DPL_RETURN_IF_ERROR(SetBlockTable(0, blocks));
    }
    DPL_RETURN_IF_ERROR(EvalSeq(0, absl::MakeConstSpan(tokens).first(static_cast<size_t>(n)), nullptr, nullptr));
    DPL_RETURN_IF_ERROR(RewindSeq(0, 0));
    if (kv_layout_.paged()) DPL_RETURN_IF_ERROR(SetBlockTable(0, {}));
    done = n;
  }
  DPL_RETURN_IF_ERROR(WarmupPackedPasses());
  const int S = n_seq();
  DPL_CUDA_CHECK(cudaMemsetAsync(buf_.seq_token, 0, S * 4, s));
  DPL_CUDA_CHECK(cudaMemsetAsync(buf_.seq_pos, 0, S * 4, s));
  DPL_CUDA_CHECK(cudaMemsetAsync(buf_.row_seq, 0xff, S * 4, s));
  DPL_CUDA_CHECK(cudaStreamSynchronize(s));
  return absl::OkStatus();
}

// Why: a server's first pass of several prompts, and its first with decode
// rows beside them, still took 31-37 ms after the one-sequence warm-up (a
// warm pass of two 50-token prompts over a 2,000-token start takes 16.3 ms:
// H100, the shared-start load's step trace and dpl-bench --shared,
// docs/PERF.md; with this warm-up the load's median first token went 73.8
// -> 49.0 ms): their kernels (prompt attention over a tile list,
// the logits rows' gather, the eager sampling of a first token, the decode
// rows' gather and finish) had not run yet. So sequences 0 and 1, 8 tokens
// each: a pass of both (sequence 0 over its first 8, so at a depth), a
// first token drawn for sequence 0, then a pass of its decode row beside
// sequence 1's next 8; both rewound. Skipped with one sequence, or a pool
// or context too small for 24 positions a sequence.
absl::Status CudaDecoder::WarmupPackedPasses() {
  constexpr int kChunk = 8;
  const int per_seq = 3 * kChunk;
  if (n_seq() < 2 || max_batch_ < 2 * kChunk || n_ctx_ < per_seq + 1) return absl::OkStatus();
  const bool paged = kv_layout_.paged();
  const int blocks = (per_seq + 1 + kv_layout_.block() - 1) / kv_layout_.block();
  if (paged && kv_layout_.n_blocks < 2 * blocks) return absl::OkStatus();
  for (int seq = 0; seq < 2 && paged; ++seq) {
    std::vector<int> table(static_cast<size_t>(blocks));
    for (int i = 0; i < blocks; ++i) table[static_cast<size_t>(i)] = seq * blocks + i;
    DPL_RETURN_IF_ERROR(SetBlockTable(seq, table));
  }
  const std::vector<int32_t> t(kChunk, 0);
  std::vector<float> last;
  DPL_RETURN_IF_ERROR(EvalSeq(0, t, nullptr, nullptr));
  const SeqChunk both[2] = {{0, t}, {1, t}};
  DPL_RETURN_IF_ERROR(EvalSeqs(both, &last));
  DPL_RETURN_IF_ERROR(BeginSampling(0, generate::SamplerParams{}, t).status());
  const int seqs[1] = {0};
  int32_t next[1] = {0};
  const SeqChunk beside[1] = {{1, t}};
  DPL_RETURN_IF_ERROR(StepWithChunks(seqs, next, beside, &last));
  for (int seq = 0; seq < 2; ++seq) {
    DPL_RETURN_IF_ERROR(RewindSeq(seq, 0));
    if (paged) DPL_RETURN_IF_ERROR(SetBlockTable(seq, {}));
  }
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
  // An expert tensor [n_cols, n_rows, n_expert]: expert 0's matrix and the
  // stride to the next (the file's bytes: TensorView::n_rows counts every
  // expert's rows, n_bytes / n_expert apart).
  auto experts = [&](const formats::TensorView* t, kernels::ExpertWeights* e,
                     kernels::ExpertPlan* plan) -> absl::Status {
    e->w = view(*t);
    e->n_expert = static_cast<int>(t->ne[2]);
    e->w.n_rows = static_cast<int64_t>(t->ne[1]);
    e->expert_stride = e->w.n_rows * e->w.row_stride;
    if (t->ne[2] == 0 || e->expert_stride * static_cast<int64_t>(t->ne[2]) != static_cast<int64_t>(t->n_bytes)) {
      return absl::InvalidArgumentError(absl::StrCat(t->n_bytes, " bytes are not ", t->ne[2], " experts of ",
                                                     e->expert_stride));
    }
    DPL_ASSIGN_OR_RETURN(*plan, kernels::PlanExperts(*e, tuning_));
    return absl::OkStatus();
  };
  embed_ = view(*desc.token_embd);
  layers_.resize(desc.layers.size());
  for (size_t l = 0; l < layers_.size(); ++l) {
    const model::LayerTensors& t = desc.layers[l];
    Layer& L = layers_[l];
    for (auto [src, dst] : {std::pair{t.wq, &L.wq}, {t.wk, &L.wk}, {t.wv, &L.wv}, {t.wo, &L.wo},
                            {t.w_gate, &L.w_gate}, {t.w_up, &L.w_up}, {t.w_down, &L.w_down}}) {
      if (src == nullptr) continue;  // a MoE layer's dense feed-forward
      DPL_RETURN_IF_ERROR(Annotate(matrix(src, dst), absl::StrCat("tensor '", src->name, "'")));
    }
    if (t.router != nullptr) {
      MoeLayer& M = L.moe.emplace();
      DPL_RETURN_IF_ERROR(Annotate(matrix(t.router, &M.router), absl::StrCat("tensor '", t.router->name, "'")));
      for (auto [src, dst, plan] : {std::tuple{t.gate_exps, &M.gate, &M.gate_plan},
                                    {t.up_exps, &M.up, &M.up_plan}, {t.down_exps, &M.down, &M.down_plan}}) {
        DPL_RETURN_IF_ERROR(Annotate(experts(src, dst, plan), absl::StrCat("tensor '", src->name, "'")));
      }
      M.gate_up_grouped = M.gate_plan.kernel == M.up_plan.kernel && M.gate_plan.ksplit == M.up_plan.ksplit;
    }
    L.attn_norm = vec(t.attn_norm);
    L.ffn_norm = vec(t.ffn_norm);
    L.bq = vec(t.bq);
    L.bk = vec(t.bk);
    L.bv = vec(t.bv);
    L.bo = vec(t.bo);
    L.head_norms = {vec(t.q_norm), vec(t.k_norm), static_cast<float>(hp_.rms_eps)};
    DPL_ASSIGN_OR_RETURN(L.qkv, kernels::PlanMatVecGroups({L.wq.w, L.wk.w, L.wv.w}, tuning_));
    if (!L.moe) {
      DPL_ASSIGN_OR_RETURN(L.gate_up, kernels::PlanMatVecGroups({L.w_gate.w, L.w_up.w}, tuning_));
    }
  }
  output_norm_ = vec(desc.output_norm);
  return Annotate(matrix(desc.output, &out_), absl::StrCat("tensor '", desc.output->name, "'"));
}

// Every buffer of a pass, sized from one table and carved from one
// allocation (256-byte aligned slices), after a check against free memory.
absl::Status CudaDecoder::Allocate() {
  const int n_seq = this->n_seq();
  // A MoE model has no dense feed-forward: its own buffers are below (F 0).
  const uint64_t T = std::max(max_batch_, n_seq), S = n_seq, E = hp_.n_embd, F = hp_.moe() ? 0 : hp_.n_ff,
                 Q = hp_.q_dim(), KV = hp_.kv_dim(), V = hp_.n_vocab;
  // Mixture of experts: slices of M rows, k routes a row, X = n_ff_exp.
  moe_rows_ = hp_.moe() ? static_cast<int>(std::min<uint64_t>(T, kMoeRows)) : 0;
  const uint64_t M = moe_rows_, NX = hp_.n_expert, K = hp_.n_expert_used, X = hp_.n_ff_exp;
  route_log_rows_ = hp_.moe() && record_routes_ ? static_cast<int>(T) : 0;
  logit_rows_ = std::max(std::min(max_batch_, kMaxLogitRows), n_seq);
  ring_stride_ = static_cast<int>(std::min<int64_t>(n_ctx_, kMaxRing));
  const uint64_t W = std::max({E, F, Q});  // widest matvec input
  if (kv_block_ > 0) {
    // One pool; a sequence reaches n_ctx_ positions at most (whole blocks,
    // no more than the pool).
    DPL_ASSIGN_OR_RETURN(kv_layout_, kernels::MakePagedKvCacheLayout(
                                         static_cast<int>(hp_.n_layer), static_cast<int>(hp_.n_head_kv),
                                         static_cast<int>(hp_.head_dim), n_seq, kv_block_, kv_pool_blocks_,
                                         n_ctx_));
    n_ctx_ = kv_layout_.n_ctx;
    ring_stride_ = static_cast<int>(std::min<int64_t>(n_ctx_, kMaxRing));
    tables_.emplace(n_seq, kv_layout_.block(), kv_layout_.n_blocks, kv_layout_.max_blocks());
  } else {
    DPL_ASSIGN_OR_RETURN(kv_layout_, kernels::MakeKvCacheLayout(
                                         static_cast<int>(hp_.n_layer), static_cast<int>(hp_.n_head_kv),
                                         static_cast<int>(n_ctx_), static_cast<int>(hp_.head_dim),
                                         n_seq));
  }
  const uint64_t table_ints = kv_layout_.paged() ? S * static_cast<uint64_t>(kv_layout_.max_blocks()) : 0;
  // Step buckets 1, 2, 4, ... and n_seq itself.
  buckets_.clear();
  for (int b = 1;; b *= 2) {
    buckets_.emplace_back();
    buckets_.back().batch = std::min(b, n_seq);
    if (b >= n_seq) break;
  }
  uint64_t attn_ws_floats = 0;
  for (Bucket& b : buckets_) {
    DPL_ASSIGN_OR_RETURN(b.attn, kernels::PlanDecodeAttention(
                                     static_cast<int>(hp_.n_head), static_cast<int>(hp_.n_head_kv),
                                     static_cast<int>(hp_.head_dim), static_cast<int>(n_ctx_),
                                     static_cast<int>(hp_.sliding_window), tuning_, b.batch));
    attn_ws_floats = std::max(attn_ws_floats, b.attn.workspace_floats);
  }
  rope_shape_ = {static_cast<int>(hp_.n_head), static_cast<int>(hp_.n_head_kv),
                 static_cast<int>(hp_.head_dim), static_cast<int>(hp_.n_rot),
                 static_cast<int>(n_ctx_)};
  // The single-token step folds RoPE into the Q/K/V matvec where it rotates
  // whole heads without per-head norms and every Q/K/V launch has the folded
  // epilogue (kernels/matvec/matvec_rope.h).
  rope_fold_ok_ = tuning_.rope_in_matvec && hp_.n_rot == hp_.head_dim;
  for (const Layer& L : layers_) {
    rope_fold_ok_ = rope_fold_ok_ && L.head_norms.q == nullptr && L.head_norms.k == nullptr;
    for (const kernels::MatVecGroupPlan& g : L.qkv) {
      rope_fold_ok_ = rope_fold_ok_ &&
                      kernels::FoldsRope(g.plan.kernel, g.plan.mixed ? g.plan.last_kernel : g.plan.kernel,
                                         g.plan.decode);
    }
  }
  prompt_attn_ = {static_cast<int>(hp_.n_head), static_cast<int>(hp_.n_head_kv),
                  static_cast<int>(hp_.head_dim), static_cast<int>(n_ctx_),
                  static_cast<int>(hp_.sliding_window)};
  // Passes of up to int8_max_rows_ rows keep int8 activations: the dp4a
  // matvec, or for 2..tuning.mma_max_tokens rows its tensor-core form when every
  // matrix has one (q4_K, q5_K, q6_K, q8_0 in whole 256-column blocks: a
  // Q4_K_M, Q5_K_M, Q6_K or Q8_0 file), which beats
  // dequantize + GEMM there (each weight read once, not dequantized to f16
  // and read again). Other types move to dequantize + GEMM from
  // gemm_min_tokens rows, where that wins over their token tile.
  // Past kMmaMaxTokens, passes of up to wide_max_rows_ rows
  // (tuning.mma_f16_max_tokens) run the f16 form's wide launch when every
  // layer matrix has that form (token tiles over the grid, no f16 copy of
  // the weights); not a MoE model's: its prompts stay on cuBLAS from 9 rows
  // (the f16 form rounds d sc q - dmin m in f16 steps, cuBLAS's weights
  // are the exact value rounded once, and the router's near-ties follow
  // such differences).
  auto mma = [](const Matrix& m) { return kernels::MatVecMmaSupports(m.plan.kernel, m.w.n_cols); };
  auto f16 = [](const Matrix& m) { return kernels::MatVecMmaF16Supports(m.plan.kernel, m.w.n_cols); };
  bool all_mma = mma(out_), all_f16 = true;
  for (const Layer& L : layers_) {
    for (const Matrix* m : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down}) {
      if (m->w.data == nullptr) continue;  // a MoE layer's feed-forward: its own kernels
      all_mma = all_mma && mma(*m);
      all_f16 = all_f16 && f16(*m);
    }
  }
  const int mma_rows = std::min(tuning_.mma_max_tokens, kernels::kMmaMaxTokens);
  int8_max_rows_ = all_mma ? std::max(mma_rows, tuning_.gemm_min_tokens - 1) : tuning_.gemm_min_tokens - 1;
  prompt_int8_max_rows_ =
      hp_.moe() ? std::min(int8_max_rows_, std::max(1, tuning_.moe_prompt_mma_max_rows)) : int8_max_rows_;
  wide_max_rows_ = !hp_.moe() && all_mma && all_f16 && mma_rows == kernels::kMmaMaxTokens &&
                           int8_max_rows_ == kernels::kMmaMaxTokens && tuning_.mma_f16_max_tokens > kernels::kMmaMaxTokens
                       ? tuning_.mma_f16_max_tokens
                       : 0;
  // The tensor-core path's f16 scratch: activations of a chunk, and the
  // largest layer matrix (the lm head, larger, goes through it in row blocks),
  // where some prompt pass of up to T rows takes that path.
  w_f16_elems_ = 0;
  // (A wide pass whose inputs may go to cuBLAS, DecodeTuning::wide_gemm_*,
  // needs it too.)
  const bool wide_gemm = wide_max_rows_ > 0 && (tuning_.wide_gemm_qkv_rows > 0 || tuning_.wide_gemm_o_rows > 0 ||
                                                tuning_.wide_gemm_q6k_down_rows > 0);
  const bool wide_covers = prompt_int8_max_rows_ >= kernels::kMmaMaxTokens && static_cast<int>(T) <= wide_max_rows_;
  if (static_cast<int>(T) > prompt_int8_max_rows_ && (!wide_covers || wide_gemm)) {
    for (const Layer& L : layers_) {
      for (const Matrix* m : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down}) {
        if (m->w.data == nullptr) continue;
        w_f16_elems_ = std::max(w_f16_elems_, m->w.n_rows * m->w.n_cols);
      }
    }
  }
  const uint64_t x_f16_bytes = w_f16_elems_ > 0 ? T * W * 2 : 0;
  // The dp4a matvec's int8 activations: only for products below the
  // tensor-core threshold when that path exists.
  const uint64_t qx_tokens =
      w_f16_elems_ > 0 ? std::min<uint64_t>(T, std::max({1, int8_max_rows_, wide_max_rows_})) : T;
  // Its f16 copy for the f16 form's rows: up to 64, or the wide launch's.
  const int64_t f16_rows = std::max(kernels::kMmaMaxTokens, wide_max_rows_);
  DPL_ASSIGN_OR_RETURN(const uint64_t qx_bytes, kernels::MatVecScratchBytes(W, qx_tokens, f16_rows));
  Buffers& b = buf_;
  void* qx_mem = nullptr;  // int8 activations, laid out by MatVecScratchIn
  void* moe_h_mem = nullptr;  // MoE int8 activations, laid out by MoeActsIn
  void* moe_g_mem = nullptr;
  void* moe_groups_mem = nullptr;  // the routes grouped by expert, laid out by MoeGroupsIn
  const struct {
    uint64_t bytes;
    void* slot;  // address of the Buffers pointer to set
  } table[] = {
      {T * 4, &b.tokens},          {T * 4, &b.positions},      {static_cast<uint64_t>(hp_.n_rot / 2) * 8, &b.inv_freq},
      {static_cast<uint64_t>(hp_.n_rot / 2) * 16, &b.rope_cs},
      {S * 4, &b.row_seq},         {S * 4, &b.seq_token},      {S * 4, &b.seq_pos},
      {T * 4, &b.pass_seq},        {S * E * 4, &b.head_x},
      {T * sizeof(kernels::PromptTile), &b.prompt_tiles},
      {T * E * 4, &b.x},           {T * E * 4, &b.h},          {T * Q * 4, &b.q},
      {T * KV * 4, &b.k},          {T * KV * 4, &b.v},         {T * Q * 4, &b.att},
      {T * F * 4, &b.gate},        {T * F * 4, &b.up},         {static_cast<uint64_t>(logit_rows_) * V * 4, &b.logits},
      {attn_ws_floats * 4, &b.attn_ws},                        {kv_layout_.TotalBytes(), &b.kv},
      {table_ints * 4, &b.kv_tables},
      {S * sizeof(kernels::SamplingParams), &b.params},        {S * sizeof(kernels::SamplerState), &b.sampler},
      {S * ring_stride_ * 4, &b.rings},                        {kernels::SamplingWorkspaceBytes(n_seq), &b.sampling_ws},
      {S * kernels::AllowedWords(static_cast<int>(V)) * 4, &b.allowed}, {S * 4, &b.allowed_on},
      {S * kernels::kMaxLogitBias * sizeof(kernels::LogitBias), &b.bias}, {S * 4, &b.n_bias},
      {qx_bytes, &qx_mem},
      {M * NX * 4, &b.moe_logits}, {M * K * 4, &b.moe_ids},   {M * K * 4, &b.moe_w},
      {static_cast<uint64_t>(hp_.n_layer) * route_log_rows_ * K * 4, &b.route_log},
      {M * K * X * 4, &b.moe_gate}, {M * K * X * 4, &b.moe_up}, {M * K * E * 4, &b.moe_down},
      {M > 0 ? kernels::MoeActsBytes(static_cast<int64_t>(M * E)) : 0, &moe_h_mem},
      {M > 0 ? kernels::MoeActsBytes(static_cast<int64_t>(M * K * X)) : 0, &moe_g_mem},
      {M > 0 ? kernels::MoeGroupsBytes(static_cast<int>(M * K), static_cast<int>(NX)) : 0, &moe_groups_mem},
      {x_f16_bytes, &b.x_f16},     {static_cast<uint64_t>(w_f16_elems_) * 2, &b.w_f16},
      {tuning_.gemm_dequant_ahead ? static_cast<uint64_t>(w_f16_elems_) * 2 : 0, &b.w_f16_ahead},
  };
  auto align = [](uint64_t n) { return (n + 255) / 256 * 256; };
  uint64_t total = 0;
  for (const auto& e : table) total += align(e.bytes);
  report_.kv_cache_bytes = kv_layout_.TotalBytes();
  report_.scratch_bytes = total - report_.kv_cache_bytes;
  DPL_ASSIGN_OR_RETURN(const auto mem, DeviceMemoryInfo());
  if (total > mem.first) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "not enough device memory: KV cache %.2f GiB (%s) + buffers %.2f GiB needed, %.2f GiB free",
        report_.kv_cache_bytes / 1073741824.0,
        kv_layout_.paged() ? absl::StrFormat("a pool of %d blocks of %d positions", kv_layout_.n_blocks,
                                             kv_layout_.block())
                           : absl::StrFormat("-c %d x %d sequences", n_ctx_, n_seq),
        report_.scratch_bytes / 1073741824.0, mem.first / 1073741824.0));
  }
  DPL_ASSIGN_OR_RETURN(arena_, kernels::DeviceBuffer<uint8_t>::Allocate(total));
  uint8_t* at = arena_.get();
  for (const auto& e : table) {
    std::memcpy(e.slot, &at, sizeof(void*));  // every slot is a pointer (a member of b, or qx_mem)
    at += align(e.bytes);
  }
  // RouteTopK copies into the log only where it exists (a zero-byte entry
  // above still got an address).
  if (route_log_rows_ == 0) b.route_log = nullptr;
  b.qx = kernels::MatVecScratchIn(qx_mem, static_cast<int64_t>(W), static_cast<int64_t>(qx_tokens), f16_rows);
  if (M > 0) {
    b.moe_h = kernels::MoeActsIn(moe_h_mem, static_cast<int64_t>(M * E));
    b.moe_g = kernels::MoeActsIn(moe_g_mem, static_cast<int64_t>(M * K * X));
    b.moe_groups = kernels::MoeGroupsIn(moe_groups_mem, static_cast<int>(M * K), static_cast<int>(NX));
  }
  // The f16 copy only where a plan reads it.
  b.qx.f16_min_tokens = std::min({tuning_.mma_f16_min_tokens, tuning_.mma_f16_min_tokens_q5k,
                                   tuning_.mma_f16_min_tokens_q6k, tuning_.mma_f16_min_tokens_q8_0});
  // Sequences start with RNG counter 0, token 0 at position 0, and
  // parameters that sample greedily: a benchmark step of a sequence that was
  // never started (TimeDecodeSteps) reads defined values.
  DPL_CUDA_CHECK(cudaMemset(b.sampler, 0, S * sizeof(kernels::SamplerState)));
  DPL_CUDA_CHECK(cudaMemset(b.seq_token, 0, S * 4));
  DPL_CUDA_CHECK(cudaMemset(b.seq_pos, 0, S * 4));
  DPL_CUDA_CHECK(cudaMemset(b.row_seq, 0xff, S * 4));  // all -1: padding
  DPL_CUDA_CHECK(cudaMemset(b.allowed_on, 0, S * 4));  // no masks
  DPL_CUDA_CHECK(cudaMemset(b.n_bias, 0, S * 4));      // no logit biases
  if (kv_layout_.paged()) {
    // Every entry a block of the pool (0) until a table is set: a padding
    // row's read of its sequence's first key stays inside the pool.
    DPL_CUDA_CHECK(cudaMemset(b.kv_tables, 0, table_ints * 4));
    DPL_ASSIGN_OR_RETURN(h_tables_, kernels::PinnedBuffer<int>::Allocate(table_ints));
    std::fill(h_tables_.get(), h_tables_.get() + table_ints, 0);
    DPL_ASSIGN_OR_RETURN(tables_uploaded_, kernels::CreateEvent());
    kv_pages_ = {b.kv_tables, kv_layout_.max_blocks(), kv_layout_.block_shift};
  }
  {
    kernels::SamplingParams greedy;
    greedy.temperature = 0;
    greedy.repeat_last_n = 0;
    const std::vector<kernels::SamplingParams> all(S, greedy);
    DPL_CUDA_CHECK(cudaMemcpy(b.params, all.data(), S * sizeof(greedy), cudaMemcpyHostToDevice));
  }
  if (tuning_.gemm_dequant_ahead && !tuning_.gemm_ahead_side_first) {
    DPL_ASSIGN_OR_RETURN(stream_, kernels::CreateHighPriorityStream());
  } else {
    DPL_ASSIGN_OR_RETURN(stream_, kernels::CreateStream());
  }
  DPL_ASSIGN_OR_RETURN(h_rows_, kernels::PinnedBuffer<int>::Allocate(n_seq));
  DPL_ASSIGN_OR_RETURN(h_tokens_, kernels::PinnedBuffer<int>::Allocate(std::max(2, n_seq)));
  DPL_ASSIGN_OR_RETURN(h_params_, kernels::PinnedBuffer<kernels::SamplingParams>::Allocate(1));
  DPL_ASSIGN_OR_RETURN(h_allowed_, kernels::PinnedBuffer<uint32_t>::Allocate(
                                       static_cast<size_t>(S) * kernels::AllowedWords(static_cast<int>(V))));
  DPL_ASSIGN_OR_RETURN(h_bias_, kernels::PinnedBuffer<kernels::LogitBias>::Allocate(
                                    static_cast<size_t>(S) * kernels::kMaxLogitBias));
  DPL_ASSIGN_OR_RETURN(h_n_bias_, kernels::PinnedBuffer<int>::Allocate(S));
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

absl::Status CudaDecoder::EnqueueForward(int n, const Bucket* step, absl::Span<const Segment> segments,
                                         bool all_logits, const Bucket* step_rows, int n_step_rows) {
  const int E = static_cast<int>(hp_.n_embd), F = static_cast<int>(hp_.n_ff);
  const int Q = static_cast<int>(hp_.q_dim());
  const float eps = static_cast<float>(hp_.rms_eps);
  cudaStream_t s = stream_.get();
  Buffers& b = buf_;
  // Products over more than int8_max_rows_ tokens run dequantize + cuBLAS
  // (activations in f16), the others on the int8 matvec (dp4a, or its
  // tensor-core forms for 2..kMmaMaxTokens tokens and the f16 form's wide
  // launch up to DecodeTuning::mma_f16_max_tokens), whose kernels go out as
  // programmatic dependent launches when the tuning says so (the decode
  // step's chain).
  // A MoE model's prompt passes move to the f16 path sooner
  // (prompt_int8_max_rows_: DecodeTuning::moe_prompt_mma_max_rows).
  const int int8_max_rows = step == nullptr ? prompt_int8_max_rows_ : int8_max_rows_;
  auto tensor_cores = [&](int rows) {
    const bool wide = rows > kernels::kMmaMaxTokens && rows <= wide_max_rows_;  // the f16 form's wide launch
    return gemm_.has_value() && rows > int8_max_rows && !wide;
  };
  // A pass on the wide launch sends an input's products to cuBLAS from its
  // threshold (DecodeTuning::wide_gemm_*; `from` 0: never); a pass on
  // tensor cores sends them all.
  const bool wide_pass = gemm_.has_value() && n > int8_max_rows && n > kernels::kMmaMaxTokens && n <= wide_max_rows_;
  auto via_gemm = [&](int from) { return tensor_cores(n) || (wide_pass && from > 0 && n >= from); };
  // No programmatic dependent launches in a pass with cuBLAS GEMMs in it
  // (conservatively, whether or not a q6_K down is there to take its
  // threshold).
  const bool any_gemm = via_gemm(tuning_.wide_gemm_qkv_rows) || via_gemm(tuning_.wide_gemm_o_rows) ||
                        via_gemm(tuning_.wide_gemm_q6k_down_rows);
  const bool pdl = tuning_.pdl && !any_gemm;
  // Prepares x (rows tokens of `cols` values) once for the products that
  // read it: f16 for cuBLAS (gemm), int8 blocks (and their f16 tiles) for
  // the matvec's forms.
  auto prepare = [&](const float* x, int cols, int rows, bool gemm) {
    if (gemm) {
      return kernels::ConvertToF16(x, static_cast<int64_t>(rows) * cols, b.x_f16, s);
    }
    return kernels::QuantizeActivations(x, cols, rows, &b.qx, s, pdl);
  };
  // h = rmsnorm(x) * w, prepared (fused into one launch on the dp4a path).
  auto norm_prepare = [&](const float* x, const float* w, int rows, bool gemm) -> absl::Status {
    if (!gemm) {
      return kernels::NormQuantizeActivations(x, w, eps, E, rows, b.h, &b.qx, s, pdl);
    }
    // The products read only the f16 copy: no float32 h (RmsNorm, then
    // ConvertToF16, bit for bit).
    return kernels::RmsNormF16(x, w, b.x_f16, rows, E, eps, s);
  };
  // y = W x (+ bias) (+ residual) for the rows tokens in x (prepared).
  // A prompt pass on tensor cores with gemm_dequant_ahead: every layer
  // matrix in the order mm meets it, each dequantized a product ahead.
  const bool ahead = ahead_.has_value() && step == nullptr && tensor_cores(n);
  if (ahead) {
    ahead_order_.clear();
    for (const Layer& L : layers_) {
      const Matrix* qkv[3] = {&L.wq, &L.wk, &L.wv};
      const Matrix* gate_up[2] = {&L.w_gate, &L.w_up};
      for (const kernels::MatVecGroupPlan& g : L.qkv) {
        for (int i : g.members) ahead_order_.push_back(&qkv[i]->w);
      }
      ahead_order_.push_back(&L.wo.w);
      if (L.moe) continue;  // its feed-forward runs its own kernels (EnqueueMoe)
      for (const kernels::MatVecGroupPlan& g : L.gate_up) {
        for (int i : g.members) ahead_order_.push_back(&gate_up[i]->w);
      }
      ahead_order_.push_back(&L.w_down.w);
    }
    DPL_RETURN_IF_ERROR(ahead_->Begin(ahead_order_, b.w_f16, b.w_f16_ahead, w_f16_elems_, s));
  }
  auto mm = [&](const Matrix& m, const float* x, const kernels::MatVecOut& out, int rows, bool gemm) {
    if (gemm) {
      if (ahead && ahead_->Next(m.w)) {
        return ahead_->Run(*gemm_, m.w, b.x_f16, rows, out.y, out.bias, out.residual);
      }
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
                      const kernels::MatVecOut* outs, const float* x, bool gemm,
                      const kernels::MatVecRope& rope = {}) -> absl::Status {
    for (const kernels::MatVecGroupPlan& g : groups) {
      if (gemm) {
        for (int i : g.members) DPL_RETURN_IF_ERROR(mm(*ms[i], x, outs[i], n, true));
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
      io.rope = rope;
      DPL_RETURN_IF_ERROR(kernels::RunMatVecGroup(absl::MakeConstSpan(ws, g.members.size()), g.plan,
                                                  absl::MakeConstSpan(os, g.members.size()), io, s));
    }
    return absl::OkStatus();
  };

  DPL_RETURN_IF_ERROR(kernels::EmbedRows(embed_, b.tokens, n, b.x, s));
  // One token: RoPE and the cache write go in the Q/K/V matvec's epilogue
  // where the model allows (rope_fold_ok_), with this step's cos, sin.
  const bool rope_fold = rope_fold_ok_ && n == 1 && !tensor_cores(n);
  if (rope_fold) {
    DPL_RETURN_IF_ERROR(kernels::RopeTable(b.positions, b.inv_freq, rope_shape_.n_rot / 2,
                                           b.rope_cs, s, pdl));
  }
  // A step's rows reach their regions through b.row_seq on the device, a
  // packed prompt pass's through b.pass_seq; one prompt's tokens all write
  // one region, addressed by its offset. Paged, every pass's rows name
  // their sequence (RunChunk stages b.pass_seq too) and the kernels reach
  // the rows through the block tables (kv_pages_).
  const bool packed = step == nullptr && (segments.size() > 1 || n_step_rows > 0);
  const bool paged = kv_layout_.paged();
  const uint64_t region = step != nullptr || packed || paged ? 0 : kv_layout_.SeqOffset(segments[0].seq);
  const int* row_seq = step != nullptr ? b.row_seq : packed || paged ? b.pass_seq : nullptr;
  // A packed pass's chunks go through prompt attention in one launch a
  // layer: their query tiles, planned here, staged once for every layer
  // (at most T tiles: a chunk has a tile per 64 tokens, and a token at least).
  const bool one_launch = packed && tuning_.prompt_attn_one_launch;
  if (one_launch) {
    std::vector<kernels::PromptChunk> chunks;
    chunks.reserve(segments.size());
    for (const Segment& g : segments) chunks.push_back({g.seq, g.first_pos, g.row, g.n});
    h_prompt_tiles_ = kernels::PlanPromptTiles(chunks);
    // Pageable memory: the copy has read the vector when this call returns,
    // and the pass ends with a stream sync before the vector changes.
    DPL_CUDA_CHECK(cudaMemcpyAsync(b.prompt_tiles, h_prompt_tiles_.data(),
                                   h_prompt_tiles_.size() * sizeof(kernels::PromptTile),
                                   cudaMemcpyHostToDevice, s));
  }
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Layer& L = layers_[l];
    uint16_t* k_cache = b.kv + kv_layout_.KOffset(static_cast<int>(l)) + region;
    uint16_t* v_cache = b.kv + kv_layout_.VOffset(static_cast<int>(l)) + region;
    // Attention block.
    const bool qkv_gemm = via_gemm(tuning_.wide_gemm_qkv_rows);
    const bool o_gemm = via_gemm(tuning_.wide_gemm_o_rows);
    DPL_RETURN_IF_ERROR(norm_prepare(b.x, L.attn_norm, n, qkv_gemm));
    // q, k, v = Wq h, Wk h, Wv h (+ biases); q and k rotated (RoPE), k and
    // v written to the cache at the token's position.
    const Matrix* qkv[3] = {&L.wq, &L.wk, &L.wv};
    using kernels::MatVecRole;
    const kernels::MatVecOut qkv_out[3] = {
        {b.q, L.bq, nullptr, rope_fold ? MatVecRole::kRopeQ : MatVecRole::kPlain},
        {b.k, L.bk, nullptr, rope_fold ? MatVecRole::kRopeK : MatVecRole::kPlain},
        {b.v, L.bv, nullptr, rope_fold ? MatVecRole::kCacheV : MatVecRole::kPlain}};
    kernels::MatVecRope rope;
    if (rope_fold) {
      rope = {b.positions, row_seq, b.rope_cs, k_cache, v_cache, rope_shape_.head_dim,
              rope_shape_.n_head_kv, rope_shape_.n_ctx, hp_.rope_style == model::RopeStyle::kNeox, kv_pages_};
    }
    DPL_RETURN_IF_ERROR(mm_group(L.qkv, qkv, qkv_out, b.h, qkv_gemm, rope));
    if (!rope_fold) {
      DPL_RETURN_IF_ERROR(kernels::RopeWriteKv(rope_shape_, hp_.rope_style, b.positions, b.inv_freq,
                                               L.head_norms, b.q, b.k, b.v, k_cache, v_cache, n, s,
                                               pdl, row_seq, kv_pages_));
    }
    if (step != nullptr || n == 1) {  // flash-decoding, one query row per sequence, positions read on the device
      // a, and on the dp4a path a's int8 blocks for Wo, from the combine.
      std::optional<kernels::QuantOut> aq;
      if (!o_gemm && tuning_.attn_quantize_output) {
        DPL_ASSIGN_OR_RETURN(aq, kernels::QuantizeInto(Q, n, &b.qx));
      }
      const kernels::DecodeAttentionPlan& plan = step != nullptr ? step->attn : buckets_.front().attn;
      DPL_RETURN_IF_ERROR(kernels::DecodeAttention(plan, b.q, k_cache, v_cache, b.positions,
                                                   b.attn_ws, b.att, s, aq ? &*aq : nullptr, row_seq,
                                                   kv_pages_));
      if (!aq) DPL_RETURN_IF_ERROR(prepare(b.att, Q, n, o_gemm));
    } else {  // causal flash attention over each sequence's chunk
      if (n_step_rows > 0) {
        // A mixed pass's decode rows first (rows 0..k of step_rows's plan;
        // its other rows are chunk rows, their results overwritten below).
        DPL_RETURN_IF_ERROR(kernels::DecodeAttention(step_rows->attn, b.q, k_cache, v_cache, b.positions,
                                                     b.attn_ws, b.att, s, nullptr, b.row_seq, kv_pages_));
      }
      if (one_launch) {  // every chunk's tiles in one launch (the layer's arrays: region 0)
        DPL_RETURN_IF_ERROR(kernels::PromptAttentionBatch(prompt_attn_, b.q, k_cache, v_cache, h_prompt_tiles_,
                                                          b.prompt_tiles, b.att, s, kv_pages_));
      } else {
        for (const Segment& g : segments) {
          const uint64_t at = packed && !paged ? kv_layout_.SeqOffset(g.seq) : 0;
          DPL_RETURN_IF_ERROR(kernels::PromptAttention(prompt_attn_, b.q + static_cast<int64_t>(g.row) * Q,
                                                       k_cache + at, v_cache + at, g.first_pos, g.n,
                                                       b.att + static_cast<int64_t>(g.row) * Q, s, kv_pages_,
                                                       g.seq));
        }
      }
      DPL_RETURN_IF_ERROR(prepare(b.att, Q, n, o_gemm));
    }
    DPL_RETURN_IF_ERROR(mm(L.wo, b.att, {b.x, L.bo, b.x}, n, o_gemm));  // x += Wo a
    // Feed-forward block.
    if (L.moe) {
      DPL_RETURN_IF_ERROR(EnqueueMoe(*L.moe, static_cast<int>(l), L.ffn_norm, n, pdl));
      continue;
    }
    DPL_RETURN_IF_ERROR(norm_prepare(b.x, L.ffn_norm, n, tensor_cores(n)));
    const Matrix* gate_up[2] = {&L.w_gate, &L.w_up};
    const kernels::MatVecOut gate_up_out[2] = {{b.gate, nullptr, nullptr}, {b.up, nullptr, nullptr}};
    DPL_RETURN_IF_ERROR(mm_group(L.gate_up, gate_up, gate_up_out, b.h, tensor_cores(n)));
    const bool down_gemm =
        via_gemm(L.w_down.w.type == formats::GgmlType::kQ6_K ? tuning_.wide_gemm_q6k_down_rows : 0);
    if (down_gemm) {  // g = silu(gate) * up, straight to the f16 the products read
      DPL_RETURN_IF_ERROR(kernels::SwiGluF16(b.gate, b.up, b.x_f16, static_cast<int64_t>(n) * F, s));
    } else {
      DPL_RETURN_IF_ERROR(kernels::SwiGluQuantizeActivations(b.gate, b.up, F, n, b.gate, &b.qx, s, pdl));
    }
    DPL_RETURN_IF_ERROR(mm(L.w_down, b.gate, {b.x, nullptr, b.x}, n, down_gemm));  // x += Wdown g
  }
  if (ahead) DPL_RETURN_IF_ERROR(ahead_->End());
  // LM head: every token's (a step: every row's) logits, or the last token's
  // only; a packed pass's segments' last tokens, gathered into rows.
  if (packed) {
    // Logits rows: the decode rows', then each chunk's last token's.
    if (n_step_rows > 0) {
      DPL_CUDA_CHECK(cudaMemcpyAsync(b.head_x, b.x, static_cast<size_t>(n_step_rows) * E * sizeof(float),
                                     cudaMemcpyDeviceToDevice, s));
    }
    const int k = n_step_rows + static_cast<int>(segments.size());
    for (int i = n_step_rows; i < k; ++i) {
      const Segment& g = segments[static_cast<size_t>(i - n_step_rows)];
      DPL_CUDA_CHECK(cudaMemcpyAsync(b.head_x + static_cast<int64_t>(i) * E,
                                     b.x + static_cast<int64_t>(g.row + g.n - 1) * E, E * sizeof(float),
                                     cudaMemcpyDeviceToDevice, s));
    }
    DPL_RETURN_IF_ERROR(norm_prepare(b.head_x, output_norm_, k, tensor_cores(k)));
    return mm(out_, b.h, {b.logits, nullptr, nullptr}, k, tensor_cores(k));
  }
  const int first = all_logits ? 0 : n - 1;
  const int rows = n - first;
  DPL_RETURN_IF_ERROR(norm_prepare(b.x + first * E, output_norm_, rows, tensor_cores(rows)));
  return mm(out_, b.h, {b.logits, nullptr, nullptr}, rows, tensor_cores(rows));
}

// Per slice of m rows (the slices are independent: each row's routing and
// sum read only that row):
//   h = rmsnorm(x) * ffn_norm (float32 for the router, int8 for the experts)
//   logits = Wrouter h;  ids, w = RouteTopK(logits)
//   g = silu(Wgate[ids] h) * Wup[ids] h      (a row per route, m * k of them)
//   x += sum_j w_j Wdown[ids_j] g_j
// Every launch reads the experts' ids from device memory: the graph holds
// the same kernels whatever the router picks. Prompt slices run the same
// per-route products as a step (kernels/matvec/moe.h says what that costs).
absl::Status CudaDecoder::EnqueueMoe(const MoeLayer& moe, int layer, const float* ffn_norm, int n, bool pdl) {
  const int E = static_cast<int>(hp_.n_embd), X = static_cast<int>(hp_.n_ff_exp);
  const int k = static_cast<int>(hp_.n_expert_used), n_expert = static_cast<int>(hp_.n_expert);
  const float eps = static_cast<float>(hp_.rms_eps);
  cudaStream_t s = stream_.get();
  Buffers& b = buf_;
  for (int r0 = 0; r0 < n; r0 += moe_rows_) {
    const int m = std::min(moe_rows_, n - r0);
    float* x = b.x + static_cast<int64_t>(r0) * E;  // (m, E)
    float* h = b.h + static_cast<int64_t>(r0) * E;  // (m, E)
    DPL_RETURN_IF_ERROR(kernels::MoeNormQuantize(x, ffn_norm, eps, E, m, h, b.moe_h, s, pdl));
    kernels::MatVecIo io;
    io.x = h;
    io.n_tokens = m;
    io.y = b.moe_logits;
    DPL_RETURN_IF_ERROR(kernels::RunMatVec(moe.router.w, moe.router.plan, io, s));
    int* log = b.route_log != nullptr
                   ? b.route_log + (static_cast<int64_t>(layer) * route_log_rows_ + r0) * k
                   : nullptr;
    DPL_RETURN_IF_ERROR(kernels::RouteTopK(b.moe_logits, m, n_expert, k, b.moe_ids, b.moe_w, s, pdl, log));
    const int routes = m * k;
    // Routes numbering at least the experts (tuning): grouped by expert,
    // each expert's weights read once per tile of its routes on the int8
    // tensor cores (within ~1e-6 of a CTA column a route). One tile size for
    // the three products (RouteGroups' tiles serve all): 8 unless every
    // expert tensor has the tensor-core form.
    const bool grouped = tuning_.moe_grouped_min_fill_pct > 0 && m > 1 &&
                         int64_t{routes} * 100 >= int64_t{tuning_.moe_grouped_min_fill_pct} * n_expert;
    int tile = kernels::kMoeTileRoutes;
    if (grouped) {
      tile = std::min({kernels::MoeTileRoutes(routes, n_expert, moe.gate_plan.kernel, E),
                       kernels::MoeTileRoutes(routes, n_expert, moe.up_plan.kernel, E),
                       kernels::MoeTileRoutes(routes, n_expert, moe.down_plan.kernel, X)});
      DPL_RETURN_IF_ERROR(kernels::RouteGroups(b.moe_ids, routes, tile, b.moe_groups, s, pdl));
    }
    auto experts = [&](absl::Span<const kernels::ExpertOut> parts, const kernels::MoeActs& in, int n_cols,
                       int x_div) {
      return grouped ? kernels::ExpertMatVecGrouped(parts, in, n_cols, routes, x_div, b.moe_groups, tile, s, pdl)
                     : kernels::ExpertMatVec(parts, in, n_cols, routes, x_div, b.moe_ids, s, pdl);
    };
    const kernels::ExpertOut gate_up[2] = {{&moe.gate, &moe.gate_plan, b.moe_gate},
                                           {&moe.up, &moe.up_plan, b.moe_up}};
    if (moe.gate_up_grouped) {
      DPL_RETURN_IF_ERROR(experts(gate_up, b.moe_h, E, k));
    } else {
      for (const kernels::ExpertOut& o : gate_up) DPL_RETURN_IF_ERROR(experts({o}, b.moe_h, E, k));
    }
    DPL_RETURN_IF_ERROR(kernels::MoeSwiGluQuantize(b.moe_gate, b.moe_up, X, routes, b.moe_gate, b.moe_g, s, pdl));
    const kernels::ExpertOut down[1] = {{&moe.down, &moe.down_plan, b.moe_down}};
    DPL_RETURN_IF_ERROR(experts(down, b.moe_g, X, 1));
    DPL_RETURN_IF_ERROR(kernels::MoeCombine(b.moe_down, b.moe_w, m, k, E, x, s, pdl));
  }
  return absl::OkStatus();
}

absl::Status CudaDecoder::EnqueueStep(const Bucket& bucket, bool sample) {
  Buffers& b = buf_;
  cudaStream_t s = stream_.get();
  DPL_RETURN_IF_ERROR(kernels::GatherStepRows(b.row_seq, b.seq_token, b.seq_pos, bucket.batch,
                                              b.tokens, b.positions, s));
  DPL_RETURN_IF_ERROR(EnqueueForward(bucket.batch, &bucket, /*segments=*/{}, /*all_logits=*/true));
  if (sample) {
    // The rows' input ids are spent by now: their sampled ids replace them.
    DPL_RETURN_IF_ERROR(SampleRows(bucket.batch, b.logits, b.tokens));
  }
  // The step moves its sequences on itself, so back-to-back replays decode
  // consecutive positions (SampleLoop, dpl-bench).
  return kernels::FinishStepRows(b.row_seq, bucket.batch, sample ? b.tokens : nullptr,
                                 b.seq_token, b.seq_pos, s);
}

absl::Status CudaDecoder::SampleRows(int rows, float* logits, int* tokens_out) {
  kernels::SampleBatch sb;
  sb.params = buf_.params;
  sb.n_seqs = n_seq();
  sb.slots = buf_.row_seq;
  sb.batch = rows;
  sb.logits = logits;
  sb.n_vocab = static_cast<int>(hp_.n_vocab);
  sb.rings = buf_.rings;
  sb.ring_stride = ring_stride_;
  sb.states = buf_.sampler;
  sb.workspace = buf_.sampling_ws;
  sb.tokens_out = tokens_out;
  sb.allowed = buf_.allowed;
  sb.allowed_on = buf_.allowed_on;
  sb.bias = buf_.bias;
  sb.n_bias = buf_.n_bias;
  return kernels::SampleTokens(sb, stream_.get());
}

absl::Status CudaDecoder::SetAllowedTokens(int seq, absl::Span<const uint32_t> mask) {
  DPL_RETURN_IF_ERROR(CheckSeq(seq));
  const size_t words = kernels::AllowedWords(static_cast<int>(hp_.n_vocab));
  if (mask.size() != words) {
    return absl::InvalidArgumentError(absl::StrCat("SetAllowedTokens: a mask of ", mask.size(),
                                                   " words; ", hp_.n_vocab, " tokens need ", words));
  }
  // Staged in pinned memory (the copy reads it when it runs), one region a
  // sequence: the next call for this sequence comes after a step that
  // synchronized, so the copy has run by then.
  uint32_t* staged = h_allowed_.get() + static_cast<size_t>(seq) * words;
  std::copy(mask.begin(), mask.end(), staged);
  cudaStream_t s = stream_.get();
  DPL_CUDA_CHECK(cudaMemcpyAsync(buf_.allowed + static_cast<size_t>(seq) * words, staged,
                                 words * 4, cudaMemcpyHostToDevice, s));
  DPL_CUDA_CHECK(cudaMemsetAsync(buf_.allowed_on + seq, 1, 1, s));  // nonzero: on
  return absl::OkStatus();
}

absl::Status CudaDecoder::ClearAllowedTokens(int seq) {
  DPL_RETURN_IF_ERROR(CheckSeq(seq));
  DPL_CUDA_CHECK(cudaMemsetAsync(buf_.allowed_on + seq, 0, 4, stream_.get()));
  return absl::OkStatus();
}

absl::Status CudaDecoder::SetLogitBias(int seq, absl::Span<const kernels::LogitBias> bias) {
  DPL_RETURN_IF_ERROR(CheckSeq(seq));
  DPL_RETURN_IF_ERROR(kernels::CheckLogitBias(bias, hp_.n_vocab));
  // Staged in pinned memory, one region a sequence, as SetAllowedTokens'
  // masks: a later call for the sequence comes after a step that
  // synchronized (the copies have run), or else its own copies, enqueued
  // after these and before any draw, write the whole list again.
  kernels::LogitBias* staged = h_bias_.get() + static_cast<size_t>(seq) * kernels::kMaxLogitBias;
  std::copy(bias.begin(), bias.end(), staged);
  int* count = h_n_bias_.get() + seq;
  *count = static_cast<int>(bias.size());
  cudaStream_t s = stream_.get();
  if (!bias.empty()) {
    DPL_CUDA_CHECK(cudaMemcpyAsync(buf_.bias + static_cast<size_t>(seq) * kernels::kMaxLogitBias, staged,
                                   bias.size() * sizeof(kernels::LogitBias), cudaMemcpyHostToDevice, s));
  }
  DPL_CUDA_CHECK(cudaMemcpyAsync(buf_.n_bias + seq, count, sizeof(int), cudaMemcpyHostToDevice, s));
  return absl::OkStatus();
}

absl::Status CudaDecoder::ClearLogitBias(int seq) {
  DPL_RETURN_IF_ERROR(CheckSeq(seq));
  DPL_CUDA_CHECK(cudaMemsetAsync(buf_.n_bias + seq, 0, 4, stream_.get()));
  return absl::OkStatus();
}

absl::Status CudaDecoder::LaunchGenerationStep(const Bucket& bucket) {
  if (bucket.generate) {
    DPL_CUDA_CHECK(cudaGraphLaunch(bucket.generate.get(), stream_.get()));
    return absl::OkStatus();
  }
  return EnqueueStep(bucket, /*sample=*/true);  // eager: the same kernels, launched one by one
}

const CudaDecoder::Bucket& CudaDecoder::BucketFor(int n) const {
  for (const Bucket& b : buckets_) {
    if (b.batch >= n) return b;
  }
  return buckets_.back();  // n <= n_seq: never reached
}

absl::Status CudaDecoder::UploadRows(const Bucket& bucket, int n) {
  int* rows = h_rows_.get();
  for (int r = n; r < bucket.batch; ++r) rows[r] = -1;
  DPL_CUDA_CHECK(cudaMemcpyAsync(buf_.row_seq, rows, bucket.batch * sizeof(int),
                                 cudaMemcpyHostToDevice, stream_.get()));
  return absl::OkStatus();
}

absl::Status CudaDecoder::CheckSeq(int seq) const {
  if (seq < 0 || seq >= n_seq()) {
    return absl::InvalidArgumentError(
        absl::StrCat("sequence ", seq, " is out of range [0, ", n_seq(), ")"));
  }
  return absl::OkStatus();
}

absl::Status CudaDecoder::RunChunk(int seq, absl::Span<const int32_t> tokens, bool all_logits) {
  const int n = static_cast<int>(tokens.size());
  const int first_pos = static_cast<int>(n_past_[seq]);
  cudaStream_t s = stream_.get();
  const Bucket& one = buckets_.front();
  DPL_RETURN_IF_ERROR(UploadTables());
  if (n == 1 && !all_logits && one.forward) {
    // One token (a host-sampled generation step): bucket 1's forward graph,
    // the token and position staged as the sequence's pending ones.
    const int staged[2] = {tokens[0], first_pos};
    h_rows_.get()[0] = seq;
    DPL_RETURN_IF_ERROR(UploadRows(one, 1));
    DPL_CUDA_CHECK(cudaMemcpyAsync(buf_.seq_token + seq, &staged[0], sizeof(int),
                                   cudaMemcpyHostToDevice, s));
    DPL_CUDA_CHECK(cudaMemcpyAsync(buf_.seq_pos + seq, &staged[1], sizeof(int),
                                   cudaMemcpyHostToDevice, s));
    DPL_CUDA_CHECK(cudaGraphLaunch(one.forward.get(), s));
    DPL_CUDA_CHECK(cudaStreamSynchronize(s));  // `staged` must outlive the copies
  } else {
    std::vector<int> positions(n);
    for (int t = 0; t < n; ++t) positions[t] = first_pos + t;
    DPL_CUDA_CHECK(cudaMemcpyAsync(buf_.tokens, tokens.data(), n * sizeof(int),
                                   cudaMemcpyHostToDevice, s));
    DPL_CUDA_CHECK(cudaMemcpyAsync(buf_.positions, positions.data(), n * sizeof(int),
                                   cudaMemcpyHostToDevice, s));
    std::vector<int> row_seq;
    if (kv_layout_.paged()) {  // the rows' sequence, for the block tables
      row_seq.assign(static_cast<size_t>(n), seq);
      DPL_CUDA_CHECK(cudaMemcpyAsync(buf_.pass_seq, row_seq.data(), n * sizeof(int), cudaMemcpyHostToDevice, s));
    }
    const Segment one{seq, first_pos, 0, n};
    DPL_RETURN_IF_ERROR(EnqueueForward(n, /*step=*/nullptr, absl::MakeConstSpan(&one, 1), all_logits));
    DPL_CUDA_CHECK(cudaStreamSynchronize(s));  // the host vectors must outlive the copies
  }
  n_past_[seq] += n;
  last_logits_row_[seq] = all_logits ? n - 1 : 0;
  return absl::OkStatus();
}

absl::Status CudaDecoder::CheckChunk(int seq, absl::Span<const int32_t> tokens) const {
  DPL_RETURN_IF_ERROR(CheckSeq(seq));
  if (tokens.empty()) return absl::InvalidArgumentError("no tokens to evaluate");
  if (n_past_[seq] + static_cast<int64_t>(tokens.size()) > n_ctx_) {
    return absl::OutOfRangeError(absl::StrCat(n_past_[seq] + tokens.size(),
                                              " tokens do not fit in the context of ", n_ctx_,
                                              " (use -c to enlarge it)"));
  }
  DPL_RETURN_IF_ERROR(CheckPages(seq, n_past_[seq] + static_cast<int64_t>(tokens.size())));
  for (int32_t t : tokens) {
    if (t < 0 || t >= hp_.n_vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat("token id ", t, " is outside the vocabulary [0, ", hp_.n_vocab, ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status CudaDecoder::EvalSeqs(absl::Span<const SeqChunk> chunks, std::vector<float>* last) {
  if (chunks.empty()) return absl::InvalidArgumentError("no chunks to evaluate");
  if (chunks.size() == 1) {
    std::vector<float> one;
    DPL_RETURN_IF_ERROR(EvalSeq(chunks[0].seq, chunks[0].tokens, last != nullptr ? &one : nullptr, nullptr));
    if (last != nullptr) *last = std::move(one);
    return absl::OkStatus();
  }
  ++step_count_;  // distinct sequences, as StepSeqs checks them
  return RunPacked({}, {}, chunks, last);
}

absl::Status CudaDecoder::StepWithChunks(absl::Span<const int> seqs, absl::Span<int32_t> next,
                                         absl::Span<const SeqChunk> chunks, std::vector<float>* last) {
  if (chunks.empty()) return StepSeqs(seqs, next);
  if (seqs.empty()) return EvalSeqs(chunks, last);
  DPL_RETURN_IF_ERROR(CheckStepSeqs(seqs, next));  // marks them for the chunks' distinctness check
  return RunPacked(seqs, next, chunks, last);
}

absl::Status CudaDecoder::RunPacked(absl::Span<const int> seqs, absl::Span<int32_t> next,
                                    absl::Span<const SeqChunk> chunks, std::vector<float>* last) {
  // Every chunk checked before anything runs (the step's sequences are
  // checked and marked for this round already); the rows' tokens, positions
  // and sequences staged: the step's rows first (their tokens and positions
  // gathered on the device), then each chunk's.
  const int k = static_cast<int>(seqs.size());
  std::vector<Segment> segments;
  std::vector<int> tokens, positions, row_seq(seqs.begin(), seqs.end());
  for (const SeqChunk& c : chunks) {
    DPL_RETURN_IF_ERROR(CheckChunk(c.seq, c.tokens));
    if (last_step_[c.seq] == step_count_) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", c.seq, " twice in a pass"));
    }
    last_step_[c.seq] = step_count_;
    const int n = static_cast<int>(c.tokens.size()), first_pos = static_cast<int>(n_past_[c.seq]);
    segments.push_back({c.seq, first_pos, k + static_cast<int>(tokens.size()), n});
    for (int t = 0; t < n; ++t) {
      tokens.push_back(c.tokens[static_cast<size_t>(t)]);
      positions.push_back(first_pos + t);
      row_seq.push_back(c.seq);
    }
  }
  const int n = static_cast<int>(row_seq.size());
  if (n > max_batch_) {
    return absl::InvalidArgumentError(
        absl::StrCat("a pass of ", n, " tokens; at most ", max_batch_, " (max_batch)"));
  }
  cudaStream_t s = stream_.get();
  Buffers& b = buf_;
  DPL_RETURN_IF_ERROR(UploadTables());
  const Bucket* step = nullptr;
  if (k > 0) {
    step = &BucketFor(k);
    std::copy(seqs.begin(), seqs.end(), h_rows_.get());
    DPL_RETURN_IF_ERROR(UploadRows(*step, k));
    DPL_RETURN_IF_ERROR(kernels::GatherStepRows(b.row_seq, b.seq_token, b.seq_pos, k, b.tokens, b.positions, s));
  }
  const size_t m = tokens.size();
  DPL_CUDA_CHECK(cudaMemcpyAsync(b.tokens + k, tokens.data(), m * sizeof(int), cudaMemcpyHostToDevice, s));
  DPL_CUDA_CHECK(cudaMemcpyAsync(b.positions + k, positions.data(), m * sizeof(int), cudaMemcpyHostToDevice, s));
  DPL_CUDA_CHECK(cudaMemcpyAsync(b.pass_seq, row_seq.data(), n * sizeof(int), cudaMemcpyHostToDevice, s));
  if (step != nullptr && step->batch > n) {  // the plan's rows past the pass: padding (position -1)
    DPL_CUDA_CHECK(cudaMemsetAsync(b.positions + n, 0xff, (step->batch - n) * sizeof(int), s));
  }
  DPL_RETURN_IF_ERROR(EnqueueForward(n, /*step=*/nullptr, segments, /*all_logits=*/false, step, k));
  if (k > 0) {
    // The step's rows sample (logits rows 0..k) and move their sequences on,
    // as a decode step does.
    DPL_RETURN_IF_ERROR(SampleRows(k, b.logits, b.tokens));
    DPL_RETURN_IF_ERROR(kernels::FinishStepRows(b.row_seq, k, b.tokens, b.seq_token, b.seq_pos, s));
    for (int i = 0; i < k; ++i) {
      DPL_RETURN_IF_ERROR(EnqueueDrawLogits(seqs[i], b.logits + static_cast<int64_t>(i) * hp_.n_vocab));
    }
    DPL_CUDA_CHECK(cudaMemcpyAsync(h_tokens_.get(), b.tokens, k * sizeof(int), cudaMemcpyDeviceToHost, s));
  }
  if (last != nullptr) {
    const size_t V = static_cast<size_t>(hp_.n_vocab);
    last->resize(chunks.size() * V);
    DPL_CUDA_CHECK(cudaMemcpyAsync(last->data(), b.logits + k * V, last->size() * sizeof(float),
                                   cudaMemcpyDeviceToHost, s));
  }
  DPL_CUDA_CHECK(cudaStreamSynchronize(s));  // the host vectors must outlive the copies
  for (int i = 0; i < k; ++i) {
    ++n_past_[seqs[i]];
    next[i] = h_tokens_.get()[i];
    draw_logits_ready_[seqs[i]] = keep_draw_logits_[seqs[i]];
  }
  for (size_t i = 0; i < chunks.size(); ++i) {
    const int seq = chunks[i].seq;
    sampling_[seq] = false;
    n_past_[seq] += static_cast<int64_t>(chunks[i].tokens.size());
    last_logits_row_[seq] = k + static_cast<int>(i);
  }
  return absl::OkStatus();
}

absl::Status CudaDecoder::EvalSeq(int seq, absl::Span<const int32_t> tokens,
                                  std::vector<float>* last, std::vector<float>* all) {
  DPL_RETURN_IF_ERROR(CheckChunk(seq, tokens));
  sampling_[seq] = false;  // a pending token would now be at the wrong position
  const int64_t V = hp_.n_vocab;
  if (all != nullptr) all->clear();
  // Every token's logits fit buf_.logits in chunks of logit_rows_ tokens.
  const size_t step = all != nullptr ? logit_rows_ : max_batch_;
  for (size_t at = 0; at < tokens.size(); at += step) {
    const auto chunk = tokens.subspan(at, std::min<size_t>(step, tokens.size() - at));
    DPL_RETURN_IF_ERROR(RunChunk(seq, chunk, all != nullptr));
    if (all != nullptr) {
      const size_t old = all->size();
      all->resize(old + chunk.size() * V);
      DPL_CUDA_CHECK(cudaMemcpy(all->data() + old, buf_.logits, chunk.size() * V * 4,
                                cudaMemcpyDeviceToHost));
    }
  }
  if (last != nullptr) {
    last->resize(V);
    if (all != nullptr) {
      std::copy(all->end() - V, all->end(), last->begin());
    } else {
      DPL_CUDA_CHECK(cudaMemcpy(last->data(), buf_.logits + last_logits_row_[seq] * V, V * 4,
                                cudaMemcpyDeviceToHost));
    }
  }
  return absl::OkStatus();
}

absl::Status CudaDecoder::RewindSeq(int seq, int64_t n) {
  DPL_RETURN_IF_ERROR(CheckSeq(seq));
  if (n < 0 || n > n_past_[seq]) {
    return absl::InvalidArgumentError(absl::StrCat("cannot rewind sequence ", seq, " to ", n));
  }
  n_past_[seq] = n;  // later positions are overwritten before attention reads them
  sampling_[seq] = false;
  if (tables_.has_value()) tables_->Keep(seq, n);
  return absl::OkStatus();
}

absl::Status CudaDecoder::CopySeqPrefix(int dst, int src, int64_t n) {
  DPL_RETURN_IF_ERROR(CheckSeq(dst));
  DPL_RETURN_IF_ERROR(CheckSeq(src));
  if (dst == src) return absl::InvalidArgumentError(absl::StrCat("cannot copy sequence ", src, " onto itself"));
  if (n < 0 || n > n_past_[src]) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot copy ", n, " positions of sequence ", src, ": it holds ", n_past_[src]));
  }
  if (kv_layout_.paged()) {
    tables_->Share(dst, src, n);  // copied when dst's table comes (SetBlockTable)
  } else if (n > 0) {
    // Rows of head_dim f16 at a pitch of n_ctx positions; the rows of one
    // array (layer l's K or V) are (n_seq, n_kv_head) and the arrays follow
    // each other (K0 V0 K1 V1 ...), so a sequence's rows form one 3-D box:
    // x = n positions, y = its n_kv_head heads, z = 2 n_layer arrays.
    const kernels::KvCacheLayout& L = kv_layout_;
    const size_t pitch = static_cast<size_t>(L.n_ctx) * L.head_dim * sizeof(uint16_t);
    const size_t rows = static_cast<size_t>(L.n_seq) * L.n_kv_head;
    cudaMemcpy3DParms p{};
    p.srcPtr = make_cudaPitchedPtr(buf_.kv + L.SeqOffset(src), pitch, pitch, rows);
    p.dstPtr = make_cudaPitchedPtr(buf_.kv + L.SeqOffset(dst), pitch, pitch, rows);
    p.extent = make_cudaExtent(static_cast<size_t>(n) * L.head_dim * sizeof(uint16_t),
                               static_cast<size_t>(L.n_kv_head), 2 * static_cast<size_t>(L.n_layer));
    p.kind = cudaMemcpyDeviceToDevice;
    DPL_CUDA_CHECK(cudaMemcpy3DAsync(&p, stream_.get()));
  }
  n_past_[dst] = n;
  sampling_[dst] = false;
  return absl::OkStatus();
}

absl::Status CudaDecoder::AdoptSeqPrefix(int seq, int64_t n) {
  if (!tables_.has_value()) return absl::FailedPreconditionError("AdoptSeqPrefix: the KV cache is not paged");
  DPL_RETURN_IF_ERROR(CheckSeq(seq));
  if (n > n_ctx_) {
    return absl::InvalidArgumentError(absl::StrCat("cannot adopt ", n, " positions into sequence ", seq,
                                                   " of ", n_ctx_));
  }
  DPL_RETURN_IF_ERROR(tables_->Adopt(seq, n));  // checks n >= 0 and the table
  n_past_[seq] = n;
  sampling_[seq] = false;
  return absl::OkStatus();
}

absl::Status CudaDecoder::SetBlockTable(int seq, absl::Span<const int> blocks) {
  if (!tables_.has_value()) return absl::FailedPreconditionError("SetBlockTable: the KV cache is not paged");
  DPL_RETURN_IF_ERROR(CheckSeq(seq));
  // The staging row may still be read by the last pass's upload.
  DPL_CUDA_CHECK(cudaEventSynchronize(tables_uploaded_.get()));
  DPL_ASSIGN_OR_RETURN(const std::vector<kv::BlockCopy> copies, tables_->Set(seq, blocks, n_past_[seq]));
  // Each copy: `rows` positions of every kv head (rows of head_dim f16 at a
  // pitch of one block's positions) of every array (K0 V0 K1 V1 ...: a
  // block's heads are (n_blocks, n_kv_head) rows of the array), one 3-D box.
  const kernels::KvCacheLayout& L = kv_layout_;
  const size_t row_bytes = static_cast<size_t>(L.head_dim) * sizeof(uint16_t);
  const size_t pitch = static_cast<size_t>(L.block()) * row_bytes;
  const size_t heads = static_cast<size_t>(L.n_blocks) * L.n_kv_head;
  for (const kv::BlockCopy& c : copies) {
    cudaMemcpy3DParms p{};
    p.srcPtr = make_cudaPitchedPtr(buf_.kv + L.BlockOffset(c.src), pitch, pitch, heads);
    p.dstPtr = make_cudaPitchedPtr(buf_.kv + L.BlockOffset(c.dst), pitch, pitch, heads);
    p.extent = make_cudaExtent(static_cast<size_t>(c.rows) * row_bytes, static_cast<size_t>(L.n_kv_head),
                               2 * static_cast<size_t>(L.n_layer));
    p.kind = cudaMemcpyDeviceToDevice;
    DPL_CUDA_CHECK(cudaMemcpy3DAsync(&p, stream_.get()));
  }
  int* row = h_tables_.get() + static_cast<size_t>(seq) * L.max_blocks();
  std::copy(blocks.begin(), blocks.end(), row);
  return absl::OkStatus();
}

absl::Status CudaDecoder::CheckPages(int seq, int64_t positions) const {
  if (!tables_.has_value()) return absl::OkStatus();
  return tables_->CheckRun(seq, positions);
}

absl::Status CudaDecoder::UploadTables() {
  if (!tables_.has_value()) return absl::OkStatus();
  const std::vector<int> changed = tables_->TakeChanged();
  if (changed.empty()) return absl::OkStatus();
  cudaStream_t s = stream_.get();
  const size_t width = static_cast<size_t>(kv_layout_.max_blocks());
  for (int seq : changed) {
    // The table's entries; those past it keep earlier (valid) block ids.
    const size_t n = tables_->table(seq).size();
    if (n == 0) continue;
    const size_t at = static_cast<size_t>(seq) * width;
    DPL_CUDA_CHECK(cudaMemcpyAsync(buf_.kv_tables + at, h_tables_.get() + at, n * sizeof(int),
                                   cudaMemcpyHostToDevice, s));
  }
  DPL_CUDA_CHECK(cudaEventRecord(tables_uploaded_.get(), s));
  return absl::OkStatus();
}

std::vector<int> CudaDecoder::step_buckets() const {
  std::vector<int> out;
  for (const Bucket& b : buckets_) out.push_back(b.batch);
  return out;
}

absl::StatusOr<double> CudaDecoder::TimeDecodeSteps(int n, int batch) {
  if (eager_) return absl::FailedPreconditionError("no captured graph (eager mode)");
  if (batch < 1 || batch > n_seq()) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch ", batch, " is out of range [1, ", n_seq(), "]"));
  }
  for (int seq = 0; seq < batch; ++seq) {
    if (n_past_[seq] + n > n_ctx_) {
      return absl::OutOfRangeError(absl::StrCat("sequence ", seq, ": ", n,
                                                " decode steps from position ", n_past_[seq],
                                                " run past the context of ", n_ctx_));
    }
    DPL_RETURN_IF_ERROR(CheckPages(seq, n_past_[seq] + n));
  }
  DPL_RETURN_IF_ERROR(UploadTables());
  // The bucket a server's step of `batch` sequences takes (padding rows
  // included when batch is not a bucket size).
  Bucket* bucket = &buckets_[&BucketFor(batch) - buckets_.data()];
  cudaStream_t s = stream_.get();
  if (!bucket->forward) {
    DPL_ASSIGN_OR_RETURN(bucket->forward, kernels::CaptureGraph(s, [&] {
                           return EnqueueStep(*bucket, /*sample=*/false);
                         }));
  }
  std::vector<int> pos(batch);
  for (int seq = 0; seq < batch; ++seq) {
    h_rows_.get()[seq] = seq;
    pos[seq] = static_cast<int>(n_past_[seq]);
  }
  DPL_RETURN_IF_ERROR(UploadRows(*bucket, batch));
  DPL_CUDA_CHECK(cudaMemcpyAsync(buf_.seq_pos, pos.data(), batch * sizeof(int),
                                 cudaMemcpyHostToDevice, s));
  DPL_ASSIGN_OR_RETURN(const kernels::Event start, kernels::CreateEvent(cudaEventDefault));
  DPL_ASSIGN_OR_RETURN(const kernels::Event stop, kernels::CreateEvent(cudaEventDefault));
  DPL_CUDA_CHECK(cudaEventRecord(start.get(), s));
  for (int i = 0; i < n; ++i) DPL_CUDA_CHECK(cudaGraphLaunch(bucket->forward.get(), s));
  DPL_CUDA_CHECK(cudaEventRecord(stop.get(), s));
  DPL_CUDA_CHECK(cudaEventSynchronize(stop.get()));
  float ms = 0;
  DPL_CUDA_CHECK(cudaEventElapsedTime(&ms, start.get(), stop.get()));
  for (int seq = 0; seq < batch; ++seq) {
    n_past_[seq] += n;
    sampling_[seq] = false;
  }
  return ms / 1e3;
}

absl::Status CudaDecoder::StartSampling(int seq, const generate::SamplerParams& params,
                                        absl::Span<const int32_t> history, bool restart_draws) {
  DPL_RETURN_IF_ERROR(CheckSeq(seq));
  if (n_past_[seq] == 0) return absl::FailedPreconditionError("sampling needs a prompt first");
  kernels::SamplingParams& p = h_params_.get()[0];
  p = params;
  // The ring holds at most ring_stride_ tokens; no penalty, no ring.
  const bool penalized = params.repeat_penalty != 1.0f || params.presence_penalty != 0.0f ||
                         params.frequency_penalty != 0.0f;
  p.repeat_last_n = penalized ? std::clamp(params.repeat_last_n, 0, ring_stride_) : 0;
  cudaStream_t s = stream_.get();
  Buffers& b = buf_;
  DPL_CUDA_CHECK(cudaMemcpyAsync(b.params + seq, &p, sizeof(p), cudaMemcpyHostToDevice, s));
  kernels::SamplerState* state = b.sampler + seq;
  // The RNG counter carries on unless the caller starts a new sequence of draws.
  if (restart_draws) DPL_CUDA_CHECK(cudaMemsetAsync(&state->step, 0, sizeof(state->step), s));
  // The penalty ring from the history (empty without a penalty).
  const kernels::RecentRing ring = kernels::MakeRecentRing(history, p.repeat_last_n);
  if (!ring.tokens.empty()) {
    DPL_CUDA_CHECK(cudaMemcpyAsync(b.rings + static_cast<int64_t>(seq) * ring_stride_,
                                   ring.tokens.data(), ring.tokens.size() * sizeof(int),
                                   cudaMemcpyHostToDevice, s));
  }
  const int32_t head_count[2] = {ring.head, ring.count};
  DPL_CUDA_CHECK(cudaMemcpyAsync(&state->ring_head, head_count, sizeof(head_count),
                                 cudaMemcpyHostToDevice, s));
  const int pos = static_cast<int>(n_past_[seq]);
  DPL_CUDA_CHECK(cudaMemcpyAsync(b.seq_pos + seq, &pos, sizeof(int), cudaMemcpyHostToDevice, s));
  // The first token comes from the prompt's last logits, still in
  // b.logits, straight into the sequence's pending token.
  h_rows_.get()[0] = seq;
  DPL_CUDA_CHECK(cudaMemcpyAsync(b.row_seq, h_rows_.get(), sizeof(int), cudaMemcpyHostToDevice, s));
  float* row = b.logits + static_cast<int64_t>(last_logits_row_[seq]) * hp_.n_vocab;
  DPL_RETURN_IF_ERROR(SampleRows(1, row, b.seq_token + seq));
  DPL_RETURN_IF_ERROR(EnqueueDrawLogits(seq, row));
  DPL_CUDA_CHECK(cudaMemcpyAsync(&h_tokens_.get()[0], b.seq_token + seq, sizeof(int),
                                 cudaMemcpyDeviceToHost, s));
  DPL_CUDA_CHECK(cudaEventRecord(token_ready_[0].get(), s));
  // The host copies above read `head_count` and `pos` when they run.
  DPL_CUDA_CHECK(cudaStreamSynchronize(s));
  sampling_[seq] = true;
  draw_logits_ready_[seq] = keep_draw_logits_[seq];
  return absl::OkStatus();
}

absl::StatusOr<int32_t> CudaDecoder::BeginSampling(int seq, const generate::SamplerParams& params,
                                                   absl::Span<const int32_t> history) {
  DPL_RETURN_IF_ERROR(StartSampling(seq, params, history, /*restart_draws=*/true));
  return h_tokens_.get()[0];
}

absl::Status CudaDecoder::CheckStepSeqs(absl::Span<const int> seqs, absl::Span<int32_t> next) {
  const int k = static_cast<int>(seqs.size());
  if (k == 0 || k > n_seq()) {
    return absl::InvalidArgumentError(
        absl::StrCat("a step of ", k, " sequences (1 to ", n_seq(), ")"));
  }
  if (next.size() != seqs.size()) {
    return absl::InvalidArgumentError("StepSeqs: one output per sequence");
  }
  // Distinct: each sequence's last step index, kept across steps (no
  // per-step allocation).
  ++step_count_;
  for (int seq : seqs) {
    DPL_RETURN_IF_ERROR(CheckSeq(seq));
    if (last_step_[seq] == step_count_) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", seq, " twice in a step"));
    }
    last_step_[seq] = step_count_;
    if (!sampling_[seq]) {
      return absl::FailedPreconditionError(
          absl::StrCat("sequence ", seq, ": a step before BeginSampling"));
    }
    if (n_past_[seq] >= n_ctx_) {
      return absl::OutOfRangeError(
          absl::StrCat("sequence ", seq, ": the context of ", n_ctx_, " positions is full"));
    }
    DPL_RETURN_IF_ERROR(CheckPages(seq, n_past_[seq] + 1));
  }
  return absl::OkStatus();
}

absl::Status CudaDecoder::StepSeqs(absl::Span<const int> seqs, absl::Span<int32_t> next) {
  DPL_RETURN_IF_ERROR(CheckStepSeqs(seqs, next));
  const int k = static_cast<int>(seqs.size());
  const Bucket& bucket = BucketFor(k);
  DPL_RETURN_IF_ERROR(UploadTables());
  std::copy(seqs.begin(), seqs.end(), h_rows_.get());
  DPL_RETURN_IF_ERROR(UploadRows(bucket, k));
  cudaStream_t s = stream_.get();
  DPL_RETURN_IF_ERROR(LaunchGenerationStep(bucket));
  for (int i = 0; i < k; ++i) {
    DPL_RETURN_IF_ERROR(EnqueueDrawLogits(seqs[i], buf_.logits + static_cast<int64_t>(i) * hp_.n_vocab));
  }
  DPL_CUDA_CHECK(cudaMemcpyAsync(h_tokens_.get(), buf_.tokens, k * sizeof(int),
                                 cudaMemcpyDeviceToHost, s));
  DPL_CUDA_CHECK(cudaStreamSynchronize(s));
  for (int i = 0; i < k; ++i) {
    ++n_past_[seqs[i]];  // its pending token is now in the cache
    next[i] = h_tokens_.get()[i];
    draw_logits_ready_[seqs[i]] = keep_draw_logits_[seqs[i]];
  }
  return absl::OkStatus();
}

absl::Status CudaDecoder::StepLogits(int i, std::vector<float>* out) const {
  if (i < 0 || i >= logit_rows_) {
    return absl::InvalidArgumentError(absl::StrCat("logits row ", i, " out of range"));
  }
  out->resize(hp_.n_vocab);
  DPL_CUDA_CHECK(cudaMemcpy(out->data(), buf_.logits + static_cast<int64_t>(i) * hp_.n_vocab,
                            hp_.n_vocab * sizeof(float), cudaMemcpyDeviceToHost));
  return absl::OkStatus();
}

absl::Status CudaDecoder::KeepDrawLogits(int seq, bool on) {
  DPL_RETURN_IF_ERROR(CheckSeq(seq));
  if (on && h_draw_logits_.size() == 0) {
    DPL_ASSIGN_OR_RETURN(h_draw_logits_, kernels::PinnedBuffer<float>::Allocate(
                                             static_cast<size_t>(n_seq()) * static_cast<size_t>(hp_.n_vocab)));
  }
  keep_draw_logits_[seq] = on;
  draw_logits_ready_[seq] = false;
  return absl::OkStatus();
}

absl::StatusOr<absl::Span<const float>> CudaDecoder::DrawLogits(int seq) const {
  DPL_RETURN_IF_ERROR(CheckSeq(seq));
  if (!draw_logits_ready_[seq]) {
    return absl::FailedPreconditionError(absl::StrCat("sequence ", seq, ": no draw's logits kept"));
  }
  const size_t V = static_cast<size_t>(hp_.n_vocab);
  return absl::Span<const float>(h_draw_logits_.get() + static_cast<size_t>(seq) * V, V);
}

absl::StatusOr<std::vector<int32_t>> CudaDecoder::RecordedRoutes(int rows) const {
  if (route_log_rows_ == 0) {
    return absl::FailedPreconditionError("no routes recorded: a MoE model opened with record_routes");
  }
  if (rows < 1 || rows > route_log_rows_) {
    return absl::InvalidArgumentError(absl::StrCat("recorded routes: ", rows, " rows, the log holds 1..",
                                                   route_log_rows_));
  }
  const size_t L = hp_.n_layer, k = hp_.n_expert_used, row_bytes = k * sizeof(int32_t);
  std::vector<int32_t> out(L * rows * k);
  DPL_CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
  // Each layer's first `rows` rows of its route_log_rows_.
  DPL_CUDA_CHECK(cudaMemcpy2D(out.data(), rows * row_bytes, buf_.route_log, route_log_rows_ * row_bytes,
                              rows * row_bytes, L, cudaMemcpyDeviceToHost));
  return out;
}

absl::Status CudaDecoder::EnqueueDrawLogits(int seq, const float* row) {
  if (!keep_draw_logits_[seq]) return absl::OkStatus();
  const size_t V = static_cast<size_t>(hp_.n_vocab);
  DPL_CUDA_CHECK(cudaMemcpyAsync(h_draw_logits_.get() + static_cast<size_t>(seq) * V, row, V * sizeof(float),
                                 cudaMemcpyDeviceToHost, stream_.get()));
  return absl::OkStatus();
}

absl::StatusOr<int32_t> CudaDecoder::NextToken() {
  const int seq = 0;
  int32_t token = 0;
  DPL_RETURN_IF_ERROR(StepSeqs(absl::MakeConstSpan(&seq, 1), absl::MakeSpan(&token, 1)));
  return token;
}

absl::Status CudaDecoder::SampleLoop(const generate::SamplerParams& params,
                                     absl::Span<const int32_t> history, int32_t max_tokens,
                                     const std::function<bool(int32_t)>& on_token) {
  if (kv_layout_.paged()) {  // its steps run ahead of any block table (StepSeqs checks each)
    return absl::FailedPreconditionError("SampleLoop runs on a cache of regions, not a paged one");
  }
  DPL_RETURN_IF_ERROR(StartSampling(0, params, history, /*restart_draws=*/false));
  const Bucket& one = buckets_.front();
  h_rows_.get()[0] = 0;
  DPL_RETURN_IF_ERROR(UploadRows(one, 1));
  cudaStream_t s = stream_.get();
  int* h_tokens = h_tokens_.get();
  int64_t& n_past = n_past_[0];
  // Pipeline: the GPU runs step i (feeding token i, sampling token i + 1)
  // while the host waits for token i and streams it: one wait per token.
  for (int32_t i = 0; max_tokens < 0 || i < max_tokens; ++i) {
    const bool more = (max_tokens < 0 || i + 1 < max_tokens) && n_past < n_ctx_;
    if (more) {
      DPL_RETURN_IF_ERROR(LaunchGenerationStep(one));
      const int slot = (i + 1) & 1;
      DPL_CUDA_CHECK(cudaMemcpyAsync(&h_tokens[slot], buf_.tokens, sizeof(int),
                                     cudaMemcpyDeviceToHost, s));
      DPL_CUDA_CHECK(cudaEventRecord(token_ready_[slot].get(), s));
    }
    DPL_CUDA_CHECK(cudaEventSynchronize(token_ready_[i & 1].get()));
    const int32_t token = h_tokens[i & 1];
    if (!on_token(token)) {
      DPL_CUDA_CHECK(cudaStreamSynchronize(s));  // the step already queued finishes
      if (more) ++n_past;  // its KV row holds the refused token; callers rewind past it
      return absl::OkStatus();
    }
    if (!more) break;
    ++n_past;  // token i is now in the cache (step i ran)
  }
  DPL_CUDA_CHECK(cudaStreamSynchronize(s));
  return absl::OkStatus();
}

std::string CudaDecoder::LoadReport() const {
  std::string buckets;
  for (const Bucket& b : buckets_) absl::StrAppend(&buckets, buckets.empty() ? "" : ",", b.batch);
  return absl::StrFormat(
      "cuda: weights %.2f GiB loaded in %.2f s (%.1f GB/s); KV cache %.2f GiB (f16, %d sequences x "
      "%d positions); buffers %.2f GiB (prompt chunk %d, f16 GEMM from %s tokens); decode "
      "steps of %s rows %s\n"
      "cuda load stages: init %.0f ms, weights %.0f ms, setup %.0f ms, graph %.0f ms",
      report_.weight_bytes / 1073741824.0, report_.load.seconds, report_.load.gb_per_s(),
      report_.kv_cache_bytes / 1073741824.0, n_seq(), n_ctx_,
      report_.scratch_bytes / 1073741824.0, max_batch_,
      !gemm_.has_value() ? absl::StrCat(max_batch_ + 1)
      : absl::StrCat(prompt_int8_max_rows_ == int8_max_rows_
                         ? absl::StrCat(int8_max_rows_ + 1)
                         : absl::StrCat(prompt_int8_max_rows_ + 1, " (prompts) / ", int8_max_rows_ + 1, " (steps)"),
                     wide_max_rows_ > 0 ? absl::StrCat(", but 65-", wide_max_rows_, " on the f16 form") : ""),
      buckets,
      eager_ ? "eager (DPL_EAGER)" : "captured as CUDA graphs", report_.init_seconds * 1e3,
      report_.weights_seconds * 1e3, report_.setup_seconds * 1e3, report_.graph_seconds * 1e3);
}

namespace {

// The weights' line of the timing block: how they went up, and where the time went.
std::string WeightsStage(const LoadStats& l) {
  return absl::StrFormat(
      "weights (%.1f GB/s: %d chunks from the file's pinned pages, %.0f ms pinning over the "
      "threads; %d staged%s, staging allocated %.0f ms, filled %.0f ms, copies waited for %.0f ms)",
      l.gb_per_s(), l.pinned_chunks, l.pin_seconds * 1e3, l.staged_chunks,
      l.fallback.empty() ? "" : absl::StrCat(" (", l.fallback, ")"), l.staging_seconds * 1e3,
      l.fill_seconds * 1e3, l.wait_seconds * 1e3);
}

}  // namespace

std::vector<std::pair<std::string, double>> CudaDecoder::LoadStages() const {
  return {{"cuda init", report_.init_seconds},
          {WeightsStage(report_.load), report_.weights_seconds},
          {"setup", report_.setup_seconds},
          {"graph", report_.graph_seconds},
          {"warm-up", report_.warmup_seconds}};
}

}  // namespace dpl::runtime
