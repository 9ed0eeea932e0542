// The grammars of an engine's slots (structured output: response_format,
// grammar, json_schema, tool_choice): one matcher per slot and the
// allowed-token mask of each draw over the model's vocabulary, which is
// built from the file's tokenizer once per engine, on a thread the
// constructor starts: built at the first grammar, it cost that request
// ~290 ms on an H200's host (qwen2's 151,936 tokens: the tokenizer read
// again and the trie; 16.9 ms a token over a 20-token answer against 2.24
// free, PERF "The grammar mask per step"), now ready before a request comes.
// The CPU engine hands the mask to its host sampler (Sampler::
// SampleAllowed), the CUDA engine to the device sampler (CudaDecoder::
// SetAllowedTokens); both draw the same way from it.
#pragma once

#include <chrono>
#include <cstdint>
#include <future>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "formats/model_file.h"
#include "runtime/grammar/grammar.h"
#include "runtime/grammar/matcher.h"

namespace dpl::server {

class SlotGrammars {
 public:
  // n_vocab: the model's (its logits' width), which may differ from the
  // tokenizer's: ids beyond the tokenizer's are never allowed.
  SlotGrammars(std::shared_ptr<const formats::ModelFile> file, int n_slots, int32_t n_vocab);

  // The slot's grammar for the request it now serves; null clears it. The
  // first one waits for the vocabulary if its build is still running. The
  // grammar's token literals are resolved against the vocabulary (a
  // control token of that text: that token alone; grammar/matcher.h).
  // Errors: a model without a vocabulary.
  absl::Status Set(int slot, std::shared_ptr<const grammar::Grammar> grammar);
  void Clear(int slot) { matchers_[static_cast<size_t>(slot)].reset(); }
  bool active(int slot) const { return matchers_[static_cast<size_t>(slot)] != nullptr; }
  // The vocabulary's build has finished (well or not), without a grammar
  // asking for it.
  bool vocabulary_ready() const {
    return vocab_ != nullptr || !vocab_build_.valid() ||
           vocab_build_.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
  }

  // The tokens the slot's grammar allows next, (n_vocab + 31) / 32 words
  // (token i: bit i % 32 of word i / 32), valid until the next call.
  // Errors (FailedPrecondition): the grammar has ended, or allows nothing.
  absl::StatusOr<absl::Span<const uint32_t>> Allowed(int slot);
  // The slot's grammar takes the drawn token.
  absl::Status Accept(int slot, int32_t token);

 private:
  std::shared_ptr<const formats::ModelFile> file_;
  int32_t n_vocab_ = 0;
  std::vector<std::unique_ptr<grammar::Matcher>> matchers_;  // (n_slots)
  // The vocabulary's build (the constructor's thread), taken at the first
  // grammar into vocab_ or vocab_error_.
  std::future<absl::StatusOr<std::unique_ptr<grammar::Vocabulary>>> vocab_build_;
  std::unique_ptr<grammar::Vocabulary> vocab_;
  absl::Status vocab_error_;
  std::vector<uint32_t> bits_;                               // vocab_->mask_words()
  std::vector<uint32_t> allowed_;                            // (n_vocab_ + 31) / 32
};

}  // namespace dpl::server
