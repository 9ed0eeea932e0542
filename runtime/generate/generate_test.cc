// The generation loop against a fake decoder: non-finite logits end it with
// an error naming the position, on the prompt and on a generated token.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "formats/metadata.h"
#include "runtime/generate/generate.h"

namespace dpl::generate {
namespace {

constexpr int32_t kVocab = 8;

// Logits favour token (position + 1) % kVocab; the row of position
// `bad_position` holds `bad_value` at token 3.
class FakeDecoder : public Decoder {
 public:
  FakeDecoder(int64_t bad_position, float bad_value) : bad_(bad_position), value_(bad_value) {}
  int32_t n_vocab() const override { return kVocab; }
  int64_t n_ctx() const override { return 64; }
  int64_t n_past() const override { return n_past_; }
  absl::Status Eval(absl::Span<const int32_t> tokens, std::vector<float>* last,
                    std::vector<float>* all) override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      std::vector<float> row(kVocab, 0.0f);
      row[(n_past_ + 1) % kVocab] = 5.0f;
      if (n_past_ == bad_) row[3] = value_;
      if (all != nullptr) all->insert(all->end(), row.begin(), row.end());
      if (last != nullptr) *last = row;
      ++n_past_;
    }
    return absl::OkStatus();
  }
  absl::Status Rewind(int64_t n) override {
    n_past_ = n;
    return absl::OkStatus();
  }

 private:
  int64_t bad_;
  float value_;
  int64_t n_past_ = 0;
};

tokenizer::Tokenizer IdsOnly() {
  formats::Metadata meta;
  meta.Set("general.architecture", formats::MetaValue::String("llama"));
  meta.Set("tokenizer.ggml.model", formats::MetaValue::String("none"));
  meta.Set("llama.vocab_size", formats::MetaValue::U32(kVocab));
  absl::StatusOr<tokenizer::Tokenizer> tok = tokenizer::Tokenizer::FromMetadata(meta);
  REQUIRE_MESSAGE(tok.ok(), tok.status().ToString());
  return *tok;
}

absl::StatusOr<std::vector<int32_t>> Run(FakeDecoder& dec) {
  const tokenizer::Tokenizer tok = IdsOnly();
  SamplerParams p;
  p.temperature = 0;
  Sampler sampler(p);
  const std::vector<int32_t> prompt = {1, 2, 3};
  GenerateRequest req;
  req.prompt = prompt;
  req.n_predict = 5;
  Timings t;
  return Generate(dec, tok, sampler, req, [](absl::string_view) {}, &t);
}

TEST_CASE("finite logits generate; NaN or Inf logits are an error naming the position") {
  FakeDecoder fine(-1, 0.0f);
  const absl::StatusOr<std::vector<int32_t>> out = Run(fine);
  REQUIRE(out.ok());
  CHECK(*out == std::vector<int32_t>{3, 4, 5, 6, 7});
  for (float bad : {std::nanf(""), std::numeric_limits<float>::infinity()}) {
    FakeDecoder at_prompt(2, bad);  // the prompt's last position
    absl::Status s = Run(at_prompt).status();
    CHECK(s.code() == absl::StatusCode::kDataLoss);
    CHECK(s.message().find("at position 2") != absl::string_view::npos);
    FakeDecoder later(5, bad);  // the third generated token's step
    s = Run(later).status();
    CHECK(s.code() == absl::StatusCode::kDataLoss);
    CHECK(s.message().find("at position 5") != absl::string_view::npos);
  }
}

}  // namespace
}  // namespace dpl::generate
