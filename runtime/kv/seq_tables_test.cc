#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <vector>

#include "runtime/kv/seq_tables.h"

namespace dpl::kv {
namespace {

// 3 sequences, blocks of 16 positions, a pool of 12 blocks, tables of 4.
SeqTables Tables() { return SeqTables(3, 16, 12, 4); }

std::vector<BlockCopy> SetOk(SeqTables& t, int seq, std::vector<int> blocks, int64_t n_past) {
  absl::StatusOr<std::vector<BlockCopy>> c = t.Set(seq, blocks, n_past);
  REQUIRE(c.ok());
  return *c;
}

TEST_CASE("seq tables: a growing sequence copies nothing and runs within its table") {
  SeqTables t = Tables();
  CHECK(!t.CheckRun(0, 1).ok());  // no blocks yet
  CHECK(SetOk(t, 0, {3}, 0).empty());
  CHECK(t.CheckRun(0, 16).ok());
  CHECK(!t.CheckRun(0, 17).ok());
  CHECK(SetOk(t, 0, {3, 7}, 16).empty());
  CHECK(t.CheckRun(0, 32).ok());
  CHECK(t.TakeChanged() == std::vector<int>{0});
  CHECK(t.TakeChanged().empty());
}

TEST_CASE("seq tables: a copied start moves the partial last block's rows only") {
  SeqTables t = Tables();
  CHECK(SetOk(t, 0, {3, 7, 9}, 0).empty());  // then passes write 40 positions
  CHECK(t.CheckRun(0, 40).ok());
  t.Share(1, 0, 37);                          // sequence 1 starts with its first 37
  // Until its table is set, sequence 1's rows are in sequence 0's blocks.
  CHECK(!t.CheckRun(1, 38).ok());
  // The scheduler shares the 2 full blocks and gives a block of its own.
  const std::vector<BlockCopy> c = SetOk(t, 1, {3, 7, 5}, 37);
  REQUIRE(c.size() == 1);
  CHECK(c[0].src == 9);
  CHECK(c[0].dst == 5);
  CHECK(c[0].rows == 5);  // positions 32..36
  CHECK(t.CheckRun(1, 48).ok());
  // A start of whole blocks copies nothing.
  t.Share(2, 0, 32);
  CHECK(SetOk(t, 2, {3, 7}, 32).empty());
}

TEST_CASE("seq tables: copy on write of a kept start's shared partial block") {
  SeqTables t = Tables();
  CHECK(SetOk(t, 0, {1, 2}, 0).empty());  // then 30 positions written
  t.Keep(0, 20);  // the next request keeps 20 (block 2 is shared meanwhile)
  const std::vector<BlockCopy> c = SetOk(t, 0, {1, 8}, 20);
  REQUIRE(c.size() == 1);
  CHECK(c[0].src == 2);
  CHECK(c[0].dst == 8);
  CHECK(c[0].rows == 4);
  // Released: nothing held, any table.
  t.Keep(0, 0);
  CHECK(SetOk(t, 0, {}, 0).empty());
  CHECK(SetOk(t, 0, {2, 1}, 0).empty());
}

// The scheduler's prefix cache: blocks that sequence 0 wrote outlive its
// use of them; sequence 1, which held rows of its own, drops them and
// adopts the blocks as its first positions. Nothing is copied; it runs
// within its table at once.
TEST_CASE("seq tables: an adopted start lives in the table's own blocks") {
  SeqTables t = Tables();
  CHECK(SetOk(t, 0, {3, 7, 9}, 0).empty());  // then 40 positions written
  t.Keep(0, 0);                               // sequence 0 released; blocks 3, 7 stay cached
  CHECK(SetOk(t, 0, {}, 0).empty());
  CHECK(SetOk(t, 1, {1, 2}, 0).empty());      // sequence 1 ran 20 positions
  CHECK(t.CheckRun(1, 20).ok());
  t.Keep(1, 0);                               // emptied for the next request
  CHECK(SetOk(t, 1, {3, 7, 4}, 0).empty());   // the cached blocks and one of its own
  CHECK(!t.Adopt(1, 49).ok());                // beyond its table: refused, nothing changed
  CHECK(t.CheckRun(1, 48).ok());
  REQUIRE(t.Adopt(1, 32).ok());
  CHECK(t.CheckRun(1, 48).ok());
  // Its rows are where the table says: a later table keeps them without a
  // copy, and one that moves them copies from the adopted blocks.
  CHECK(SetOk(t, 1, {3, 7, 4, 5}, 32).empty());
  const std::vector<BlockCopy> c = SetOk(t, 1, {3, 8, 4}, 32);
  REQUIRE(c.size() == 1);
  CHECK(c[0].src == 7);
  CHECK(c[0].dst == 8);
  CHECK(c[0].rows == 16);
  // Adopting drops rows held elsewhere (a copied start not yet moved).
  CHECK(SetOk(t, 2, {6}, 0).empty());
  t.Share(2, 1, 20);
  CHECK(!t.CheckRun(2, 16).ok());
  REQUIRE(t.Adopt(2, 16).ok());
  CHECK(t.CheckRun(2, 16).ok());
  CHECK(SetOk(t, 2, {6, 10}, 16).empty());
}

TEST_CASE("seq tables: bad tables are refused and change nothing") {
  SeqTables t = Tables();
  CHECK(SetOk(t, 0, {3, 7}, 0).empty());  // then 20 positions written
  (void)t.TakeChanged();
  CHECK(!t.Set(0, {3, 12}, 20).ok());           // outside the pool
  CHECK(!t.Set(0, {3, -1}, 20).ok());
  CHECK(!t.Set(0, {1, 2, 3, 4, 5}, 20).ok());   // longer than a table
  CHECK(!t.Set(0, {3}, 20).ok());               // too short for its rows
  CHECK(!t.Set(0, {7, 3}, 20).ok());            // 7 receives rows while it holds others
  CHECK(!t.Set(1, {4}, 5).ok());                // rows it never had
  CHECK(t.TakeChanged().empty());
  CHECK(t.table(0).size() == 2);
  CHECK(t.CheckRun(0, 32).ok());
}

}  // namespace
}  // namespace dpl::kv
