// Where a sequence's KV rows live, as the kernels that write and read the
// f16 cache address them (issue 30's paged cache). Plain data and one
// inline address function, usable from host code and device code.
//
// A layer's K (or V) array is (n_blocks, n_kv_head, block, head_dim) f16:
// a block holds `block` consecutive positions of one sequence for every kv
// head (positions contiguous inside a head, as decode attention wants:
// kernels/ops/kv_cache.h says why). Two ways to find a sequence's blocks:
//   regions (tables == null): block = n_ctx and sequence s owns block s,
//     the layout of kernels/ops/kv_cache.h (one region per sequence);
//   pages (tables != null): block = 1 << block_shift positions, and
//     position p of sequence s lives in block
//     tables[s * max_blocks + (p >> block_shift)], a block of the pool that
//     the server's scheduler handed out (runtime/kv/block_pool.h); n_ctx is
//     then the positions a table can reach, max_blocks << block_shift.
// The region layout is the paged layout with one block per sequence, so
// every kernel runs the same address expression, and a paged cache gives
// the same bits as regions: only where a row sits changes.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define DPL_KV_HD __host__ __device__ __forceinline__
#else
#define DPL_KV_HD inline
#endif

namespace dpl::kernels {

struct KvPages {
  const int* tables = nullptr;  // (n_seq, max_blocks) block ids, device memory; null: regions
  int max_blocks = 0;           // entries per sequence's table
  int block_shift = 0;          // log2(positions per block), pages only

  DPL_KV_HD bool paged() const { return tables != nullptr; }
};

// Element offset of the row (seq, kv head, pos) in one layer's K or V array:
//   regions: ((seq * n_kv_head + head) * n_ctx + pos) * head_dim
//   pages:   ((blk * n_kv_head + head) * block + pos % block) * head_dim,
//            blk = tables[seq * max_blocks + pos / block]
// pos must be in [0, n_ctx) and (pages) its table entry a valid block.
DPL_KV_HD uint64_t KvRowOffset(const KvPages& pages, int seq, int n_kv_head, int n_ctx, int head, int pos,
                               int head_dim) {
  if (!pages.paged()) {
    return ((static_cast<uint64_t>(seq) * n_kv_head + head) * n_ctx + pos) * head_dim;
  }
  const int blk = pages.tables[static_cast<int64_t>(seq) * pages.max_blocks + (pos >> pages.block_shift)];
  const int in_block = pos & ((1 << pages.block_shift) - 1);
  return (((static_cast<uint64_t>(blk) * n_kv_head + head) << pages.block_shift) + in_block) * head_dim;
}

}  // namespace dpl::kernels
