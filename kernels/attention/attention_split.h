// How decode attention divides the KV sequence among blocks, shared by the
// host planner and the kernels (so the combine kernel and the tests agree with
// the split kernel bit for bit).
//
// The grid is fixed when the CUDA graph is captured: max_splits blocks per kv
// head. At run time every kernel derives from the current KV length L (read
// from device memory) how many of them work:
//   n_active = min(max_splits, ceil(L / min_chunk)),  chunk = ceil(L / n_active)
// and split s covers [s * chunk, min(L, (s + 1) * chunk)); blocks s >= n_active
// exit at once. Why adaptive: a fixed split count would give 32768/max_splits-
// sized chunks at long contexts (good) but 1-position chunks with a combine
// cost larger than the KV read at short ones; a fixed chunk size would leave
// most SMs idle at depth 3254 (only L/chunk blocks per kv head).
#pragma once

#if defined(__CUDACC__)
#define DPL_ATTN_HD __host__ __device__ __forceinline__
#else
#define DPL_ATTN_HD inline
#endif

namespace dpl::kernels {

// min_chunk: the fewest positions a split handles (below it the partial
// results cost more to write and combine than the keys they summarize;
// DecodeTuning::attn_min_chunk, >= 1).
DPL_ATTN_HD int AttnActiveSplits(int kv_len, int max_splits, int min_chunk) {
  const int by_len = (kv_len + min_chunk - 1) / min_chunk;
  const int n = by_len < max_splits ? by_len : max_splits;
  return n > 0 ? n : 1;
}

DPL_ATTN_HD int AttnChunk(int kv_len, int n_active) { return (kv_len + n_active - 1) / n_active; }

// The keys a decode query at position *d_pos attends: [lo, lo + len) with
// len >= 1, i.e. 0 .. pos (capped to the cache), or its last `window` of
// them with a sliding window (window > 0). Splits divide the len keys from
// lo; the split and combine kernels both derive it from d_pos.
struct AttnKeys {
  int lo;
  int len;
};
DPL_ATTN_HD AttnKeys AttnKeyRange(int pos, int n_ctx, int window) {
  int end = pos + 1;
  end = end < n_ctx ? end : n_ctx;
  end = end > 1 ? end : 1;
  const int lo = window > 0 && end > window ? end - window : 0;
  return {lo, end - lo};
}

}  // namespace dpl::kernels
