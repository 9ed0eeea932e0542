#include <cuda_fp16.h>

#include <atomic>
#include <cmath>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kernels/attention/attention.h"
#include "kernels/attention/attention_split.h"
#include "kernels/attention/mma_f16.cuh"
#include "kernels/act_quant.cuh"
#include "kernels/cuda_check.h"
#include "kernels/kv_pages.h"
#include "kernels/ops/kv_cache.h"
#include "kernels/launch.cuh"

namespace dpl::kernels {
namespace {

constexpr int kThreads = 128;  // 4 warps per (kv head, split) block
constexpr int kWarps = kThreads / 32;

// ---------------------------------------------------------------------------
// Split kernel, block (s, kvh, b): for batch row b (its query, position and
// sequence: a region, or kPaged a block table), the G query heads
// h = kvh * G + g and the positions t in split s's chunk [t_begin, t_end):
//   x_t = (q_h . k_t) * log2(e) / sqrt(HD)          (scores in the log2 domain)
//   m = max_t x_t,  l = sum_t 2^(x_t - m),  acc = sum_t 2^(x_t - m) v_t
// written to the workspace unnormalized; the combine kernel merges splits.
//
// On tensor cores (mma.sync m16n8k16, layouts in mma_f16.cuh): the G heads
// are the rows of the A operand (rows G..15 are zero; G <= 8, so only rows
// 0..7 -- each lane's row g = lane / 4 -- are ever live, and the accumulator
// halves of rows 8..15 are dropped), keys are the n dimension of S = Q K^T
// and the k dimension of O = P V. K and V arrive in tiles of kTileT = 64
// rows; warp w takes keys 16w .. 16w + 15 of every tile (one k-step of P V)
// and keeps its own online softmax state (m, l, O) for the G heads, so a
// tile needs no block-wide softmax step; the four warps' states are merged
// once at the end, through shared memory. Why tensor cores: the CUDA-core
// form of this kernel (7 heads x 8 dims of FMAs and a 4-level butterfly per
// head per row, three barriers per tile) was latency-bound on that work:
// attention_bench, 7B depth 3254, 10.0 -> 8.5 us a call; depth 32768 40.8
// -> 25.5 us (docs/PERF.md).
//
// Precision: q (scaled to the log2 domain) and P enter the MMAs as hi + lo
// f16 pairs (SplitHalf2), two MMAs each, so the products are as precise as
// f32 ones with the f16 cache values (exact in f16 already); one f16
// rounding of q and P would add ~2^-11 relative error to every score and
// weight. The sums run in an order of the MMAs' own, not the CPU's: results
// match the float64 reference to ~1e-7 (attention_gpu_test), not bitwise.
//
// K and V reach the block through shared memory: the block first issues
// cp.async copies of its first kStages tiles of K and V (a head's rows are
// contiguous, so with regions a tile is one contiguous span; pages: below),
// and only then loads q. Why: at mid lengths (depth ~3k) a split holds
// ~50-100 rows, i.e. 1-2 tiles, so its whole chunk is in flight after one
// issue burst and the block pays one
// HBM latency instead of one per step of a register pipeline. At long lengths
// the stage being refilled streams while the other one is worked on (double
// buffering), 2 * kStages * kTileT * HD * 2 bytes = 64 KB (HD 128) in flight
// per block. Rows past the chunk are zero-filled, never read: a stale or NaN
// V row times a zero probability would not stay 0. cp.async groups are
// committed in the fixed order K_j, V_j (pages: K_j and V_j together, then
// an empty group; empty groups for tiles past the chunk), so "at most
// 2 * kStages - 2 pending" means K_j and V_j landed.
//
// Where a tile's rows come from (kPaged, kernels/kv_pages.h):
//   regions: row t of kv head kvh of sequence seq at
//            ((seq * n_head_kv + kvh) * n_ctx + t) * HD: a tile is one
//            contiguous span (IssuePaddedRows from the head's base);
//   pages:   at KvRowOffset(pages, seq, ..., kvh, t, HD), through the
//            sequence's block table: a tile of 64 keys from any position
//            may cross up to 5 blocks of 16, so each thread looks up the
//            block of every row it copies (IssuePaddedRowsAt: per row one
//            4-byte table load, L1/L2-resident, a shift, a mask and a
//            multiply-add; 8 rows a thread per tile at HD 128, 4 at HD 64),
//            and that one lookup addresses the row's K and V copies alike
//            (one layout), issued together. Rows inside a block stay
//            contiguous, so the copies are as coalesced as with regions (a
//            warp's 16-byte chunks cover 2 or 4 whole rows).
constexpr int kTileT = 64;
constexpr int kStages = 2;
constexpr int kKeysPerWarp = kTileT / kWarps;  // 16: one k-step of P V
static_assert(kKeysPerWarp == 16, "a warp's keys of a tile are one mma k-step");

template <int HD>
__host__ __device__ constexpr int TileHalves() {
  return kTileT * attn_mma::PaddedRowHalves(HD);
}
template <int HD>
__host__ __device__ constexpr int StreamSmemBytes() {
  // (kStages, {K, V}) padded tiles: HD 128 -> 69632 bytes, HD 64 -> 36864;
  // reused for the warps' (kWarps, 8, HD) float states at the end.
  return kStages * 2 * TileHalves<HD>() * 2;
}

// (One long kernel on purpose: the cp.async stages, the fragments and the
// softmax state share one register and shared-memory budget; device
// functions would inline back into exactly this.)
template <int HD, int G, bool kPaged>
__global__ void __launch_bounds__(kThreads, 2) AttnStreamKernel(
    const float* __restrict__ q,         // (batch, n_head, HD)
    const __half* __restrict__ k_cache,  // regions: (n_seq, n_head_kv, n_ctx, HD);
                                         // pages: (n_blocks, n_head_kv, 1 << block_shift, HD)
    const __half* __restrict__ v_cache,  // as k_cache
    const int* __restrict__ d_pos,       // (batch)
    const int* __restrict__ d_seq,       // (batch) or null: sequence 0
    int n_ctx, int window, int max_splits, int min_chunk, float scale_log2, bool early_kv,
    float* __restrict__ ws_acc,  // (batch, n_head, max_splits, HD)
    float* __restrict__ ws_ml,   // (batch, n_head, max_splits, 2): (m, l)
    KvPages pages) {             // kPaged: the block tables; unused for regions
  using namespace attn_mma;
  constexpr int kLd = PaddedRowHalves(HD);
  constexpr int kTile = TileHalves<HD>();
  constexpr int kDimSteps = HD / 16;  // k-steps of Q K^T
  constexpr int kDimTiles = HD / 8;   // n8 tiles of O
  static_assert(G >= 1 && G <= 8, "GQA group of 1..8 query heads (the live A rows)");
  static_assert(HD % 32 == 0, "K fragments are loaded 32 dims per ldmatrix.x4");
  static_assert(kWarps * 8 * HD * 4 <= StreamSmemBytes<HD>(), "warp states fit the staging");
  extern __shared__ __align__(16) unsigned char s_dyn[];
  // Stage st: K tile at s_kv + (2*st) * kTile, V tile right after it.
  __half* s_kv = reinterpret_cast<__half*>(s_dyn);
  __shared__ float s_m[kWarps][8], s_l[kWarps][8];  // each warp's (m, l) per head

  // Launched as a programmatic dependent of RoPE when the decode step uses
  // PDL (a no-op otherwise). RoPE writes q and the cache row of position p
  // only; d_pos, the block tables (uploaded before the step, like d_pos) and
  // the rows before p were written by earlier steps, so the position is
  // read, and (early_kv) every split whose chunk ends before p issues its
  // first tiles, before the wait: their K/V loads overlap RoPE. The split
  // holding p waits first.
  const int b = blockIdx.z;
  const AttnKeys keys = AttnKeyRange(d_pos[b], n_ctx, window);
  const int n_act = AttnActiveSplits(keys.len, max_splits, min_chunk);
  const int s = blockIdx.x, kvh = blockIdx.y;
  if (s >= n_act) return;
  const int n_head = gridDim.y * G;
  const int seq = d_seq != nullptr ? max(d_seq[b], 0) : 0;
  q += (size_t)b * n_head * HD;
  if constexpr (!kPaged) {  // pages: rows are found from the array's start
    k_cache += (size_t)seq * gridDim.y * n_ctx * HD;
    v_cache += (size_t)seq * gridDim.y * n_ctx * HD;
  }
  ws_acc += (size_t)b * n_head * max_splits * HD;
  ws_ml += (size_t)b * n_head * max_splits * 2;
  const int chunk = AttnChunk(keys.len, n_act);
  const int t_begin = keys.lo + s * chunk;
  const int t_end = min(keys.lo + keys.len, t_begin + chunk);
  const int n_tiles = t_end > t_begin ? (t_end - t_begin + kTileT - 1) / kTileT : 0;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int gid = lane >> 2, tig = lane & 3;  // fragment row (head) and column pair
  const __half* kh = k_cache + (size_t)kvh * n_ctx * HD;  // regions: the head's rows
  const __half* vh = v_cache + (size_t)kvh * n_ctx * HD;

  // Keys [t, t + n) of the head's K and V into stage st's K and V tiles
  // (the rest of each tile zero), committed as two groups (regions: K, V;
  // pages: K and V together, then an empty one, since each row's lookup
  // serves both copies; the waits below count groups, two per tile, and
  // need K and V alike); with live false both groups are empty.
  auto issue_kv = [&](int st, int t, int n, bool live) {
    if constexpr (kPaged) {
      if (live) {
        IssuePaddedRowsAt<HD, kTileT, kThreads, /*kPair=*/true>(
            s_kv + (2 * st) * kTile, k_cache, s_kv + (2 * st + 1) * kTile, v_cache, n, tid,
            [&](int r) { return KvRowOffset(pages, seq, gridDim.y, n_ctx, kvh, t + r, HD); });
      }
      CpAsyncCommit();
      CpAsyncCommit();
    } else {
      if (live) IssuePaddedRows<HD, kTileT, kThreads>(s_kv + (2 * st) * kTile, kh, t, n, tid);
      CpAsyncCommit();
      if (live) IssuePaddedRows<HD, kTileT, kThreads>(s_kv + (2 * st + 1) * kTile, vh, t, n, tid);
      CpAsyncCommit();
    }
  };
  // Prologue: the first kStages tiles' copies go out before anything else.
  const bool holds_current = !early_kv || t_end == keys.lo + keys.len;
  if (holds_current) GridDependencyWait();
#pragma unroll
  for (int j = 0; j < kStages; ++j) {
    const int t = t_begin + j * kTileT;
    const int n = min(kTileT, t_end - t);
    issue_kv(j, t, n, j < n_tiles);
  }
  if (!holds_current) GridDependencyWait();
  // The combine kernel (launched as a programmatic dependent) may start its
  // launch now; it waits for this grid's completion before reading partials.
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");

  // q of head g (this lane's A row), scaled to the log2 domain, as hi + lo
  // A fragments: [ks][0] = a0 (dims 16 ks + 2t, +1), [ks][1] = a2 (+8).
  uint32_t qh[kDimSteps][2], ql[kDimSteps][2];
  {
    const bool live = gid < G;
    const float* qp = q + (size_t)(kvh * G + (live ? gid : 0)) * HD + 2 * tig;
    const float sc = live ? scale_log2 : 0.0f;
#pragma unroll
    for (int ks = 0; ks < kDimSteps; ++ks) {
      const float2 a0 = *reinterpret_cast<const float2*>(qp + ks * 16);
      const float2 a2 = *reinterpret_cast<const float2*>(qp + ks * 16 + 8);
      SplitHalf2(a0.x * sc, a0.y * sc, &qh[ks][0], &ql[ks][0]);
      SplitHalf2(a2.x * sc, a2.y * sc, &qh[ks][1], &ql[ks][1]);
    }
  }
  // This warp's state for head g: O (dims 8 dt + 2t, +1), the running max m
  // (shared by the 4 lanes of the row) and this lane's partial sum l.
  float o[kDimTiles][2];
#pragma unroll
  for (int dt = 0; dt < kDimTiles; ++dt) o[dt][0] = o[dt][1] = 0.0f;
  float m_run = -INFINITY, l_run = 0.0f;
  // ldmatrix row addresses (mma_f16.cuh): K plain, matrix i = lane / 8 is
  // keys +(lane & 7), dims 32 kp + 8i; V transposed, matrix i is keys
  // +(lane & 7) + 8 (i & 1), dims 16 dp + 8 (i >> 1).
  const int k_row = lane & 7, k_col = (lane >> 3) * 8;
  const int v_row = (lane & 7) + ((lane >> 3) & 1) * 8, v_col = (lane >> 4) * 8;
  const int key0 = warp * kKeysPerWarp;  // this warp's keys within a tile

  for (int j = 0; j < n_tiles; ++j) {
    const int st = j % kStages;
    const int n_t = min(kTileT, t_end - (t_begin + j * kTileT));
    CpAsyncWait<2 * kStages - 2>();  // K_j and V_j landed (this thread's copies)
    __syncthreads();                 // ... and everyone's
    if (key0 < n_t) {  // warp-uniform; the warp's first key is valid
      const __half* sk = s_kv + (2 * st) * kTile;
      const __half* sv = sk + kTile;
      // S for keys key0 + 8 nt + (2t, 2t+1): c0, c1 of sc[nt] (c2, c3: dead rows).
      float sc[2][4];
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.0f;
#pragma unroll
      for (int kp = 0; kp < HD / 32; ++kp) {
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
          uint32_t bk[4];
          LdMatrixX4(bk, SmemAddr(sk + (key0 + nt * 8 + k_row) * kLd + kp * 32 + k_col));
          const uint32_t h0[4] = {qh[2 * kp][0], 0u, qh[2 * kp][1], 0u};
          const uint32_t l0[4] = {ql[2 * kp][0], 0u, ql[2 * kp][1], 0u};
          const uint32_t h1[4] = {qh[2 * kp + 1][0], 0u, qh[2 * kp + 1][1], 0u};
          const uint32_t l1[4] = {ql[2 * kp + 1][0], 0u, ql[2 * kp + 1][1], 0u};
          Mma16816(sc[nt], h0, bk[0], bk[1]);
          Mma16816(sc[nt], l0, bk[0], bk[1]);
          Mma16816(sc[nt], h1, bk[2], bk[3]);
          Mma16816(sc[nt], l1, bk[2], bk[3]);
        }
      }
      // Keys past the chunk (zero rows): a select to -inf, never a multiply.
      float mx = m_run;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        const int key = key0 + nt * 8 + 2 * tig;
        sc[nt][0] = key < n_t ? sc[nt][0] : -INFINITY;
        sc[nt][1] = key + 1 < n_t ? sc[nt][1] : -INFINITY;
        mx = fmaxf(mx, fmaxf(sc[nt][0], sc[nt][1]));
      }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      // mx is finite (key0 < n_t), so 2^(-inf - mx) = 0 for masked keys and
      // for the first tile's old state.
      const float alpha = exp2f(m_run - mx);
      m_run = mx;
      l_run *= alpha;
#pragma unroll
      for (int dt = 0; dt < kDimTiles; ++dt) {
        o[dt][0] *= alpha;
        o[dt][1] *= alpha;
      }
      float p[2][2];
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        p[nt][0] = exp2f(sc[nt][0] - mx);
        p[nt][1] = exp2f(sc[nt][1] - mx);
        l_run += p[nt][0] + p[nt][1];
      }
      // P as hi + lo A fragments: a0 = keys 2t, 2t+1 (tile 0), a2 = +8 (tile 1).
      uint32_t ph[4] = {0u, 0u, 0u, 0u}, pl[4] = {0u, 0u, 0u, 0u};
      SplitHalf2(p[0][0], p[0][1], &ph[0], &pl[0]);
      SplitHalf2(p[1][0], p[1][1], &ph[2], &pl[2]);
#pragma unroll
      for (int dp = 0; dp < HD / 16; ++dp) {
        uint32_t bv[4];
        LdMatrixX4Trans(bv, SmemAddr(sv + (key0 + v_row) * kLd + dp * 16 + v_col));
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          float c[4] = {o[2 * dp + half][0], o[2 * dp + half][1], 0.0f, 0.0f};
          Mma16816(c, ph, bv[2 * half], bv[2 * half + 1]);
          Mma16816(c, pl, bv[2 * half], bv[2 * half + 1]);
          o[2 * dp + half][0] = c[0];
          o[2 * dp + half][1] = c[1];
        }
      }
    }
    __syncthreads();  // stage st is free again
    // Refill stage st with tile j + kStages (or commit empty groups, keeping
    // the K_j, V_j group order the wait above counts on).
    const int jn = j + kStages;
    const int tn = t_begin + jn * kTileT;
    const int nn = min(kTileT, t_end - tn);
    issue_kv(st, tn, nn, jn < n_tiles);
  }
  CpAsyncWait<0>();  // only empty groups can be pending; drain before reuse
  __syncthreads();

  // Merge the warps' states: M = max_w m_w, f_w = 2^(m_w - M) (0 for a warp
  // that saw no key), acc = sum_w f_w O_w, l = sum_w f_w l_w; the split's
  // partials are (M, l, acc). A split with no keys writes (-inf, 0, 0).
  l_run += __shfl_xor_sync(0xffffffffu, l_run, 1);
  l_run += __shfl_xor_sync(0xffffffffu, l_run, 2);
  float* s_o = reinterpret_cast<float*>(s_dyn);  // (kWarps, 8, HD)
  if (tig == 0) {
    s_m[warp][gid] = m_run;
    s_l[warp][gid] = l_run;
  }
#pragma unroll
  for (int dt = 0; dt < kDimTiles; ++dt) {
    *reinterpret_cast<float2*>(s_o + ((size_t)warp * 8 + gid) * HD + dt * 8 + 2 * tig) =
        make_float2(o[dt][0], o[dt][1]);
  }
  __syncthreads();
  __shared__ float s_f[kWarps][8];  // f_w per head
  if (tid < kWarps * 8) {
    const int w = tid / 8, g = tid % 8;
    float mm = s_m[0][g];
#pragma unroll
    for (int k = 1; k < kWarps; ++k) mm = fmaxf(mm, s_m[k][g]);
    s_f[w][g] = s_m[w][g] == -INFINITY ? 0.0f : exp2f(s_m[w][g] - mm);
    if (w == 0 && g < G) {
      float l = 0.0f;
#pragma unroll
      for (int k = 0; k < kWarps; ++k) {
        l += (s_m[k][g] == -INFINITY ? 0.0f : exp2f(s_m[k][g] - mm)) * s_l[k][g];
      }
      float* ml = ws_ml + ((size_t)(kvh * G + g) * max_splits + s) * 2;
      ml[0] = mm;
      ml[1] = l;
    }
  }
  __syncthreads();
  for (int i = tid; i < G * HD; i += kThreads) {
    const int g = i / HD, d = i % HD;
    float a = 0.0f;
#pragma unroll
    for (int k = 0; k < kWarps; ++k) a = fmaf(s_f[k][g], s_o[((size_t)k * 8 + g) * HD + d], a);
    ws_acc[((size_t)(kvh * G + g) * max_splits + s) * HD + d] = a;
  }
}

// Combine, block (h, b) (query head, batch row), kParts * HD threads:
//   M = max_s m_s,  out[h][d] = sum_s 2^(m_s - M) acc_s[d] / sum_s 2^(m_s - M) l_s
// Thread (part, d) sums the splits s = part (mod kParts), then the parts are
// added in order. Its first kPre partials are loaded before the split
// weights are known (they do not depend on them), so their L2 latency
// overlaps the weights' (m, l) loads; later ones go 4 loads in flight. (A
// serial chain costs one L2 latency per step: d_pos, then (m, l), then the
// partials.) kParts = 8 halves each thread's share of a deep context's splits
// (DecodeTuning::attn_combine_parts).
constexpr int kPre = 4;
template <int HD, int kParts>
__global__ void __launch_bounds__(HD * kParts) AttnCombineKernel(
    const float* __restrict__ ws_acc,  // (batch, n_head, max_splits, HD)
    const float* __restrict__ ws_ml,   // (batch, n_head, max_splits, 2)
    const int* __restrict__ d_pos,     // (batch)
    int n_ctx, int window, int max_splits, int min_chunk,
    float* __restrict__ out,  // (batch, n_head, HD)
    QuantOut quant) {         // (batch, n_head * HD) as int8 blocks, or q == null
  static_assert(HD * kParts <= 1024, "one block per head");
  __shared__ float s_w[1024];   // max_splits <= 1024 (checked by the planner)
  __shared__ float s_red[kParts][HD];
  __shared__ float s_scalar[2];
  // Launched as a programmatic dependent of the split kernel: block here
  // until that grid has completed and its partials are visible (a no-op
  // when launched normally).
  GridDependencyWait();
  GridLaunchDependents();
  const int h = blockIdx.x, b = blockIdx.y, tid = threadIdx.x;
  const int n_act =
      AttnActiveSplits(AttnKeyRange(d_pos[b], n_ctx, window).len, max_splits, min_chunk);
  // Row b's head h: the n_head = gridDim.x heads of a row are consecutive.
  const size_t bh = (size_t)b * gridDim.x + h;
  const int d = tid % HD, part = tid / HD;
  const float* a = ws_acc + bh * max_splits * HD + d;
  float pre[kPre];
#pragma unroll
  for (int i = 0; i < kPre; ++i) {
    const int s = part + i * kParts;
    pre[i] = s < n_act ? a[(size_t)s * HD] : 0.0f;
  }
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
  float acc = 0.0f;
#pragma unroll
  for (int i = 0; i < kPre; ++i) {
    const int s = part + i * kParts;
    if (s < n_act) acc = fmaf(s_w[s], pre[i], acc);
  }
  int s = part + kPre * kParts;
  for (; s + 3 * kParts < n_act; s += 4 * kParts) {
    const float a0 = a[(size_t)s * HD], a1 = a[(size_t)(s + kParts) * HD];
    const float a2 = a[(size_t)(s + 2 * kParts) * HD];
    const float a3 = a[(size_t)(s + 3 * kParts) * HD];
    acc = fmaf(s_w[s], a0, acc);
    acc = fmaf(s_w[s + kParts], a1, acc);
    acc = fmaf(s_w[s + 2 * kParts], a2, acc);
    acc = fmaf(s_w[s + 3 * kParts], a3, acc);
  }
  for (; s < n_act; s += kParts) acc = fmaf(s_w[s], a[(size_t)s * HD], acc);
  s_red[part][d] = acc;
  __syncthreads();
  if (part == 0) {
    float t = 0.0f;
#pragma unroll
    for (int p = 0; p < kParts; ++p) t += s_red[p][d];
    const float o = t / s_scalar[0];
    out[bh * HD + d] = o;
    // Each warp of part 0 holds 32 consecutive outputs: one activation
    // block of the Wo matvec that reads them (one launch fewer per layer).
    if (quant.q != nullptr) QuantizeBlock32(o, (bh * HD + d) / 32, quant);
  }
}

using SplitFn = void (*)(const float*, const __half*, const __half*, const int*, const int*, int,
                         int, int, int, float, bool, float*, float*, KvPages);

template <int HD, bool kPaged>
SplitFn PickSplitT(int group) {
#define DPL_ATTN_CASE(G) \
  case G: return AttnStreamKernel<HD, G, kPaged>;
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

SplitChoice PickSplit(int head_dim, int group, bool paged) {
  SplitChoice c;
  if (head_dim == 64) {
    c.fn = paged ? PickSplitT<64, true>(group) : PickSplitT<64, false>(group);
    c.smem = StreamSmemBytes<64>();
  } else if (head_dim == 128) {
    c.fn = paged ? PickSplitT<128, true>(group) : PickSplitT<128, false>(group);
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
  if (tuning.attn_combine_parts != 4 && tuning.attn_combine_parts != 8) {
    return absl::InvalidArgumentError(absl::StrCat(
        "decode attention: attn_combine_parts ", tuning.attn_combine_parts, " (4 or 8)"));
  }
  if (tuning.attn_min_chunk < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("decode attention: attn_min_chunk ", tuning.attn_min_chunk, " < 1"));
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
  // The occupancy of the regions kernel; the paged one has the same shared
  // memory and the same __launch_bounds__ (2 blocks per SM), and gets its
  // opt-in here too, before any graph capture.
  const SplitChoice split = PickSplit(head_dim, group, /*paged=*/false);
  const SplitChoice split_paged = PickSplit(head_dim, group, /*paged=*/true);
  int per_sm = 0;
  cudaError_t occ = cudaSuccess;
  if (split.smem > 0) {
    occ = cudaFuncSetAttribute(split.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, split.smem);
    if (occ == cudaSuccess) {
      occ = cudaFuncSetAttribute(split_paged.fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 split_paged.smem);
    }
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
  plan.min_chunk = tuning.attn_min_chunk;
  plan.combine_parts = tuning.attn_combine_parts;
  const int by_ctx = (keys + plan.min_chunk - 1) / plan.min_chunk;
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
                             const QuantOut* quant, const int* d_seq, const KvPages& pages) {
  if (!q || !k_cache || !v_cache || !d_pos || !workspace || !out) {
    return absl::InvalidArgumentError("decode attention: null pointer");
  }
  // Every position a row may read (< plan.n_ctx) must have a table entry.
  DPL_RETURN_IF_ERROR(CheckKvPages(pages, plan.n_ctx, "decode attention"));
  if (quant != nullptr && (!quant->q || !quant->d || !quant->s)) {
    return absl::InvalidArgumentError("decode attention: a quantized output with null buffers");
  }
  const QuantOut qout = quant != nullptr ? *quant : QuantOut{};
  if (plan.max_splits <= 0 || plan.min_chunk < 1 ||
      (plan.combine_parts != 4 && plan.combine_parts != 8) || plan.n_head_kv <= 0 || plan.n_head % plan.n_head_kv != 0 ||
      plan.batch <= 0) {
    return absl::InvalidArgumentError("decode attention: plan not from PlanDecodeAttention");
  }
  const int group = plan.n_head / plan.n_head_kv;
  const bool paged = pages.paged();
  const SplitChoice split = PickSplit(plan.head_dim, group, paged);
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
    static std::atomic<bool> opted_in[2][2][9];
    std::atomic<bool>& done = opted_in[plan.head_dim == 128 ? 1 : 0][paged ? 1 : 0][group];
    if (!done.load(std::memory_order_relaxed)) {
      DPL_CUDA_CHECK(
          cudaFuncSetAttribute(split.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, split.smem));
      done.store(true, std::memory_order_relaxed);
    }
  }
  DPL_RETURN_IF_ERROR(LaunchKernel(split.fn, dim3(plan.max_splits, plan.n_head_kv, plan.batch),
                                   dim3(kThreads), split.smem, stream, plan.step_pdl, q, kc, vc,
                                   d_pos, d_seq, plan.n_ctx, plan.window, plan.max_splits,
                                   plan.min_chunk, scale_log2, plan.early_kv, ws_acc, ws_ml,
                                   pages));
  // The combine kernel goes out as a programmatic dependent launch (Hopper
  // PDL): its launch overlaps the split kernel's tail, and griddepcontrol.wait
  // inside it orders the reads of the partials after the split grid.
  const dim3 grid(plan.n_head, plan.batch), block(plan.head_dim * plan.combine_parts);
  auto launch = [&](auto kernel) {
    return LaunchKernel(kernel, grid, block, 0, stream, plan.pdl, ws_acc, ws_ml, d_pos, plan.n_ctx,
                        plan.window, plan.max_splits, plan.min_chunk, out, qout);
  };
  if (plan.head_dim == 64) {
    return plan.combine_parts == 8 ? launch(AttnCombineKernel<64, 8>) : launch(AttnCombineKernel<64, 4>);
  }
  return plan.combine_parts == 8 ? launch(AttnCombineKernel<128, 8>) : launch(AttnCombineKernel<128, 4>);
}

}  // namespace dpl::kernels
