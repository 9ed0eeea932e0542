// The CUDA device: a .dpl model on one GPU. Weights are one device
// allocation (DeviceWeights); every activation buffer, the f16 KV cache and
// the kernels' scratch are one more, carved from one size table at load.
//
// Sequences: the cache holds n_seq regions of n_ctx positions (a server's
// slots; 1 for dpl-run), or, paged (the server, CudaDecoderOptions::
// kv_block), one pool of blocks that each sequence reaches through its
// block table (SetBlockTable; kernels/kv_pages.h). A decode step runs B
// rows, row r one token of sequence row_seq[r], and is captured at load as one CUDA graph per batch
// size bucket (1, 2, 4, ... up to n_seq) and replayed for every token: the
// rows' tokens, positions, sampling parameters and sampler states live in
// device memory (kernels/step), so nothing is re-captured as contexts grow,
// requests come and go or their parameters change. A step of k active
// sequences takes the smallest bucket >= k; its other rows are padding.
//
// One step, top to bottom (llama / qwen2 / qwen3), for the B rows at once:
//   x = embed(token)
//   per layer:  h = rmsnorm(x) * attn_norm                (fused with h's int8 quantization)
//               q, k, v = Wq h + bq, Wk h + bk, Wv h + bv  (one launch per weight kernel)
//               qwen3: q, k = per-head rmsnorm(q) * q_norm, rmsnorm(k) * k_norm
//               rope(q, k, pos); cache[seq][pos] = (k, v) (one launch, norms included)
//               a = attention(q, cache[seq][0..pos])     (sliding window: cache[seq][pos-W+1..pos])
//               x = Wo a + x
//               h = rmsnorm(x) * ffn_norm
//               g, u = Wgate h, Wup h                    (one launch)
//               x = Wdown (silu(g) * u) + x              (SwiGLU fused with quantization)
//               qwen3moe, in place of the three lines above (kernels/matvec/moe.h):
//               e, w = top-k(softmax(Wrouter h)), renormalized   (per row, on the device)
//               x += sum_j w_j Wdown[e_j] (silu(Wgate[e_j] h) * Wup[e_j] h)
//   logits = Wout (rmsnorm(x) * output_norm)
//   token = sample(logits) per row, with its sequence's parameters
// Every weight is read once per step for all rows. Activations stay int8
// up to int8_max_rows_ rows: one row takes the dp4a matvec, 2 to
// tuning.mma_max_tokens (64) rows its tensor-core form (int8 mma,
// kernels/matvec/matvec_mma.cu) when every matrix is q4_K, q5_K, q6_K or q8_0, else the
// dp4a token tile; more rows (and
// other types from tuning.gemm_min_tokens rows) dequantize to f16 for a
// cuBLAS GEMM (kernels/gemm).
// Prompts run the same math over chunks of up to `max_batch` tokens of one
// sequence, with the same choice of product path by chunk size; RoPE and
// the KV write are one launch for the chunk and attention is one causal
// flash-attention launch (kernels/attention/prompt_attention.h).
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
#include "kernels/matvec/moe.h"
#include "kernels/kv_pages.h"
#include "kernels/ops/kv_cache.h"
#include "kernels/ops/ops.h"
#include "kernels/sampling/sampling.h"
#include "kernels/tuning.h"
#include "model/hparams.h"
#include "model/model.h"
#include "runtime/cuda/device_weights.h"
#include "runtime/generate/decoder.h"
#include "runtime/kv/seq_tables.h"

namespace dpl::runtime {

// Positions a KV cache may hold (the kernels index positions with int).
inline constexpr int64_t kMaxContext = int64_t{1} << 24;

struct CudaDecoderOptions {
  int64_t n_ctx = 4096;   // KV cache positions per sequence (0: the model's context length)
  // Sequences with their own cache region (the server's -np): batched steps
  // of up to n_seq rows, a graph per bucket captured at load.
  int n_seq = 1;
  int max_batch = 2048;   // prompt chunk: tokens per forward pass (llama.cpp's -ub)
  // Paged KV (issue 30; the server): kv_block > 0 makes the cache one pool
  // of kv_pool_blocks blocks of kv_block positions (a power of two, 16 to
  // 1024) that the sequences share through block tables (SetBlockTable);
  // n_ctx is then what one sequence may reach (at most the pool;
  // kv_pool_blocks 0: the pool is n_ctx positions). kv_block 0: a region of
  // n_ctx positions per sequence.
  int kv_block = 0;
  int kv_pool_blocks = 0;
  // Debugging: run every step eagerly instead of replaying the graph (dpl-run
  // sets it from DPL_EAGER=1). Same bits either way.
  bool eager = false;
  // Tests: every pass of a MoE model keeps each row's expert choices
  // (RouteTopK's ids, copied by the kernel itself, so graphs hold it too)
  // for RecordedRoutes.
  bool record_routes = false;
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
  double warmup_seconds = 0;   // graphs uploaded, a few prompt passes run (CudaDecoder::Warmup)
};

class CudaDecoder : public generate::Decoder {
 public:
  static absl::StatusOr<std::unique_ptr<CudaDecoder>> Create(const std::string& path,
                                                             const CudaDecoderOptions& options);

  // generate::Decoder: one conversation, sequence 0.
  int32_t n_vocab() const override { return static_cast<int32_t>(hp_.n_vocab); }
  int64_t n_ctx() const override { return n_ctx_; }
  int64_t n_past() const override { return n_past_[0]; }
  absl::Status Eval(absl::Span<const int32_t> tokens, std::vector<float>* last,
                    std::vector<float>* all) override {
    return EvalSeq(0, tokens, last, all);
  }
  absl::Status Rewind(int64_t n) override { return RewindSeq(0, n); }
  std::string LoadReport() const override;
  std::vector<std::pair<std::string, double>> LoadStages() const override;
  bool samples_on_device() const override { return true; }
  absl::Status SampleLoop(const generate::SamplerParams& params, absl::Span<const int32_t> history,
                          int32_t max_tokens,
                          const std::function<bool(int32_t)>& on_token) override;

  // Many sequences (the server's engine). seq is in [0, n_seq()).
  int n_seq() const { return static_cast<int>(n_past_.size()); }
  int64_t n_past(int seq) const { return n_past_[seq]; }
  // Runs `tokens` at the sequence's next positions (a prompt, or a chunk of
  // one); `last` / `all` as Eval.
  absl::Status EvalSeq(int seq, absl::Span<const int32_t> tokens, std::vector<float>* last,
                       std::vector<float>* all);
  absl::Status RewindSeq(int seq, int64_t n);
  // Prompt chunks of several sequences (distinct) in ONE forward pass: their
  // tokens packed as rows, chunk after chunk (at most max_batch() in all),
  // so every weight is read once for all of them, each chunk's attention
  // over its own sequence. `last` (if not null) gets each chunk's last
  // logits, chunk i's at [i * n_vocab, (i + 1) * n_vocab); BeginSampling of
  // a chunk's sequence samples from them. One chunk is EvalSeq. Errors (the
  // pass runs only when every chunk is good): as EvalSeq's, a sequence
  // twice, more than max_batch() tokens.
  struct SeqChunk {
    int seq = 0;
    absl::Span<const int32_t> tokens;
  };
  absl::Status EvalSeqs(absl::Span<const SeqChunk> chunks, std::vector<float>* last);
  // A mixed pass: a decode step for `seqs` (as StepSeqs: next[i] the next
  // token of seqs[i]) and prompt chunks of other sequences (as EvalSeqs) in
  // ONE forward pass, run eagerly: the step's rows first (decode attention),
  // then the chunks' (prompt attention), every weight read once for all of
  // them (Sarathi-Serve's piggybacking: a burst of prompts does not stall
  // the running streams for a step of their own). Either may be empty.
  // Errors as StepSeqs's and EvalSeqs's, a sequence in both, more than
  // max_batch() rows; nothing runs then.
  absl::Status StepWithChunks(absl::Span<const int> seqs, absl::Span<int32_t> next,
                              absl::Span<const SeqChunk> chunks, std::vector<float>* last);
  int max_batch() const { return max_batch_; }
  // Sequence `dst` becomes the first n positions of sequence `src` (left as
  // it is): their keys and values copied on the decoder's stream, after
  // everything enqueued before (one 3-D copy: every layer's K and V rows of
  // every head). Paged: nothing is copied yet; dst's rows stay in src's
  // blocks until SetBlockTable gives dst its table (src's full blocks,
  // shared, and its own for the rest: the rows of a partial block are
  // copied then). Errors: a sequence out of range, dst == src, n outside
  // [0, n_past(src)].
  absl::Status CopySeqPrefix(int dst, int src, int64_t n);
  // Paged KV: the sequence's first n positions are the rows already in the
  // first blocks of its table (SetBlockTable first): blocks of the
  // scheduler's prefix cache that any sequence wrote. Nothing is copied;
  // its earlier rows are dropped and no token is pending. Errors: not
  // paged, a sequence out of range, n < 0, beyond its table or the context.
  absl::Status AdoptSeqPrefix(int seq, int64_t n);
  // Paged KV: the pool blocks that hold the sequence's positions from now on
  // (block i: positions [i * kv_block(), (i + 1) * kv_block())), uploaded
  // before the next pass. Where a block differs from the one that holds its
  // rows (after CopySeqPrefix, or a shared partial block replaced), those
  // rows are copied on the decoder's stream. A pass needs the sequence's
  // table to reach every position it writes and reads (FailedPrecondition
  // otherwise). Errors (nothing changes): not paged, a sequence out of
  // range, a block outside the pool, a table longer than max_blocks or too
  // short for the sequence's n_past positions.
  absl::Status SetBlockTable(int seq, absl::Span<const int> blocks);
  bool paged() const { return kv_layout_.paged(); }
  int kv_block() const { return kv_layout_.block(); }
  int kv_pool_blocks() const { return kv_layout_.n_blocks; }
  // After EvalSeq of a prompt: samples the sequence's first token from the
  // prompt's last logits with `params` (`history`: the ids so far, for the
  // repetition penalty) and keeps it pending; from then on each StepSeqs
  // that names the sequence runs its pending token and samples the next.
  // The draws start over (RNG counter 0), so a seed repeats its tokens
  // whatever ran before; SampleLoop carries the counter on instead (one
  // conversation).
  absl::StatusOr<int32_t> BeginSampling(int seq, const generate::SamplerParams& params,
                                        absl::Span<const int32_t> history);
  // Structured output: every draw of the sequence from now on (BeginSampling,
  // StepSeqs, StepWithChunks) takes only tokens whose bit is set in `mask`
  // (AllowedWords(n_vocab) words; token i: bit i % 32 of word i / 32; at
  // least one set), as the CPU sampler's SampleAllowed, until the next
  // SetAllowedTokens or ClearAllowedTokens. Enqueued on the decoder's
  // stream (the captured steps read the device copy): the caller sets the
  // mask for each draw from its grammar's state after the last token.
  absl::Status SetAllowedTokens(int seq, absl::Span<const uint32_t> mask);
  absl::Status ClearAllowedTokens(int seq);
  // OpenAI's logit_bias: every draw of the sequence from now on
  // (BeginSampling, StepSeqs, StepWithChunks) adds each entry's bias to its
  // token's logit before the penalties (kernels::SampleBatch::bias), as the
  // CPU sampler does, until the next SetLogitBias or ClearLogitBias. The
  // list must pass kernels::CheckLogitBias (at most kMaxLogitBias distinct
  // tokens in the vocabulary). Enqueued on the decoder's stream, as
  // SetAllowedTokens (the captured steps read the device copy). The
  // single-sequence SampleLoop / NextToken run no biases.
  absl::Status SetLogitBias(int seq, absl::Span<const kernels::LogitBias> bias);
  absl::Status ClearLogitBias(int seq);
  // One batched decode step of the distinct sequences `seqs` (each with a
  // pending token and a free position): next[i] = seqs[i]'s new token (also
  // pending now). One graph replay and one host round trip for all of them.
  absl::Status StepSeqs(absl::Span<const int> seqs, absl::Span<int32_t> next);
  // Tests and debugging: the logits row i of the last StepSeqs (seqs[i]'s)
  // was sampled from, as long as nothing has run since.
  absl::Status StepLogits(int i, std::vector<float>* out) const;
  // Logprobs: while on, every draw of the sequence (BeginSampling, StepSeqs,
  // StepWithChunks; not SampleLoop) copies the logits it was drawn from to
  // host memory, as the sampler left them: after the logit biases, the
  // penalties and the allowed-token mask (-inf), which it writes in place,
  // before temperature and the filters. One async copy of the row on the
  // decoder's stream before the synchronization that reads the draw's token
  // (a pinned (n_seq, n_vocab) buffer allocated at the first KeepDrawLogits
  // on): sequences that are off copy nothing. DrawLogits returns the
  // sequence's latest, valid until its next draw; FailedPrecondition when
  // none was kept since it was turned on.
  absl::Status KeepDrawLogits(int seq, bool on);
  absl::StatusOr<absl::Span<const float>> DrawLogits(int seq) const;
  // The single-sequence forms (sequence 0).
  absl::StatusOr<int32_t> BeginSampling(const generate::SamplerParams& params,
                                        absl::Span<const int32_t> history) {
    return BeginSampling(0, params, history);
  }
  absl::StatusOr<int32_t> NextToken();

  const model::Hparams& hparams() const { return hp_; }
  // The file's metadata and tensor table (ModelFile::OpenIndex).
  std::shared_ptr<const formats::ModelFile> file() const { return index_; }
  const kernels::DecodeTuning& tuning() const { return tuning_; }
  const CudaMemoryReport& memory() const { return report_; }
  // Bytes of weights one decode step reads (every tensor but the embedding
  // table, which is read one row per token unless it is also the lm head).
  uint64_t weight_bytes_per_token() const { return bytes_per_token_; }
  // Multiply-adds of a prompt token's layer products (ModelDesc::prompt_macs_per_token).
  uint64_t prompt_macs_per_token() const { return prompt_macs_per_token_; }
  bool uses_graph() const { return !eager_; }
  // With CudaDecoderOptions::record_routes: the expert ids every MoE layer
  // chose for rows 0..rows-1 of the last pass, (n_layer, rows, k) (a step's
  // rows are its batch rows in bucket order). FailedPrecondition without the
  // option; InvalidArgument for rows outside [1, the pass rows the decoder
  // holds].
  absl::StatusOr<std::vector<int32_t>> RecordedRoutes(int rows) const;
  // Whether single-token steps fold RoPE and the KV write into the Q/K/V
  // matvec (DecodeTuning::rope_in_matvec, where the model and plans allow).
  bool folds_rope() const { return rope_fold_ok_; }
  // The batch sizes a step graph exists for (ascending, the last >= n_seq).
  std::vector<int> step_buckets() const;
  // Benchmarking: replays the forward-only step graph of sequences
  // 0..batch-1 (batch <= n_seq; the smallest bucket that holds them, as
  // StepSeqs takes) n times back to back from their n_past() (each feeding
  // the token last written for it, nothing sampled), with one sync at the
  // end; returns the seconds between events around the replays. The graph
  // of a bucket above 1 is captured on first use, outside the timing.
  absl::StatusOr<double> TimeDecodeSteps(int n, int batch = 1);

 private:
  // A weight matrix and how its matvec launches (planned once at load).
  struct Matrix {
    kernels::WeightMatrix w;
    kernels::MatVecPlan plan;
  };
  // A mixture-of-experts feed-forward (qwen3moe; kernels/matvec/moe.h):
  // the router and the three expert tensors, each one device buffer of the
  // file's bytes (expert e's matrix at its fixed stride).
  struct MoeLayer {
    Matrix router;  // (n_expert, n_embd) f32
    kernels::ExpertWeights gate, up, down;
    kernels::ExpertPlan gate_plan, up_plan, down_plan;
    bool gate_up_grouped = false;  // gate and up in one launch (same kernel and k-split)
  };
  struct Layer {
    // w_gate, w_up, w_down: empty (null data) in a MoE layer, which has `moe`.
    Matrix wq, wk, wv, wo, w_gate, w_up, w_down;
    std::optional<MoeLayer> moe;
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
  // A decode step of `batch` rows: its attention plan (the rows share one
  // wave of split blocks) and graphs.
  struct Bucket {
    int batch = 0;
    kernels::DecodeAttentionPlan attn;
    kernels::GraphExec generate;  // gather, forward, sample, finish (captured at load)
    kernels::GraphExec forward;   // gather, forward, finish without sampling (1: at load; others on demand)
  };
  // Device buffers of a forward pass, carved from one allocation (Allocate).
  // T = max(max_batch, n_seq) rows; S = n_seq.
  struct Buffers {
    int* tokens = nullptr;       // (T) token ids of the current pass (a step: the rows' sampled ids after it)
    int* positions = nullptr;    // (T) their positions
    int* row_seq = nullptr;      // (S) a step's row -> sequence (< 0: padding), written by the host
    int* pass_seq = nullptr;     // (T) a packed prompt pass's row -> sequence, written by the host
    float* head_x = nullptr;     // (S, n_embd) a packed pass's chunks' last rows of x, for the LM head
    kernels::PromptTile* prompt_tiles = nullptr;  // (T) a packed pass's query tiles, written by the host
    int* seq_token = nullptr;    // (S) each sequence's pending token
    int* seq_pos = nullptr;      // (S) each sequence's next position
    double* inv_freq = nullptr;  // (n_rot / 2) RoPE frequencies
    double* rope_cs = nullptr;   // (n_rot / 2, 2) this step's cos, sin (a folded RoPE)
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
    uint16_t* w_f16_ahead = nullptr;  // (w_f16_elems_) the second, with tuning_.gemm_dequant_ahead
    float* attn_ws = nullptr;    // (max over buckets of attn.workspace_floats)
    uint16_t* kv = nullptr;      // kv_layout_: per layer K then V, (S, n_kv_head, n_ctx, head_dim) f16
                                 // (paged: (n_blocks, n_kv_head, block, head_dim))
    int* kv_tables = nullptr;    // paged: (S, kv_layout_.max_blocks()) block tables (kernels/kv_pages.h)
    kernels::SamplingParams* params = nullptr;  // (S) each sequence's sampling parameters
    kernels::SamplerState* sampler = nullptr;   // (S), zeroed once: RNG counters persist
    int* rings = nullptr;                       // (S, ring_stride_) repetition-penalty rings
    void* sampling_ws = nullptr;                // (SamplingWorkspaceBytes(S)) bytes
    uint32_t* allowed = nullptr;                // (S, AllowedWords(n_vocab)) allowed-token masks
    int* allowed_on = nullptr;                  // (S) nonzero: the sequence's mask applies
    kernels::LogitBias* bias = nullptr;         // (S, kMaxLogitBias) each sequence's logit biases
    int* n_bias = nullptr;                      // (S) entries of bias in use (0: none)
    kernels::MatVecScratch qx;                  // int8 activations (T, max width)
    // Mixture of experts (qwen3moe), for a slice of M = moe_rows_ rows of a
    // pass at a time, k = n_expert_used routes a row, X = n_ff_exp:
    float* moe_logits = nullptr;  // (M, n_expert) router logits
    int* moe_ids = nullptr;       // (M, k) the routes' experts
    float* moe_w = nullptr;       // (M, k) their renormalized weights
    float* moe_gate = nullptr;    // (M * k, X) gate products, then silu(gate) * up
    float* moe_up = nullptr;      // (M * k, X) up products
    float* moe_down = nullptr;    // (M * k, n_embd) down products
    kernels::MoeActs moe_h;       // int8 blocks of the rows' normed x: (M, n_embd)
    kernels::MoeActs moe_g;       // int8 blocks of silu(gate) * up: (M * k, X)
    kernels::MoeGroups moe_groups;  // the (M * k) routes grouped by expert (RouteGroups)
    int* route_log = nullptr;     // (n_layer, T, k) record_routes: every row's ids a layer
  };

  CudaDecoder() = default;
  absl::Status Init(const std::string& path, const CudaDecoderOptions& options);
  absl::Status BindWeights(const model::ModelDesc& desc);
  absl::Status Allocate();
  absl::Status InitRope(const model::ModelDesc& desc);
  // Every step graph uploaded and a few prompt passes run, so that no
  // request pays for the first launches (Init's last stage).
  absl::Status Warmup();
  // Warmup's passes of several sequences: packed prompts, a first token
  // drawn, decode rows beside a prompt chunk.
  absl::Status WarmupPackedPasses();
  absl::Status CheckSeq(int seq) const;
  // A prompt chunk for the sequence: not empty, ids in the vocabulary, room
  // in its context.
  absl::Status CheckChunk(int seq, absl::Span<const int32_t> tokens) const;
  // A prompt pass's run of consecutive tokens of one sequence: rows
  // [row, row + n) at positions first_pos, first_pos + 1, ...
  struct Segment {
    int seq = 0;
    int first_pos = 0;
    int row = 0;
    int n = 0;
  };
  // Enqueues a forward pass of the n rows in buf_.tokens at buf_.positions
  // (device memory), in one of two shapes:
  //   step != null: a decode step, n = step->batch rows, row r one token of
  //     sequence buf_.row_seq[r]; every row's logits land in buf_.logits.
  //   step == null: prompt tokens, `segments` in row order (n rows in all).
  //     One segment: its last token's logits (all_logits: every token's)
  //     land in buf_.logits. Several (EvalSeqs; buf_.pass_seq holds each
  //     row's sequence): segment i's last token's logits in row i.
  //   A mixed pass (StepWithChunks) is the second shape with n_step_rows
  //   decode rows before the segments: rows 0..n_step_rows of step_rows's
  //   plan (buf_.row_seq, buf_.positions as a step gathers them) attend
  //   through decode attention; logits rows are theirs, then the segments'.
  absl::Status EnqueueForward(int n, const Bucket* step, absl::Span<const Segment> segments,
                              bool all_logits, const Bucket* step_rows = nullptr, int n_step_rows = 0);
  // StepSeqs's checks; marks the sequences for this round (step_count_).
  absl::Status CheckStepSeqs(absl::Span<const int> seqs, absl::Span<int32_t> next);
  // The packed pass of EvalSeqs (seqs empty) and StepWithChunks: checks the
  // chunks (distinct from each other and from seqs, already checked), runs,
  // samples the step's rows, copies the chunks' last logits to `last`.
  absl::Status RunPacked(absl::Span<const int> seqs, absl::Span<int32_t> next,
                         absl::Span<const SeqChunk> chunks, std::vector<float>* last);
  // One decode step of `bucket`: the rows gathered from their sequences, the
  // forward pass, (with `sample`) each live row's next token sampled into
  // buf_.tokens, then the sequences moved on (FinishStepRows). What the step
  // graphs capture, and what eager mode runs.
  absl::Status EnqueueStep(const Bucket& bucket, bool sample);
  // A MoE layer's feed-forward for rows [0, n) of the pass: x += the
  // weighted sum of the chosen experts' SwiGLU products (kernels/matvec/
  // moe.h), all on the device, in slices of moe_rows_ rows.
  absl::Status EnqueueMoe(const MoeLayer& moe, int layer, const float* ffn_norm, int n, bool pdl);
  // Samples `rows` rows of logits (rows, n_vocab; penalties rewrite them in
  // place), row r for sequence
  // buf_.row_seq[r] with its parameters, sampler state and ring, into
  // tokens_out[r] (SampleTokens).
  absl::Status SampleRows(int rows, float* logits, int* tokens_out);
  // Launches bucket's generation step (its graph, or eagerly).
  absl::Status LaunchGenerationStep(const Bucket& bucket);
  // The smallest bucket of at least n rows.
  const Bucket& BucketFor(int n) const;
  // Writes h_rows_[0..n) (then -1 up to bucket.batch) to buf_.row_seq.
  absl::Status UploadRows(const Bucket& bucket, int n);
  absl::Status RunChunk(int seq, absl::Span<const int32_t> tokens, bool all_logits);
  // BeginSampling's and SampleLoop's start: the sequence's parameters
  // (repeat_last_n normalized), penalty ring from `history` and position,
  // the RNG counter reset (restart_draws), and the first token sampled from
  // the prompt's last logits into seq_token[seq] and h_tokens_[0]
  // (token_ready_[0] recorded).
  absl::Status StartSampling(int seq, const generate::SamplerParams& params,
                             absl::Span<const int32_t> history, bool restart_draws);
  // Enqueues the copy of `row` (a draw's logits on the device) to the
  // sequence's host row when it keeps them (KeepDrawLogits); the caller
  // synchronizes, then marks the draws kept (draw_logits_ready_).
  absl::Status EnqueueDrawLogits(int seq, const float* row);
  // Paged: the sequence's table reaches `positions` and holds its rows (a
  // pass may run it); OK for regions.
  absl::Status CheckPages(int seq, int64_t positions) const;
  // Paged: enqueues the upload of every table changed since the last pass
  // (the passes synchronize at their end, so the staging is free again by
  // the next SetBlockTable).
  absl::Status UploadTables();

  std::unique_ptr<DeviceWeights> weights_;
  std::shared_ptr<formats::ModelFile> index_;  // metadata and tensor table
  model::Hparams hp_;
  kernels::DecodeTuning tuning_;
  int64_t n_ctx_ = 0;
  std::vector<int64_t> n_past_;  // (n_seq) positions each sequence's region holds
  std::vector<bool> sampling_;   // (n_seq) a sampled token is pending (BeginSampling ran)
  // StepSeqs' distinctness check: steps so far, and each sequence's last one.
  uint64_t step_count_ = 0;
  std::vector<uint64_t> last_step_;  // (n_seq)
  int max_batch_ = 0;
  int kv_block_ = 0;        // CudaDecoderOptions::kv_block (0: regions)
  int kv_pool_blocks_ = 0;  // CudaDecoderOptions::kv_pool_blocks
  // Products of at most this many rows keep int8 activations (see the top).
  int int8_max_rows_ = 0;
  int prompt_int8_max_rows_ = 0;  // the same for prompt passes (a MoE model's: fewer)
  // Passes of 65 to this many rows run the f16 form's wide launch, not
  // cuBLAS (DecodeTuning::mma_f16_max_tokens, where every layer matrix has
  // the form and the model is dense; 0: none).
  int wide_max_rows_ = 0;
  // Mixture of experts: the feed-forward runs over a pass's rows in slices
  // of at most this many (its buffers' rows; a step of up to 256 rows is one
  // slice).
  static constexpr int kMoeRows = 256;
  int moe_rows_ = 0;
  bool record_routes_ = false;  // CudaDecoderOptions::record_routes
  int route_log_rows_ = 0;      // T of buf_.route_log (0: not recorded)
  // Rows of buf_.logits: Eval asked for every token's logits runs chunks of
  // at most this many tokens (a 2048-token chunk's logits would take 1.2 GB
  // for a 152k vocabulary; one row is all a prompt needs otherwise); a step
  // needs one per row.
  static constexpr int kMaxLogitRows = 512;
  int logit_rows_ = 0;
  std::vector<int> last_logits_row_;  // (n_seq) the row of buf_.logits with each sequence's last prompt logits
  // Penalty ring slots per sequence: repeat_last_n beyond it looks back over
  // the last ring_stride_ tokens only (min(n_ctx, kMaxRing)).
  static constexpr int kMaxRing = 8192;
  int ring_stride_ = 0;
  bool eager_ = false;
  uint64_t bytes_per_token_ = 0;
  uint64_t prompt_macs_per_token_ = 0;
  CudaMemoryReport report_;

  kernels::WeightMatrix embed_;
  Matrix out_;
  const float* output_norm_ = nullptr;  // (n_embd)
  std::vector<Layer> layers_;
  kernels::RopeKvShape rope_shape_;
  bool rope_fold_ok_ = false;  // single-token steps fold RoPE into the Q/K/V matvec
  kernels::KvCacheLayout kv_layout_;
  kernels::KvPages kv_pages_;             // what the kernels read (regions: no tables)
  std::optional<kv::SeqTables> tables_;   // paged: each sequence's table and where its rows are
  kernels::PinnedBuffer<int> h_tables_;   // paged: (S, max_blocks) staging of buf_.kv_tables
  kernels::Event tables_uploaded_;        // paged: after the last upload (the staging is free)
  kernels::PromptAttentionShape prompt_attn_;
  std::vector<Bucket> buckets_;  // ascending batch
  // f16 GEMM path for products of more than int8_max_rows_ rows (unset
  // when no pass has that many): the cuBLAS handle and the f16 weight
  // scratch size (the largest layer matrix; bigger ones go in row blocks).
  std::optional<kernels::PromptGemm> gemm_;
  std::optional<kernels::F16WeightsAhead> ahead_;  // tuning_.gemm_dequant_ahead and a tensor-core path
  std::vector<const kernels::WeightMatrix*> ahead_order_;  // a prompt pass's matrices, in product order
  int64_t w_f16_elems_ = 0;

  kernels::Stream stream_;
  kernels::DeviceBuffer<uint8_t> arena_;  // every buffer of buf_
  Buffers buf_;

  std::vector<kernels::PromptTile> h_prompt_tiles_;  // the packed pass's tiles (PromptAttentionBatch)
  kernels::PinnedBuffer<int> h_rows_;    // (n_seq) a step's row -> sequence, staged for upload
  kernels::PinnedBuffer<int> h_tokens_;  // (max(2, n_seq)) sampled ids read by the host
  kernels::PinnedBuffer<kernels::SamplingParams> h_params_;
  kernels::PinnedBuffer<uint32_t> h_allowed_;  // (S, AllowedWords(n_vocab)) SetAllowedTokens' staging  // (1) staged for upload
  kernels::PinnedBuffer<kernels::LogitBias> h_bias_;  // (S, kMaxLogitBias) SetLogitBias' staging
  kernels::PinnedBuffer<int> h_n_bias_;                // (S) its counts, staged
  // KeepDrawLogits: the draws' logits, (S, n_vocab), allocated at the first
  // sequence turned on; which sequences copy theirs, and which hold one.
  kernels::PinnedBuffer<float> h_draw_logits_;
  std::vector<bool> keep_draw_logits_;   // (n_seq)
  std::vector<bool> draw_logits_ready_;  // (n_seq)
  kernels::Event token_ready_[2];
};

}  // namespace dpl::runtime
