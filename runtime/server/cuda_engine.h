// The CUDA device as a BatchEngine: one slot per sequence region of the
// runtime's KV cache (CudaDecoderOptions::n_seq, the server's -np), all
// active slots decoded together in one step (CudaDecoder::StepSeqs: one
// graph replay of the smallest step bucket that holds them, every weight
// read once for all of them, sampling on the GPU with each slot's own
// parameters). Prompts run chunk by chunk into the slot's region between
// steps.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/cuda/cuda_decoder.h"
#include "runtime/server/batch_engine.h"
#include "runtime/server/slot_grammars.h"

namespace dpl::server {

class CudaEngine : public BatchEngine {
 public:
  static absl::StatusOr<std::unique_ptr<CudaEngine>> Load(const std::string& path,
                                                          const runtime::CudaDecoderOptions& options);

  int n_slots() const override { return decoder_->n_seq(); }
  int64_t n_ctx() const override { return decoder_->n_ctx(); }
  int32_t n_vocab() const override { return decoder_->n_vocab(); }
  absl::StatusOr<int32_t> Prefill(int slot, absl::Span<const int32_t> tokens, bool last,
                                  const SamplerParams& params) override;
  // The parts in packed prompt passes (CudaDecoder::EvalSeqs) of at most
  // max_batch tokens each.
  absl::Status PrefillBatch(absl::Span<const PrefillPart> parts, absl::Span<int32_t> first) override;
  absl::Status Step(absl::Span<const int> slots, absl::Span<int32_t> next) override;
  // Both in one mixed pass (CudaDecoder::StepWithChunks) when the decode
  // rows and the parts fit max_batch; else PrefillBatch, then Step.
  absl::Status StepWithPrefill(absl::Span<const PrefillPart> parts, absl::Span<int32_t> first,
                               absl::Span<const int> slots, absl::Span<int32_t> next) override;
  int64_t n_past(int slot) const override;
  absl::Status KeepPrefix(int slot, absl::Span<const int32_t> kept) override;
  absl::Status CopyPrefix(int slot, int from, absl::Span<const int32_t> kept) override;
  void Release(int slot) override;
  // Paged KV (CudaDecoderOptions::kv_block): the slot's sequence reads and
  // writes its positions in these pool blocks (CudaDecoder::SetBlockTable;
  // a copied start's rows follow it there). A cache of regions ignores it.
  void SetBlockTable(int slot, absl::Span<const int> blocks) override;
  int kv_pool_blocks() const override { return decoder_->paged() ? decoder_->kv_pool_blocks() : 0; }
  int kv_block_size() const override { return decoder_->paged() ? decoder_->kv_block() : 0; }
  // The prefix cache's blocks as a slot's start (paged only): the rows stay
  // where they are (CudaDecoder::AdoptSeqPrefix), nothing copied.
  bool supports_block_adoption() const override { return decoder_->paged(); }
  absl::Status AdoptPrefix(int slot, absl::Span<const int32_t> kept) override;
  // Structured output: each draw of a slot with a grammar takes the mask
  // of its grammar's state (SlotGrammars), copied to the device before the
  // step (CudaDecoder::SetAllowedTokens), and the grammar takes the token.
  bool supports_grammar() const override { return true; }
  absl::Status SetGrammar(int slot, std::shared_ptr<const grammar::Grammar> grammar) override;
  // Logit biases: copied to the device once a request (CudaDecoder::SetLogitBias),
  // read by every draw of the slot's sequence, cleared when the request ends.
  bool supports_logit_bias() const override { return true; }
  absl::Status SetLogitBias(int slot, absl::Span<const LogitBias> bias) override;
  // Logprobs, the CPU engine's numbers: a draw is scored on the host from
  // the logits the device sampler drew it from (CudaDecoder::
  // KeepDrawLogits: one row copied back per draw of a slot that asked,
  // nothing for the others), its biases, penalties and mask (-inf) in them.
  // A scored prompt (`prompt`; the slot must be empty, as the CPU engine's)
  // runs alone, in passes of kScoreRows tokens that keep every position's
  // logits (EvalSeq's `all`), never packed with other slots' chunks.
  bool supports_logprobs() const override { return true; }
  absl::Status SetLogprobs(int slot, int top_n, bool prompt) override;
  absl::StatusOr<SlotLogprobs> TakeLogprobs(int slot) override;

  const runtime::CudaDecoder& decoder() const { return *decoder_; }

 private:
  explicit CudaEngine(std::unique_ptr<runtime::CudaDecoder> d);
  absl::Status CheckSlot(int slot) const;
  // CheckSlot, and the slot's last block table was taken (SetBlockTable).
  absl::Status CheckTable(int slot) const;
  // One output per part, every slot in range, params with every last part.
  absl::Status CheckParts(absl::Span<const PrefillPart> parts, absl::Span<int32_t> first) const;

  std::unique_ptr<runtime::CudaDecoder> decoder_;
  std::vector<std::vector<int32_t>> prompts_;  // (n_slots) the history for the repetition penalty
  // After a prompt's last chunk: its sequence's first token, sampled from its
  // last logits (`logits`, checked finite) with `params`.
  absl::StatusOr<int32_t> BeginSampling(int slot, absl::Span<const float> logits, const SamplerParams& params);
  // After a pass of `parts` (their tokens run, logits_ holding one row per
  // part): the prompts' histories extended, the last parts' first tokens.
  absl::Status AfterParts(absl::Span<const PrefillPart> parts, absl::Span<int32_t> first);

  // Before a draw of each of `slots`: its grammar's mask on the device (a
  // slot without a grammar: none). After: the grammars take the tokens.
  absl::Status MaskDraws(absl::Span<const int> slots);
  absl::Status AcceptDraws(absl::Span<const int> slots, absl::Span<const int32_t> tokens);
  // No grammar, no mask.
  absl::Status DropGrammar(int slot);
  // The slot's request ended: DropGrammar, no logit biases, no logprobs.
  absl::Status EndRequest(int slot);

  // Logprobs of a slot's request (SetLogprobs).
  struct Scoring {
    int top = -1;               // top_n; -1: off
    bool prompt = false;        // prompt scoring
    std::vector<float> prev;    // prompt scoring: the last position's logits
    SlotLogprobs recorded;      // since the last TakeLogprobs
  };
  // A scored prompt's pass: every position's logits of this many tokens at
  // most on the host at once (128 x 152k floats: 78 MB), not a 2048-token
  // chunk's 1.2 GB; such prompts are rare (echo), their passes short.
  static constexpr size_t kScoreRows = 128;
  bool scores_prompt(int slot) const { return scoring_[slot].prompt; }
  // A scored prompt's chunk (Prefill's): run, each token at a position >= 1
  // scored from the logits before it; `last` gets the chunk's last logits.
  absl::Status RunScored(int slot, absl::Span<const int32_t> tokens, std::vector<float>* last);
  // After a draw of each of `slots` (tokens[i] slot i's): the slots that
  // score draws record theirs from the decoder's copy of its logits.
  absl::Status ScoreDraws(absl::Span<const int> slots, absl::Span<const int32_t> tokens);
  absl::Status StopScoring(int slot);

  SlotGrammars grammars_;
  std::vector<bool> biased_;                   // (n_slots) the slot's sequence has logit biases on the device
  std::vector<Scoring> scoring_;               // (n_slots)
  std::vector<absl::Status> table_error_;      // (n_slots) SetBlockTable's last refusal, or OK
  std::vector<float> logits_;                  // a pass's last logits (checked finite), a chunk's after another
};

}  // namespace dpl::server
