#include "runtime/server/slot_grammars.h"

#include <algorithm>
#include <future>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "runtime/grammar/tokenizer_vocab.h"
#include "runtime/tokenizer/tokenizer.h"

namespace dpl::server {

namespace {

absl::StatusOr<std::unique_ptr<grammar::Vocabulary>> BuildVocabulary(const formats::ModelFile& file) {
  DPL_ASSIGN_OR_RETURN(tokenizer::Tokenizer tok, tokenizer::Tokenizer::FromMetadata(file.metadata()));
  if (!tok.has_vocab()) {
    return absl::FailedPreconditionError("the model has no vocabulary: a grammar cannot be matched");
  }
  return std::make_unique<grammar::Vocabulary>(grammar::VocabularyFromTokenizer(tok));
}

}  // namespace

SlotGrammars::SlotGrammars(std::shared_ptr<const formats::ModelFile> file, int n_slots, int32_t n_vocab)
    : file_(std::move(file)),
      n_vocab_(n_vocab),
      matchers_(static_cast<size_t>(std::max(n_slots, 0))),
      allowed_((static_cast<size_t>(std::max(n_vocab, 0)) + 31) / 32) {
  // The file outlives the build: the thread holds it too (the destructor
  // waits for the thread, the future's).
  vocab_build_ = std::async(std::launch::async, [file = file_] { return BuildVocabulary(*file); });
}

absl::Status SlotGrammars::Set(int slot, std::shared_ptr<const grammar::Grammar> grammar) {
  std::unique_ptr<grammar::Matcher>& m = matchers_[static_cast<size_t>(slot)];
  if (grammar == nullptr) {
    m.reset();
    return absl::OkStatus();
  }
  if (vocab_ == nullptr) {
    if (vocab_build_.valid()) {
      absl::StatusOr<std::unique_ptr<grammar::Vocabulary>> v = vocab_build_.get();
      if (v.ok()) {
        vocab_ = *std::move(v);
      } else {
        vocab_error_ = v.status();
      }
    }
    if (vocab_ == nullptr) return vocab_error_;
  }
  m = std::make_unique<grammar::Matcher>(std::move(grammar), vocab_.get());  // its token literals resolved
  return absl::OkStatus();
}

absl::StatusOr<absl::Span<const uint32_t>> SlotGrammars::Allowed(int slot) {
  grammar::Matcher& m = *matchers_[static_cast<size_t>(slot)];
  if (m.ended()) {
    return absl::FailedPreconditionError("the grammar ended the generation: nothing may follow its end token");
  }
  bits_.assign(vocab_->mask_words(), 0);
  m.FillMask(*vocab_, absl::MakeSpan(bits_));
  // The model's vocabulary may be wider than the tokenizer's (those ids are
  // never allowed: the missing words are zero) or narrower (the tokenizer's
  // ids past it are cut off).
  std::fill(allowed_.begin(), allowed_.end(), 0u);
  std::copy_n(bits_.begin(), std::min(bits_.size(), allowed_.size()), allowed_.begin());
  if (n_vocab_ % 32 != 0 && !allowed_.empty()) allowed_.back() &= (1u << (n_vocab_ % 32)) - 1;
  int64_t n = 0;
  for (uint32_t w : allowed_) n += __builtin_popcount(w);
  if (n == 0) return absl::FailedPreconditionError("the grammar allows no token here");
  return absl::MakeConstSpan(allowed_);
}

absl::Status SlotGrammars::Accept(int slot, int32_t token) {
  return matchers_[static_cast<size_t>(slot)]->AcceptToken(*vocab_, token);
}

}  // namespace dpl::server
