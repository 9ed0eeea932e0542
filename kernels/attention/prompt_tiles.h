// The query tiles of a packed prompt pass (issue 30): every chunk's 64-row
// query tiles in one list, so that one prompt-attention launch
// (PromptAttentionBatch, prompt_attention.h) covers a pass of many chunks.
// Why: a pass that packs sixteen 50-token chunks behind a shared 2,000-token
// start launched sixteen grids of n_head CTAs a layer (28 on a 7B: a fifth
// of an H100's SMs, each grid waiting for the one before); one grid of all
// the tiles fills the GPU. Host code only, no CUDA: the list is planned on
// the host and copied to the device with the pass's other rows.
#pragma once

#include <vector>

#include "absl/types/span.h"

namespace dpl::kernels {

// Query rows a CTA of the prompt kernel takes (prompt_attention.cu's kBlockM).
inline constexpr int kPromptTileRows = 64;

// One chunk of a pass: n_tokens query tokens of sequence `seq` at positions
// p0 .. p0 + n_tokens - 1, in rows row .. row + n_tokens - 1 of the pass's
// q and out.
struct PromptChunk {
  int seq = 0;
  int p0 = 0;
  int row = 0;
  int n_tokens = 0;
};

// One CTA's work: query tokens m0 .. min(m0 + 64, n_tokens) - 1 of a chunk
// (m0 a multiple of 64). Read by the kernel from device memory: plain ints.
struct PromptTile {
  int seq = 0;
  int p0 = 0;
  int row = 0;
  int n_tokens = 0;
  int m0 = 0;
};

// Keys the tile's last token attends (without a window): its CTA's work.
inline int PromptTileKeys(const PromptTile& t) {
  const int end = t.m0 + kPromptTileRows < t.n_tokens ? t.m0 + kPromptTileRows : t.n_tokens;
  return t.p0 + end;
}

// Every chunk's tiles, the ones with the most keys first (ties: earlier
// chunks first, then a chunk's later tiles first): a grid is dispatched in
// order, so the long tiles start first and the short ones fill the tail,
// as the one-chunk launch orders its own tiles. Chunks with n_tokens <= 0
// contribute nothing.
std::vector<PromptTile> PlanPromptTiles(absl::Span<const PromptChunk> chunks);

}  // namespace dpl::kernels
