#include <cuda_fp16.h>

#include <atomic>
#include <cmath>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kernels/attention/attention.h"
#include "kernels/attention/attention_split.h"
#include "kernels/act_quant.cuh"
#include "kernels/cuda_check.h"
#include "kernels/launch.cuh"

namespace dpl::kernels {
namespace {

constexpr int kThreads = 128;  // 4 warps per (kv head, split) block

__device__ __forceinline__ void HalfsToFloats(const uint4& raw, float* f) {
  const __half2* h = reinterpret_cast<const __half2*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 v = __half22float2(h[i]);
    f[2 * i] = v.x;
    f[2 * i + 1] = v.y;
  }
}

// ---------------------------------------------------------------------------
// Split kernel, block (s, kvh, b): for batch row b (its query, position and
// sequence region), the G query heads h = kvh * G + g and the
// positions t in split s's chunk [t_begin, t_end):
//   x_t = (q_h . k_t) * log2(e) / sqrt(HD)          (scores in the log2 domain)
//   m = max_t x_t,  l = sum_t 2^(x_t - m),  acc = sum_t 2^(x_t - m) v_t
// written to the workspace unnormalized; the combine kernel merges splits.
// Thread mapping: a row of HD halves is read by LPR = HD/8 lanes, 16 bytes
// (8 dims) each, so one warp instruction covers 512 B of whole rows and
// NGRP = 128/LPR rows are worked on per block per step. Each tile of kTileT
// positions is scored into shared memory (dot partials summed by an xor
// butterfly inside the LPR lanes), one softmax update per tile rescales the
// running state, then V for the tile is accumulated.
//
// K and V reach the block through shared memory:
// the block first issues cp.async copies of its first kStages tiles of K and
// V (kTileT rows each; a head's rows are contiguous, so a tile is one
// contiguous span of kTileT * HD halves), and only then loads q. Why: at mid
// lengths (depth ~3k) a split holds ~50-100 rows, i.e. 1-2 tiles, so its whole
// chunk is in flight after one issue burst and the block pays one HBM latency
// instead of one per step of a register pipeline (the first version of this
// kernel, streaming through registers, paid a chain of ~6 dependent round
// trips: 16.6 vs 13.9 us per 14B layer at depth 3254). At long lengths the stage being
// refilled streams while the other one is scored (double buffering), keeping
// 2 * kStages * kTileT * HD * 2 bytes = 64 KB (HD 128) in flight per block.
// cp.async groups are committed in a fixed order K_j, V_j (empty groups for
// tiles past the chunk), so "wait until at most N groups are pending" waits
// for exactly K_j (N = 2*kStages-1) or V_j (N = 2*kStages-2).
constexpr int kTileT = 64;
constexpr int kStages = 2;

template <int HD>
__host__ __device__ constexpr int StreamSmemBytes() {
  // (kStages, {K, V}, kTileT, HD) halves; reused for the final (NGRP, G, HD)
  // float reduction, which needs at most 8 * 8 * 128 * 4 = 32 KB.
  return kStages * 2 * kTileT * HD * 2;
}

__device__ __forceinline__ void CpAsync16(void* smem, const void* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Copies rows [t, t + n) of one head's cache (contiguous, HD halves per row)
// to dst, 16 bytes per cp.async, consecutive threads on consecutive chunks.
template <int HD>
__device__ __forceinline__ void IssueRows(__half* dst,                // (kTileT, HD)
                                          const __half* __restrict__ src_head,  // (n_ctx, HD)
                                          int t, int n, int tid) {
  const int chunks = n * (HD / 8);
  const __half* src = src_head + (size_t)t * HD;
  for (int c = tid; c < chunks; c += kThreads) CpAsync16(dst + c * 8, src + c * 8);
}

// (One long kernel on purpose: the cp.async stages, the per-tile softmax and
// the reduction share one register and shared-memory budget; device
// functions would inline back into exactly this.)
template <int HD, int G>
__global__ void __launch_bounds__(kThreads, 2) AttnStreamKernel(
    const float* __restrict__ q,         // (batch, n_head, HD)
    const __half* __restrict__ k_cache,  // (n_seq, n_head_kv, n_ctx, HD)
    const __half* __restrict__ v_cache,  // (n_seq, n_head_kv, n_ctx, HD)
    const int* __restrict__ d_pos,       // (batch)
    const int* __restrict__ d_seq,       // (batch) or null: region 0
    int n_ctx, int window, int max_splits, float scale_log2, bool early_kv,
    float* __restrict__ ws_acc,  // (batch, n_head, max_splits, HD)
    float* __restrict__ ws_ml) {  // (batch, n_head, max_splits, 2): (m, l)
  constexpr int LPR = HD / 8;
  constexpr int NGRP = kThreads / LPR;
  constexpr int kTileHalves = kTileT * HD;
  static_assert(G >= 1 && G <= 8, "GQA group of 1..8 query heads");
  static_assert(kTileT % NGRP == 0, "row groups tile a smem tile exactly");
  static_assert(NGRP * G * HD * 4 <= StreamSmemBytes<HD>(), "reduction fits the staging buffer");
  extern __shared__ __align__(16) unsigned char s_dyn[];
  // Stage st: K tile at s_kv + (2*st) * kTileHalves, V tile right after it.
  __half* s_kv = reinterpret_cast<__half*>(s_dyn);
  __shared__ __align__(16) float s_p[kTileT][8];  // [t][g] scores, then probabilities
  __shared__ float s_scale[8];

  // Launched as a programmatic dependent of RoPE when the decode step uses
  // PDL (a no-op otherwise). RoPE writes q and the cache row of position p
  // only; d_pos and the rows before p were written by earlier steps, so the
  // position is read, and (early_kv) every split whose chunk ends before p
  // issues its first tiles, before the wait: their K/V loads overlap RoPE.
  // The split holding p waits first.
  const int b = blockIdx.z;
  const AttnKeys keys = AttnKeyRange(d_pos[b], n_ctx, window);
  const int n_act = AttnActiveSplits(keys.len, max_splits);
  const int s = blockIdx.x, kvh = blockIdx.y;
  if (s >= n_act) return;
  const int n_head = gridDim.y * G;
  const int seq = d_seq != nullptr ? max(d_seq[b], 0) : 0;
  q += (size_t)b * n_head * HD;
  k_cache += (size_t)seq * gridDim.y * n_ctx * HD;
  v_cache += (size_t)seq * gridDim.y * n_ctx * HD;
  ws_acc += (size_t)b * n_head * max_splits * HD;
  ws_ml += (size_t)b * n_head * max_splits * 2;
  const int chunk = AttnChunk(keys.len, n_act);
  const int t_begin = keys.lo + s * chunk;
  const int t_end = min(keys.lo + keys.len, t_begin + chunk);
  const int n_tiles = t_end > t_begin ? (t_end - t_begin + kTileT - 1) / kTileT : 0;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int row_lane = tid % LPR, grp = tid / LPR;
  const __half* kh = k_cache + (size_t)kvh * n_ctx * HD;
  const __half* vh = v_cache + (size_t)kvh * n_ctx * HD;

  // Prologue: the first kStages tiles' copies go out before anything else.
  const bool holds_current = !early_kv || t_end == keys.lo + keys.len;
  if (holds_current) GridDependencyWait();
#pragma unroll
  for (int j = 0; j < kStages; ++j) {
    const int t = t_begin + j * kTileT;
    const int n = min(kTileT, t_end - t);
    if (j < n_tiles) IssueRows<HD>(s_kv + (2 * j) * kTileHalves, kh, t, n, tid);
    CpAsyncCommit();
    if (j < n_tiles) IssueRows<HD>(s_kv + (2 * j + 1) * kTileHalves, vh, t, n, tid);
    CpAsyncCommit();
  }
  if (!holds_current) GridDependencyWait();
  // The combine kernel (launched as a programmatic dependent) may start its
  // launch now; it waits for this grid's completion before reading partials.
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");

  float qr[G][8];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    const float4* qp = reinterpret_cast<const float4*>(q + (size_t)(kvh * G + g) * HD + row_lane * 8);
    const float4 a = qp[0], b = qp[1];
    qr[g][0] = a.x * scale_log2; qr[g][1] = a.y * scale_log2;
    qr[g][2] = a.z * scale_log2; qr[g][3] = a.w * scale_log2;
    qr[g][4] = b.x * scale_log2; qr[g][5] = b.y * scale_log2;
    qr[g][6] = b.z * scale_log2; qr[g][7] = b.w * scale_log2;
  }
  float acc[G][8];
#pragma unroll
  for (int g = 0; g < G; ++g)
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[g][e] = 0.0f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};

  for (int j = 0; j < n_tiles; ++j) {
    const int st = j % kStages;
    const __half* sk = s_kv + (2 * st) * kTileHalves + row_lane * 8;      // (kTileT, HD)
    const __half* sv = s_kv + (2 * st + 1) * kTileHalves + row_lane * 8;  // (kTileT, HD)
    const int t0 = t_begin + j * kTileT;
    const int n_t = min(kTileT, t_end - t0);
    CpAsyncWait<2 * kStages - 1>();  // K_j landed (this thread's copies)
    __syncthreads();                 // ... and everyone's
    // Pass 1: scores of rows p = base + grp; base is warp-uniform (butterfly).
    // Rows p >= n_t hold stale bytes: their dots are computed, never stored,
    // and the butterfly only mixes lanes of the same row.
#pragma unroll 2
    for (int base = 0; base < n_t; base += NGRP) {
      const int p = base + grp;
      float kf[8];
      HalfsToFloats(*reinterpret_cast<const uint4*>(sk + p * HD), kf);
      float dot[G];
#pragma unroll
      for (int g = 0; g < G; ++g) {
        float a = 0.0f;
#pragma unroll
        for (int e = 0; e < 8; ++e) a = fmaf(qr[g][e], kf[e], a);
        dot[g] = a;
      }
#pragma unroll
      for (int o = LPR / 2; o > 0; o >>= 1)
#pragma unroll
        for (int g = 0; g < G; ++g) dot[g] += __shfl_xor_sync(0xffffffffu, dot[g], o);
      float mine = dot[0];
#pragma unroll
      for (int g = 1; g < G; ++g) mine = row_lane == g ? dot[g] : mine;
      if (p < n_t && row_lane < G) s_p[p][row_lane] = mine;
    }
    CpAsyncWait<2 * kStages - 2>();  // V_j landed
    __syncthreads();
#pragma unroll
    for (int jj = 0; jj < 2; ++jj) {
      const int g = warp + 4 * jj;
      if (g < G) {
        float mx = -INFINITY;
        for (int p = lane; p < n_t; p += 32) mx = fmaxf(mx, s_p[p][g]);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        const float m_new = fmaxf(m_run[jj], mx);
        float sum = 0.0f;
        for (int p = lane; p < n_t; p += 32) {
          const float e = exp2f(s_p[p][g] - m_new);
          s_p[p][g] = e;
          sum += e;
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
        const float sc = exp2f(m_run[jj] - m_new);  // 0 on the first tile
        l_run[jj] = l_run[jj] * sc + sum;
        m_run[jj] = m_new;
        if (lane == 0) s_scale[g] = sc;
      }
    }
    __syncthreads();
    // Pass 2: acc = acc * scale + sum_t p_t v_t.
#pragma unroll
    for (int g = 0; g < G; ++g) {
      const float sc = s_scale[g];
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[g][e] *= sc;
    }
#pragma unroll 2
    for (int p = grp; p < n_t; p += NGRP) {
      float vf[8];
      HalfsToFloats(*reinterpret_cast<const uint4*>(sv + p * HD), vf);
      const float4 pa = *reinterpret_cast<const float4*>(&s_p[p][0]);
      const float4 pb = *reinterpret_cast<const float4*>(&s_p[p][4]);
      const float pr[8] = {pa.x, pa.y, pa.z, pa.w, pb.x, pb.y, pb.z, pb.w};
#pragma unroll
      for (int g = 0; g < G; ++g)
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[g][e] = fmaf(pr[g], vf[e], acc[g][e]);
    }
    __syncthreads();  // stage st and s_p are free again
    // Refill stage st with tile j + kStages (or commit empty groups, keeping
    // the K_j, V_j group order the waits above count on).
    const int jn = j + kStages;
    const int tn = t_begin + jn * kTileT;
    const int nn = min(kTileT, t_end - tn);
    if (jn < n_tiles) IssueRows<HD>(s_kv + (2 * st) * kTileHalves, kh, tn, nn, tid);
    CpAsyncCommit();
    if (jn < n_tiles) IssueRows<HD>(s_kv + (2 * st + 1) * kTileHalves, vh, tn, nn, tid);
    CpAsyncCommit();
  }
  CpAsyncWait<0>();  // only empty groups can be pending; drain before reuse
  __syncthreads();

  // Sum the NGRP row groups' accumulators (staging buffer reused), write the
  // split's partials.
  float* s_red = reinterpret_cast<float*>(s_dyn);  // (NGRP, G, HD)
#pragma unroll
  for (int g = 0; g < G; ++g) {
    float4* dst = reinterpret_cast<float4*>(s_red + ((size_t)grp * G + g) * HD + row_lane * 8);
    dst[0] = make_float4(acc[g][0], acc[g][1], acc[g][2], acc[g][3]);
    dst[1] = make_float4(acc[g][4], acc[g][5], acc[g][6], acc[g][7]);
  }
  __syncthreads();
  for (int o = tid; o < G * HD; o += kThreads) {
    const int g = o / HD, d = o % HD;
    float a = 0.0f;
#pragma unroll
    for (int r = 0; r < NGRP; ++r) a += s_red[((size_t)r * G + g) * HD + d];
    ws_acc[((size_t)(kvh * G + g) * max_splits + s) * HD + d] = a;
  }
#pragma unroll
  for (int jj = 0; jj < 2; ++jj) {
    const int g = warp + 4 * jj;
    if (g < G && lane == 0) {
      float* ml = ws_ml + ((size_t)(kvh * G + g) * max_splits + s) * 2;
      ml[0] = m_run[jj];
      ml[1] = l_run[jj];
    }
  }
}

// Combine, block (h, b) (query head, batch row), kCombineParts * HD threads:
//   M = max_s m_s,  out[h][d] = sum_s 2^(m_s - M) acc_s[d] / sum_s 2^(m_s - M) l_s
// The split weights are computed once into shared memory; thread (part, d)
// sums the splits s = part (mod kCombineParts), 4 loads in flight, then the
// parts are added. (A serial loop over splits costs one L2 latency per split.)
constexpr int kCombineParts = 4;
template <int HD>
__global__ void __launch_bounds__(HD * kCombineParts) AttnCombineKernel(
    const float* __restrict__ ws_acc,  // (batch, n_head, max_splits, HD)
    const float* __restrict__ ws_ml,   // (batch, n_head, max_splits, 2)
    const int* __restrict__ d_pos,     // (batch)
    int n_ctx, int window, int max_splits,
    float* __restrict__ out,  // (batch, n_head, HD)
    QuantOut quant) {         // (batch, n_head * HD) as int8 blocks, or q == null
  __shared__ float s_w[1024];   // max_splits <= 1024 (checked by the planner)
  __shared__ float s_red[kCombineParts][HD];
  __shared__ float s_scalar[2];
  // Launched as a programmatic dependent of the split kernel: block here
  // until that grid has completed and its partials are visible (a no-op
  // when launched normally).
  GridDependencyWait();
  GridLaunchDependents();
  const int h = blockIdx.x, b = blockIdx.y, tid = threadIdx.x;
  const int n_act = AttnActiveSplits(AttnKeyRange(d_pos[b], n_ctx, window).len, max_splits);
  // Row b's head h: the n_head = gridDim.x heads of a row are consecutive.
  const size_t bh = (size_t)b * gridDim.x + h;
  const float* ml = ws_ml + bh * max_splits * 2;
  if (tid < 32) {
    float m = -INFINITY;
    for (int s = tid; s < n_act; s += 32) m = fmaxf(m, ml[2 * s]);
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    float l = 0.0f;
    for (int s = tid; s < n_act; s += 32) {
      const float w = exp2f(ml[2 * s] - m);  // 0 for an empty split (m_s = -inf)
      s_w[s] = w;
      l = fmaf(w, ml[2 * s + 1], l);
    }
    for (int o = 16; o > 0; o >>= 1) l += __shfl_xor_sync(0xffffffffu, l, o);
    if (tid == 0) s_scalar[0] = l;
  }
  __syncthreads();
  const int d = tid % HD, part = tid / HD;
  const float* a = ws_acc + bh * max_splits * HD + d;
  float acc = 0.0f;
  int s = part;
  for (; s + 3 * kCombineParts < n_act; s += 4 * kCombineParts) {
    const float a0 = a[(size_t)s * HD], a1 = a[(size_t)(s + kCombineParts) * HD];
    const float a2 = a[(size_t)(s + 2 * kCombineParts) * HD];
    const float a3 = a[(size_t)(s + 3 * kCombineParts) * HD];
    acc = fmaf(s_w[s], a0, acc);
    acc = fmaf(s_w[s + kCombineParts], a1, acc);
    acc = fmaf(s_w[s + 2 * kCombineParts], a2, acc);
    acc = fmaf(s_w[s + 3 * kCombineParts], a3, acc);
  }
  for (; s < n_act; s += kCombineParts) acc = fmaf(s_w[s], a[(size_t)s * HD], acc);
  s_red[part][d] = acc;
  __syncthreads();
  if (part == 0) {
    float t = 0.0f;
#pragma unroll
    for (int p = 0; p < kCombineParts; ++p) t += s_red[p][d];
    const float o = t / s_scalar[0];
    out[bh * HD + d] = o;
    // Each warp of part 0 holds 32 consecutive outputs: one activation
    // block of the Wo matvec that reads them (one launch fewer per layer).
    if (quant.q != nullptr) QuantizeBlock32(o, (bh * HD + d) / 32, quant);
  }
}

using SplitFn = void (*)(const float*, const __half*, const __half*, const int*, const int*, int,
                         int, int, float, bool, float*, float*);

template <int HD>
SplitFn PickSplitT(int group) {
#define DPL_ATTN_CASE(G) \
  case G: return AttnStreamKernel<HD, G>;
  switch (group) {
    DPL_ATTN_CASE(1) DPL_ATTN_CASE(2) DPL_ATTN_CASE(3) DPL_ATTN_CASE(4)
    DPL_ATTN_CASE(5) DPL_ATTN_CASE(6) DPL_ATTN_CASE(7) DPL_ATTN_CASE(8)
    default: return nullptr;
  }
#undef DPL_ATTN_CASE
}

struct SplitChoice {
  SplitFn fn = nullptr;
  int smem = 0;  // dynamic shared memory bytes
};

SplitChoice PickSplit(int head_dim, int group) {
  SplitChoice c;
  if (head_dim == 64) {
    c.fn = PickSplitT<64>(group);
    c.smem = StreamSmemBytes<64>();
  } else if (head_dim == 128) {
    c.fn = PickSplitT<128>(group);
    c.smem = StreamSmemBytes<128>();
  }
  return c;
}

}  // namespace

absl::StatusOr<DecodeAttentionPlan> PlanDecodeAttention(int n_head, int n_head_kv, int head_dim,
                                                        int n_ctx, int window,
                                                        const DecodeTuning& tuning, int batch) {
  const int num_sms = tuning.num_sms;
  if (n_head <= 0 || n_head_kv <= 0 || n_ctx <= 0 || num_sms <= 0 || batch <= 0 ||
      batch > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "decode attention: sizes must be positive (n_head=", n_head, ", n_head_kv=", n_head_kv,
        ", n_ctx=", n_ctx, ", num_sms=", num_sms, ", batch=", batch, " of at most 65535)"));
  }
  if (head_dim != 64 && head_dim != 128) {
    return absl::UnimplementedError(
        absl::StrCat("decode attention: head_dim ", head_dim, " (kernels exist for 64 and 128)"));
  }
  if (window < 0) {
    return absl::InvalidArgumentError(absl::StrCat("decode attention: window ", window, " < 0"));
  }
  if (n_head % n_head_kv != 0 || n_head / n_head_kv > 8) {
    return absl::UnimplementedError(absl::StrCat(
        "decode attention: n_head ", n_head, " / n_head_kv ", n_head_kv,
        " must be a whole group of 1..8 query heads per kv head"));
  }
  DecodeAttentionPlan plan;
  plan.n_head = n_head;
  plan.n_head_kv = n_head_kv;
  plan.head_dim = head_dim;
  plan.n_ctx = n_ctx;
  plan.window = window;
  plan.batch = batch;
  // One full wave: as many split blocks as fit on the GPU at once, shared by
  // the batch's rows.
  const int group = n_head / n_head_kv;
  const SplitChoice split = PickSplit(head_dim, group);
  int per_sm = 0;
  cudaError_t occ = cudaSuccess;
  if (split.smem > 0) {
    occ = cudaFuncSetAttribute(split.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, split.smem);
  }
  if (occ == cudaSuccess) {
    occ = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, split.fn, kThreads, split.smem);
  }
  if (occ != cudaSuccess || per_sm <= 0) {
    (void)cudaGetLastError();  // no device: clear the sticky-free error, use a safe guess
    per_sm = 2;
  }
  if (per_sm > tuning.attn_max_blocks_per_sm) per_sm = tuning.attn_max_blocks_per_sm;
  int want = (per_sm * num_sms + n_head_kv * batch - 1) / (n_head_kv * batch);
  if (tuning.attn_splits > 0) want = tuning.attn_splits;
  if (want > 1024) want = 1024;  // the combine kernel's weight table
  // Never more splits than the keys a query can see need.
  const int keys = window > 0 && window < n_ctx ? window : n_ctx;
  const int by_ctx = (keys + kAttnMinChunk - 1) / kAttnMinChunk;
  plan.max_splits = want < by_ctx ? want : by_ctx;
  if (plan.max_splits < 1) plan.max_splits = 1;
  plan.workspace_floats =
      static_cast<uint64_t>(batch) * n_head * plan.max_splits * (head_dim + 2);
  plan.pdl = tuning.attn_pdl;
  plan.step_pdl = tuning.pdl;
  plan.early_kv = tuning.attn_early_kv;
  return plan;
}

absl::Status DecodeAttention(const DecodeAttentionPlan& plan, const float* q,
                             const uint16_t* k_cache, const uint16_t* v_cache, const int* d_pos,
                             float* workspace, float* out, cudaStream_t stream,
                             const QuantOut* quant, const int* d_seq) {
  if (!q || !k_cache || !v_cache || !d_pos || !workspace || !out) {
    return absl::InvalidArgumentError("decode attention: null pointer");
  }
  if (quant != nullptr && (!quant->q || !quant->d || !quant->s)) {
    return absl::InvalidArgumentError("decode attention: a quantized output with null buffers");
  }
  const QuantOut qout = quant != nullptr ? *quant : QuantOut{};
  if (plan.max_splits <= 0 || plan.n_head_kv <= 0 || plan.n_head % plan.n_head_kv != 0 ||
      plan.batch <= 0) {
    return absl::InvalidArgumentError("decode attention: plan not from PlanDecodeAttention");
  }
  const int group = plan.n_head / plan.n_head_kv;
  const SplitChoice split = PickSplit(plan.head_dim, group);
  if (!split.fn) {
    return absl::UnimplementedError(absl::StrCat("decode attention: head_dim ", plan.head_dim,
                                                 " group ", group));
  }
  float* ws_acc = workspace;
  float* ws_ml =
      workspace + static_cast<uint64_t>(plan.batch) * plan.n_head * plan.max_splits * plan.head_dim;
  const float scale_log2 = static_cast<float>(1.4426950408889634 / std::sqrt(double(plan.head_dim)));
  const auto* kc = reinterpret_cast<const __half*>(k_cache);
  const auto* vc = reinterpret_cast<const __half*>(v_cache);
  if (split.smem > 0) {
    // Above 48 KB of dynamic shared memory needs the opt-in. PlanDecodeAttention
    // already set it (before any graph capture); set it here only if this
    // process never did, so captured calls normally make no extra API call.
    static std::atomic<bool> opted_in[2][9];
    std::atomic<bool>& done = opted_in[plan.head_dim == 128 ? 1 : 0][group];
    if (!done.load(std::memory_order_relaxed)) {
      DPL_CUDA_CHECK(
          cudaFuncSetAttribute(split.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, split.smem));
      done.store(true, std::memory_order_relaxed);
    }
  }
  DPL_RETURN_IF_ERROR(LaunchKernel(split.fn, dim3(plan.max_splits, plan.n_head_kv, plan.batch),
                                   dim3(kThreads), split.smem, stream, plan.step_pdl, q, kc, vc,
                                   d_pos, d_seq, plan.n_ctx, plan.window, plan.max_splits,
                                   scale_log2, plan.early_kv, ws_acc, ws_ml));
  // The combine kernel goes out as a programmatic dependent launch (Hopper
  // PDL): its launch overlaps the split kernel's tail, and griddepcontrol.wait
  // inside it orders the reads of the partials after the split grid.
  const dim3 grid(plan.n_head, plan.batch), block(plan.head_dim * kCombineParts);
  return plan.head_dim == 64
             ? LaunchKernel(AttnCombineKernel<64>, grid, block, 0, stream, plan.pdl, ws_acc, ws_ml,
                            d_pos, plan.n_ctx, plan.window, plan.max_splits, out, qout)
             : LaunchKernel(AttnCombineKernel<128>, grid, block, 0, stream, plan.pdl, ws_acc,
                            ws_ml, d_pos, plan.n_ctx, plan.window, plan.max_splits, out, qout);
}

}  // namespace dpl::kernels
