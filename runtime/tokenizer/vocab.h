// The byte-level BPE vocabulary of a GGUF "gpt2" tokenizer, read from
// tokenizer.ggml.*: token texts and types, the lookups Encode needs, and the
// merge ranks. Private to //runtime/tokenizer (tokenizer.cc encodes with it).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "formats/metadata.h"
#include "runtime/tokenizer/tokenizer.h"

namespace dpl::tokenizer {

struct Vocab {
  std::vector<std::string> texts;  // as stored: byte-level encoded for normal tokens
  std::vector<TokenType> types;
  // Views into `texts` (built after `texts` is final; Vocab never moves).
  absl::flat_hash_map<absl::string_view, int32_t> text_to_id;
  std::array<int32_t, 256> byte_token;  // id of the one-byte symbol of each byte
  // (left id << 32 | right id) -> (rank, merged id).
  absl::flat_hash_map<uint64_t, std::pair<int32_t, int32_t>> merges;
  // Control, user-defined and unknown tokens, longest text first.
  std::vector<int32_t> specials;
  PreTokenizer pre = PreTokenizer::kNone;
  bool ignore_merges = false;  // try the whole pre-token as one token first
};

// The merges key of the symbol pair (left, right).
inline uint64_t PairKey(int32_t left, int32_t right) {
  return (uint64_t(uint32_t(left)) << 32) | uint32_t(right);
}

// Reads and checks tokenizer.ggml.pre, .tokens, .token_type and .merges.
absl::StatusOr<std::shared_ptr<Vocab>> LoadBpeVocab(const formats::Metadata& meta);

}  // namespace dpl::tokenizer
