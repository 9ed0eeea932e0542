// Geometry of the f16 KV cache and the RoPE frequency table: host helpers
// shared by the runtime, the kernels' tests and the CPU reference.
//
// Layout: for each layer, K then V, each (n_seq, n_kv_head, n_ctx, head_dim)
// f16: one region of n_ctx positions per sequence (a server slot; 1 for a
// single conversation), so every sequence's region is laid out exactly as a
// single-sequence cache and the kernels reach sequence s by one offset.
// Paged (issue 30, block_shift > 0): each array is (n_blocks, n_kv_head,
// 1 << block_shift, head_dim), one pool of blocks that the sequences' block
// tables point into (kernels/kv_pages.h: a region is the paged layout with
// one block of n_ctx positions per sequence).
// Why head-major: decode attention reads, for one kv head, a run of
// consecutive positions; with positions contiguous inside a head that run is
// one contiguous span of chunk * head_dim * 2 bytes (fully coalesced 16-byte
// loads). The price is the per-token write of n_kv_head rows of head_dim * 2
// bytes at stride n_ctx * head_dim * 2, which is tiny.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/kv_pages.h"

namespace dpl::kernels {

struct KvCacheLayout {
  int n_layer = 0;
  int n_kv_head = 0;
  int n_ctx = 0;  // positions per sequence
  int head_dim = 0;
  int n_seq = 1;  // sequences (regions; pages: block tables)
  // Pages only (0 for regions): log2 of positions per block, and the pool's
  // blocks; n_ctx is then what one table reaches (a multiple of the block).
  int block_shift = 0;
  int n_blocks = 0;

  bool paged() const { return block_shift > 0; }
  int block() const { return paged() ? 1 << block_shift : n_ctx; }
  // Entries of one sequence's block table (1 for regions).
  int max_blocks() const { return paged() ? n_ctx >> block_shift : 1; }
  // f16 elements of one block (a region: one sequence's) in one layer's K
  // (or V) array.
  uint64_t ElemsPerBlock() const { return static_cast<uint64_t>(n_kv_head) * block() * head_dim; }
  // Regions: f16 elements of one sequence's region (a block).
  uint64_t ElemsPerSeq() const { return static_cast<uint64_t>(n_kv_head) * n_ctx * head_dim; }
  // f16 elements in one layer's K (or V) array.
  uint64_t ElemsPerArray() const { return ElemsPerBlock() * (paged() ? n_blocks : n_seq); }
  // Element offset of a block (regions: sequence s's region) inside one array.
  uint64_t BlockOffset(int block_id) const { return ElemsPerBlock() * block_id; }
  // Regions: element offset of sequence s's region inside one array.
  uint64_t SeqOffset(int seq) const { return ElemsPerSeq() * seq; }
  // Element offset of layer l's K array (V follows it: + ElemsPerArray()).
  uint64_t KOffset(int layer) const { return 2 * ElemsPerArray() * layer; }
  uint64_t VOffset(int layer) const { return KOffset(layer) + ElemsPerArray(); }
  // Element offset of (head, pos) inside one sequence's region (pages:
  // (head, pos % block) inside one block).
  uint64_t RowOffset(int head, int pos) const {
    const int in_block = paged() ? pos & (block() - 1) : pos;
    return (static_cast<uint64_t>(head) * block() + in_block) * head_dim;
  }
  uint64_t TotalBytes() const { return 2 * ElemsPerArray() * n_layer * sizeof(uint16_t); }
};

// Validated layout: every field positive, head_dim even.
absl::StatusOr<KvCacheLayout> MakeKvCacheLayout(int n_layer, int n_kv_head, int n_ctx,
                                                int head_dim, int n_seq = 1);

// Validated paged layout: a pool of n_blocks blocks of `block` positions
// (a power of two, 16 to 1024), tables of n_seq sequences reaching n_ctx
// positions each (rounded up to a whole block; at most n_blocks blocks).
absl::StatusOr<KvCacheLayout> MakePagedKvCacheLayout(int n_layer, int n_kv_head, int head_dim, int n_seq,
                                                     int block, int n_blocks, int64_t n_ctx);

// Whether `pages` (kernels/kv_pages.h) can address n_ctx positions a
// sequence: regions always; pages need block_shift in [4, 10] (blocks of
// 16 to 1024) and max_blocks > 0 entries reaching at least n_ctx (a
// position past a table's reach would read the next sequence's table).
// InvalidArgument naming the field, prefixed with `who` (the kernel).
absl::Status CheckKvPages(const KvPages& pages, int64_t n_ctx, absl::string_view who);

// inv_freq[i] = freq_scale * base^(-2i / n_rot), i < n_rot / 2, in float64
// (the same table the CPU reference uses; upload it once for RopeWriteKv).
// Errors: n_rot not positive and even, base <= 0.
absl::StatusOr<std::vector<double>> RopeInvFreq(double base, int n_rot, double freq_scale = 1.0);

}  // namespace dpl::kernels
