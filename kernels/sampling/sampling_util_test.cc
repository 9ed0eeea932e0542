#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <random>
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

}  // namespace
}  // namespace dpl::kernels
