#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include "kernels/attention/attention_split.h"

namespace dpl::kernels {
namespace {

// The active splits' ranges [s * chunk, min(L, (s + 1) * chunk)) must tile
// [0, L) exactly, in order, for every length and split budget.
TEST_CASE("attention splits tile the KV length exactly") {
  for (int max_splits : {1, 2, 7, 66, 132, 1024}) {
    for (int len = 1; len <= 40000; len += (len < 300 ? 1 : 97)) {
      const int n = AttnActiveSplits(len, max_splits);
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
      // Splits are only used when each gets about kAttnMinChunk positions.
      if (n > 1) CHECK(chunk >= kAttnMinChunk / 2);
    }
  }
}

TEST_CASE("active split count grows with length up to the budget") {
  CHECK(AttnActiveSplits(1, 132) == 1);
  CHECK(AttnActiveSplits(kAttnMinChunk, 132) == 1);
  CHECK(AttnActiveSplits(kAttnMinChunk + 1, 132) == 2);
  CHECK(AttnActiveSplits(3254, 132) == (3254 + kAttnMinChunk - 1) / kAttnMinChunk);
  CHECK(AttnActiveSplits(32768, 132) == 132);
}

}  // namespace
}  // namespace dpl::kernels
