// Decode attention: one new query token against an f16 KV cache (or a batch
// of them, one per sequence, each against its own sequence's rows: a region
// of the cache, or blocks of a paged one, kernels/kv_pages.h), grouped-query
// (query head h reads kv head h / (n_head / n_head_kv)), causal over keys
// 0..pos with pos = *d_pos, scale 1/sqrt(head_dim). Flash-decoding: a split
// kernel (grid max_splits x n_head_kv; each block takes one chunk of positions
// for one kv head and all its query heads, so K/V bytes are loaded once per
// GQA group) writes partial (max, sum, acc) per query head, then a combine
// kernel merges them. See attention_split.h for how the fixed grid adapts to
// the current length.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/statusor.h"
#include "kernels/act_quant.h"
#include "kernels/kv_pages.h"
#include "kernels/tuning.h"

namespace dpl::kernels {

struct DecodeAttentionPlan {
  int n_head = 0;
  int n_head_kv = 0;
  int head_dim = 0;    // 64 or 128
  int n_ctx = 0;       // positions per sequence: regions, rows per kv head of a region;
                       // pages, at most what a block table reaches (max_blocks << block_shift)
  int max_splits = 0;  // split-kernel blocks per kv head and batch row (grid.x)
  // Copied from DecodeTuning by the planner (0 = not planned: rejected).
  int min_chunk = 0;      // fewest keys per active split (AttnActiveSplits)
  int combine_parts = 0;  // combine threads per head dim, 4 or 8
  int batch = 1;       // query rows (sequences) per call (grid.z)
  // Floats of the caller-allocated workspace: per query head and split,
  // head_dim accumulators plus (max, sum).
  uint64_t workspace_floats = 0;
  int window = 0;      // > 0: sliding window, the query sees its last `window` keys only
  // The combine kernel as a programmatic dependent launch (DecodeTuning::attn_pdl).
  bool pdl = true;
  // The split kernel as one (DecodeTuning::pdl: the whole step's chain).
  bool step_pdl = false;
  // Splits not holding the current position load their first K/V tiles
  // before waiting on RoPE (DecodeTuning::attn_early_kv).
  bool early_kv = true;
};

// Chooses max_splits so that batch * n_head_kv * max_splits split blocks fill
// one wave (the kernel's occupancy per SM, capped at
// tuning.attn_max_blocks_per_sm, times tuning.num_sms; at most 1024 splits;
// tuning.attn_splits overrides), but never more splits than
// ceil(n_ctx / tuning.attn_min_chunk). Errors: attn_min_chunk < 1, head_dim not 64/128, n_head not a
// multiple of n_head_kv, group (n_head / n_head_kv) above 8, sizes <= 0,
// batch above 65535.
absl::StatusOr<DecodeAttentionPlan> PlanDecodeAttention(int n_head, int n_head_kv, int head_dim,
                                                        int n_ctx, int window,
                                                        const DecodeTuning& tuning, int batch = 1);

// For each batch row b < plan.batch, with pos = d_pos[b] and its sequence
// r = max(d_seq[b], 0) (0 without d_seq):
//   out[b] = softmax(q[b] k_r^T / sqrt(head_dim)) v_r over keys 0..min(pos, n_ctx-1)
// (with plan.window > 0: the last `window` of them, AttnKeyRange), where row
// (kv head h, position t) of k_r (v_r) is at k_cache + KvRowOffset(pages, r,
// n_head_kv, n_ctx, h, t, head_dim) (kernels/kv_pages.h).
//   q:         (batch, n_head, head_dim) floats (already rotated)
//   k_cache:   one layer's K array, f16 bits (kernels/ops/kv_cache.h):
//              regions (pages.tables null): (n_seq, n_head_kv, n_ctx, head_dim);
//              pages: (n_blocks, n_head_kv, 1 << pages.block_shift, head_dim).
//              Rows 0..pos of each row's sequence valid
//   v_cache:   the layer's V array, as k_cache
//   d_pos:     (batch) ints, device memory; a negative position (a padding
//              row of a batched step) attends key 0 of its sequence: finite,
//              never read by anyone (pages: that sequence's first table
//              entry must still name a block of the pool)
//   workspace: (plan.workspace_floats) floats, scratch
//   out:       (batch, n_head, head_dim) floats
//   quant:     null, or where out is also written as int8 activation blocks
//              (kernels/act_quant.h: batch rows of n_head * head_dim / 32
//              blocks), bit for bit what QuantizeActivations(out) would
//              write; the combine kernel does it, so the Wo matvec needs no
//              quantize launch.
//   d_seq:     (batch) ints, device memory, or null: every row is sequence
//              0 (with pages: every row reads sequence 0's table). A
//              negative entry means sequence 0.
//   pages:     where a sequence's rows are (kernels/kv_pages.h). Default
//              (tables null): regions, sequence r's region at r * n_head_kv *
//              n_ctx * head_dim, exactly as before pages existed (the same
//              kernel code). With tables: (n_seq, pages.max_blocks) block ids
//              in device memory, read on the device like d_pos (so a
//              captured graph follows table updates); position t of
//              sequence r is in block tables[r * max_blocks + (t >>
//              block_shift)] at row t & (block - 1). The entries a row
//              reads (positions of its key range) must name blocks of the
//              pool. Errors: block_shift outside [4, 10], max_blocks <= 0,
//              plan.n_ctx > max_blocks << block_shift (InvalidArgument).
//              Same plan, same inputs: paged and regions give the same bits.
// A row's result depends on its own query, position and sequence only (and
// on plan.max_splits): the same row in another batch of the same plan is
// bit-identical.
absl::Status DecodeAttention(const DecodeAttentionPlan& plan, const float* q,
                             const uint16_t* k_cache, const uint16_t* v_cache, const int* d_pos,
                             float* workspace, float* out, cudaStream_t stream,
                             const QuantOut* quant = nullptr, const int* d_seq = nullptr,
                             const KvPages& pages = {});

}  // namespace dpl::kernels
