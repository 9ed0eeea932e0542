#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cmath>
#include <set>

#include "kernels/ops/kv_cache.h"

namespace dpl::kernels {
namespace {

TEST_CASE("KV cache layout: arrays and rows tile the buffer without overlap") {
  auto layout = MakeKvCacheLayout(3, 2, 5, 4);
  REQUIRE(layout.ok());
  std::set<uint64_t> starts;
  for (int l = 0; l < 3; ++l) {
    for (int arr = 0; arr < 2; ++arr) {
      const uint64_t base = arr == 0 ? layout->KOffset(l) : layout->VOffset(l);
      for (int h = 0; h < 2; ++h) {
        for (int p = 0; p < 5; ++p) starts.insert(base + layout->RowOffset(h, p));
      }
    }
  }
  // 3 layers * 2 arrays * 2 heads * 5 positions distinct rows of 4 elements,
  // exactly covering TotalBytes.
  CHECK(starts.size() == 60);
  CHECK(*starts.rbegin() + 4 == layout->TotalBytes() / 2);
  uint64_t expect = 0;
  for (uint64_t s : starts) {
    CHECK(s == expect);
    expect += 4;
  }
  // Positions of one head are contiguous (the attention kernel relies on it).
  CHECK(layout->RowOffset(1, 3) + 4 == layout->RowOffset(1, 4));
}

TEST_CASE("KV cache layout: each sequence's region is a single-sequence cache") {
  auto one = MakeKvCacheLayout(2, 2, 5, 4);
  auto three = MakeKvCacheLayout(2, 2, 5, 4, 3);
  REQUIRE(one.ok());
  REQUIRE(three.ok());
  CHECK(three->ElemsPerSeq() == one->ElemsPerArray());
  CHECK(three->ElemsPerArray() == 3 * one->ElemsPerArray());
  CHECK(three->TotalBytes() == 3 * one->TotalBytes());
  // Regions follow each other inside a layer's K array; V follows all of K.
  CHECK(three->SeqOffset(2) == 2 * one->ElemsPerArray());
  CHECK(three->VOffset(1) - three->KOffset(1) == three->ElemsPerArray());
  CHECK(three->KOffset(1) == 2 * three->ElemsPerArray());
  // The last row of the last region ends where V begins.
  CHECK(three->SeqOffset(2) + three->RowOffset(1, 4) + 4 == three->ElemsPerArray());
}

TEST_CASE("KV cache layout rejects bad shapes") {
  CHECK(!MakeKvCacheLayout(2, 4, 16, 128, 0).ok());
  CHECK(!MakeKvCacheLayout(0, 4, 16, 128).ok());
  CHECK(!MakeKvCacheLayout(2, 4, 16, 127).ok());
  CHECK(!MakeKvCacheLayout(2, -1, 16, 128).ok());
}

TEST_CASE("RoPE inverse frequencies") {
  auto inv = RopeInvFreq(1000000.0, 128);
  REQUIRE(inv.ok());
  REQUIRE(inv->size() == 64);
  CHECK((*inv)[0] == 1.0);
  CHECK((*inv)[1] == doctest::Approx(std::pow(1e6, -2.0 / 128)).epsilon(1e-15));
  CHECK((*inv)[63] == doctest::Approx(std::pow(1e6, -126.0 / 128)).epsilon(1e-15));
  for (size_t i = 1; i < inv->size(); ++i) CHECK((*inv)[i] < (*inv)[i - 1]);
  auto scaled = RopeInvFreq(10000.0, 64, 0.25);
  REQUIRE(scaled.ok());
  CHECK((*scaled)[5] == doctest::Approx(0.25 * std::pow(10000.0, -10.0 / 64)).epsilon(1e-15));
  CHECK(!RopeInvFreq(10000.0, 63).ok());
  CHECK(!RopeInvFreq(-1.0, 64).ok());
}

}  // namespace
}  // namespace dpl::kernels
