// The vocabulary of a GGUF tokenizer, read from tokenizer.ggml.*: token
// texts and types, the lookups Encode needs, and the merge ranks (byte-level
// BPE, "gpt2") or the token scores (SentencePiece, "llama"). Private to
// //runtime/tokenizer (tokenizer.cc and spm.cc encode with it).
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
  std::vector<float> scores;  // SentencePiece: merge priority of each token (higher first)
  // Views into `texts` (built after `texts` is final; Vocab never moves).
  absl::flat_hash_map<absl::string_view, int32_t> text_to_id;
  // Id of each byte's token: its one-byte symbol (byte-level BPE) or
  // <0xXX> (SentencePiece; kNoToken where the vocabulary lacks it).
  std::array<int32_t, 256> byte_token;
  // (left id << 32 | right id) -> (rank, merged id).
  absl::flat_hash_map<uint64_t, std::pair<int32_t, int32_t>> merges;
  // Control, user-defined and unknown tokens, longest text first.
  std::vector<int32_t> specials;
  PreTokenizer pre = PreTokenizer::kNone;
  bool ignore_merges = false;  // try the whole pre-token as one token first
  bool add_space_prefix = false;  // SentencePiece: " " before a text's first raw fragment
};

// The merges key of the symbol pair (left, right).
inline uint64_t PairKey(int32_t left, int32_t right) {
  return (uint64_t(uint32_t(left)) << 32) | uint32_t(right);
}

// Reads and checks tokenizer.ggml.pre, .tokens, .token_type and .merges.
absl::StatusOr<std::shared_ptr<Vocab>> LoadBpeVocab(const formats::Metadata& meta);
// Reads and checks tokenizer.ggml.tokens, .token_type, .scores and
// .add_space_prefix (default true, as llama.cpp).
absl::StatusOr<std::shared_ptr<Vocab>> LoadSpmVocab(const formats::Metadata& meta);

// SentencePiece: appends the tokens of one raw fragment, already prefixed
// and with its spaces escaped to U+2581 (llama.cpp's
// llm_tokenizer_spm_session::tokenize).
void EncodeSpm(const Vocab& v, absl::string_view escaped, std::vector<int32_t>& out);

}  // namespace dpl::tokenizer
