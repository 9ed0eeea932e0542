#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include "kernels/attention/attention_split.h"

namespace dpl::kernels {
namespace {

// The active splits' ranges [s * chunk, min(L, (s + 1) * chunk)) must tile
// [0, L) exactly, in order, for every length and split budget.
TEST_CASE("attention splits tile the KV length exactly") {
  for (int min_chunk : {1, 32, 128}) {
  for (int max_splits : {1, 2, 7, 66, 132, 1024}) {
    for (int len = 1; len <= 40000; len += (len < 300 ? 1 : 97)) {
      const int n = AttnActiveSplits(len, max_splits, min_chunk);
      REQUIRE(n >= 1);
      REQUIRE(n <= max_splits);
      const int chunk = AttnChunk(len, n);
      int covered = 0;
      for (int s = 0; s < n; ++s) {
        const int b = s * chunk;
        const int e = b + chunk < len ? b + chunk : len;
        if (b >= len) continue;  // an empty split (allowed; writes no keys)
        REQUIRE(b == covered);
        covered = e;
      }
      REQUIRE(covered == len);
      // Splits are only used when each gets about min_chunk positions.
      if (n > 1) CHECK(chunk >= min_chunk / 2);
    }
  }
  }
}

TEST_CASE("active split count grows with length up to the budget") {
  for (int c : {32, 100}) {
    CHECK(AttnActiveSplits(1, 132, c) == 1);
    CHECK(AttnActiveSplits(c, 132, c) == 1);
    CHECK(AttnActiveSplits(c + 1, 132, c) == 2);
    CHECK(AttnActiveSplits(3254, 132, c) == (3254 + c - 1) / c);
    CHECK(AttnActiveSplits(32768, 132, c) == 132);
  }
}

}  // namespace
}  // namespace dpl::kernels
