// Byte-level BPE tokenizer as GGUF describes it (tokenizer.ggml.model "gpt2"),
// SentencePiece's BPE ("llama": Llama 2, Mistral, Phi-3 vocabularies), plus
// the id-only tokenizer of a vocabulary-less model ("none").
//
// Encoding (llama.cpp's llm_tokenizer_bpe, reproduced exactly):
//   1. Special-token partition: the texts of user-defined tokens are always
//      matched; control (and unknown) token texts only when parse_special.
//      Tokens are tried longest text first; each one splits every remaining
//      raw fragment at all of its occurrences.
//   2. Each raw fragment is decoded as UTF-8 (bad bytes -> U+FFFD) and cut by
//      the pre-tokenizer named by tokenizer.ggml.pre (a hand-written scanner
//      for the model's split regex: llama3, qwen2, qwen35).
//   3. Each pre-token's bytes become one symbol per byte and are merged by
//      BPE: the adjacent pair of lowest merge rank first (ties: leftmost).
//      Llama 3 ("ignore_merges") first looks the whole pre-token up in the
//      vocabulary.
// SentencePiece ("llama", llama.cpp's llm_tokenizer_spm): the same special
// partition; each raw fragment gets a leading space when it is the text's
// first or follows a special token (tokenizer.ggml.add_space_prefix, default
// on), spaces become U+2581, and the fragment's UTF-8 characters are merged
// pairwise, the pair whose joined text is the token of highest score first
// (ties: leftmost); a piece that is no token comes out as its bytes'
// <0xXX> tokens.
//
// Vocabulary-less models: Encode returns an empty vector (check has_vocab();
// ParseIdList reads ids typed by a user), TokenToPiece renders "<42>".
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "formats/metadata.h"

namespace dpl::tokenizer {

// tokenizer.ggml.token_type values (llama.cpp's llama_token_type).
enum class TokenType : uint8_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

// The split regexes we implement, by llama.cpp pre-tokenizer type.
enum class PreTokenizer : uint8_t {
  kNone,    // vocabulary-less model
  kLlama3,  // "llama-bpe", "llama3", "llama-v3": digits in runs of 1..3
  kQwen2,   // "qwen2", "deepseek-r1-qwen": digits one at a time
  kQwen35,  // "qwen35": as qwen2, combining marks (\p{M}) joined to letters
  kSpm,     // SentencePiece ("llama" model): no split, whitespace escaped
};

inline constexpr int32_t kNoToken = -1;

struct Vocab;  // tokenizer.cc

class Tokenizer {
 public:
  // Reads tokenizer.ggml.* (and {arch}.vocab_size for model "none"). Rejects
  // other tokenizer models and unknown pre-tokenizers, naming the supported
  // ones.
  static absl::StatusOr<Tokenizer> FromMetadata(const formats::Metadata& meta);

  // Token ids of `text`. add_bos prepends the BOS id (when the model has one;
  // whether the model wants it is adds_bos_by_default()). parse_special
  // matches control-token texts such as "<|im_start|>".
  std::vector<int32_t> Encode(absl::string_view text, bool add_bos, bool parse_special) const;
  // [begin, end) of each control-token text Encode(text, _, true) would turn
  // into its token (user-defined tokens, which match either way, excluded),
  // in order.
  std::vector<std::pair<size_t, size_t>> ControlTextSpans(absl::string_view text) const;

  // The bytes a token stands for. Control tokens render their text (e.g.
  // "<|im_end|>"); out-of-range ids and ids of a vocabulary-less model
  // render as "<ID>". A piece may be part of a UTF-8 character: use
  // TokenStreamDecoder to print tokens as they come.
  std::string TokenToPiece(int32_t id) const;
  // Concatenated pieces.
  std::string Decode(absl::Span<const int32_t> ids) const;

  // Fewest tokens Encode can give for `n_bytes` of text: no piece is longer
  // than the longest token text in the vocabulary (a byte-level BPE piece
  // has at most as many bytes as its stored text), so a caller can refuse a
  // text too long for its context without tokenizing it (ceil(n_bytes /
  // longest text), plus the BOS when added). A vocabulary-less model reads
  // no text: 0.
  int64_t MinTokensFor(int64_t n_bytes, bool add_bos) const;

  // EOS, EOT, EOM from metadata, plus control/user-defined tokens whose text
  // is a known end-of-turn marker (<|im_end|>, <|eot_id|>, <|eom_id|>,
  // <|endoftext|>, <|end_of_text|>).
  bool IsEndOfGeneration(int32_t id) const;
  const std::vector<int32_t>& end_of_generation_ids() const { return eog_ids_; }

  bool has_vocab() const { return vocab_ != nullptr; }
  int32_t n_vocab() const { return n_vocab_; }
  PreTokenizer pre_tokenizer() const { return pre_; }
  bool adds_bos_by_default() const { return add_bos_; }
  bool adds_eos_by_default() const { return add_eos_; }
  // SentencePiece vocabularies that put a space before a text's first raw
  // fragment (Decode of Encode(text) then starts with that space).
  bool adds_space_prefix() const;
  int32_t bos_id() const { return bos_id_; }  // kNoToken when absent
  int32_t eos_id() const { return eos_id_; }
  int32_t eot_id() const { return eot_id_; }

  // Id of the token whose vocabulary text is exactly `text`; kNoToken if none
  // (always for a vocabulary-less model).
  int32_t FindToken(absl::string_view text) const;
  // Vocabulary text (byte-level encoded for normal tokens); empty when absent.
  absl::string_view TokenText(int32_t id) const;
  TokenType token_type(int32_t id) const;

  // Parses "1, 2,3" or "1 2 3" into ids, each checked against n_vocab.
  static absl::StatusOr<std::vector<int32_t>> ParseIdList(absl::string_view text,
                                                          int32_t n_vocab);

 private:
  struct Fragment {
    int32_t token;  // kNoToken: raw text [begin, end)
    size_t begin;
    size_t end;
  };
  std::vector<Fragment> Partition(absl::string_view text, bool parse_special) const;

  std::shared_ptr<const Vocab> vocab_;  // null for a vocabulary-less model
  int32_t n_vocab_ = 0;
  int64_t max_text_bytes_ = 0;  // longest token text of the vocabulary
  PreTokenizer pre_ = PreTokenizer::kNone;
  bool add_bos_ = false;
  bool add_eos_ = false;
  int32_t bos_id_ = kNoToken;
  int32_t eos_id_ = kNoToken;
  int32_t eot_id_ = kNoToken;
  int32_t eom_id_ = kNoToken;
  std::vector<int32_t> eog_ids_;  // sorted, unique
};

// Turns a stream of token ids into text without ever splitting a UTF-8
// character across the strings it returns: bytes of an incomplete trailing
// sequence are held until the next token completes them (or Flush).
class TokenStreamDecoder {
 public:
  explicit TokenStreamDecoder(const Tokenizer& tokenizer) : tokenizer_(&tokenizer) {}

  // Text that became complete with this token (maybe empty).
  std::string Push(int32_t id);
  // Whatever is held back (an incomplete sequence, emitted as raw bytes).
  std::string Flush();

 private:
  const Tokenizer* tokenizer_;
  std::string pending_;
};

}  // namespace dpl::tokenizer
