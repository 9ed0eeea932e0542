// PlanPromptTiles: every query token of every chunk in exactly one tile, the
// tiles ordered by the keys they read.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <map>
#include <utility>
#include <vector>

#include "kernels/attention/prompt_tiles.h"

namespace dpl::kernels {
namespace {

// (seq, token) -> times covered, for every tile's tokens; checks each tile
// against its chunk.
std::map<std::pair<int, int>, int> Coverage(const std::vector<PromptChunk>& chunks,
                                            const std::vector<PromptTile>& tiles) {
  std::map<std::pair<int, int>, int> seen;
  for (const PromptTile& t : tiles) {
    CHECK(t.m0 % kPromptTileRows == 0);
    CHECK(t.m0 >= 0);
    CHECK(t.m0 < t.n_tokens);
    bool from_a_chunk = false;
    for (const PromptChunk& c : chunks) {
      from_a_chunk |= c.seq == t.seq && c.p0 == t.p0 && c.row == t.row && c.n_tokens == t.n_tokens;
    }
    CHECK(from_a_chunk);
    for (int i = t.m0; i < t.n_tokens && i < t.m0 + kPromptTileRows; ++i) ++seen[{t.seq, i}];
  }
  return seen;
}

TEST_CASE("one chunk: its tiles, the last (most keys) first, as the one-chunk launch orders them") {
  const std::vector<PromptChunk> chunks = {{3, 100, 0, 130}};
  const std::vector<PromptTile> tiles = PlanPromptTiles(chunks);
  REQUIRE(tiles.size() == 3);
  CHECK(tiles[0].m0 == 128);
  CHECK(tiles[1].m0 == 64);
  CHECK(tiles[2].m0 == 0);
  CHECK(PromptTileKeys(tiles[0]) == 230);
  CHECK(PromptTileKeys(tiles[1]) == 228);
  CHECK(PromptTileKeys(tiles[2]) == 164);
}

TEST_CASE("many chunks: every token once, tiles ordered by the keys they read") {
  // A shared start's pass (short chunks far into their sequences), a fresh
  // prompt, a one-token chunk, and an empty chunk that adds nothing.
  std::vector<PromptChunk> chunks;
  int row = 0;
  for (int s = 0; s < 6; ++s) {
    chunks.push_back({s, 2000, row, 50});
    row += 50;
  }
  chunks.push_back({6, 0, row, 300});
  row += 300;
  chunks.push_back({7, 17, row, 1});
  row += 1;
  chunks.push_back({8, 5, row, 0});
  const std::vector<PromptTile> tiles = PlanPromptTiles(chunks);
  CHECK(tiles.size() == 6 + 5 + 1);
  const auto seen = Coverage(chunks, tiles);
  int covered = 0;
  for (const auto& [key, times] : seen) {
    CHECK(times == 1);
    ++covered;
  }
  CHECK(covered == 6 * 50 + 300 + 1);
  for (size_t i = 1; i < tiles.size(); ++i) CHECK(PromptTileKeys(tiles[i - 1]) >= PromptTileKeys(tiles[i]));
  // Ties keep the chunks' order: the six shared-start chunks (2050 keys
  // each) lead, sequences 0..5 in turn.
  for (int s = 0; s < 6; ++s) CHECK(tiles[static_cast<size_t>(s)].seq == s);
  CHECK(tiles.back().seq == 7);  // 18 keys
}

TEST_CASE("no chunks, no tiles") { CHECK(PlanPromptTiles({}).empty()); }

}  // namespace
}  // namespace dpl::kernels
