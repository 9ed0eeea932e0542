// The CPU reference device as a BatchEngine: one reference::ReferenceModel
// (its own KV cache) and one host generate::Sampler per slot, all sharing the
// mmapped model file. Step runs the slots one after the other: the float64
// reference is the oracle, not a fast path; the GPU engine batches them.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "formats/model_file.h"
#include "runtime/generate/sampler.h"
#include "runtime/reference/reference_model.h"
#include "runtime/server/batch_engine.h"
#include "runtime/server/slot_grammars.h"

namespace dpl::server {

struct CpuEngineOptions {
  int n_slots = 1;
  int64_t n_ctx = 4096;  // positions per slot (0: the model's, capped at 4096)
  int threads = 0;       // per slot's reference model (0: all cores); only one runs at a time
  // Weights each slot's reference dequantizes to float32 at load (see
  // reference::ReferenceOptions): the budget is shared, so with many slots
  // big models fall back to dequantizing rows on the fly.
  uint64_t max_resident_bytes = uint64_t{2} << 30;
};

class CpuEngine : public BatchEngine {
 public:
  static absl::StatusOr<std::unique_ptr<CpuEngine>> Load(std::shared_ptr<formats::ModelFile> file,
                                                         const CpuEngineOptions& options);

  int n_slots() const override { return static_cast<int>(slots_.size()); }
  int64_t n_ctx() const override { return n_ctx_; }
  int32_t n_vocab() const override { return n_vocab_; }
  absl::StatusOr<int32_t> Prefill(int slot, absl::Span<const int32_t> tokens, bool last,
                                  const SamplerParams& params) override;
  absl::Status Step(absl::Span<const int> slots, absl::Span<int32_t> next) override;
  int64_t n_past(int slot) const override;
  absl::Status KeepPrefix(int slot, absl::Span<const int32_t> kept) override;
  absl::Status CopyPrefix(int slot, int from, absl::Span<const int32_t> kept) override;
  void Release(int slot) override;
  // A grammar's mask needs the model's vocabulary (SlotGrammars: built
  // from the file's tokenizer at the first grammar, once for the engine).
  bool supports_grammar() const override { return true; }
  absl::Status SetGrammar(int slot, std::shared_ptr<const grammar::Grammar> grammar) override;
  // Draws are scored from the sampler's penalized logits (and the grammar's
  // mask), prompt tokens from the reference's logits; with `prompt`, the
  // slot must be empty (n_past 0): an earlier position's logits are gone.
  // Logit biases go to the slot's sampler, made by the prompt's last chunk.
  bool supports_logit_bias() const override { return true; }
  absl::Status SetLogitBias(int slot, absl::Span<const LogitBias> bias) override;
  bool supports_logprobs() const override { return true; }
  absl::Status SetLogprobs(int slot, int top_n, bool prompt) override;
  absl::StatusOr<SlotLogprobs> TakeLogprobs(int slot) override;

 private:
  struct Slot {
    std::unique_ptr<reference::ReferenceModel> model;
    std::unique_ptr<generate::Sampler> sampler;  // set by the prompt's last chunk
    std::vector<int32_t> prompt;                 // the history for the repetition penalty
    std::vector<LogitBias> bias;                 // SetLogitBias', for the next sampler
    int32_t pending = -1;                        // sampled, not yet run
    int logprobs_top = -1;                       // SetLogprobs' top_n; -1: off
    bool score_prompt = false;
    std::vector<float> prev_logits;              // scoring: the last position's logits
    SlotLogprobs recorded;                       // since the last TakeLogprobs
  };
  // Turns the slot's logprobs off and forgets what it recorded (the request ended).
  static void ClearLogprobs(Slot& s);
  CpuEngine() = default;
  absl::Status CheckSlot(int slot) const;
  // Runs `token` at the slot's next position; the logits of it.
  absl::StatusOr<std::vector<float>> Run(Slot& s, int32_t token);
  // Samples the slot's next token from `logits` (within its grammar, which
  // then takes the token) and remembers it for the penalty.
  absl::StatusOr<int32_t> SampleNext(int slot, absl::Span<const float> logits);

  std::vector<Slot> slots_;
  int64_t n_ctx_ = 0;
  int32_t n_vocab_ = 0;
  std::shared_ptr<formats::ModelFile> file_;
  std::unique_ptr<SlotGrammars> grammars_;
};

}  // namespace dpl::server
