#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/sampling/sampling_util.h"

namespace dpl::kernels {
namespace {

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

TEST_CASE("OrderedKey preserves float order and round-trips") {
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 30.0f);
  std::vector<float> v = {0.0f, -0.0f, 1e-30f, -1e-30f, 3.5f, -3.5f, INFINITY, -INFINITY};
  for (int i = 0; i < 2000; ++i) v.push_back(dist(rng));
  for (float a : v) {
    CHECK(KeyToFloatBits(OrderedKey(Bits(a))) == Bits(a));
    for (int j = 0; j < 20; ++j) {
      const float b = v[(j * 97 + static_cast<int>(Bits(a) % 1000)) % v.size()];
      if (a < b) CHECK(OrderedKey(Bits(a)) < OrderedKey(Bits(b)));
      if (a > b) CHECK(OrderedKey(Bits(a)) > OrderedKey(Bits(b)));
    }
  }
}

TEST_CASE("CandidateKey: larger logit first, then lower id") {
  CHECK(CandidateKey(Bits(2.0f), 9) > CandidateKey(Bits(1.0f), 0));
  CHECK(CandidateKey(Bits(1.0f), 3) > CandidateKey(Bits(1.0f), 4));
  CHECK(CandidateId(CandidateKey(Bits(-7.0f), 151000)) == 151000u);
}

TEST_CASE("UniformFromCounter: in [0, 1), deterministic, roughly uniform") {
  double sum = 0;
  for (uint64_t s = 0; s < 100000; ++s) {
    const double u = UniformFromCounter(42, s);
    REQUIRE(u >= 0.0);
    REQUIRE(u < 1.0);
    sum += u;
  }
  CHECK(sum / 100000 == doctest::Approx(0.5).epsilon(0.01));
  CHECK(UniformFromCounter(42, 5) == UniformFromCounter(42, 5));
  CHECK(UniformFromCounter(42, 5) != UniformFromCounter(43, 5));
  CHECK(UniformFromCounter(42, 5) != UniformFromCounter(42, 6));
}

TEST_CASE("MakeRecentRing keeps the last repeat_last_n tokens") {
  const std::vector<int32_t> hist = {1, 2, 3, 4, 5, 6, 7};
  RecentRing r = MakeRecentRing(hist, 4);
  REQUIRE(r.tokens.size() == 4);
  CHECK(r.count == 4);
  CHECK(r.head == 7 % 4);
  std::vector<int32_t> sorted = r.tokens;
  std::sort(sorted.begin(), sorted.end());
  CHECK(sorted == std::vector<int32_t>{4, 5, 6, 7});
  CHECK(r.tokens[(r.head + 3) % 4] == 7);  // newest just before head
  RecentRing short_ring = MakeRecentRing(std::vector<int32_t>{9, 8}, 5);
  CHECK(short_ring.count == 2);
  CHECK(short_ring.head == 2);
  CHECK(short_ring.tokens == std::vector<int32_t>{9, 8, -1, -1, -1});
  CHECK(MakeRecentRing(hist, 0).tokens.empty());
}

TEST_CASE("CheckLogitBias: distinct tokens in the vocabulary, biases in range, not every token banned") {
  CHECK(CheckLogitBias({}, 10).ok());
  CHECK(CheckLogitBias({{0, -100.0f}, {9, 100.0f}, {4, -INFINITY}}, 10).ok());
  auto refused = [](std::vector<LogitBias> b, int64_t n_vocab, const char* what) {
    const absl::Status s = CheckLogitBias(b, n_vocab);
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK_MESSAGE(std::string(s.message()).find(what) != std::string::npos, s.message());
  };
  refused({{10, 1.0f}}, 10, "token id 10 is outside the vocabulary [0, 10)");
  refused({{-1, 1.0f}}, 10, "token id -1");
  refused({{3, 100.5f}}, 10, "not in [-100, 100]");
  refused({{3, INFINITY}}, 10, "not in [-100, 100]");
  refused({{3, NAN}}, 10, "not in [-100, 100]");
  refused({{3, 1.0f}, {5, 2.0f}, {3, 1.0f}}, 10, "token 3 is listed twice");
  refused({{0, -INFINITY}, {1, -INFINITY}, {2, -INFINITY}}, 3, "bans every token");
  CHECK(CheckLogitBias({{0, -INFINITY}, {1, -INFINITY}, {2, -100.0f}}, 3).ok());
  std::vector<LogitBias> many(kMaxLogitBias + 1);
  for (size_t i = 0; i < many.size(); ++i) many[i] = {static_cast<int32_t>(i), 1.0f};
  refused(many, 100000, "1025 entries, at most 1024");
  many.pop_back();
  CHECK(CheckLogitBias(many, 100000).ok());
}

}  // namespace
}  // namespace dpl::kernels
