#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cmath>
#include <set>
#include <string>

#include <vector>

#include "kernels/kv_pages.h"
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

TEST_CASE("KV cache layout: KvRowOffset of regions is the region's row") {
  auto three = MakeKvCacheLayout(2, 2, 5, 4, 3);
  REQUIRE(three.ok());
  const KvPages regions;
  for (int s = 0; s < 3; ++s) {
    for (int h = 0; h < 2; ++h) {
      for (int p = 0; p < 5; ++p) {
        CHECK(KvRowOffset(regions, s, 2, 5, h, p, 4) == three->SeqOffset(s) + three->RowOffset(h, p));
      }
    }
  }
}

TEST_CASE("KV cache layout: a paged pool's rows tile it, each sequence through its table") {
  // 2 sequences reaching 64 positions each in blocks of 16, a pool of 6 blocks:
  // sequence 0 holds blocks 4, 1, 5; sequence 1 holds 0, 3, 2 (the 6 blocks, each once).
  auto paged = MakePagedKvCacheLayout(2, 2, 4, 2, 16, 6, 60);
  REQUIRE(paged.ok());
  CHECK(paged->paged());
  CHECK(paged->block() == 16);
  CHECK(paged->n_ctx == 64);  // rounded up to whole blocks
  CHECK(paged->max_blocks() == 4);
  CHECK(paged->ElemsPerArray() == 6 * 2 * 16 * 4);
  const std::vector<int> tables = {4, 1, 5, -1, 0, 3, 2, -1};
  const KvPages pages{tables.data(), paged->max_blocks(), paged->block_shift};
  std::set<uint64_t> starts;
  for (int s = 0; s < 2; ++s) {
    for (int h = 0; h < 2; ++h) {
      for (int p = 0; p < 48; ++p) {
        const uint64_t at = KvRowOffset(pages, s, 2, paged->n_ctx, h, p, 4);
        const int blk = tables[static_cast<size_t>(s * 4 + p / 16)];
        CHECK(at == paged->BlockOffset(blk) + paged->RowOffset(h, p));
        starts.insert(at);
      }
    }
  }
  CHECK(starts.size() == 6 * 2 * 16);  // every row of the pool exactly once
  CHECK(*starts.rbegin() + 4 == paged->ElemsPerArray());
  // Positions of one head stay contiguous inside a block.
  CHECK(KvRowOffset(pages, 1, 2, 64, 1, 20, 4) + 4 == KvRowOffset(pages, 1, 2, 64, 1, 21, 4));
  // A table never reaches past the pool.
  auto small = MakePagedKvCacheLayout(2, 2, 4, 2, 16, 3, 1000);
  REQUIRE(small.ok());
  CHECK(small->n_ctx == 48);
}

TEST_CASE("KV cache layout rejects bad paged shapes") {
  CHECK(!MakePagedKvCacheLayout(2, 2, 4, 2, 24, 6, 64).ok());    // not a power of two
  CHECK(!MakePagedKvCacheLayout(2, 2, 4, 2, 8, 6, 64).ok());     // below 16
  CHECK(!MakePagedKvCacheLayout(2, 2, 4, 2, 2048, 6, 64).ok());  // above 1024
  CHECK(!MakePagedKvCacheLayout(2, 2, 4, 2, 16, 0, 64).ok());
  CHECK(!MakePagedKvCacheLayout(2, 2, 4, 0, 16, 6, 64).ok());
}

TEST_CASE("KV pages: a table that cannot address n_ctx is refused, naming the field") {
  const int dummy = 0;
  CHECK(CheckKvPages({}, 1 << 20, "k").ok());  // regions
  CHECK(CheckKvPages({&dummy, 4, 4}, 64, "k").ok());
  auto refused = [&](const KvPages& p, int64_t n_ctx, const char* field) {
    const absl::Status st = CheckKvPages(p, n_ctx, "kernel");
    CAPTURE(field);
    CHECK(st.code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(st.message()).find(field) != std::string::npos);
    CHECK(std::string(st.message()).rfind("kernel: ", 0) == 0);
  };
  refused({&dummy, 4, 3}, 64, "block_shift");
  refused({&dummy, 4, 11}, 64, "block_shift");
  refused({&dummy, 0, 4}, 64, "max_blocks");
  refused({&dummy, 3, 4}, 64, "n_ctx 64 is more than a block table reaches");
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
