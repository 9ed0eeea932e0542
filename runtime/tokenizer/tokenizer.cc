#include "runtime/tokenizer/tokenizer.h"

#include <algorithm>
#include <array>
#include <limits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/match.h"
#include "base/status_macros.h"
#include "runtime/tokenizer/unicode.h"
#include "runtime/tokenizer/vocab.h"

namespace dpl::tokenizer {
namespace {

// Texts that end a turn in the model families we know.
constexpr absl::string_view kEndOfTurnTexts[] = {
    "<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|endoftext|>", "<|end_of_text|>",
    "<|end|>",  // Phi-3
};

bool IsCrOrLf(uint32_t cp) { return cp == '\r' || cp == '\n'; }

uint32_t AsciiLower(uint32_t cp) { return (cp >= 'A' && cp <= 'Z') ? cp + 32 : cp; }

// End of the whitespace pre-token at `pos`: \s*[\r\n]+ | \s+(?!\S) | \s+.
size_t WhitespaceEnd(const std::vector<uint32_t>& cpts, const std::vector<uint8_t>& cls,
                     size_t pos) {
  const size_t n = cpts.size();
  size_t run = 0;
  size_t after_last_newline = 0;  // 0: no \r or \n in the run
  while (pos + run < n && (cls[pos + run] & kClassWhitespace)) {
    if (IsCrOrLf(cpts[pos + run])) after_last_newline = pos + run + 1;
    ++run;
  }
  if (after_last_newline > 0) return after_last_newline;
  // Leave the last space to prefix the word that follows.
  if (run > 1 && pos + run < n) return pos + run - 1;
  if (run > 0) return pos + run;
  return pos + 1;  // unreachable for valid classes; never loop forever
}

// Splits code points [0, n) into pre-tokens, calling emit(begin, end) for each.
// One scanner serves the three regexes, which differ in digit runs and in
// whether combining marks join letters (qwen35: \p{L} below is [\p{L}\p{M}],
// and the punctuation run excludes \p{M} too):
//   (?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])
//   | [^\r\n\p{L}\p{N}]?\p{L}+
//   | \p{N}{1,max_digits}
//   | ' '?[^\s\p{L}\p{N}]+[\r\n]*
//   | \s*[\r\n]+ | \s+(?!\S) | \s+
// Alternatives are tried in order at each position, as a regex engine would.
template <typename Emit>
void ScanPreTokens(const std::vector<uint32_t>& cpts, const std::vector<uint8_t>& cls,
                   size_t max_digits, bool marks_join_letters, Emit&& emit) {
  const size_t n = cpts.size();
  auto cls_at = [&](size_t p) -> uint8_t { return p < n ? cls[p] : 0; };
  const uint8_t kWord = marks_join_letters ? kClassLetter | kClassMark : kClassLetter;
  const uint8_t kLwn = kWord | kClassWhitespace | kClassNumber;
  size_t pos = 0;
  while (pos < n) {
    const uint32_t cp = cpts[pos];
    const uint8_t c = cls[pos];

    // Contractions: 's 't 'm 'd 're 've 'll, any case.
    if (cp == '\'' && pos + 1 < n) {
      const uint32_t c1 = AsciiLower(cpts[pos + 1]);
      if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') {
        emit(pos, pos + 2);
        pos += 2;
        continue;
      }
      if (pos + 2 < n) {
        const uint32_t c2 = AsciiLower(cpts[pos + 2]);
        if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) {
          emit(pos, pos + 3);
          pos += 3;
          continue;
        }
      }
    }

    // [^\r\n\p{L}\p{N}]?\p{L}+
    if (!IsCrOrLf(cp) && !(c & kClassNumber) && ((c & kWord) || (cls_at(pos + 1) & kWord))) {
      size_t end = pos + 1;
      while (cls_at(end) & kWord) ++end;
      emit(pos, end);
      pos = end;
      continue;
    }

    // \p{N}{1,max_digits}
    if (c & kClassNumber) {
      size_t end = pos + 1;
      while (end - pos < max_digits && (cls_at(end) & kClassNumber)) ++end;
      emit(pos, end);
      pos = end;
      continue;
    }

    // ' '?[^\s\p{L}\p{N}]+[\r\n]*
    {
      const size_t first = pos + (cp == ' ' ? 1 : 0);
      if (first < n && !(cls[first] & kLwn)) {
        size_t end = first + 1;
        while (end < n && !(cls[end] & kLwn)) ++end;
        while (end < n && IsCrOrLf(cpts[end])) ++end;
        emit(pos, end);
        pos = end;
        continue;
      }
    }

    const size_t end = WhitespaceEnd(cpts, cls, pos);
    emit(pos, end);
    pos = end;
  }
}

// Scratch buffers reused across the pre-tokens of one Encode call.
struct Workspace {
  std::vector<uint32_t> cpts;
  std::vector<uint8_t> cls;
  std::string piece;
  std::string byte_level;
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
  };
  std::vector<Symbol> symbols;
  struct Candidate {
    int32_t rank;
    int32_t left;  // symbol index of the left half
    int32_t left_id;
    int32_t right_id;
    int32_t merged_id;
  };
  std::vector<Candidate> heap;
};

// Heap order: lowest rank first, then leftmost.
bool LaterCandidate(const Workspace::Candidate& a, const Workspace::Candidate& b) {
  return a.rank != b.rank ? a.rank > b.rank : a.left > b.left;
}

// BPE of one pre-token's bytes, appending ids to `out`.
void BpeWord(const Vocab& v, absl::string_view bytes, Workspace& ws, std::vector<int32_t>& out) {
  if (bytes.empty()) return;
  if (bytes.size() == 1) {
    out.push_back(v.byte_token[uint8_t(bytes[0])]);
    return;
  }
  if (v.ignore_merges) {
    ws.byte_level.clear();
    for (char ch : bytes) AppendUtf8(ByteToCodepoint(uint8_t(ch)), ws.byte_level);
    auto it = v.text_to_id.find(absl::string_view(ws.byte_level));
    if (it != v.text_to_id.end()) {
      out.push_back(it->second);
      return;
    }
  }

  const int32_t n = static_cast<int32_t>(bytes.size());
  auto& sym = ws.symbols;
  sym.resize(n);
  for (int32_t i = 0; i < n; ++i) {
    sym[i] = {v.byte_token[uint8_t(bytes[i])], i - 1, i + 1 < n ? i + 1 : -1};
  }
  auto& heap = ws.heap;
  heap.clear();
  auto consider = [&](int32_t left) {
    if (left < 0) return;
    const int32_t right = sym[left].next;
    if (right < 0) return;
    auto it = v.merges.find(PairKey(sym[left].id, sym[right].id));
    if (it == v.merges.end()) return;
    heap.push_back({it->second.first, left, sym[left].id, sym[right].id, it->second.second});
    std::push_heap(heap.begin(), heap.end(), LaterCandidate);
  };
  for (int32_t i = 0; i + 1 < n; ++i) consider(i);

  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), LaterCandidate);
    const Workspace::Candidate c = heap.back();
    heap.pop_back();
    // Stale if either half has merged since: symbol ids only ever grow into
    // longer texts starting at the same byte, so equal ids mean the same pair.
    Workspace::Symbol& l = sym[c.left];
    if (l.id != c.left_id || l.next < 0) continue;
    Workspace::Symbol& r = sym[l.next];
    if (r.id != c.right_id) continue;
    l.id = c.merged_id;
    r.id = kNoToken;  // dead
    l.next = r.next;
    if (l.next >= 0) sym[l.next].prev = c.left;
    consider(l.prev);
    consider(c.left);
  }
  for (int32_t i = 0; i >= 0; i = sym[i].next) out.push_back(sym[i].id);
}

// UTF-8 decode, pre-tokenize and BPE one fragment of raw text.
void EncodeRaw(const Vocab& v, absl::string_view text, Workspace& ws, std::vector<int32_t>& out) {
  ws.cpts.clear();
  DecodeUtf8(text, ws.cpts);
  ws.cls.resize(ws.cpts.size());
  for (size_t i = 0; i < ws.cpts.size(); ++i) ws.cls[i] = ClassOf(ws.cpts[i]);
  const size_t max_digits = v.pre == PreTokenizer::kLlama3 ? 3 : 1;
  ScanPreTokens(ws.cpts, ws.cls, max_digits, v.pre == PreTokenizer::kQwen35, [&](size_t begin, size_t end) {
    // Re-encoded from code points, so bad input bytes tokenize as U+FFFD.
    ws.piece.clear();
    for (size_t i = begin; i < end; ++i) AppendUtf8(ws.cpts[i], ws.piece);
    BpeWord(v, ws.piece, ws, out);
  });
}

absl::StatusOr<int32_t> ReadOptionalId(const formats::Metadata& meta, absl::string_view key,
                                       int64_t n_vocab) {
  if (meta.Find(key) == nullptr) return kNoToken;
  DPL_ASSIGN_OR_RETURN(const uint64_t id, meta.GetUint(key));
  if (id >= uint64_t(n_vocab)) {
    return absl::InvalidArgumentError(
        absl::StrCat(key, " = ", id, " is outside the vocabulary of ", n_vocab, " tokens"));
  }
  return static_cast<int32_t>(id);
}

constexpr absl::string_view kModelKey = "tokenizer.ggml.model";

// A vocabulary-less model ("none"): only its size, from {arch}.vocab_size.
absl::StatusOr<int32_t> IdOnlyVocabSize(const formats::Metadata& meta) {
  DPL_ASSIGN_OR_RETURN(const absl::string_view arch, meta.GetString("general.architecture"));
  const std::string key = absl::StrCat(arch, ".vocab_size");
  if (meta.Find(key) == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model has no vocabulary (tokenizer.ggml.model ",
        meta.Find(kModelKey) ? "= \"none\"" : "is missing", ") and no ", key));
  }
  DPL_ASSIGN_OR_RETURN(const uint64_t n, meta.GetUint(key));
  if (n == 0 || n > uint64_t(std::numeric_limits<int32_t>::max())) {
    return absl::InvalidArgumentError(absl::StrCat(key, " = ", n, " is not a usable size"));
  }
  return static_cast<int32_t>(n);
}

absl::Status UnsupportedModel(absl::string_view model) {
  absl::string_view what = model == "bert" ? " (WordPiece)"
                          : model == "t5"   ? " (Unigram)"
                                            : "";
  return absl::UnimplementedError(absl::StrCat(
      "tokenizer.ggml.model = \"", model, "\"", what,
      " is not supported; dpl supports \"gpt2\" (byte-level BPE), \"llama\" (SentencePiece) "
      "and \"none\" (ids only)"));
}

// A SentencePiece token's text as bytes: U+2581 back to a space.
std::string UnescapeSpm(absl::string_view text) {
  return absl::StrReplaceAll(text, {{"\xe2\x96\x81", " "}});
}

}  // namespace

int64_t Tokenizer::MinTokensFor(int64_t n_bytes, bool add_bos) const {
  if (vocab_ == nullptr || max_text_bytes_ <= 0 || n_bytes <= 0) return 0;
  return (n_bytes + max_text_bytes_ - 1) / max_text_bytes_ + (add_bos && bos_id_ != kNoToken ? 1 : 0);
}

absl::StatusOr<Tokenizer> Tokenizer::FromMetadata(const formats::Metadata& meta) {
  std::string model = "none";
  if (meta.Find(kModelKey) != nullptr) {
    DPL_ASSIGN_OR_RETURN(const absl::string_view m, meta.GetString(kModelKey));
    model = std::string(m);
  }
  Tokenizer t;
  if (model == "none") {
    DPL_ASSIGN_OR_RETURN(t.n_vocab_, IdOnlyVocabSize(meta));
  } else if (model == "llama") {
    DPL_ASSIGN_OR_RETURN(t.vocab_, LoadSpmVocab(meta));
    t.n_vocab_ = static_cast<int32_t>(t.vocab_->texts.size());
    t.pre_ = PreTokenizer::kSpm;
    for (const std::string& text : t.vocab_->texts) {
      t.max_text_bytes_ = std::max<int64_t>(t.max_text_bytes_, static_cast<int64_t>(text.size()));
    }
  } else if (model == "gpt2") {
    DPL_ASSIGN_OR_RETURN(t.vocab_, LoadBpeVocab(meta));
    t.n_vocab_ = static_cast<int32_t>(t.vocab_->texts.size());
    t.pre_ = t.vocab_->pre;
    for (const std::string& text : t.vocab_->texts) {
      t.max_text_bytes_ = std::max<int64_t>(t.max_text_bytes_, static_cast<int64_t>(text.size()));
    }
  } else {
    return UnsupportedModel(model);
  }

  DPL_ASSIGN_OR_RETURN(t.bos_id_, ReadOptionalId(meta, "tokenizer.ggml.bos_token_id", t.n_vocab_));
  DPL_ASSIGN_OR_RETURN(t.eos_id_, ReadOptionalId(meta, "tokenizer.ggml.eos_token_id", t.n_vocab_));
  DPL_ASSIGN_OR_RETURN(t.eot_id_, ReadOptionalId(meta, "tokenizer.ggml.eot_token_id", t.n_vocab_));
  DPL_ASSIGN_OR_RETURN(t.eom_id_, ReadOptionalId(meta, "tokenizer.ggml.eom_token_id", t.n_vocab_));
  // llama.cpp's SentencePiece defaults where the file names none: <s> = 1,
  // </s> = 2.
  if (t.pre_ == PreTokenizer::kSpm) {
    if (t.bos_id_ == kNoToken && meta.Find("tokenizer.ggml.bos_token_id") == nullptr && t.n_vocab_ > 1) t.bos_id_ = 1;
    if (t.eos_id_ == kNoToken && meta.Find("tokenizer.ggml.eos_token_id") == nullptr && t.n_vocab_ > 2) t.eos_id_ = 2;
  }
  // llama.cpp's per-type default: Llama 3 and SentencePiece vocabularies add BOS.
  const bool bos_default = t.pre_ == PreTokenizer::kLlama3 || t.pre_ == PreTokenizer::kSpm;
  DPL_ASSIGN_OR_RETURN(const bool add_bos, meta.GetBoolOr("tokenizer.ggml.add_bos_token", bos_default));
  DPL_ASSIGN_OR_RETURN(const bool add_eos, meta.GetBoolOr("tokenizer.ggml.add_eos_token", false));
  t.add_bos_ = add_bos && t.bos_id_ != kNoToken;
  t.add_eos_ = add_eos && t.eos_id_ != kNoToken;

  for (int32_t id : {t.eos_id_, t.eot_id_, t.eom_id_}) {
    if (id != kNoToken) t.eog_ids_.push_back(id);
  }
  for (absl::string_view text : kEndOfTurnTexts) {
    const int32_t id = t.FindToken(text);
    if (id == kNoToken) continue;
    const TokenType ty = t.token_type(id);
    if (ty == TokenType::kControl || ty == TokenType::kUserDefined) t.eog_ids_.push_back(id);
  }
  std::sort(t.eog_ids_.begin(), t.eog_ids_.end());
  t.eog_ids_.erase(std::unique(t.eog_ids_.begin(), t.eog_ids_.end()), t.eog_ids_.end());
  return t;
}

// The text split into raw fragments and special tokens (llama.cpp's
// tokenizer_st_partition): each special, longest first, splits every raw
// fragment at all its occurrences. Control tokens match only with
// parse_special; user-defined ones always.
std::vector<Tokenizer::Fragment> Tokenizer::Partition(absl::string_view text, bool parse_special) const {
  const Vocab& v = *vocab_;
  std::vector<Fragment> frags = {{kNoToken, 0, text.size()}};
  std::vector<Fragment> next;
  std::array<bool, 256> present{};  // bytes that occur in `text`
  for (char ch : text) present[uint8_t(ch)] = true;
  for (int32_t id : v.specials) {
    const TokenType ty = v.types[id];
    if (!parse_special && ty != TokenType::kUserDefined) continue;
    const absl::string_view s = v.texts[id];
    if (!present[uint8_t(s[0])]) continue;
    bool found = false;
    next.clear();
    for (const Fragment& f : frags) {
      if (f.token != kNoToken) {
        next.push_back(f);
        continue;
      }
      size_t at = f.begin;
      while (at < f.end) {
        const size_t hit = text.substr(0, f.end).find(s, at);
        if (hit == absl::string_view::npos) break;
        found = true;
        if (hit > at) next.push_back({kNoToken, at, hit});
        next.push_back({id, hit, hit + s.size()});
        at = hit + s.size();
      }
      if (at < f.end) next.push_back({kNoToken, at, f.end});
    }
    if (found) frags.swap(next);
  }
  return frags;
}

std::vector<int32_t> Tokenizer::Encode(absl::string_view text, bool add_bos,
                                       bool parse_special) const {
  std::vector<int32_t> out;
  if (vocab_ == nullptr) return out;
  if (add_bos && bos_id_ != kNoToken) out.push_back(bos_id_);
  if (pre_ == PreTokenizer::kSpm) {
    // A raw fragment after the start or a special token gets the space
    // prefix (llama.cpp: is_prev_special starts true).
    bool prev_special = true;
    std::string escaped;
    for (const Fragment& f : Partition(text, parse_special)) {
      if (f.token != kNoToken) {
        out.push_back(f.token);
        prev_special = true;
        continue;
      }
      if (f.begin == f.end) continue;  // empty text: no tokens
      escaped.clear();
      if (vocab_->add_space_prefix && prev_special) escaped = "\xe2\x96\x81";
      escaped += absl::StrReplaceAll(text.substr(f.begin, f.end - f.begin), {{" ", "\xe2\x96\x81"}});
      EncodeSpm(*vocab_, escaped, out);
      prev_special = false;
    }
    return out;
  }
  Workspace ws;
  for (const Fragment& f : Partition(text, parse_special)) {
    if (f.token != kNoToken) {
      out.push_back(f.token);
    } else {
      EncodeRaw(*vocab_, text.substr(f.begin, f.end - f.begin), ws, out);
    }
  }
  return out;
}

std::vector<std::pair<size_t, size_t>> Tokenizer::ControlTextSpans(absl::string_view text) const {
  std::vector<std::pair<size_t, size_t>> spans;
  if (vocab_ == nullptr) return spans;
  for (const Fragment& f : Partition(text, /*parse_special=*/true)) {
    if (f.token != kNoToken && vocab_->types[f.token] != TokenType::kUserDefined) spans.emplace_back(f.begin, f.end);
  }
  return spans;
}

std::string Tokenizer::TokenToPiece(int32_t id) const {
  if (vocab_ == nullptr || id < 0 || id >= n_vocab_) return absl::StrCat("<", id, ">");
  const std::string& text = vocab_->texts[id];
  switch (vocab_->types[id]) {
    case TokenType::kControl:
    case TokenType::kUserDefined:
    case TokenType::kUnknown:
      return text;
    default:
      break;
  }
  if (pre_ == PreTokenizer::kSpm) {
    if (vocab_->types[id] == TokenType::kByte && text.size() == 6 && absl::StartsWith(text, "<0x")) {
      int byte = 0;
      if (absl::SimpleHexAtoi(absl::string_view(text).substr(3, 2), &byte)) {
        return std::string(1, static_cast<char>(byte));
      }
    }
    return UnescapeSpm(text);
  }
  // Byte-level text -> bytes. A code point outside the byte map (never in a
  // well-formed vocabulary) is passed through as UTF-8.
  std::vector<uint32_t> cpts;
  DecodeUtf8(text, cpts);
  std::string out;
  out.reserve(cpts.size());
  for (uint32_t cp : cpts) {
    const int b = CodepointToByte(cp);
    if (b >= 0) {
      out.push_back(static_cast<char>(b));
    } else {
      AppendUtf8(cp, out);
    }
  }
  return out;
}

std::string Tokenizer::Decode(absl::Span<const int32_t> ids) const {
  std::string out;
  for (int32_t id : ids) out += TokenToPiece(id);
  return out;
}

bool Tokenizer::adds_space_prefix() const {
  return vocab_ != nullptr && pre_ == PreTokenizer::kSpm && vocab_->add_space_prefix;
}

bool Tokenizer::IsEndOfGeneration(int32_t id) const {
  return std::binary_search(eog_ids_.begin(), eog_ids_.end(), id);
}

int32_t Tokenizer::FindToken(absl::string_view text) const {
  if (vocab_ == nullptr) return kNoToken;
  auto it = vocab_->text_to_id.find(text);
  return it == vocab_->text_to_id.end() ? kNoToken : it->second;
}

absl::string_view Tokenizer::TokenText(int32_t id) const {
  if (vocab_ == nullptr || id < 0 || id >= n_vocab_) return {};
  return vocab_->texts[id];
}

TokenType Tokenizer::token_type(int32_t id) const {
  if (vocab_ == nullptr || id < 0 || id >= n_vocab_) return TokenType::kUndefined;
  return vocab_->types[id];
}

absl::StatusOr<std::vector<int32_t>> Tokenizer::ParseIdList(absl::string_view text,
                                                            int32_t n_vocab) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i < text.size()) {
    const char ch = text[i];
    if (ch == ',' || ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r') {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < text.size() && text[j] >= '0' && text[j] <= '9') ++j;
    int64_t id = 0;
    if (j == i || j - i > 10 || !absl::SimpleAtoi(text.substr(i, j - i), &id)) {
      return absl::InvalidArgumentError(
          absl::StrCat("token id list: expected a number at offset ", i, " of \"", text, "\""));
    }
    if (id >= n_vocab) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", id,
                                                     " is outside the vocabulary of ", n_vocab,
                                                     " tokens"));
    }
    ids.push_back(static_cast<int32_t>(id));
    i = j;
  }
  return ids;
}

std::string TokenStreamDecoder::Push(int32_t id) {
  pending_ += tokenizer_->TokenToPiece(id);
  // Hold back a trailing sequence whose lead byte announces more bytes than
  // have arrived. Only the last 3 bytes can belong to such a sequence.
  size_t keep = 0;
  const size_t n = pending_.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const uint8_t b = static_cast<uint8_t>(pending_[n - back]);
    if ((b & 0xC0) == 0x80) continue;  // continuation byte: look further back
    const int len = Utf8SequenceLength(b);
    if (len > int(back)) keep = back;
    break;
  }
  std::string out = pending_.substr(0, n - keep);
  pending_.erase(0, n - keep);
  return out;
}

std::string TokenStreamDecoder::Flush() {
  std::string out;
  out.swap(pending_);
  return out;
}

}  // namespace dpl::tokenizer
