// Decode attention: one new query token against an f16 KV cache, grouped-query
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
  int max_splits = 0;  // split-kernel blocks per kv head (grid.x)
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

// Chooses max_splits so that n_head_kv * max_splits split blocks fill one
// wave (the kernel's occupancy per SM, capped at
// tuning.attn_max_blocks_per_sm, times tuning.num_sms; at most 1024 splits;
// tuning.attn_splits overrides), but never more splits than
// ceil(n_ctx / kAttnMinChunk). Errors: head_dim not 64/128, n_head not a
// multiple of n_head_kv, group (n_head / n_head_kv) above 8, sizes <= 0.
absl::StatusOr<DecodeAttentionPlan> PlanDecodeAttention(int n_head, int n_head_kv, int head_dim,
                                                        int n_ctx, int window,
                                                        const DecodeTuning& tuning);

// out = softmax(q k^T / sqrt(head_dim)) v over keys 0..min(*d_pos, n_ctx-1)
// (with plan.window > 0: the last `window` of them, AttnKeyRange).
//   q:         (n_head, head_dim) floats (already rotated)
//   k_cache:   (n_head_kv, n_ctx, head_dim) f16 bits, rows 0..pos valid
//   v_cache:   (n_head_kv, n_ctx, head_dim) f16 bits
//   workspace: (plan.workspace_floats) floats, scratch
//   out:       (n_head, head_dim) floats
//   quant:     null, or where out is also written as int8 activation blocks
//              (kernels/act_quant.h: n_head * head_dim / 32 blocks), bit for
//              bit what QuantizeActivations(out) would write; the combine
//              kernel does it, so the Wo matvec needs no quantize launch.
absl::Status DecodeAttention(const DecodeAttentionPlan& plan, const float* q,
                             const uint16_t* k_cache, const uint16_t* v_cache, const int* d_pos,
                             float* workspace, float* out, cudaStream_t stream,
                             const QuantOut* quant = nullptr);

}  // namespace dpl::kernels
