#include "runtime/tokenizer/vocab.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "runtime/tokenizer/unicode.h"

namespace dpl::tokenizer {
namespace {

// Pre-tokenizer names (tokenizer.ggml.pre) and what llama.cpp maps them to.
struct PreName {
  absl::string_view name;
  PreTokenizer pre;
};
constexpr PreName kPreNames[] = {
    {"llama-bpe", PreTokenizer::kLlama3},
    {"llama3", PreTokenizer::kLlama3},
    {"llama-v3", PreTokenizer::kLlama3},
    {"qwen2", PreTokenizer::kQwen2},
    {"deepseek-r1-qwen", PreTokenizer::kQwen2},
    {"qwen35", PreTokenizer::kQwen35},
};

std::string SupportedPreNames() {
  std::vector<std::string> names;
  for (const PreName& p : kPreNames) names.push_back(absl::StrCat("\"", p.name, "\""));
  return absl::StrJoin(names, ", ");
}

absl::StatusOr<const formats::MetaValue*> GetStringArray(const formats::Metadata& meta,
                                                         absl::string_view key) {
  DPL_ASSIGN_OR_RETURN(const formats::MetaValue* arr, meta.GetArray(key));
  if (arr->elem_type != formats::GgufValueType::kString) {
    return absl::InvalidArgumentError(
        absl::StrCat(key, " must be an array of strings, found an array of ",
                     formats::GgufValueTypeName(arr->elem_type)));
  }
  return arr;
}

// tokenizer.ggml.pre, mapped to the split regex we implement.
absl::StatusOr<PreTokenizer> ReadPreTokenizer(const formats::Metadata& meta) {
  const absl::StatusOr<absl::string_view> name = meta.GetString("tokenizer.ggml.pre");
  if (!name.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "byte-level BPE model without a usable tokenizer.ggml.pre (", name.status().message(),
        "); supported: ", SupportedPreNames()));
  }
  for (const PreName& p : kPreNames) {
    if (p.name == *name) return p.pre;
  }
  return absl::InvalidArgumentError(absl::StrCat("tokenizer.ggml.pre = \"", *name,
                                                 "\" is not supported; supported: ",
                                                 SupportedPreNames()));
}

// Token texts and types (tokenizer.ggml.tokens, tokenizer.ggml.token_type).
absl::Status ReadTokens(const formats::Metadata& meta, Vocab& v) {
  DPL_ASSIGN_OR_RETURN(const formats::MetaValue* tokens,
                       GetStringArray(meta, "tokenizer.ggml.tokens"));
  const uint64_t n = tokens->count;
  if (n == 0 || n > uint64_t(std::numeric_limits<int32_t>::max())) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer.ggml.tokens has ", n, " entries"));
  }
  v.texts.reserve(n);
  for (uint64_t i = 0; i < n; ++i) v.texts.emplace_back(tokens->StringAt(i));
  v.types.assign(n, TokenType::kNormal);
  const formats::MetaValue* tt = meta.Find("tokenizer.ggml.token_type");
  if (tt == nullptr) return absl::OkStatus();
  if (tt->type != formats::GgufValueType::kArray ||
      tt->elem_type == formats::GgufValueType::kString ||
      tt->elem_type == formats::GgufValueType::kF32 ||
      tt->elem_type == formats::GgufValueType::kF64 || tt->count != n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tokenizer.ggml.token_type must be an integer array of ", n,
        " entries (one per token), found ", tt->DebugString(4)));
  }
  for (uint64_t i = 0; i < n; ++i) {
    const int64_t x = tt->IntAt(i);
    if (x < 0 || x > 6) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer.ggml.token_type[", i, "] = ", x, " is not a token type"));
    }
    v.types[i] = static_cast<TokenType>(x);
  }
  return absl::OkStatus();
}

// text -> id (later duplicates win, as in llama.cpp's token_to_id) and the
// one-byte token of every byte.
absl::Status IndexTexts(Vocab& v) {
  v.text_to_id.reserve(v.texts.size());
  for (size_t i = 0; i < v.texts.size(); ++i) v.text_to_id[v.texts[i]] = static_cast<int32_t>(i);
  std::string one;
  for (int b = 0; b < 256; ++b) {
    one.clear();
    AppendUtf8(ByteToCodepoint(uint8_t(b)), one);
    auto it = v.text_to_id.find(absl::string_view(one));
    if (it == v.text_to_id.end()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "byte-level vocabulary lacks the token for byte 0x%02x (text \"%s\")", b, one));
    }
    v.byte_token[b] = it->second;
  }
  return absl::OkStatus();
}

// tokenizer.ggml.merges: "left right" pairs, rank = position.
absl::Status ReadMerges(const formats::Metadata& meta, Vocab& v) {
  DPL_ASSIGN_OR_RETURN(const formats::MetaValue* merges,
                       GetStringArray(meta, "tokenizer.ggml.merges"));
  v.merges.reserve(merges->count);
  std::string joined;
  for (uint64_t i = 0; i < merges->count; ++i) {
    const absl::string_view m = merges->StringAt(i);
    const size_t sp = m.find(' ', 1);
    if (sp == absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer.ggml.merges[", i, "] = \"", m, "\" is not \"left right\""));
    }
    const absl::string_view a = m.substr(0, sp), b = m.substr(sp + 1);
    joined.assign(a.data(), a.size());
    joined.append(b.data(), b.size());
    auto ia = v.text_to_id.find(a), ib = v.text_to_id.find(b);
    auto ij = v.text_to_id.find(absl::string_view(joined));
    // A merge whose halves or result are not tokens could only matter
    // through further merges of non-tokens; real vocabularies have none.
    if (ia == v.text_to_id.end() || ib == v.text_to_id.end() || ij == v.text_to_id.end()) {
      continue;
    }
    // First (lowest-rank) occurrence of a pair wins.
    v.merges.try_emplace(PairKey(ia->second, ib->second), static_cast<int32_t>(i), ij->second);
  }
  return absl::OkStatus();
}

// Control, user-defined and unknown tokens with a text, longest first (the
// special partition tries them in this order).
void ListSpecials(Vocab& v) {
  for (size_t i = 0; i < v.texts.size(); ++i) {
    const TokenType ty = v.types[i];
    if ((ty == TokenType::kControl || ty == TokenType::kUserDefined || ty == TokenType::kUnknown) &&
        !v.texts[i].empty()) {
      v.specials.push_back(static_cast<int32_t>(i));
    }
  }
  std::stable_sort(v.specials.begin(), v.specials.end(), [&](int32_t a, int32_t b) {
    return v.texts[a].size() > v.texts[b].size();
  });
}

}  // namespace

absl::StatusOr<std::shared_ptr<Vocab>> LoadSpmVocab(const formats::Metadata& meta) {
  auto vocab = std::make_shared<Vocab>();
  Vocab& v = *vocab;
  v.pre = PreTokenizer::kSpm;
  DPL_RETURN_IF_ERROR(ReadTokens(meta, v));
  const size_t n = v.texts.size();
  const formats::MetaValue* sc = meta.Find("tokenizer.ggml.scores");
  if (sc == nullptr || sc->type != formats::GgufValueType::kArray ||
      (sc->elem_type != formats::GgufValueType::kF32 && sc->elem_type != formats::GgufValueType::kF64) ||
      sc->count != n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "SentencePiece vocabulary needs tokenizer.ggml.scores, a float array of ", n,
        " entries (one per token)", sc == nullptr ? "; it is missing" : absl::StrCat(", found ", sc->DebugString(4))));
  }
  v.scores.resize(n);
  for (size_t i = 0; i < n; ++i) v.scores[i] = static_cast<float>(sc->FloatAt(i));
  DPL_ASSIGN_OR_RETURN(v.add_space_prefix, meta.GetBoolOr("tokenizer.ggml.add_space_prefix", true));
  v.text_to_id.reserve(n);
  for (size_t i = 0; i < n; ++i) v.text_to_id[v.texts[i]] = static_cast<int32_t>(i);
  for (int b = 0; b < 256; ++b) {
    auto it = v.text_to_id.find(absl::StrFormat("<0x%02X>", b));
    v.byte_token[b] = it == v.text_to_id.end() ? kNoToken : it->second;
  }
  ListSpecials(v);
  return vocab;
}

absl::StatusOr<std::shared_ptr<Vocab>> LoadBpeVocab(const formats::Metadata& meta) {
  auto vocab = std::make_shared<Vocab>();
  Vocab& v = *vocab;
  DPL_ASSIGN_OR_RETURN(v.pre, ReadPreTokenizer(meta));
  // llama.cpp's per-type default (llama-vocab.cpp).
  v.ignore_merges = v.pre == PreTokenizer::kLlama3;
  DPL_RETURN_IF_ERROR(ReadTokens(meta, v));
  DPL_RETURN_IF_ERROR(IndexTexts(v));
  DPL_RETURN_IF_ERROR(ReadMerges(meta, v));
  ListSpecials(v);
  return vocab;
}

}  // namespace dpl::tokenizer
