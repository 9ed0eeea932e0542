#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <numeric>
#include <vector>

#include "runtime/kv/block_pool.h"

namespace dpl::kv {
namespace {

std::vector<int32_t> Tokens(int n, int32_t first) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), first);
  return t;
}

BlockPool Pool(int blocks, int size) {
  absl::StatusOr<BlockPool> p = BlockPool::Create(blocks, size);
  REQUIRE(p.ok());
  return *std::move(p);
}

// A sequence that wrote `tokens` (whole blocks) into fresh blocks and cached
// each as it filled, as the engine will.
std::vector<int> WriteAndCache(BlockPool& pool, const std::vector<int32_t>& tokens) {
  std::vector<int> blocks;
  const int bs = pool.block_size();
  for (size_t i = 0; i + bs <= tokens.size(); i += bs) {
    absl::StatusOr<int> b = pool.Allocate();
    REQUIRE(b.ok());
    CHECK(pool.Cache(*b, blocks.empty() ? -1 : blocks.back(),
                     absl::MakeConstSpan(tokens).subspan(i, static_cast<size_t>(bs))));
    blocks.push_back(*b);
  }
  return blocks;
}

TEST_CASE("block pool: bad sizes are refused") {
  CHECK(!BlockPool::Create(0, 16).ok());
  CHECK(!BlockPool::Create(8, 0).ok());
}

TEST_CASE("block pool: allocate until exhausted, release, allocate again") {
  BlockPool pool = Pool(3, 16);
  std::vector<int> got;
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<int> b = pool.Allocate();
    REQUIRE(b.ok());
    got.push_back(*b);
  }
  CHECK(got == std::vector<int>{0, 1, 2});
  CHECK(pool.num_available() == 0);
  const absl::StatusOr<int> none = pool.Allocate();
  CHECK(absl::IsResourceExhausted(none.status()));
  CHECK(none.status().message().find("3 blocks") != absl::string_view::npos);
  REQUIRE(pool.Release({got[1]}).ok());
  CHECK(pool.num_available() == 1);
  const absl::StatusOr<int> again = pool.Allocate();
  REQUIRE(again.ok());
  CHECK(*again == got[1]);
}

TEST_CASE("block pool: a bad release changes nothing") {
  BlockPool pool = Pool(4, 8);
  const int a = *pool.Allocate();
  CHECK(!pool.Release({a, a}).ok());  // one reference, released twice
  CHECK(pool.RefCount(a) == 1);
  CHECK(!pool.Release({7}).ok());
  CHECK(!pool.Release({-1}).ok());
  CHECK(!pool.Ref(3).ok());  // never allocated
  REQUIRE(pool.Ref(a).ok());
  REQUIRE(pool.Release({a, a}).ok());
  CHECK(pool.RefCount(a) == 0);
  CHECK(pool.num_available() == 4);
}

TEST_CASE("block pool: a released prefix is matched exactly and taken back") {
  BlockPool pool = Pool(8, 4);
  const std::vector<int32_t> prompt = Tokens(12, 100);  // three full blocks
  const std::vector<int> seq = WriteAndCache(pool, prompt);
  REQUIRE(seq.size() == 3);
  REQUIRE(pool.Release(seq).ok());
  CHECK(pool.num_cached() == 3);
  CHECK(pool.num_available() == 8);  // cached blocks are evictable

  // Same first 9 tokens, then different: two blocks match.
  std::vector<int32_t> other = prompt;
  other[9] = 7;
  std::vector<int> hit = pool.MatchPrefix(other, 10);
  CHECK(hit == std::vector<int>{seq[0], seq[1]});
  CHECK(pool.RefCount(seq[0]) == 1);
  CHECK(pool.num_available() == 6);
  // max_blocks caps the match (a prompt keeps at least one token to compute).
  std::vector<int> capped = pool.MatchPrefix(prompt, 2);
  CHECK(capped.size() == 2);
  CHECK(pool.RefCount(seq[0]) == 2);
  REQUIRE(pool.Release(capped).ok());
  REQUIRE(pool.Release(hit).ok());

  // A different first block matches nothing, even if later blocks agree.
  std::vector<int32_t> shifted = prompt;
  shifted[0] = 99;
  CHECK(pool.MatchPrefix(shifted, 3).empty());
  // Fewer tokens than a block: nothing.
  CHECK(pool.MatchPrefix(Tokens(3, 100), 3).empty());
}

TEST_CASE("block pool: eviction takes the least recently released, tails first") {
  BlockPool pool = Pool(4, 2);
  const std::vector<int> a = WriteAndCache(pool, Tokens(4, 0));   // blocks 0, 1
  const std::vector<int> b = WriteAndCache(pool, Tokens(4, 50));  // blocks 2, 3
  REQUIRE(pool.Release(a).ok());
  REQUIRE(pool.Release(b).ok());
  // Eviction order: a's tail, a's head, b's tail, b's head.
  CHECK(*pool.Allocate() == a[1]);
  CHECK(pool.num_cached() == 3);
  CHECK(pool.MatchPrefix(Tokens(4, 0), 2) == std::vector<int>{a[0]});  // head only now
  REQUIRE(pool.Release({a[0]}).ok());
  CHECK(*pool.Allocate() == b[1]);  // a's head went back to the end of the order
  CHECK(pool.MatchPrefix(Tokens(4, 50), 2) == std::vector<int>{b[0]});
}

TEST_CASE("block pool: a block in use is never evicted; caching rules") {
  BlockPool pool = Pool(2, 2);
  const std::vector<int> a = WriteAndCache(pool, Tokens(2, 0));
  const int other = *pool.Allocate();
  CHECK(absl::IsResourceExhausted(pool.Allocate().status()));  // a[0] cached but in use
  // The same prefix cached twice: the second stays private.
  CHECK(!pool.Cache(other, -1, Tokens(2, 0)));
  CHECK(!pool.IsCached(other));
  CHECK(!pool.Cache(a[0], -1, Tokens(2, 9)));          // already cached
  CHECK(!pool.Cache(other, -1, Tokens(3, 9)));         // not a full block
  REQUIRE(pool.Release({other}).ok());
  CHECK(!pool.Cache(other, -1, Tokens(2, 9)));         // not in use
  const int c = *pool.Allocate();
  CHECK(c == other);                                   // freed, not cached: reused first
  CHECK(pool.Cache(c, a[0], Tokens(2, 2)));            // continues a's block
  REQUIRE(pool.Release({a[0], c}).ok());
  CHECK(pool.MatchPrefix(Tokens(4, 0), 2) == std::vector<int>{a[0], c});
}

// What a scheduler does before it commits to a cached start: FindPrefix
// names the chain MatchPrefix would take and takes nothing (no reference,
// the eviction order as it was); CachedChild finds the block that caches a
// prefix another sequence duplicated, so that sequence's next block can
// continue the cached chain.
TEST_CASE("block pool: FindPrefix takes nothing; CachedChild continues a duplicated prefix") {
  BlockPool pool = Pool(6, 2);
  const std::vector<int> a = WriteAndCache(pool, Tokens(4, 0));  // blocks 0, 1
  REQUIRE(pool.Release(a).ok());                                 // evictable: a[1], then a[0]
  CHECK(pool.FindPrefix(Tokens(6, 0), 3) == a);
  CHECK(pool.FindPrefix(Tokens(6, 0), 1) == std::vector<int>{a[0]});
  CHECK(pool.FindPrefix(Tokens(1, 0), 3).empty());
  CHECK(pool.RefCount(a[0]) == 0);
  CHECK(pool.num_available() == 6);
  // The order is untouched: after the 4 free blocks, a's tail goes first.
  std::vector<int> taken;
  for (int i = 0; i < 5; ++i) taken.push_back(*pool.Allocate());
  CHECK(taken.back() == a[1]);
  CHECK(pool.FindPrefix(Tokens(4, 0), 2) == std::vector<int>{a[0]});

  // Another sequence ran the same first block into its own block d (not
  // cached: a[0] caches those tokens), then a block of its own.
  const int d = taken[0], e = taken[1];
  CHECK(!pool.Cache(d, -1, Tokens(2, 0)));
  CHECK(pool.CachedChild(-1, Tokens(2, 0)) == a[0]);
  CHECK(pool.CachedChild(-1, Tokens(2, 1)) == -1);      // other tokens
  CHECK(pool.CachedChild(d, Tokens(2, 2)) == -1);       // d is not cached
  CHECK(pool.CachedChild(-1, Tokens(3, 0)) == -1);      // not a block
  CHECK(pool.Cache(e, a[0], Tokens(2, 7)));             // its chain goes on from a[0]
  CHECK(pool.CachedChild(a[0], Tokens(2, 7)) == e);
  REQUIRE(pool.Release({d, e}).ok());
  std::vector<int32_t> seq = Tokens(2, 0);
  seq.push_back(7);
  seq.push_back(8);
  CHECK(pool.MatchPrefix(seq, 2) == std::vector<int>{a[0], e});
}

}  // namespace
}  // namespace dpl::kv
