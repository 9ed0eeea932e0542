// Decode attention: one new query token against an f16 KV cache (or a batch
// of them, one per sequence, each against its own sequence region), grouped-query
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
#include "kernels/tuning.h"

namespace dpl::kernels {

struct DecodeAttentionPlan {
  int n_head = 0;
  int n_head_kv = 0;
  int head_dim = 0;    // 64 or 128
  int n_ctx = 0;       // cache rows per kv head
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
// region r = d_seq[b]:
//   out[b] = softmax(q[b] k_r^T / sqrt(head_dim)) v_r over keys 0..min(pos, n_ctx-1)
// (with plan.window > 0: the last `window` of them, AttnKeyRange).
//   q:         (batch, n_head, head_dim) floats (already rotated)
//   k_cache:   (n_seq, n_head_kv, n_ctx, head_dim) f16 bits (kernels/ops/kv_cache.h),
//              rows 0..pos of each row's region valid
//   v_cache:   (n_seq, n_head_kv, n_ctx, head_dim) f16 bits
//   d_pos:     (batch) ints, device memory; a negative position (a padding
//              row of a batched step) attends key 0 of its region: finite,
//              never read by anyone
//   workspace: (plan.workspace_floats) floats, scratch
//   out:       (batch, n_head, head_dim) floats
//   quant:     null, or where out is also written as int8 activation blocks
//              (kernels/act_quant.h: batch rows of n_head * head_dim / 32
//              blocks), bit for bit what QuantizeActivations(out) would
//              write; the combine kernel does it, so the Wo matvec needs no
//              quantize launch.
//   d_seq:     (batch) ints, device memory, or null: every row in region 0.
//              A negative entry means region 0.
// A row's result depends on its own query, position and region only (and
// on plan.max_splits): the same row in another batch of the same plan is
// bit-identical.
absl::Status DecodeAttention(const DecodeAttentionPlan& plan, const float* q,
                             const uint16_t* k_cache, const uint16_t* v_cache, const int* d_pos,
                             float* workspace, float* out, cudaStream_t stream,
                             const QuantOut* quant = nullptr, const int* d_seq = nullptr);

}  // namespace dpl::kernels
