#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "formats/gguf.h"
#include "runtime/tokenizer/tokenizer.h"
#include "runtime/tokenizer/unicode.h"
#include "tests/shared_dir.h"

namespace dpl::tokenizer {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE_MESSAGE(in.good(), "cannot open ", path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

const formats::Metadata& MetadataOf(const std::string& rel_path) {
  static std::map<std::string, std::unique_ptr<formats::Metadata>> cache;
  auto& slot = cache[rel_path];
  if (!slot) {
    auto gguf = formats::GgufFile::Open(testing::SharedDir() + "/" + rel_path);
    REQUIRE_MESSAGE(gguf.ok(), gguf.status().ToString());
    slot = std::make_unique<formats::Metadata>(gguf->metadata());
  }
  return *slot;
}

const Tokenizer& TokenizerOf(const std::string& rel_path) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  auto& slot = cache[rel_path];
  if (!slot) {
    auto t = Tokenizer::FromMetadata(MetadataOf(rel_path));
    REQUIRE_MESSAGE(t.ok(), rel_path, ": ", t.status().ToString());
    slot = std::make_unique<Tokenizer>(*std::move(t));
  }
  return *slot;
}

std::string IdsToString(const std::vector<int32_t>& ids) { return absl::StrJoin(ids, " "); }

// llama.cpp's vocab tests: each case in .inp is followed by
// "\n__ggml_vocab_test__\n"; .out has one line of space-separated ids per case.
void RunVocabVectors(const std::string& name) {
  const std::string base = testing::SharedDir() + "/vocab/" + name;
  const std::string inp = ReadFile(base + ".inp");
  const std::string outp = ReadFile(base + ".out");
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> cases;
  size_t at = 0;
  for (size_t hit; (hit = inp.find(sep, at)) != std::string::npos; at = hit + sep.size()) {
    cases.push_back(inp.substr(at, hit - at));
  }
  REQUIRE_MESSAGE(at == inp.size(), "trailing text after the last separator in ", name);
  std::vector<std::string> lines = absl::StrSplit(outp, '\n');
  REQUIRE(!lines.empty());
  REQUIRE(lines.back().empty());  // file ends with a newline
  lines.pop_back();
  REQUIRE_MESSAGE(lines.size() == cases.size(), name, ": ", cases.size(), " inputs but ",
                  lines.size(), " outputs");
  REQUIRE(cases.size() >= 40);

  const Tokenizer& tok = TokenizerOf("vocab/" + name);
  int mismatches = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    std::vector<int32_t> expect;
    for (absl::string_view f : absl::StrSplit(lines[i], ' ', absl::SkipEmpty())) {
      int32_t id;
      REQUIRE(absl::SimpleAtoi(f, &id));
      expect.push_back(id);
    }
    const std::vector<int32_t> got = tok.Encode(cases[i], /*add_bos=*/false,
                                                /*parse_special=*/false);
    if (got != expect) {
      ++mismatches;
      FAIL_CHECK(name, " case ", i, " \"", cases[i], "\"\n  expected: ", IdsToString(expect),
                     "\n  got:      ", IdsToString(got));
    }
    // Every case is valid UTF-8, so pieces must give the text back (after
    // the space a SentencePiece vocabulary puts before it).
    const std::string back = (tok.adds_space_prefix() && !cases[i].empty() ? " " : "") + cases[i];
    CHECK_MESSAGE(tok.Decode(got) == back, name, " case ", i, " does not round-trip");
  }
  MESSAGE(name, ": ", cases.size() - mismatches, "/", cases.size(), " cases match");
  CHECK(mismatches == 0);
}

TEST_CASE("llama.cpp vocab vectors: qwen2") { RunVocabVectors("ggml-vocab-qwen2.gguf"); }

TEST_CASE("llama.cpp vocab vectors: qwen35") { RunVocabVectors("ggml-vocab-qwen35.gguf"); }

TEST_CASE("llama.cpp vocab vectors: llama-spm (SentencePiece)") {
  RunVocabVectors("ggml-vocab-llama-spm.gguf");
}

TEST_CASE("llama.cpp vocab vectors: phi-3 (SentencePiece)") { RunVocabVectors("ggml-vocab-phi-3.gguf"); }

TEST_CASE("SentencePiece: BOS, space prefix after specials, byte fallback, end of turn") {
  const Tokenizer& spm = TokenizerOf("vocab/ggml-vocab-llama-spm.gguf");
  CHECK(spm.pre_tokenizer() == PreTokenizer::kSpm);
  CHECK(spm.adds_bos_by_default());
  CHECK(spm.bos_id() == 1);
  CHECK(spm.eos_id() == 2);
  CHECK(spm.IsEndOfGeneration(2));
  CHECK(spm.Encode("", false, false).empty());
  CHECK(spm.Encode("", true, false) == std::vector<int32_t>{1});
  const std::vector<int32_t> hello = spm.Encode("Hello world", false, false);
  REQUIRE(!hello.empty());
  CHECK(spm.TokenText(hello[0]).substr(0, 3) == "\xe2\x96\x81");  // "▁Hello"
  CHECK(spm.Decode(hello) == " Hello world");
  std::vector<int32_t> with_bos = {1};
  with_bos.insert(with_bos.end(), hello.begin(), hello.end());
  CHECK(spm.Encode("Hello world", true, false) == with_bos);
  // "<s>" is a control token: text without parse_special, the token with it;
  // the raw text after it gets the space prefix again.
  CHECK(spm.Encode("<s>Hello world", false, true) == with_bos);
  CHECK(spm.Encode("<s>Hello world", false, false) != with_bos);
  // A character with no token of its own comes out as its UTF-8 bytes.
  const std::vector<int32_t> rare = spm.Encode("\xf0\x9f\x98\x80", false, false);  // U+1F600
  int bytes = 0;
  for (int32_t id : rare) bytes += spm.token_type(id) == TokenType::kByte;
  CHECK(bytes == 4);
  CHECK(spm.Decode(rare) == " \xf0\x9f\x98\x80");

  const Tokenizer& phi3 = TokenizerOf("vocab/ggml-vocab-phi-3.gguf");
  const int32_t end = phi3.FindToken("<|end|>");
  REQUIRE(end != kNoToken);
  CHECK(phi3.IsEndOfGeneration(end));
}

TEST_CASE("llama.cpp vocab vectors: llama-bpe") { RunVocabVectors("ggml-vocab-llama-bpe.gguf"); }

TEST_CASE("oracle prompt of tiny-qwen2-vocab tokenizes like llama.cpp") {
  const std::string prompt = ReadFile(testing::SharedDir() + "/oracle/tiny-qwen2-vocab-q4km.prompt");
  const std::string tokens_text =
      ReadFile(testing::SharedDir() + "/oracle/tiny-qwen2-vocab-q4km.tokens");
  std::vector<int32_t> all;
  for (absl::string_view f : absl::StrSplit(tokens_text, absl::ByAnyChar(", \n"), absl::SkipEmpty())) {
    int32_t id;
    REQUIRE(absl::SimpleAtoi(f, &id));
    all.push_back(id);
  }
  REQUIRE(all.size() > 3);  // the prompt's ids, then 3 continuation tokens
  const std::vector<int32_t> expect(all.begin(), all.end() - 3);

  const Tokenizer& tok = TokenizerOf("oracle/tiny-qwen2-vocab-q4km.gguf");
  CHECK(!tok.adds_bos_by_default());
  const std::vector<int32_t> got = tok.Encode(prompt, /*add_bos=*/false, /*parse_special=*/true);
  CHECK_MESSAGE(got == expect, "expected ", IdsToString(expect), "\ngot      ", IdsToString(got));
  CHECK(std::find(got.begin(), got.end(), 151644) != got.end());  // <|im_start|> as one token
}

TEST_CASE("special text is matched only when asked, and renders back") {
  const Tokenizer& tok = TokenizerOf("vocab/ggml-vocab-qwen2.gguf");
  const std::string text = "<|im_start|>user\nhi<|im_end|>\n";
  const auto with = tok.Encode(text, false, true);
  REQUIRE(with.size() >= 4);
  CHECK(with.front() == 151644);
  CHECK(std::count(with.begin(), with.end(), 151645) == 1);
  const auto without = tok.Encode(text, false, false);
  CHECK(std::count(without.begin(), without.end(), 151644) == 0);
  CHECK(std::count(without.begin(), without.end(), 151645) == 0);
  CHECK(without.size() > with.size());
  CHECK(tok.Decode(with) == text);
  CHECK(tok.Decode(without) == text);

  // Adjacent specials and text around them.
  const auto adj = tok.Encode("a<|im_end|><|im_start|>b", false, true);
  REQUIRE(adj.size() == 4);
  CHECK(adj[1] == 151645);
  CHECK(adj[2] == 151644);
  CHECK(adj[0] == tok.Encode("a", false, false)[0]);

  // User-defined tokens match even without parse_special (llama.cpp does too).
  const int32_t pad = tok.FindToken("[PAD151646]");
  REQUIRE(pad == 151646);
  CHECK(tok.token_type(pad) == TokenType::kUserDefined);
  CHECK(tok.Encode("x[PAD151646]", false, false).back() == pad);
}

TEST_CASE("BOS defaults and end-of-generation ids come from metadata") {
  const Tokenizer& llama = TokenizerOf("vocab/ggml-vocab-llama-bpe.gguf");
  CHECK(llama.pre_tokenizer() == PreTokenizer::kLlama3);
  CHECK(llama.n_vocab() == 128256);
  CHECK(llama.adds_bos_by_default());  // llama-bpe default, no add_bos_token key
  CHECK(llama.bos_id() == 128000);
  const auto ids = llama.Encode("Hello", /*add_bos=*/true, false);
  REQUIRE(ids.size() == 2);
  CHECK(ids[0] == 128000);
  CHECK(llama.IsEndOfGeneration(128001));  // eos <|end_of_text|>
  CHECK(llama.IsEndOfGeneration(128009));  // <|eot_id|> by text
  CHECK(!llama.IsEndOfGeneration(128000));
  CHECK(!llama.IsEndOfGeneration(ids[1]));
  CHECK(llama.TokenToPiece(128009) == "<|eot_id|>");

  const Tokenizer& qwen = TokenizerOf("vocab/ggml-vocab-qwen2.gguf");
  CHECK(qwen.pre_tokenizer() == PreTokenizer::kQwen2);
  CHECK(!qwen.adds_bos_by_default());
  CHECK(qwen.IsEndOfGeneration(151643));  // eos <|endoftext|>
  CHECK(qwen.IsEndOfGeneration(151645));  // <|im_end|>
  CHECK(!qwen.IsEndOfGeneration(151644));
  CHECK(qwen.end_of_generation_ids() == std::vector<int32_t>{151643, 151645});

  // add_bos_token in metadata overrides the pre-tokenizer default.
  formats::Metadata meta = MetadataOf("vocab/ggml-vocab-llama-bpe.gguf");
  meta.Set("tokenizer.ggml.add_bos_token", formats::MetaValue::Bool(false));
  meta.Set("tokenizer.ggml.eot_token_id", formats::MetaValue::U32(128008));
  auto t = Tokenizer::FromMetadata(meta);
  REQUIRE(t.ok());
  CHECK(!t->adds_bos_by_default());
  CHECK(t->eot_id() == 128008);
  CHECK(t->IsEndOfGeneration(128008));
}

TEST_CASE("digits: llama3 groups by three, qwen2 splits each") {
  const Tokenizer& llama = TokenizerOf("vocab/ggml-vocab-llama-bpe.gguf");
  const Tokenizer& qwen = TokenizerOf("vocab/ggml-vocab-qwen2.gguf");
  const std::string digits = "1234567";
  std::vector<std::string> lp, qp;
  for (int32_t id : llama.Encode(digits, false, false)) lp.push_back(llama.TokenToPiece(id));
  for (int32_t id : qwen.Encode(digits, false, false)) qp.push_back(qwen.TokenToPiece(id));
  CHECK(lp == std::vector<std::string>{"123", "456", "7"});
  CHECK(qp == std::vector<std::string>{"1", "2", "3", "4", "5", "6", "7"});
  // Non-ASCII digits are \p{N} too (Arabic-Indic): qwen2 BPEs each on its own.
  std::vector<int32_t> three = qwen.Encode("\xd9\xa3", false, false);
  const std::vector<int32_t> four = qwen.Encode("\xd9\xa4", false, false);
  three.insert(three.end(), four.begin(), four.end());
  CHECK(qwen.Encode("\xd9\xa3\xd9\xa4", false, false) == three);
}

TEST_CASE("MinTokensFor never exceeds what Encode gives") {
  for (const char* vocab : {"vocab/ggml-vocab-qwen2.gguf", "vocab/ggml-vocab-llama-bpe.gguf"}) {
    const Tokenizer& t = TokenizerOf(vocab);
    CAPTURE(vocab);
    // The vocabulary's longest texts (runs of spaces, dashes, ...) are what
    // compress best, so try them, and ordinary text.
    for (const std::string& text :
         {std::string(100000, ' '), std::string(5000, '-'), std::string(20000, 'a'),
          ReadFile(testing::SharedDir() + "/vocab/ggml-vocab-qwen2.gguf.inp")}) {
      for (bool bos : {false, true}) {
        const int64_t bound = t.MinTokensFor(static_cast<int64_t>(text.size()), bos);
        const int64_t got = static_cast<int64_t>(t.Encode(text, bos, true).size());
        CHECK(bound >= 1);
        CHECK(bound <= got);
      }
    }
  }
  // 10 MB can never fit 256 positions: refused without encoding it.
  CHECK(TokenizerOf("vocab/ggml-vocab-qwen2.gguf").MinTokensFor(10000000, false) > 256);
}

TEST_CASE("invalid UTF-8 tokenizes as U+FFFD, like llama.cpp") {
  const Tokenizer& qwen = TokenizerOf("vocab/ggml-vocab-qwen2.gguf");
  CHECK(qwen.Encode("a\xff", false, false) == qwen.Encode("a\xef\xbf\xbd", false, false));
  CHECK(qwen.Encode("", false, false).empty());
}

TEST_CASE("stream decoder never splits a UTF-8 character") {
  const Tokenizer& qwen = TokenizerOf("vocab/ggml-vocab-qwen2.gguf");
  // Byte tokens of U+1F999 (4 bytes) pushed one at a time.
  const std::string llama_emoji = "\xf0\x9f\xa6\x99";
  std::vector<int32_t> byte_ids;
  for (char ch : llama_emoji) {
    std::string one;
    AppendUtf8(ByteToCodepoint(uint8_t(ch)), one);
    byte_ids.push_back(qwen.FindToken(one));
    REQUIRE(byte_ids.back() >= 0);
  }
  TokenStreamDecoder dec(qwen);
  CHECK(dec.Push(qwen.Encode("ok", false, false)[0]) == "ok");
  CHECK(dec.Push(byte_ids[0]).empty());
  CHECK(dec.Push(byte_ids[1]).empty());
  CHECK(dec.Push(byte_ids[2]).empty());
  CHECK(dec.Push(byte_ids[3]) == llama_emoji);
  CHECK(dec.Flush().empty());

  // A held incomplete sequence is released raw by Flush.
  CHECK(dec.Push(byte_ids[0]).empty());
  CHECK(dec.Flush() == "\xf0");

  // Whole text: every chunk is valid UTF-8 and they concatenate to the text.
  const std::string text = "Ünïcödé 🦙🚀 中文字符 and ASCII, 3.14";
  std::string joined;
  TokenStreamDecoder dec2(qwen);
  for (int32_t id : qwen.Encode(text, false, false)) {
    const std::string chunk = dec2.Push(id);
    std::vector<uint32_t> cpts;
    DecodeUtf8(chunk, cpts);
    CHECK(std::count(cpts.begin(), cpts.end(), kReplacementChar) == 0);
    joined += chunk;
  }
  joined += dec2.Flush();
  CHECK(joined == text);
}

TEST_CASE("unicode classes") {
  CHECK(ClassOf('a') == kClassLetter);
  CHECK(ClassOf('7') == kClassNumber);
  CHECK(ClassOf(' ') == kClassWhitespace);
  CHECK(ClassOf('\n') == kClassWhitespace);
  CHECK(ClassOf('!') == 0);
  CHECK(ClassOf(0xE9) == kClassLetter);    // é
  CHECK(ClassOf(0xBD) == kClassNumber);    // ½ (No)
  CHECK(ClassOf(0x4E2D) == kClassLetter);  // 中
  CHECK(ClassOf(0x0301) == kClassMark);    // combining acute (Mn)
  CHECK(ClassOf(0x0903) == kClassMark);    // Devanagari visarga (Mc)
  CHECK(ClassOf(0x20DD) == kClassMark);    // combining enclosing circle (Me)
  CHECK(ClassOf(0x3000) == kClassWhitespace);
  CHECK(ClassOf(0xA0) == kClassWhitespace);
  CHECK(ClassOf(0x1F999) == 0);            // emoji (So)
  CHECK(ClassOf(0x2167) == kClassNumber);  // Roman numeral eight (Nl)
  CHECK(ByteToCodepoint(' ') == 0x120);
  CHECK(CodepointToByte(0x120) == ' ');
  for (int b = 0; b < 256; ++b) CHECK(CodepointToByte(ByteToCodepoint(uint8_t(b))) == b);
}

TEST_CASE("vocabulary-less model works with ids only") {
  const formats::Metadata& meta = MetadataOf("oracle/ora-llama-f32.gguf");
  auto t = Tokenizer::FromMetadata(meta);
  REQUIRE_MESSAGE(t.ok(), t.status().ToString());
  CHECK(!t->has_vocab());
  CHECK(t->n_vocab() == 2048);
  CHECK(t->Encode("hello", true, true).empty());
  CHECK(t->TokenToPiece(42) == "<42>");
  CHECK(t->FindToken("a") == kNoToken);
  CHECK(!t->IsEndOfGeneration(0));
  auto ids = Tokenizer::ParseIdList("1, 2,3 2047", t->n_vocab());
  REQUIRE(ids.ok());
  CHECK(*ids == std::vector<int32_t>{1, 2, 3, 2047});
  CHECK(!Tokenizer::ParseIdList("1,2048", 2048).ok());
  CHECK(!Tokenizer::ParseIdList("1,x", 2048).ok());
  CHECK(!Tokenizer::ParseIdList("-1", 2048).ok());
}

// The error FromMetadata gives for the qwen2 vocabulary after `edit`.
std::string ErrorAfter(const std::function<void(formats::Metadata&)>& edit) {
  formats::Metadata m = MetadataOf("vocab/ggml-vocab-qwen2.gguf");
  edit(m);
  auto t = Tokenizer::FromMetadata(m);
  REQUIRE_MESSAGE(!t.ok(), "accepted");
  return std::string(t.status().message());
}

TEST_CASE("unsupported tokenizers are rejected by name") {
  using formats::MetaValue;
  const std::string bert = ErrorAfter(
      [](formats::Metadata& m) { m.Set("tokenizer.ggml.model", MetaValue::String("bert")); });
  CHECK(bert.find("\"bert\"") != std::string::npos);
  CHECK(bert.find("WordPiece") != std::string::npos);
  CHECK(bert.find("\"llama\" (SentencePiece)") != std::string::npos);  // what is supported
  // A byte-level vocabulary relabeled SentencePiece has no scores to merge by.
  const std::string llama = ErrorAfter(
      [](formats::Metadata& m) { m.Set("tokenizer.ggml.model", MetaValue::String("llama")); });
  CHECK(llama.find("tokenizer.ggml.scores") != std::string::npos);
  const std::string falcon = ErrorAfter(
      [](formats::Metadata& m) { m.Set("tokenizer.ggml.pre", MetaValue::String("falcon")); });
  CHECK(falcon.find("\"falcon\"") != std::string::npos);
  CHECK(falcon.find("\"qwen2\"") != std::string::npos);
  CHECK(falcon.find("\"llama-bpe\"") != std::string::npos);
  const std::string eos = ErrorAfter(
      [](formats::Metadata& m) { m.Set("tokenizer.ggml.eos_token_id", MetaValue::U32(999999)); });
  CHECK(eos.find("tokenizer.ggml.eos_token_id") != std::string::npos);
  ErrorAfter([](formats::Metadata& m) { m.Erase("tokenizer.ggml.merges"); });
}

// A hand-made vocabulary: the 256 byte symbols plus merges chosen so that the
// rank order, not the left-to-right order, decides the result.
TEST_CASE("BPE applies merges by rank, leftmost first on ties") {
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) {
    std::string s;
    AppendUtf8(ByteToCodepoint(uint8_t(b)), s);
    tokens.push_back(s);
  }
  const int32_t ab = 256, bc = 257, abc = 258, aa = 259;
  tokens.push_back("ab");
  tokens.push_back("bc");
  tokens.push_back("abc");
  tokens.push_back("aa");
  formats::Metadata m;
  m.Set("general.architecture", formats::MetaValue::String("qwen2"));
  m.Set("tokenizer.ggml.model", formats::MetaValue::String("gpt2"));
  m.Set("tokenizer.ggml.pre", formats::MetaValue::String("qwen2"));
  m.Set("tokenizer.ggml.tokens", formats::MetaValue::StringArray(tokens));
  // rank 0: b c, rank 1: a b, rank 2: a bc, rank 3: a a
  m.Set("tokenizer.ggml.merges",
        formats::MetaValue::StringArray({"b c", "a b", "a bc", "a a"}));
  auto t = Tokenizer::FromMetadata(m);
  REQUIRE_MESSAGE(t.ok(), t.status().ToString());
  CHECK(t->Encode("abc", false, false) == std::vector<int32_t>{abc});  // b+c first, then a+bc
  CHECK(t->Encode("ab", false, false) == std::vector<int32_t>{ab});
  CHECK(t->Encode("abcbc", false, false) == std::vector<int32_t>{abc, bc});
  // "aaa": the leftmost "a a" merges first.
  CHECK(t->Encode("aaa", false, false) == std::vector<int32_t>{aa, int32_t('a')});
  CHECK(t->TokenToPiece(abc) == "abc");
  CHECK(!t->adds_bos_by_default());
  CHECK(t->end_of_generation_ids().empty());
}

}  // namespace
}  // namespace dpl::tokenizer
