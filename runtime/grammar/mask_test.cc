// The mask on a real vocabulary (qwen2's, 151,936 tokens, from ../shared):
// at states reached by sampling random allowed tokens, every allowed token
// is accepted and a brute-force simulation of every token gives the same
// mask at two states, of a sample of tokens at the others.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "formats/gguf.h"
#include "runtime/grammar/json_schema.h"
#include "runtime/grammar/matcher.h"
#include "runtime/grammar/tokenizer_vocab.h"
#include "runtime/tokenizer/tokenizer.h"
#include "tests/shared_dir.h"

namespace dpl::grammar {
namespace {

bool Bit(const std::vector<uint32_t>& bits, int32_t id) { return (bits[id >> 5] >> (id & 31)) & 1; }

TEST_CASE("qwen2 vocabulary: mask against token-by-token simulation") {
  auto gguf = formats::GgufFile::Open(testing::SharedDir() + "/vocab/ggml-vocab-qwen2.gguf");
  REQUIRE_MESSAGE(gguf.ok(), gguf.status().ToString());
  auto tok = tokenizer::Tokenizer::FromMetadata(gguf->metadata());
  REQUIRE(tok.ok());
  const Vocabulary v = VocabularyFromTokenizer(*tok);
  REQUIRE(v.size() == tok->n_vocab());
  REQUIRE_FALSE(v.end_of_generation().empty());
  const int32_t im_start = tok->FindToken("<|im_start|>");
  REQUIRE(im_start >= 0);
  CHECK(v.kind(im_start) == TokenKind::kControl);
  CHECK(v.FindControl("<|im_start|>") == im_start);

  auto g = JsonSchemaToGrammar(nlohmann::ordered_json::parse(R"({"type": "object", "properties": {
      "name": {"type": "string"}, "score": {"type": "number"}, "tags": {"type": "array", "items": {"enum": ["a", "b\u00e9"]}},
      "ok": {"type": "boolean"}}, "required": ["name", "score"]})"));
  REQUIRE_MESSAGE(g.ok(), g.status().ToString());
  auto grammar = std::make_shared<const Grammar>(*std::move(g));

  std::mt19937 rng(11);
  int full_checks = 0, steps = 0;
  double mask_us = 0;
  for (int run = 0; run < 3; ++run) {
    Matcher m(grammar);
    for (int step = 0; step < 40 && !m.ended(); ++step) {
      std::vector<uint32_t> bits(v.mask_words());
      const auto t0 = std::chrono::steady_clock::now();
      const int32_t n = m.FillMask(v, absl::MakeSpan(bits));
      mask_us += std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
      ++steps;
      REQUIRE(n > 0);
      CHECK_FALSE(Bit(bits, im_start));
      std::vector<int32_t> allowed;
      for (int32_t id = 0; id < v.size(); ++id) {
        if (Bit(bits, id)) allowed.push_back(id);
      }
      REQUIRE(static_cast<int32_t>(allowed.size()) == n);
      // At two states of the first run every token is simulated; at the
      // others a sample of the allowed tokens must be accepted and a sample
      // of the others refused.
      const bool full = run == 0 && (step == 0 || step == 7);
      for (int k = 0; k < (full ? static_cast<int>(allowed.size()) : 1000); ++k) {
        const int32_t id = full ? allowed[k] : allowed[rng() % allowed.size()];
        REQUIRE_MESSAGE(m.Allows(v, id), "token ", id, " '", v.piece(id), "'");
      }
      for (int k = 0; k < (full ? v.size() : 1000); ++k) {
        const int32_t id = full ? k : static_cast<int32_t>(rng() % static_cast<uint32_t>(v.size()));
        if (Bit(bits, id)) continue;
        REQUIRE_MESSAGE(!m.Allows(v, id), "token ", id, " '", v.piece(id), "'");
      }
      full_checks += full;
      // Mostly short tokens, so that the walk goes deep into the object.
      int32_t pick = allowed[rng() % allowed.size()];
      for (int tries = 0; tries < 4 && v.piece(pick).size() > 3; ++tries) pick = allowed[rng() % allowed.size()];
      REQUIRE(m.AcceptToken(v, pick).ok());
    }
  }
  CHECK(full_checks == 2);
  std::printf("qwen2 mask: %d steps, %.0f us per step (this build)\n", steps, mask_us / steps);
}

TEST_CASE("qwen2 vocabulary: a control token only where the grammar's token literal names it") {
  auto gguf = formats::GgufFile::Open(testing::SharedDir() + "/vocab/ggml-vocab-qwen2.gguf");
  REQUIRE_MESSAGE(gguf.ok(), gguf.status().ToString());
  auto tok = tokenizer::Tokenizer::FromMetadata(gguf->metadata());
  REQUIRE(tok.ok());
  const Vocabulary v = VocabularyFromTokenizer(*tok);
  const int32_t im_start = tok->FindToken("<|im_start|>");
  REQUIRE(im_start >= 0);
  // <|im_start|>, then a JSON string (which may hold the text
  // "<|im_start|>"), then optionally the literal again.
  auto g = Grammar::Parse(R"(root ::= <|im_start|> "\"" ([^"\\] | "\\" ["\\/bfnrtu])* "\"" <|im_start|>?)");
  REQUIRE_MESSAGE(g.ok(), g.status().ToString());
  auto grammar = std::make_shared<const Grammar>(*std::move(g));
  Matcher m(grammar, &v);
  std::vector<uint32_t> bits(v.mask_words());
  CHECK(m.FillMask(v, absl::MakeSpan(bits)) == 1);
  CHECK(Bit(bits, im_start));
  REQUIRE(m.AcceptToken(v, im_start).ok());
  REQUIRE(m.Accept("\"say ").ok());
  const int32_t inside = m.FillMask(v, absl::MakeSpan(bits));
  CHECK(inside > 100000);
  CHECK_FALSE(Bit(bits, im_start));
  for (int32_t id = 0; id < v.size(); ++id) {
    if (v.kind(id) == TokenKind::kControl) CHECK_FALSE(Bit(bits, id));
  }
  // Its text, as plain pieces, is content here.
  const std::vector<int32_t> spelled = tok->Encode("<|im_start|>", false, /*parse_special=*/false);
  REQUIRE(spelled.size() > 1);
  CHECK(Bit(bits, spelled[0]));
  for (int32_t id : spelled) REQUIRE(m.AcceptToken(v, id).ok());
  REQUIRE(m.Accept("\"").ok());
  m.FillMask(v, absl::MakeSpan(bits));
  CHECK(Bit(bits, im_start));
  CHECK(m.IsComplete());
  REQUIRE(m.AcceptToken(v, im_start).ok());
  CHECK(m.IsComplete());
  CHECK(tok->TokenToPiece(im_start) == "<|im_start|>");  // what the answer's text holds
}

}  // namespace
}  // namespace dpl::grammar
