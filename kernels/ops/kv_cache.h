// Geometry of the f16 KV cache and the RoPE frequency table: host helpers
// shared by the runtime, the kernels' tests and the CPU reference.
//
// Layout: for each layer, K then V, each (n_seq, n_kv_head, n_ctx, head_dim)
// f16: one region of n_ctx positions per sequence (a server slot; 1 for a
// single conversation), so every sequence's region is laid out exactly as a
// single-sequence cache and the kernels reach sequence s by one offset.
// Why head-major: decode attention reads, for one kv head, a run of
// consecutive positions; with positions contiguous inside a head that run is
// one contiguous span of chunk * head_dim * 2 bytes (fully coalesced 16-byte
// loads). The price is the per-token write of n_kv_head rows of head_dim * 2
// bytes at stride n_ctx * head_dim * 2, which is tiny.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace dpl::kernels {

struct KvCacheLayout {
  int n_layer = 0;
  int n_kv_head = 0;
  int n_ctx = 0;  // positions per sequence
  int head_dim = 0;
  int n_seq = 1;  // sequences (regions)

  // f16 elements of one sequence's region in one layer's K (or V) array.
  uint64_t ElemsPerSeq() const { return static_cast<uint64_t>(n_kv_head) * n_ctx * head_dim; }
  // f16 elements in one layer's K (or V) array.
  uint64_t ElemsPerArray() const { return ElemsPerSeq() * n_seq; }
  // Element offset of sequence s's region inside one array.
  uint64_t SeqOffset(int seq) const { return ElemsPerSeq() * seq; }
  // Element offset of layer l's K array (V follows it: + ElemsPerArray()).
  uint64_t KOffset(int layer) const { return 2 * ElemsPerArray() * layer; }
  uint64_t VOffset(int layer) const { return KOffset(layer) + ElemsPerArray(); }
  // Element offset of (head, pos) inside one sequence's region.
  uint64_t RowOffset(int head, int pos) const {
    return (static_cast<uint64_t>(head) * n_ctx + pos) * head_dim;
  }
  uint64_t TotalBytes() const { return 2 * ElemsPerArray() * n_layer * sizeof(uint16_t); }
};

// Validated layout: every field positive, head_dim even.
absl::StatusOr<KvCacheLayout> MakeKvCacheLayout(int n_layer, int n_kv_head, int n_ctx,
                                                int head_dim, int n_seq = 1);

// inv_freq[i] = freq_scale * base^(-2i / n_rot), i < n_rot / 2, in float64
// (the same table the CPU reference uses; upload it once for RopeWriteKv).
// Errors: n_rot not positive and even, base <= 0.
absl::StatusOr<std::vector<double>> RopeInvFreq(double base, int n_rot, double freq_scale = 1.0);

}  // namespace dpl::kernels
