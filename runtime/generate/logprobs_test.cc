#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "runtime/generate/logprobs.h"

namespace dpl::generate {
namespace {

const std::vector<float> kLogits = {1.0f, 3.0f, 2.5f, -1.0f, 3.0f, 0.0f, 2.9f, -4.0f};

double LogSumExp(const std::vector<float>& l, const std::vector<int>& ids) {
  double z = 0;
  for (int i : ids) z += std::exp(static_cast<double>(l[i]));
  return std::log(z);
}

TEST_CASE("the chosen token's logprob is the log-softmax; the top list is sorted, ties to the lower id") {
  auto r = ScoreToken(kLogits, 2, 4);
  REQUIRE(r.ok());
  const double z = LogSumExp(kLogits, {0, 1, 2, 3, 4, 5, 6, 7});
  CHECK(r->chosen.token == 2);
  CHECK(r->chosen.logprob == doctest::Approx(2.5 - z).epsilon(1e-6));
  REQUIRE(r->top.size() == 4);
  CHECK(r->top[0].token == 1);  // 3.0, before 4's equal 3.0
  CHECK(r->top[1].token == 4);
  CHECK(r->top[2].token == 6);
  CHECK(r->top[3].token == 2);
  CHECK(r->top[3].logprob == r->chosen.logprob);
  double total = 0;
  for (float l : kLogits) total += std::exp(static_cast<double>(l) - z);
  CHECK(total == doctest::Approx(1.0));
}

TEST_CASE("top_n 0 lists nothing; out of range is an error") {
  auto r = ScoreToken(kLogits, 7, 0);
  REQUIRE(r.ok());
  CHECK(r->top.empty());
  CHECK(!ScoreToken(kLogits, 7, kMaxTopLogprobs + 1).ok());
  CHECK(!ScoreToken(kLogits, 8, 1).ok());
  CHECK(!ScoreToken(kLogits, -1, 1).ok());
}

TEST_CASE("a mask leaves tokens out of the softmax and the list") {
  const std::vector<uint32_t> allowed = {(1u << 0) | (1u << 2) | (1u << 5)};
  auto r = ScoreToken(kLogits, 2, 20, allowed);
  REQUIRE(r.ok());
  CHECK(r->chosen.logprob == doctest::Approx(2.5 - LogSumExp(kLogits, {0, 2, 5})).epsilon(1e-6));
  REQUIRE(r->top.size() == 3);
  CHECK(r->top[0].token == 2);
  CHECK(r->top[1].token == 0);
  CHECK(r->top[2].token == 5);
  auto masked = ScoreToken(kLogits, 1, 1, allowed);
  REQUIRE(masked.ok());
  CHECK(masked->chosen.logprob == -std::numeric_limits<float>::infinity());
  CHECK(!ScoreToken(kLogits, 1, 1, std::vector<uint32_t>{1, 2}).ok());
}

// A `false` logit bias, or the device sampler's mask written into the
// logits: -inf is a token left out, as a masked one; NaN and +inf are errors.
TEST_CASE("-inf logits are left out as masked tokens; NaN and +inf are errors") {
  std::vector<float> l = kLogits;
  l[1] = l[4] = -std::numeric_limits<float>::infinity();
  auto r = ScoreToken(l, 2, 20);
  REQUIRE(r.ok());
  const std::vector<uint32_t> allowed = {0xffu & ~((1u << 1) | (1u << 4))};
  auto masked = ScoreToken(kLogits, 2, 20, allowed);
  REQUIRE(masked.ok());
  CHECK(r->chosen.logprob == masked->chosen.logprob);
  CHECK(r->chosen.logprob == doctest::Approx(2.5 - LogSumExp(kLogits, {0, 2, 3, 5, 6, 7})).epsilon(1e-6));
  REQUIRE(r->top.size() == 6);
  for (size_t i = 0; i < r->top.size(); ++i) {
    CHECK(r->top[i].token == masked->top[i].token);
    CHECK(r->top[i].logprob == masked->top[i].logprob);
  }
  auto banned = ScoreToken(l, 1, 1);
  REQUIRE(banned.ok());
  CHECK(banned->chosen.logprob == -std::numeric_limits<float>::infinity());
  l[1] = std::numeric_limits<float>::infinity();
  CHECK(!ScoreToken(l, 2, 1).ok());
  l[1] = std::nanf("");
  CHECK(!ScoreToken(l, 2, 1).ok());
}

}  // namespace
}  // namespace dpl::generate
