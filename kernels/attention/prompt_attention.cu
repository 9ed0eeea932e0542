#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kernels/attention/mma_f16.cuh"
#include "kernels/attention/prompt_attention.h"
#include "kernels/cuda_check.h"
#include "kernels/kv_pages.h"
#include "kernels/ops/kv_cache.h"
#include "kernels/launch.cuh"

namespace dpl::kernels {
namespace {

using namespace attn_mma;  // the PTX wrappers (mma_f16.cuh)

// ---------------------------------------------------------------------------
// Tile geometry. A CTA is 4 warps; each warp owns one m16 row block of the
// MMA, so the CTA covers kBlockM = 64 query rows of one query head. Keys come
// in tiles of kBlockN = 64 rows of K and V, kStages = 2 deep (the next tile's
// cp.async copies are in flight while this one is computed).
constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kBlockM = 16 * kWarps;
constexpr int kBlockN = 64;
constexpr int kStages = 2;

template <int HD>
struct TileGeometry {
  static constexpr int kLd = PaddedRowHalves(HD);  // why padded: mma_f16.cuh
  static constexpr int kTileHalves = kBlockN * kLd;
  // (kStages, {K, V}) tiles: HD 128 -> 69632 bytes, HD 64 -> 36864 bytes.
  static constexpr int kSmemBytes = kStages * 2 * kTileHalves * 2;
};

// ---------------------------------------------------------------------------
// Block (h, y): query head h, query rows t in [m0, m0 + 64) with m0 = 64 *
// (gridDim.y - 1 - y), kv head kvh = h / group. With a tile list (one launch
// for a packed pass's chunks, prompt_tiles.h) block y takes tiles[y]
// instead: its chunk's sequence, p0, n_tokens and m0, q and out offset to
// the chunk's first row, regions at the tile's sequence's region; every
// other step is the one-chunk kernel's, so a chunk's bits do not depend on
// which launch ran it. For each row t (position
// p0 + t, keys j <= lim_t = p0 + t):
//   s_j = q_t . k_j                         (f16 x f16 on tensor cores, f32 sum)
//   x_j = s_j * log2(e) / sqrt(HD)          (log2 domain: exp2f)
//   m = max_j x_j,  l = sum_j 2^(x_j - m),  o = sum_j 2^(x_j - m) v_j
//   out[t][h] = o / l
// kept online over 64-key tiles (FlashAttention-2): per tile, m grows to m',
// o and l are rescaled by 2^(m - m'), and the tile's P = 2^(x - m') (f16) is
// multiplied into o with V on tensor cores.
//
// Warp w owns rows m0 + 16w .. + 15; lane (g, t) holds rows r = 16w + g and
// r + 8 (the C layout), so each row's max and sum are reduced over the 4
// lanes of a group (shfl_xor 1, 2). The running sum l is kept per lane
// (partial over that lane's columns) and reduced once at the end: all lanes
// of a row share m, so their partials rescale alike.
//
// Rows t >= n_tokens (last CTA) are computed on the last token's data (q
// index and causal limit clamped) and never written.
//
// Fragments:
// - Q: A fragments straight from global f32 (float2 loads at the A layout's
//   (row, 2t) positions), rounded to f16 and kept in registers for the whole
//   kernel (HD/16 x 4 registers). Why not through shared memory: each element
//   is read once, and the 4 lanes of a group read 32 contiguous bytes, whole
//   sectors; smem staging would only add 17 KB per CTA.
// - K: S = Q K^T needs B(k = dim, n = key) = K[key][dim]: b0 = K[key g][dims
//   2t, 2t+1], i.e. consecutive halves of a K row. A non-transposed ldmatrix
//   of 8 K rows x 8 dims gives exactly that, so one x4 (matrices at dims +0,
//   +8, +16, +24 of keys nt*8..+7) yields b0, b1 for two k-steps.
// - P: the S accumulator of key tile nt holds (row g, keys 8nt + 2t, +1) in
//   c0, c1 and row g + 8 in c2, c3 -- the A layout of k-step nt/2 (a0, a1 for
//   even nt, a2, a3 for odd nt), so P is packed to f16 in place, no shuffle.
// - V: O = P V needs B(k = key, n = dim) = V[key][dim]: b0 = V[keys 2t, 2t+1]
//   [dim g], two rows of one column: a transposing ldmatrix of 8 keys x 8 dims
//   gives exactly that. One x4 (matrices: keys +0 / +8 x dims +0 / +8) yields
//   b0, b1 for two n8 tiles of dims.
//
// Causal mask: a select to -inf (never a multiply), only in tiles that cross
// the diagonal of some row of the CTA. Key tiles wholly past a warp's last
// row limit are skipped by that warp (uniform branch; barriers stay outside).
// With a sliding window W (kWindow), row position P sees keys P - W + 1 .. P:
// the CTA starts at the key tile of its first row's lower limit, warps skip
// tiles wholly below theirs, and both limits are applied in every tile.
//
// Registers (nvcc 13.0, sm_90a): 243 for HD 128, 134 for HD 64, no spills;
// with 69.6 KB of shared memory HD 128 runs 2 CTAs (8 warps) per SM. (Seen
// again with the paged forms added: regions 243 / 244 (window) for HD 128,
// 128 with an 8-byte spill for HD 64; paged 249 / 242 and 135, no spills.
// With the tile list read at the start: regions 247 / 248, paged 252 / 248
// for HD 128, no spills; HD 64 128 (the 8-byte spill) / 128, paged 128 /
// 143.)
// Capping at 3 CTAs per SM (168 registers) spills. Measured on an H200: a
// 512-token chunk at p0 3254 takes 126 us for Qwen2.5-7B (28/4 heads, 204
// TFLOP/s) and 197 us for 14B (40/8, 187 TFLOP/s); attention_bench prints it.
//
// Where key j's K and V rows come from (kPaged, kernels/kv_pages.h):
//   regions: the caller's (n_head_kv, n_ctx, HD) arrays, row (kvh, j) at
//            (kvh * n_ctx + j) * HD: a tile is one contiguous span
//            (IssuePaddedRows from the head's base);
//   pages:   the layer's whole arrays, row (kvh, j) of sequence seq at
//            KvRowOffset(pages, seq, n_head_kv, n_ctx, kvh, j, HD). Key
//            tiles start at multiples of 64, so a tile is one block's run of
//            rows for blocks >= 64 and 64 / block whole blocks for smaller
//            ones (4 of 16); each thread looks up the block of every row it
//            copies (IssuePaddedRowsAt: one 4-byte table load, L1-resident
//            after the first, a shift, a mask and a multiply-add per row; 8
//            rows a thread at HD 128, 4 at HD 64), for K and again for V (the
//            K, V group order and the separate waits stay as with regions),
//            once per 64-key tile against ~0.5 MFLOP of MMAs a warp (HD 128).
//
// (One kernel body on purpose: the pipeline, the fragments and the softmax
// state share one register budget.)
template <int HD, bool kWindow, bool kPaged>
__global__ void __launch_bounds__(kThreads) PromptAttnKernel(
    const float* __restrict__ q,          // (n_tokens, n_head, HD)
    const __half* __restrict__ k_cache,   // regions: (n_head_kv, n_ctx, HD);
                                          // pages: (n_blocks, n_head_kv, 1 << block_shift, HD)
    const __half* __restrict__ v_cache,   // as k_cache
    int n_head, int group, int n_ctx, int p0, int n_tokens, int window, float scale_log2,
    float* __restrict__ out,              // (n_tokens, n_head, HD)
    KvPages pages, int seq,               // kPaged: the block tables and the sequence's row
    const PromptTile* __restrict__ tiles) {  // (gridDim.y) a packed pass's tiles, or null: one chunk
  using Geo = TileGeometry<HD>;
  constexpr int kLd = Geo::kLd;
  constexpr int kDimSteps = HD / 16;      // k-steps of Q K^T (over head dims)
  constexpr int kDimTiles = HD / 8;       // n8 tiles of O
  constexpr int kKeyTiles = kBlockN / 8;  // n8 tiles of S
  constexpr int kKeySteps = kBlockN / 16; // k-steps of P V (over keys)
  static_assert(HD % 32 == 0, "K fragments are loaded 32 dims per ldmatrix.x4");
  extern __shared__ __align__(16) unsigned char s_dyn[];
  // Stage st: K tile at s_kv + st * kTileHalves, V tile at (kStages + st) * kTileHalves.
  __half* s_kv = reinterpret_cast<__half*>(s_dyn);

  const int h = blockIdx.x;
  // Why reversed: later query tiles see more keys; launching them first
  // (y = 0 is dispatched first, all heads of one tile together since x is
  // the head) leaves the short tiles to fill the tail of the grid. A tile
  // list comes ordered the same way (PlanPromptTiles).
  int m0 = (gridDim.y - 1 - blockIdx.y) * kBlockM;
  int region_seq = 0;  // regions: the caller offset to the sequence's region
  if (tiles != nullptr) {
    const PromptTile t = tiles[blockIdx.y];
    m0 = t.m0;
    p0 = t.p0;
    n_tokens = t.n_tokens;
    seq = t.seq;
    region_seq = t.seq;  // regions: the layer's arrays, the tile's sequence's region
    q += static_cast<size_t>(t.row) * n_head * HD;
    out += static_cast<size_t>(t.row) * n_head * HD;
  }
  const int kvh = h / group;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int gid = lane >> 2, tig = lane & 3;

  // Keys this CTA needs: 0 (with a window: its first row's lower limit) ..
  // p0 + (its last real token).
  const int kv_len = p0 + min(m0 + kBlockM, n_tokens);
  const int n_kt = (kv_len + kBlockN - 1) / kBlockN;
  const int j_first = kWindow ? max(0, p0 + m0 - window + 1) / kBlockN : 0;
  // Regions: the head's rows.
  const size_t head_rows = (static_cast<size_t>(region_seq) * (n_head / group) + kvh) * n_ctx * HD;
  const __half* kh = k_cache + head_rows;
  const __half* vh = v_cache + head_rows;

  // Pages: the block ids of key tile t (its 64 keys span kPageSlot blocks
  // of 16 at most, one block from 64 on) wait in shared memory, slot t % 3,
  // so a row's address costs a shared load, not a dependent global one on
  // every tile's path. Tile t's ids (slot t % 4) are copied (cp.async) with
  // tile t - 2's K group, which the loop waits for one iteration before it
  // issues tile t; the first three tiles' are loaded before the loop. Four
  // slots: the one written in iteration j last served tile j - 1, whose
  // issue (iteration j - 2, or the prologue) is behind a barrier.
  constexpr int kPageSlot = kBlockN / 16;
  __shared__ int s_blk[4][kPageSlot];
  const int n_kv_head = n_head / group;
  const int shift = pages.block_shift;
  const int* seq_table = kPaged ? pages.tables + static_cast<int64_t>(seq) * pages.max_blocks : nullptr;
  // Entries of a tile: blocks of 16..64 keys tile it (64 >> shift of them),
  // a larger block holds it whole.
  const int tile_entries = shift <= 6 ? kBlockN >> shift : 1;
  // Tile t's block ids into slot t % 4 (tid < tile_entries), those whose
  // first key is below kv_len; `now`: plain loads, else cp.async.
  auto load_ids = [&](int t, bool now) {
    if (!kPaged || t >= n_kt || tid >= tile_entries) return;
    const int first_key = t * kBlockN + (shift <= 6 ? tid << shift : 0);
    if (first_key >= kv_len) return;
    const int* src = seq_table + (first_key >> shift);
    if (now) {
      s_blk[t % 4][tid] = *src;
    } else {
      CpAsync4ZeroFill(SmemAddr(&s_blk[t % 4][tid]), src, true);
    }
  };
  // Keys [j0, j0 + kBlockN) of a head's K or V into dst, keys >= kv_len
  // zero; regions copy from the head's rows (kh or vh), pages from the
  // layer's array (k_cache or v_cache) through the tile's ids.
  auto issue = [&](__half* dst, const __half* head, const __half* array, int j0) {
    if constexpr (kPaged) {
      const int* ids = s_blk[(j0 / kBlockN) % 4];
      IssuePaddedRowsAt<HD, kBlockN, kThreads, /*kPair=*/false>(
          dst, array, nullptr, nullptr, kv_len - j0, tid, [&](int r) {
            const int key = j0 + r;
            const int blk = ids[shift <= 6 ? r >> shift : 0];
            return ((((static_cast<uint64_t>(blk) * n_kv_head + kvh) << shift) + (key & ((1 << shift) - 1))) * HD);
          });
    } else {
      IssuePaddedRows<HD, kBlockN, kThreads>(dst, head, j0, kv_len - j0, tid);
    }
  };
  if constexpr (kPaged) {
    for (int t = j_first; t < j_first + 3; ++t) load_ids(t, /*now=*/true);
    __syncthreads();
  }
  // Prologue: tile 0's copies go out before the Q loads. cp.async groups are
  // committed in the fixed order K_j, V_j (empty groups past the last tile),
  // so "at most 3 pending" means K_j landed and "at most 2" means V_j landed.
  issue(s_kv, kh, k_cache, j_first * kBlockN);
  CpAsyncCommit();
  issue(s_kv + kStages * Geo::kTileHalves, vh, v_cache, j_first * kBlockN);
  CpAsyncCommit();

  const int row_lo = m0 + warp * 16 + gid;  // token of c0/c1 (and a0/a2); row_lo + 8: c2/c3
  const int tok_lo = min(row_lo, n_tokens - 1);
  const int tok_hi = min(row_lo + 8, n_tokens - 1);
  const int lim_lo = p0 + tok_lo;  // last key each row attends
  const int lim_hi = p0 + tok_hi;
  const int warp_lim = p0 + min(m0 + warp * 16 + 15, n_tokens - 1);  // largest limit in the warp
  const int cta_min_lim = p0 + m0;                                    // smallest limit in the CTA
  // With a window: the first key each row attends, and the warp's smallest.
  const int low_lo = lim_lo - window + 1, low_hi = lim_hi - window + 1;
  const int warp_low = p0 + min(m0 + warp * 16, n_tokens - 1) - window + 1;

  uint32_t qa[kDimSteps][4];
  {
    const float* q_lo = q + (static_cast<size_t>(tok_lo) * n_head + h) * HD + 2 * tig;
    const float* q_hi = q + (static_cast<size_t>(tok_hi) * n_head + h) * HD + 2 * tig;
#pragma unroll
    for (int ks = 0; ks < kDimSteps; ++ks) {
      const float2 a0 = *reinterpret_cast<const float2*>(q_lo + ks * 16);
      const float2 a1 = *reinterpret_cast<const float2*>(q_hi + ks * 16);
      const float2 a2 = *reinterpret_cast<const float2*>(q_lo + ks * 16 + 8);
      const float2 a3 = *reinterpret_cast<const float2*>(q_hi + ks * 16 + 8);
      qa[ks][0] = PackHalf2(a0.x, a0.y);
      qa[ks][1] = PackHalf2(a1.x, a1.y);
      qa[ks][2] = PackHalf2(a2.x, a2.y);
      qa[ks][3] = PackHalf2(a3.x, a3.y);
    }
  }

  float o[kDimTiles][4];
#pragma unroll
  for (int dt = 0; dt < kDimTiles; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;
  // Running max of the raw scores s (the log2-domain max is m * scale_log2:
  // the scale is positive, so max commutes with it) and this lane's partial sums.
  float m_lo = -INFINITY, m_hi = -INFINITY;
  float l_lo = 0.0f, l_hi = 0.0f;

  // ldmatrix row addresses, per lane (see the fragment notes above):
  // K, non-transposed: matrix i = lane >> 3 is keys nt*8 + (lane & 7), dims kp*32 + 8i.
  const int k_row = lane & 7, k_col = (lane >> 3) * 8;
  // V, transposed: matrix i is keys kk*16 + (lane & 7) + 8 (i & 1), dims dp*16 + 8 (i >> 1).
  const int v_row = (lane & 7) + ((lane >> 3) & 1) * 8, v_col = (lane >> 4) * 8;

  for (int j = j_first; j < n_kt; ++j) {
    const int st = (j - j_first) & 1;
    const int j0 = j * kBlockN;
    // Refill the other stage with tile j + 1 (it was last read in iteration
    // j - 1, which ended with a barrier).
    if (j + 1 < n_kt) {
      issue(s_kv + (st ^ 1) * Geo::kTileHalves, kh, k_cache, j0 + kBlockN);
    }
    // Tile j + 3's block ids ride with K_{j+1}: waited in iteration j + 1,
    // read in iteration j + 2.
    load_ids(j + 3, /*now=*/false);
    CpAsyncCommit();
    if (j + 1 < n_kt) {
      issue(s_kv + (kStages + (st ^ 1)) * Geo::kTileHalves, vh, v_cache, j0 + kBlockN);
    }
    CpAsyncCommit();

    // Some key of this tile is visible to this warp.
    const bool active = j0 <= warp_lim && (!kWindow || j0 + kBlockN - 1 >= warp_low);
    uint32_t pa[kKeySteps][4];           // P as A fragments, k-step = 16 keys

    CpAsyncWait<3>();  // K_j landed (this thread's copies)
    __syncthreads();   // ... and everyone's
    if (active) {
      const __half* sk = s_kv + st * Geo::kTileHalves;
      float s[kKeyTiles][4];
#pragma unroll
      for (int nt = 0; nt < kKeyTiles; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
      for (int kp = 0; kp < HD / 32; ++kp) {
#pragma unroll
        for (int nt = 0; nt < kKeyTiles; ++nt) {
          uint32_t b[4];
          LdMatrixX4(b, SmemAddr(sk + (nt * 8 + k_row) * kLd + kp * 32 + k_col));
          Mma16816(s[nt], qa[2 * kp], b[0], b[1]);
          Mma16816(s[nt], qa[2 * kp + 1], b[2], b[3]);
        }
      }
      if (kWindow || j0 + kBlockN - 1 > cta_min_lim) {  // the tile crosses some row's diagonal
#pragma unroll
        for (int nt = 0; nt < kKeyTiles; ++nt) {
          const int key = j0 + nt * 8 + 2 * tig;
          s[nt][0] = key > lim_lo ? -INFINITY : s[nt][0];
          s[nt][1] = key + 1 > lim_lo ? -INFINITY : s[nt][1];
          s[nt][2] = key > lim_hi ? -INFINITY : s[nt][2];
          s[nt][3] = key + 1 > lim_hi ? -INFINITY : s[nt][3];
          if constexpr (kWindow) {
            s[nt][0] = key < low_lo ? -INFINITY : s[nt][0];
            s[nt][1] = key + 1 < low_lo ? -INFINITY : s[nt][1];
            s[nt][2] = key < low_hi ? -INFINITY : s[nt][2];
            s[nt][3] = key + 1 < low_hi ? -INFINITY : s[nt][3];
          }
        }
      }
      float mx_lo = m_lo, mx_hi = m_hi;
#pragma unroll
      for (int nt = 0; nt < kKeyTiles; ++nt) {
        mx_lo = fmaxf(mx_lo, fmaxf(s[nt][0], s[nt][1]));
        mx_hi = fmaxf(mx_hi, fmaxf(s[nt][2], s[nt][3]));
      }
      mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, 1));
      mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, 2));
      mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, 1));
      mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, 2));
      // A row with every key so far masked keeps m = -inf; subtracting 0
      // instead keeps 2^(-inf - m) = 0 rather than 2^(-inf + inf) = NaN.
      // (Without a window every row sees key 0 first; with one, a row's
      // first tiles may lie wholly below its window.)
      const float ms_lo = mx_lo == -INFINITY ? 0.0f : mx_lo * scale_log2;
      const float ms_hi = mx_hi == -INFINITY ? 0.0f : mx_hi * scale_log2;
      const float alpha_lo = exp2f(m_lo * scale_log2 - ms_lo);  // 0 on the first tile
      const float alpha_hi = exp2f(m_hi * scale_log2 - ms_hi);
      m_lo = mx_lo;
      m_hi = mx_hi;
      l_lo *= alpha_lo;
      l_hi *= alpha_hi;
#pragma unroll
      for (int dt = 0; dt < kDimTiles; ++dt) {
        o[dt][0] *= alpha_lo;
        o[dt][1] *= alpha_lo;
        o[dt][2] *= alpha_hi;
        o[dt][3] *= alpha_hi;
      }
#pragma unroll
      for (int nt = 0; nt < kKeyTiles; ++nt) {
        const float p0v = exp2f(fmaf(s[nt][0], scale_log2, -ms_lo));  // masked: 2^-inf = 0
        const float p1v = exp2f(fmaf(s[nt][1], scale_log2, -ms_lo));
        const float p2v = exp2f(fmaf(s[nt][2], scale_log2, -ms_hi));
        const float p3v = exp2f(fmaf(s[nt][3], scale_log2, -ms_hi));
        l_lo += p0v + p1v;
        l_hi += p2v + p3v;
        // C layout of key tile nt == A layout of k-step nt / 2 (see above).
        pa[nt / 2][(nt % 2) * 2 + 0] = PackHalf2(p0v, p1v);  // row g
        pa[nt / 2][(nt % 2) * 2 + 1] = PackHalf2(p2v, p3v);  // row g + 8
      }
    }

    CpAsyncWait<2>();  // V_j landed
    __syncthreads();
    if (active) {
      const __half* sv = s_kv + (kStages + st) * Geo::kTileHalves;
#pragma unroll
      for (int kk = 0; kk < kKeySteps; ++kk) {
#pragma unroll
        for (int dp = 0; dp < HD / 16; ++dp) {
          uint32_t b[4];
          LdMatrixX4Trans(b, SmemAddr(sv + (kk * 16 + v_row) * kLd + dp * 16 + v_col));
          Mma16816(o[2 * dp], pa[kk], b[0], b[1]);
          Mma16816(o[2 * dp + 1], pa[kk], b[2], b[3]);
        }
      }
    }
    __syncthreads();  // stage st is free for tile j + 2
  }
  CpAsyncWait<0>();  // only empty groups can be pending

  l_lo += __shfl_xor_sync(0xffffffffu, l_lo, 1);
  l_lo += __shfl_xor_sync(0xffffffffu, l_lo, 2);
  l_hi += __shfl_xor_sync(0xffffffffu, l_hi, 1);
  l_hi += __shfl_xor_sync(0xffffffffu, l_hi, 2);
  // l >= 1: every written row attends at least its own key, so its m is
  // finite and the key holding the max adds 2^0.
  const float inv_lo = 1.0f / l_lo, inv_hi = 1.0f / l_hi;
  if (row_lo < n_tokens) {
    float* dst = out + (static_cast<size_t>(row_lo) * n_head + h) * HD + 2 * tig;
#pragma unroll
    for (int dt = 0; dt < kDimTiles; ++dt) {
      *reinterpret_cast<float2*>(dst + dt * 8) = make_float2(o[dt][0] * inv_lo, o[dt][1] * inv_lo);
    }
  }
  if (row_lo + 8 < n_tokens) {
    float* dst = out + (static_cast<size_t>(row_lo + 8) * n_head + h) * HD + 2 * tig;
#pragma unroll
    for (int dt = 0; dt < kDimTiles; ++dt) {
      *reinterpret_cast<float2*>(dst + dt * 8) = make_float2(o[dt][2] * inv_hi, o[dt][3] * inv_hi);
    }
  }
}

// One launch: the chunk (p0, n_tokens, seq) in ceil(n_tokens / 64) query
// tiles, or, with tiles (device memory), n_tiles tiles of a packed pass.
template <int HD, bool kWindow, bool kPaged>
absl::Status LaunchPromptAttn(const PromptAttentionShape& shape, const float* q,
                              const __half* k_cache, const __half* v_cache, int p0, int n_tokens,
                              float* out, cudaStream_t stream, const KvPages& pages, int seq,
                              const PromptTile* tiles, int n_tiles) {
  constexpr int kSmem = TileGeometry<HD>::kSmemBytes;
  DPL_RETURN_IF_ERROR((OptInSharedMemory<PromptAttnKernel<HD, kWindow, kPaged>>(kSmem)));
  const int n_qtiles = tiles != nullptr ? n_tiles : (n_tokens + kBlockM - 1) / kBlockM;
  const float scale_log2 = static_cast<float>(1.4426950408889634 / std::sqrt(double(HD)));
  PromptAttnKernel<HD, kWindow, kPaged><<<dim3(shape.n_head, n_qtiles), kThreads, kSmem, stream>>>(
      q, k_cache, v_cache, shape.n_head, shape.n_head / shape.n_head_kv, shape.n_ctx, p0,
      n_tokens, shape.window, scale_log2, out, pages, seq, tiles);
  DPL_CUDA_CHECK_LAUNCH();
  return absl::OkStatus();
}

template <int HD>
absl::Status LaunchPromptAttnHd(const PromptAttentionShape& shape, const float* q,
                                const __half* k_cache, const __half* v_cache, int p0, int n_tokens,
                                float* out, cudaStream_t stream, const KvPages& pages, int seq,
                                const PromptTile* tiles = nullptr, int n_tiles = 0) {
  const bool w = shape.window > 0;
  auto launch = [&](auto kernel_launch) {
    return kernel_launch(shape, q, k_cache, v_cache, p0, n_tokens, out, stream, pages, seq, tiles, n_tiles);
  };
  if (pages.paged()) {
    return w ? launch(LaunchPromptAttn<HD, true, true>) : launch(LaunchPromptAttn<HD, false, true>);
  }
  return w ? launch(LaunchPromptAttn<HD, true, false>) : launch(LaunchPromptAttn<HD, false, false>);
}

static_assert(kBlockM == kPromptTileRows, "prompt_tiles.h plans the kernel's query tiles");

// The shape, the pages and the pointers, as both entry points take them.
absl::Status CheckCommon(const PromptAttentionShape& shape, const float* q, const uint16_t* k_cache,
                         const uint16_t* v_cache, const float* out, const KvPages& pages) {
  if (shape.head_dim != 64 && shape.head_dim != 128) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prompt attention: head_dim ", shape.head_dim, " (kernels exist for 64 and 128)"));
  }
  if (shape.n_head <= 0 || shape.n_head_kv <= 0 || shape.n_ctx <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("prompt attention: sizes must be positive (n_head=",
                                                   shape.n_head, ", n_head_kv=", shape.n_head_kv,
                                                   ", n_ctx=", shape.n_ctx, ")"));
  }
  if (shape.n_head % shape.n_head_kv != 0) {
    return absl::InvalidArgumentError(absl::StrCat("prompt attention: n_head ", shape.n_head,
                                                   " is not a multiple of n_head_kv ",
                                                   shape.n_head_kv));
  }
  if (shape.window < 0) {
    return absl::InvalidArgumentError(absl::StrCat("prompt attention: window ", shape.window, " < 0"));
  }
  // The keys read (< p0 + n_tokens <= n_ctx) must have table entries.
  DPL_RETURN_IF_ERROR(CheckKvPages(pages, shape.n_ctx, "prompt attention"));
  if (!q || !k_cache || !v_cache || !out) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prompt attention: null pointer (q=", q ? "set" : "null", ", k_cache=",
        k_cache ? "set" : "null", ", v_cache=", v_cache ? "set" : "null", ", out=",
        out ? "set" : "null", ")"));
  }
  // cp.async moves 16 bytes per copy; q and out move float2s.
  const struct {
    const void* p;
    uintptr_t align;
    const char* name;
  } ptrs[] = {{k_cache, 16, "k_cache"}, {v_cache, 16, "v_cache"}, {q, 8, "q"}, {out, 8, "out"}};
  for (const auto& x : ptrs) {
    if (reinterpret_cast<uintptr_t>(x.p) % x.align != 0) {
      return absl::InvalidArgumentError(absl::StrCat("prompt attention: ", x.name,
                                                     " not aligned to ", x.align, " bytes"));
    }
  }
  return absl::OkStatus();
}

// One chunk's positions against the shape: n_tokens > 0, p0 >= 0,
// p0 + n_tokens <= n_ctx; with pages seq >= 0.
absl::Status CheckChunk(const PromptAttentionShape& shape, const KvPages& pages, int p0, int n_tokens,
                        int seq) {
  if (n_tokens <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("prompt attention: sizes must be positive (n_tokens=", n_tokens, ")"));
  }
  if (p0 < 0) {
    return absl::InvalidArgumentError(absl::StrCat("prompt attention: p0 ", p0, " < 0"));
  }
  if (static_cast<int64_t>(p0) + n_tokens > shape.n_ctx) {
    return absl::InvalidArgumentError(absl::StrCat("prompt attention: p0 ", p0, " + n_tokens ",
                                                   n_tokens, " > n_ctx ", shape.n_ctx));
  }
  if (pages.paged() && seq < 0) {
    return absl::InvalidArgumentError(absl::StrCat("prompt attention: seq ", seq, " < 0"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status PromptAttention(const PromptAttentionShape& shape, const float* q,
                             const uint16_t* k_cache, const uint16_t* v_cache, int p0,
                             int n_tokens, float* out, cudaStream_t stream, const KvPages& pages,
                             int seq) {
  DPL_RETURN_IF_ERROR(CheckCommon(shape, q, k_cache, v_cache, out, pages));
  DPL_RETURN_IF_ERROR(CheckChunk(shape, pages, p0, n_tokens, seq));
  // gridDim.y holds the query tiles (at most 65535).
  if ((n_tokens + kBlockM - 1) / kBlockM > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("prompt attention: n_tokens ", n_tokens, " above 65535 * ", kBlockM));
  }
  const auto* kc = reinterpret_cast<const __half*>(k_cache);
  const auto* vc = reinterpret_cast<const __half*>(v_cache);
  if (shape.head_dim == 64) {
    return LaunchPromptAttnHd<64>(shape, q, kc, vc, p0, n_tokens, out, stream, pages, seq);
  }
  return LaunchPromptAttnHd<128>(shape, q, kc, vc, p0, n_tokens, out, stream, pages, seq);
}

absl::Status PromptAttentionBatch(const PromptAttentionShape& shape, const float* q,
                                  const uint16_t* k_cache, const uint16_t* v_cache,
                                  absl::Span<const PromptTile> tiles, const PromptTile* dev_tiles,
                                  float* out, cudaStream_t stream, const KvPages& pages) {
  DPL_RETURN_IF_ERROR(CheckCommon(shape, q, k_cache, v_cache, out, pages));
  if (tiles.empty() || tiles.size() > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("prompt attention: ", tiles.size(), " tiles (1 to 65535 in one launch)"));
  }
  if (dev_tiles == nullptr || reinterpret_cast<uintptr_t>(dev_tiles) % alignof(PromptTile) != 0) {
    return absl::InvalidArgumentError("prompt attention: dev_tiles null or misaligned");
  }
  for (size_t i = 0; i < tiles.size(); ++i) {
    const PromptTile& t = tiles[i];
    DPL_RETURN_IF_ERROR(CheckChunk(shape, pages, t.p0, t.n_tokens, t.seq));
    if (t.seq < 0 || t.row < 0 || t.m0 < 0 || t.m0 >= t.n_tokens || t.m0 % kBlockM != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("prompt attention: tile ", i, " (seq ", t.seq, ", row ", t.row, ", m0 ", t.m0,
                       " of ", t.n_tokens, " tokens): seq and row must be >= 0, m0 a multiple of ",
                       kBlockM, " below n_tokens"));
    }
  }
  const auto* kc = reinterpret_cast<const __half*>(k_cache);
  const auto* vc = reinterpret_cast<const __half*>(v_cache);
  const int n = static_cast<int>(tiles.size());
  if (shape.head_dim == 64) {
    return LaunchPromptAttnHd<64>(shape, q, kc, vc, 0, 0, out, stream, pages, 0, dev_tiles, n);
  }
  return LaunchPromptAttnHd<128>(shape, q, kc, vc, 0, 0, out, stream, pages, 0, dev_tiles, n);
}

}  // namespace dpl::kernels
