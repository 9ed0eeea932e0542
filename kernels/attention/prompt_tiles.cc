#include "kernels/attention/prompt_tiles.h"

#include <algorithm>

namespace dpl::kernels {

std::vector<PromptTile> PlanPromptTiles(absl::Span<const PromptChunk> chunks) {
  std::vector<PromptTile> tiles;
  for (const PromptChunk& c : chunks) {
    const int n_tiles = c.n_tokens > 0 ? (c.n_tokens + kPromptTileRows - 1) / kPromptTileRows : 0;
    for (int i = n_tiles - 1; i >= 0; --i) {
      tiles.push_back({c.seq, c.p0, c.row, c.n_tokens, i * kPromptTileRows});
    }
  }
  std::stable_sort(tiles.begin(), tiles.end(), [](const PromptTile& a, const PromptTile& b) {
    return PromptTileKeys(a) > PromptTileKeys(b);
  });
  return tiles;
}

}  // namespace dpl::kernels
