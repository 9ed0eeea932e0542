// Prompt (prefill) attention: a chunk of n_tokens query tokens at positions
// p0 .. p0 + n_tokens - 1 against the f16 KV cache of one layer, causal,
// grouped-query, scale 1/sqrt(head_dim). FlashAttention-2 on tensor cores:
// one CTA takes 64 query rows of one query head and streams 64-key tiles of
// K and V through shared memory (cp.async, double-buffered), with S = Q K^T
// and O = P V on mma.sync m16n8k16 (f16 inputs, f32 accumulators) and the
// online softmax in f32 registers. The decode path (one token) is
// attention.h's flash-decoding kernel over the same cache layout
// (kernels/ops/kv_cache.h), regions or pages (kernels/kv_pages.h).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "kernels/attention/prompt_tiles.h"
#include "kernels/kv_pages.h"

namespace dpl::kernels {

struct PromptAttentionShape {
  int n_head = 0;     // query heads
  int n_head_kv = 0;  // kv heads; n_head % n_head_kv == 0 (GQA: query head h reads kv head h / (n_head / n_head_kv))
  int head_dim = 0;   // 64 or 128
  int n_ctx = 0;      // positions: regions, cache rows per kv head; pages, at most what a
                      // block table reaches (max_blocks << block_shift)
  int window = 0;     // > 0: sliding window, each query sees its last `window` keys only
};

// For t < n_tokens, query token t sits at position P = p0 + t and attends causally to keys
// lo..P (lo = 0, or max(0, P - window + 1) with a sliding window):
//   out[t][h] = softmax(q[t][h] . K[kvh][lo..P]^T / sqrt(head_dim)) V[kvh][lo..P]
// where K[kvh][j] is the row at k_cache + KvRowOffset(pages, seq, n_head_kv, n_ctx, kvh, j,
// head_dim) with pages (kernels/kv_pages.h), at k_cache + (kvh * n_ctx + j) * head_dim without.
//   q:        (n_tokens, n_head, head_dim) f32, already rotated; 8-byte aligned
//   k_cache, v_cache: f16 bits, 16-byte aligned. Regions (pages.tables null): one sequence's
//             (n_head_kv, n_ctx, head_dim) rows of this layer (the caller offsets to the
//             sequence's region; seq is ignored). Pages: this layer's whole K / V array,
//             (n_blocks, n_head_kv, 1 << pages.block_shift, head_dim).
//             Rows 0..p0+n_tokens-1 of the sequence valid, rows after that may hold any bits
//             (stale or NaN): they are never read and never influence the output.
//   out:      (n_tokens, n_head * head_dim) f32; 8-byte aligned
//   pages:    default (tables null): regions, as above. With tables: (n_seq, max_blocks)
//             block ids in device memory; position j of sequence seq is in block
//             tables[seq * max_blocks + (j >> block_shift)] at row j & (block - 1). The entries
//             of positions 0..p0+n_tokens-1 must name the sequence's blocks (with a window,
//             those from the 64-key tile holding the first token's lower limit on: rows below
//             the limit in that tile are read and masked, so must be finite, as with regions);
//             the others are never read.
//   seq:      pages only: the sequence (its table row) the chunk belongs to.
// Same inputs: paged and regions give the same bits.
// Errors (InvalidArgument naming the field): head_dim not 64/128, n_head not a multiple of
// n_head_kv, sizes <= 0, p0 < 0, p0 + n_tokens > n_ctx, null or misaligned pointers; with
// pages: pages.block_shift outside [4, 10], pages.max_blocks <= 0, seq < 0, n_ctx past
// max_blocks << block_shift.
// No allocation, no sync, no host copies: capturable in a CUDA graph (the one-time
// shared-memory opt-in is a function attribute, not a stream operation).
absl::Status PromptAttention(const PromptAttentionShape& shape, const float* q, const uint16_t* k_cache,
                             const uint16_t* v_cache, int p0, int n_tokens, float* out,
                             cudaStream_t stream, const KvPages& pages = {}, int seq = 0);

// A packed pass's chunks in one launch (prompt_tiles.h says why): each tile
// computes what PromptAttention computes for its query rows m0 .. m0 + 63 of
// its chunk, bit for bit, with q and out the whole pass's rows (a chunk's
// tokens at rows row .. row + n_tokens - 1) and k_cache / v_cache the layer's
// whole arrays (regions: (n_seq, n_head_kv, n_ctx, head_dim), the tile's seq
// picks the region; pages as above). `tiles` is the host's copy of the list
// (checked here: each tile's chunk as PromptAttention checks a chunk, m0 a
// multiple of 64 below n_tokens, seq and row >= 0; at most 65535 tiles),
// `dev_tiles` the same list in device memory, which the kernel reads. The
// regions a tile's seq names, and the rows its chunk names, must exist.
absl::Status PromptAttentionBatch(const PromptAttentionShape& shape, const float* q,
                                  const uint16_t* k_cache, const uint16_t* v_cache,
                                  absl::Span<const PromptTile> tiles, const PromptTile* dev_tiles,
                                  float* out, cudaStream_t stream, const KvPages& pages = {});

}  // namespace dpl::kernels
