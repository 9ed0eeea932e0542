// Quantized weights times a few tokens on the int8 tensor cores: for 2 to
// kMmaMaxTokens tokens (a batched decode step, a short prompt chunk),
//   y[t, r] = sum_blocks W[r] . x[t] (+ bias[r]) (+ residual[t, r])
// for q4_K, q5_K, q6_K (raw and dpl) and q8_0 (raw and dpl), with the same
// math as the dp4a kernels (matvec_traits.cuh): integer dots of the weights'
// quants with the int8 activation blocks, scaled per sub-block in float. The integer dots of 16 rows x 8 tokens come from one
// mma.sync, so every weight byte is read and decoded once for all tokens.
//
// CTA: 4 warps over kMmaCtaRows = 64 rows (warp w rows 16w..16w+15, one m16
// tile) and all T = 8 NT tokens, walking k one 256-column block at a time.
// Per block the T tokens' int8 values and their per-32 (d, s) scales are
// copied ONCE per CTA into shared memory (cp.async, two stages: block kb+1
// lands while kb is multiplied), and every warp reads its B fragments and
// scales from there; each warp loads its own rows' weights straight into
// registers (q4_K one block ahead). Why (H200, docs/PERF.md "activations
// staged once per CTA"): the form before, with 16 rows a CTA and its warps
// splitting k, re-read the activations and scales from L1/L2 in every warp:
// 7B ffn_gate/up took 27.6 / 45.2 / 121 / 260 us at 4 / 16 / 32 / 64 tokens,
// this form 24.7 / 30.4 / 44.5 / 71.3 (probe; dequantize + cuBLAS ~96).
// Matrices with few row blocks split k over CTAs (grid.z, MmaSplits in
// matvec_geometry.h): each split writes partial sums and MmaSumSplits adds
// them in split order with the bias and residual (deterministic).
//
// Fragments (PTX ISA, mma .s8): lane = 4 g + t.
//   m16n8k32  A: a0 = A[g][4t..4t+3], a1 = A[g+8][4t..], a2 = A[g][16+4t..], a3 = A[g+8][16+4t..]
//             B: b0 = B[4t..4t+3][g], b1 = B[16+4t..][g]
//   m16n8k16  A: a0 = A[g][4t..4t+3], a1 = A[g+8][4t..];  B: b0 = B[4t..4t+3][g]
//   C (both): c0 = C[g][2t], c1 = C[g][2t+1], c2 = C[g+8][2t], c3 = C[g+8][2t+1]
// The k order inside one mma is free as long as A and B use the same one:
// for q4_K, logical k 4t..4t+3 and 16+4t..16+4t+3 are the sub-block's
// columns 8t..8t+7, so a thread's weights and activations are each one
// 8-byte load.
#include <cuda_runtime.h>

#include <algorithm>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kernels/block_row.cuh"
#include "kernels/cp_async.cuh"
#include "kernels/cuda_check.h"
#include "kernels/launch.cuh"
#include "kernels/matvec/matvec_kernels.h"
#include "kernels/matvec/matvec_traits.cuh"

namespace dpl::kernels {
namespace {

constexpr int kMmaWarps = kMmaCtaRows / 16;
constexpr int kMmaThreads = 32 * kMmaWarps;

// c += A (16x32 s8) B (32x8 s8). Not volatile: a pure function of its
// operands, which the compiler may schedule around the loads.
__device__ __forceinline__ void Mma16832(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
  asm(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// c += A (16x16 s8) B (16x8 s8)
__device__ __forceinline__ void Mma16816(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t b0) {
  asm(
      "mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
      "{%0,%1,%2,%3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a0), "r"(a1), "r"(b0));
}

// The 6-bit scales and mins of a q4_K block's 8 sub-blocks, from the header's
// scale bytes s[0..11] (hdr.y, hdr.z, hdr.w; see KScaledSum), unpacked four
// to a word at once: byte j & 3 of sc[j >> 2] is sc_j, of m[j >> 2] is m_j.
//   j < 4:  sc_j = s[j] & 63,                          m_j = s[j + 4] & 63
//   j >= 4: sc_j = (s[j + 4] & 15) | (s[j - 4] >> 6) << 4, m_j = (s[j + 4] >> 4) | (s[j] >> 6) << 4
struct Q4KScales {
  uint32_t sc[2], m[2];
};
__device__ __forceinline__ Q4KScales Q4KUnpackScales(const uint4& hdr) {
  Q4KScales r;
  r.sc[0] = hdr.y & 0x3F3F3F3Fu;
  r.m[0] = hdr.z & 0x3F3F3F3Fu;
  r.sc[1] = (hdr.w & 0x0F0F0F0Fu) | ((hdr.y >> 2) & 0x30303030u);
  r.m[1] = ((hdr.w >> 4) & 0x0F0F0F0Fu) | ((hdr.z >> 2) & 0x30303030u);
  return r;
}

// One 256-column block of the T tokens' activations in shared memory: the
// int8 values (token rows of kRow bytes: 256 + padding so that a warp's B
// loads hit distinct banks, 288 for q4_K's 8-byte loads by half-warps, 272
// for q6_K's 4-byte loads) and per sub-block j of 32 the tokens' (d, s)
// pairs, two tokens' pairs one float4 (C columns 2t, 2t + 1).
template <int T, int kRow>
struct MmaStage {
  int8_t q[T][kRow];
  float ds[8][T][2];
};

// Block kb of x (a.xq, a.xd, a.xs) into `st`, by all kMmaThreads threads;
// tokens past n_tokens are zero-filled (their products are 0 and unused).
// Each thread issues T / 8 copies of each kind, a compile-time count: the
// general strided loop cost ~150 instructions a block (SASS), a quarter of
// the block's work at 4-8 tokens. Unrolled up to 2 (more holds an address
// register per copy: 224 registers at 64 tokens).
// Which tokens a CTA multiplies: n of them, token tok's activations in row
// x(tok) of a.xq / xd / xs and its outputs in row y(tok) of each part's y.
// A dense launch's tokens are the launch's rows 0..n_tokens-1; the grouped
// expert launch's (LaunchMatVecMmaGrouped) are one tile of an expert's
// routes, their rows staged in shared memory by the CTA.
struct MmaDenseTokens {
  __device__ __forceinline__ int n(const MatVecArgs& a) const { return a.n_tokens; }
  __device__ __forceinline__ int x(int tok) const { return tok; }
  __device__ __forceinline__ int y(int tok) const { return tok; }
};
struct MmaRouteTokens {
  int count;
  const int* xr;  // (T) shared: activation rows
  const int* yr;  // (T) shared: output rows (route ids)
  __device__ __forceinline__ int n(const MatVecArgs&) const { return count; }
  __device__ __forceinline__ int x(int tok) const { return xr[tok]; }
  __device__ __forceinline__ int y(int tok) const { return yr[tok]; }
};

template <int T, int kRow, class Tokens>
__device__ __forceinline__ void StageBlock(const MatVecArgs& a, const Tokens& tk, int kb, MmaStage<T, kRow>& st) {
  static_assert(T * 16 % kMmaThreads == 0, "copies split evenly over the CTA");
  constexpr int kCopies = T * 16 / kMmaThreads;
  constexpr int kUnroll = kCopies <= 2 ? kCopies : 1;
  const int nb = a.n_cols / 32;
#pragma unroll kUnroll
  for (int k = 0; k < kCopies; ++k) {
    const int i = static_cast<int>(threadIdx.x) + k * kMmaThreads;
    const int tok = i >> 4, c = i & 15;
    const bool ok = tok < tk.n(a);
    const int8_t* src = a.xq + static_cast<int64_t>(ok ? tk.x(tok) : 0) * a.n_cols + kb * 256 + 16 * c;
    CpAsync16ZeroFill(SmemAddr(&st.q[tok][16 * c]), src, ok);
  }
#pragma unroll kUnroll
  for (int k = 0; k < kCopies; ++k) {
    const int i = static_cast<int>(threadIdx.x) + k * kMmaThreads;
    const int tok = i >> 4, j = (i >> 1) & 7, which = i & 1;
    const bool ok = tok < tk.n(a);
    const float* src = (which ? a.xs : a.xd) + static_cast<int64_t>(ok ? tk.x(tok) : 0) * nb + kb * 8 + j;
    CpAsync4ZeroFill(SmemAddr(&st.ds[j][tok][which]), src, ok);
  }
}

// Per n-tile accumulators of one thread: rows g, g + 8 x tokens 2t, 2t + 1.
template <int NT>
struct Acc {
  float v[NT][4];
};

// q4_K (raw 144-byte blocks: d, dmin, scales[12], qs[128]) and q5_K (raw
// 176: d, dmin, scales[12], qh[32], qs[128]; element l of sub-block j has
// the fifth bit j of qh[l]): block kb of rows w0 (row g) and w1 (row g+8).
//   y += d sc_j xd_j dot(q_j, xq_j) - dmin m_j xs_j   per sub-block j of 32
// This thread's bytes of one block: both headers, 8 quant bytes of each
// 32-byte chunk per row, and for q5_K the 8 qh bytes of its 8 columns
// (loaded one block ahead: Q4KLoad, then Q4KBlock).
template <bool kQ5>
struct Q4KRegs {
  uint4 h0, h1;
  uint2 q0[4], q1[4];
  uint2 qh0, qh1;  // q5_K
};

template <bool kQ5>
__device__ __forceinline__ Q4KRegs<kQ5> Q4KLoad(const uint8_t* w0, const uint8_t* w1, int kb,
                                                 int t) {
  constexpr int kBlock = kQ5 ? 176 : 144, kQs = kQ5 ? 48 : 16;
  const uint8_t* b0 = w0 + static_cast<int64_t>(kb) * kBlock;
  const uint8_t* b1 = w1 + static_cast<int64_t>(kb) * kBlock;
  Q4KRegs<kQ5> r;
  r.h0 = LdW16Span(b0);
  r.h1 = LdW16Span(b1);
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    r.q0[c] = LdW8(b0 + kQs + 32 * c + 8 * t);
    r.q1[c] = LdW8(b1 + kQs + 32 * c + 8 * t);
  }
  if constexpr (kQ5) {
    r.qh0 = LdW8(b0 + 16 + 8 * t);
    r.qh1 = LdW8(b1 + 16 + 8 * t);
  }
  return r;
}

constexpr int kQ4KStageRow = 288;

template <bool kQ5, int NT>
__device__ __forceinline__ void Q4KBlock(const Q4KRegs<kQ5>& r,
                                         const MmaStage<8 * NT, kQ4KStageRow>& st, int g, int t,
                                         Acc<NT>& acc) {
  const float d0 = Half(r.h0.x & 0xFFFFu), dm0 = Half(r.h0.x >> 16);
  const float d1 = Half(r.h1.x & 0xFFFFu), dm1 = Half(r.h1.x >> 16);
  const Q4KScales s0 = Q4KUnpackScales(r.h0), s1 = Q4KUnpackScales(r.h1);
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    // The chunk's two sub-blocks j = 2c (low nibbles), 2c + 1 (high).
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) {
      const int j = 2 * c + hi, sh = 4 * hi;
      uint32_t a0 = (r.q0[c].x >> sh) & 0x0F0F0F0Fu, a2 = (r.q0[c].y >> sh) & 0x0F0F0F0Fu;
      uint32_t a1 = (r.q1[c].x >> sh) & 0x0F0F0F0Fu, a3 = (r.q1[c].y >> sh) & 0x0F0F0F0Fu;
      if constexpr (kQ5) {  // bit j of each qh byte, as bit 4 of the quant
        a0 |= ((r.qh0.x >> j) & 0x01010101u) << 4;
        a2 |= ((r.qh0.y >> j) & 0x01010101u) << 4;
        a1 |= ((r.qh1.x >> j) & 0x01010101u) << 4;
        a3 |= ((r.qh1.y >> j) & 0x01010101u) << 4;
      }
      const int w = j >> 2, b = j & 3;
      const float ds0 = d0 * static_cast<float>(Byte(s0.sc[w], b));
      const float ds1 = d1 * static_cast<float>(Byte(s1.sc[w], b));
      const float mm0 = dm0 * static_cast<float>(Byte(s0.m[w], b));
      const float mm1 = dm1 * static_cast<float>(Byte(s1.m[w], b));
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        // B: token 8n + g, columns 32j + 8t..+7; scales of tokens 8n + 2t, +1.
        const uint2 bx = *reinterpret_cast<const uint2*>(&st.q[8 * n + g][32 * j + 8 * t]);
        const float4 xa = *reinterpret_cast<const float4*>(&st.ds[j][8 * n + 2 * t][0]);
        int c4[4] = {0, 0, 0, 0};
        Mma16832(c4, a0, a1, a2, a3, bx.x, bx.y);
        float* v = acc.v[n];
        v[0] = fmaf(static_cast<float>(c4[0]), ds0 * xa.x, v[0]) - mm0 * xa.y;
        v[1] = fmaf(static_cast<float>(c4[1]), ds0 * xa.z, v[1]) - mm0 * xa.w;
        v[2] = fmaf(static_cast<float>(c4[2]), ds1 * xa.x, v[2]) - mm1 * xa.y;
        v[3] = fmaf(static_cast<float>(c4[3]), ds1 * xa.z, v[3]) - mm1 * xa.w;
      }
    }
  }
}

// q6_K, dpl rows (kDpl: planes ql | qh | sc | d, 16-byte aligned) or raw
// 210-byte blocks (fields 2-byte aligned: LdWords2); the same words either
// way, so both layouts give the same bits (as Q6K<kDpl> in matvec_traits):
//   y += d sc_s xd_b dot(q_s - 32, xq_s)   per sub-block s of 16 (k16 mma)
// Sub-block s = 8h + 2q + seg covers, within half h, columns 32q + 16seg ..
// +15; its quants come from ql[64h + 32 (q & 1) + l] nibble q >> 1 and
// qh[32h + l] bits 2q, 2q + 1, l = 16seg + 4t .. +3 for this thread.
template <bool kDpl>
struct Q6KBlockPtrs {
  const uint8_t *ql, *qh, *sc, *d;
  __device__ Q6KBlockPtrs(const uint8_t* row, int kb, int nbe) {
    using namespace formats;
    if constexpr (kDpl) {
      const Q6KPlanes pl = Q6KDplPlanes(nbe);
      ql = row + pl.ql + static_cast<int64_t>(kb) * kQ6KQlBytes;
      qh = row + pl.qh + static_cast<int64_t>(kb) * kQ6KQhBytes;
      sc = row + pl.sc + static_cast<int64_t>(kb) * kQ6KScBytes;
      d = row + pl.d + static_cast<int64_t>(kb) * kQ6KDBytes;
    } else {
      const uint8_t* blk = row + static_cast<int64_t>(kb) * kQ6KBlockBytes;
      ql = blk + kQ6KQlOffset;
      qh = blk + kQ6KQhOffset;
      sc = blk + kQ6KScOffset;
      d = blk + kQ6KDOffset;
    }
  }
  __device__ uint32_t Word(const uint8_t* p) const {
    if constexpr (kDpl) {
      return *reinterpret_cast<const uint32_t*>(p);
    } else {
      uint32_t w[1];
      LdWords2<1>(p, w);
      return w[0];
    }
  }
  __device__ void Scales(uint32_t (&w)[4]) const {
    if constexpr (kDpl) {
      const uint4 v = LdW16(sc);
      w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
    } else {
      LdWords2<4>(sc, w);
    }
  }
};

constexpr int kQ6KStageRow = 272;

// This thread's words of q6_K block kb of rows w0 (row g) and w1 (row g + 8),
// [row][half h][seg]: ql at 64h + l and 64h + 32 + l, qh at 32h + l, l = 16 seg
// + 4t; the 16 int8 sub-block scales and d. Loaded one block ahead, as q4_K.
struct Q6KRegs {
  uint32_t la[2][2][2], lb[2][2][2], hh[2][2][2];
  uint32_t sw[2][4];
  uint32_t d[2];
};

template <bool kDpl>
__device__ __forceinline__ Q6KRegs Q6KLoad(const uint8_t* w0, const uint8_t* w1, int kb, int nbe,
                                           int t) {
  Q6KRegs r;
#pragma unroll
  for (int row = 0; row < 2; ++row) {
    const Q6KBlockPtrs<kDpl> p(row == 0 ? w0 : w1, kb, nbe);
    p.Scales(r.sw[row]);
    r.d[row] = LdW2(p.d);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int seg = 0; seg < 2; ++seg) {
        const int l = 16 * seg + 4 * t;
        r.la[row][h][seg] = p.Word(p.ql + 64 * h + l);
        r.lb[row][h][seg] = p.Word(p.ql + 64 * h + 32 + l);
        r.hh[row][h][seg] = p.Word(p.qh + 32 * h + l);
      }
    }
  }
  return r;
}

// Row `row`'s (0: g, 1: g + 8) 6-bit values of quarter q, segment seg of
// half h (as Q6K::Dot's v0..v3), minus 32: this thread's A fragment word.
__device__ __forceinline__ uint32_t Q6Quants(const Q6KRegs& r, int row, int h, int q, int seg) {
  const uint32_t la = r.la[row][h][seg], lb = r.lb[row][h][seg], hh = r.hh[row][h][seg];
  const uint32_t lo = q == 0 ? (la & 0x0F0F0F0Fu)
                      : q == 1 ? (lb & 0x0F0F0F0Fu)
                      : q == 2 ? ((la >> 4) & 0x0F0F0F0Fu)
                               : ((lb >> 4) & 0x0F0F0F0Fu);
  const uint32_t hi = q == 0 ? ((hh << 4) & 0x30303030u)
                      : q == 1 ? ((hh << 2) & 0x30303030u)
                      : q == 2 ? (hh & 0x30303030u)
                               : ((hh >> 2) & 0x30303030u);
  return static_cast<uint32_t>(Q6Signed(lo | hi));
}

// Row `row`'s int8 scale of sub-block s (0..15).
__device__ __forceinline__ int8_t Q6Scale(const Q6KRegs& r, int row, int s) {
  return static_cast<int8_t>(Byte(r.sw[row][s >> 2], s & 3));
}

// Per quarter q of half h (32 columns: one activation block, two 16-column
// sub-blocks s0 = 8h + 2q, s1 = s0 + 1 with their int8 scales), per token
// and row:
//   y += d xd (sc_s0 dot_s0 + sc_s1 dot_s1)
// The two sub-blocks' k16 integer dots scaled by their int8 scales and
// summed in integers (|sum| <= 2 x 16 x 32 x 127 x 128 < 2^24: exact, and
// exact as a float), then one float multiply-add, where scaling each
// sub-block in floats spent an I2F, a multiply and an FMA a sub-block and
// converted each scale and multiplied it by d (cubin, 8 tokens: 1,048 -> 984
// instructions a kernel; H100, 7B at 4 / 8 sequences 1,217 / 2,330 ->
// 1,219 / 2,333 t/s, and the q6_K products at 64 tokens on this form -8%;
// docs/PERF.md, 2026-12-07). The sums round once where the float scaling
// rounded twice: ~5e-8 from the single-token kernel (matvec_gpu_test).
template <int NT>
__device__ __forceinline__ void Q6KBlock(const Q6KRegs& r, const MmaStage<8 * NT, kQ6KStageRow>& st,
                                      int g, int t, Acc<NT>& acc) {
  const float d0 = Half(r.d[0]), d1 = Half(r.d[1]);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      // Activation block 4h + q of this 256-column block covers both segs:
      // its scales for this lane's C columns (tokens 8n + 2t, + 1), times
      // each row's d.
      const int xb = 4 * h + q;
      float w00[NT], w01[NT], w10[NT], w11[NT];  // [row][token 2t, 2t + 1]
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        const float4 xa = *reinterpret_cast<const float4*>(&st.ds[xb][8 * n + 2 * t][0]);
        w00[n] = d0 * xa.x;
        w01[n] = d0 * xa.z;
        w10[n] = d1 * xa.x;
        w11[n] = d1 * xa.z;
      }
      int isum[NT][4];
#pragma unroll
      for (int seg = 0; seg < 2; ++seg) {
        const uint32_t a0 = Q6Quants(r, 0, h, q, seg), a1 = Q6Quants(r, 1, h, q, seg);
        const int s = 8 * h + 2 * q + seg;
        const int sc0 = Q6Scale(r, 0, s), sc1 = Q6Scale(r, 1, s);
        const int col = 128 * h + 32 * q + 16 * seg + 4 * t;
#pragma unroll
        for (int n = 0; n < NT; ++n) {
          const uint32_t bx = *reinterpret_cast<const uint32_t*>(&st.q[8 * n + g][col]);
          int c4[4] = {0, 0, 0, 0};
          Mma16816(c4, a0, a1, bx);
          if (seg == 0) {
            isum[n][0] = c4[0] * sc0;
            isum[n][1] = c4[1] * sc0;
            isum[n][2] = c4[2] * sc1;
            isum[n][3] = c4[3] * sc1;
          } else {
            isum[n][0] += c4[0] * sc0;
            isum[n][1] += c4[1] * sc0;
            isum[n][2] += c4[2] * sc1;
            isum[n][3] += c4[3] * sc1;
          }
        }
      }
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        float* v = acc.v[n];
        v[0] = fmaf(static_cast<float>(isum[n][0]), w00[n], v[0]);
        v[1] = fmaf(static_cast<float>(isum[n][1]), w01[n], v[1]);
        v[2] = fmaf(static_cast<float>(isum[n][2]), w10[n], v[2]);
        v[3] = fmaf(static_cast<float>(isum[n][3]), w11[n], v[3]);
      }
    }
  }
}

// q8_0 (raw 34-byte blocks, 2-byte aligned, or dpl planes qs | d): the 8
// blocks b = 8kb + j of one 256-column block, j = 0..7.
//   y += d_b xd_b dot(qs_b, xq_b)   per block b of 32 (one k32 mma)
// This thread's bytes: 8 qs bytes of each block per row (columns 8t..8t+7,
// the same free k order as q4_K) and the rows' d.
struct Q8_0Regs {
  uint32_t q0[8][2], q1[8][2];
  uint32_t d0[8], d1[8];
};

template <bool kDpl>
__device__ __forceinline__ Q8_0Regs Q8_0Load(const uint8_t* w0, const uint8_t* w1, int kb, int nbe,
                                             int t) {
  using Row = BlockRow<formats::GgmlType::kQ8_0, kDpl>;
  constexpr uint32_t kQs = 0, kD = 1;  // Q8_0's fields (matvec_traits.cuh)
  const Row r0{w0, 8 * nbe}, r1{w1, 8 * nbe};
  Q8_0Regs r;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int64_t b = 8 * static_cast<int64_t>(kb) + j;
    // + 8t keeps up to 8 of the field's alignment
    LdWords<2, (Row::Align(kQs) < 8 ? Row::Align(kQs) : 8)>(r0.template Field<kQs>(b) + 8 * t, r.q0[j]);
    LdWords<2, (Row::Align(kQs) < 8 ? Row::Align(kQs) : 8)>(r1.template Field<kQs>(b) + 8 * t, r.q1[j]);
    r.d0[j] = r0.template Scale<kD>(b);
    r.d1[j] = r1.template Scale<kD>(b);
  }
  return r;
}

template <int NT>
__device__ __forceinline__ void Q8_0Block(const Q8_0Regs& r, const MmaStage<8 * NT, kQ4KStageRow>& st,
                                          int g, int t, Acc<NT>& acc) {
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float d0 = Half(r.d0[j]), d1 = Half(r.d1[j]);
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      const uint2 bx = *reinterpret_cast<const uint2*>(&st.q[8 * n + g][32 * j + 8 * t]);
      const float4 xa = *reinterpret_cast<const float4*>(&st.ds[j][8 * n + 2 * t][0]);
      int c4[4] = {0, 0, 0, 0};
      Mma16832(c4, r.q0[j][0], r.q1[j][0], r.q0[j][1], r.q1[j][1], bx.x, bx.y);
      float* v = acc.v[n];
      v[0] = fmaf(d0 * xa.x, static_cast<float>(c4[0]), v[0]);
      v[1] = fmaf(d0 * xa.z, static_cast<float>(c4[1]), v[1]);
      v[2] = fmaf(d1 * xa.x, static_cast<float>(c4[2]), v[2]);
      v[3] = fmaf(d1 * xa.z, static_cast<float>(c4[3]), v[3]);
    }
  }
}

// The weight type's registers, load and block product, by kernel.
template <MatVecKernel K>
using MmaRegs = std::conditional_t<
    K == MatVecKernel::kQ4K, Q4KRegs<false>,
    std::conditional_t<K == MatVecKernel::kQ5K, Q4KRegs<true>,
                       std::conditional_t<K == MatVecKernel::kQ8_0 || K == MatVecKernel::kQ8_0Dpl,
                                          Q8_0Regs, Q6KRegs>>>;

template <MatVecKernel K>
__device__ __forceinline__ MmaRegs<K> LoadBlock(const uint8_t* w0, const uint8_t* w1, int kb,
                                                int nbe, int t) {
  if constexpr (K == MatVecKernel::kQ4K || K == MatVecKernel::kQ5K) {
    return Q4KLoad<K == MatVecKernel::kQ5K>(w0, w1, kb, t);
  } else if constexpr (K == MatVecKernel::kQ8_0 || K == MatVecKernel::kQ8_0Dpl) {
    return Q8_0Load<K == MatVecKernel::kQ8_0Dpl>(w0, w1, kb, nbe, t);
  } else {
    return Q6KLoad<K == MatVecKernel::kQ6KDpl>(w0, w1, kb, nbe, t);
  }
}

// Part m of the launch, copied by selects (no dynamic index into the
// kernel's parameters).
__device__ __forceinline__ MatVecPart PartAt(const MatVecArgs& a, int m) {
  return m == 0 ? a.part[0] : m == 1 ? a.part[1] : a.part[2];
}

// The part row block blockIdx.y belongs to.
__device__ __forceinline__ int PartOfBlock(const MatVecArgs& a) {
  return (a.n_parts > 1 && static_cast<int>(blockIdx.y) >= a.part[1].row_block0) +
         (a.n_parts > 2 && static_cast<int>(blockIdx.y) >= a.part[2].row_block0);
}

// One CTA: part P's rows 64 (blockIdx.y - row_block0) .. +63 for the tokens
// tk and the 256-column blocks [nbe z / splits, nbe (z + 1) / splits).
// kWaited: the caller has passed GridDependencyWait already (the grouped
// form reads its tile first); else the first block's weights load before
// the wait (weights never change).
template <MatVecKernel K, int NT, bool kWaited, class Tokens>
__device__ __forceinline__ void MmaRows(const MatVecArgs& a, const MatVecPart& P, int z, const Tokens& tk) {
  constexpr int T = 8 * NT;
  constexpr bool kQ6 = K == MatVecKernel::kQ6KDpl || K == MatVecKernel::kQ6KRaw;
  constexpr int kRow = kQ6 ? kQ6KStageRow : kQ4KStageRow;
  __shared__ __align__(16) MmaStage<T, kRow> stage[2];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int row0 = (static_cast<int>(blockIdx.y) - P.row_block0) * kMmaCtaRows + 16 * warp;
  // Rows past the matrix read its last row (valid memory) and write nothing.
  const int r0 = min(row0 + g, P.n_rows - 1), r1 = min(row0 + g + 8, P.n_rows - 1);
  const uint8_t* w0 = P.w + static_cast<int64_t>(r0) * P.row_stride;
  const uint8_t* w1 = P.w + static_cast<int64_t>(r1) * P.row_stride;
  const int nbe = a.n_cols / 256;
  const int kb0 = nbe * z / P.splits, kb1 = nbe * (z + 1) / P.splits;  // kb0 < kb1: splits <= nbe
  Acc<NT> acc;
#pragma unroll
  for (int n = 0; n < NT; ++n) acc.v[n][0] = acc.v[n][1] = acc.v[n][2] = acc.v[n][3] = 0.f;
  // Each block's weights in registers one block ahead (the first before the
  // wait: weights never change).
  MmaRegs<K> cur = LoadBlock<K>(w0, w1, kb0, nbe, t);
  if constexpr (!kWaited) GridDependencyWait();
  GridLaunchDependents();
  StageBlock(a, tk, kb0, stage[0]);
  CpAsyncCommit();
  for (int kb = kb0; kb < kb1; ++kb) {
    const int buf = (kb - kb0) & 1;
    if (kb + 1 < kb1) StageBlock(a, tk, kb + 1, stage[buf ^ 1]);
    CpAsyncCommit();
    const MmaRegs<K> next = kb + 1 < kb1 ? LoadBlock<K>(w0, w1, kb + 1, nbe, t) : cur;
    CpAsyncWait<1>();  // block kb landed (this thread's copies) ...
    __syncthreads();   // ... and every thread's
    if constexpr (K == MatVecKernel::kQ4K || K == MatVecKernel::kQ5K) {
      Q4KBlock<K == MatVecKernel::kQ5K, NT>(cur, stage[buf], g, t, acc);
    } else if constexpr (K == MatVecKernel::kQ8_0 || K == MatVecKernel::kQ8_0Dpl) {
      Q8_0Block<NT>(cur, stage[buf], g, t, acc);
    } else {
      Q6KBlock<NT>(cur, stage[buf], g, t, acc);
    }
    __syncthreads();  // the next iteration's copies overwrite this buffer
    cur = next;
  }
  // Thread (g, t) holds rows row0 + g, + 8 x tokens 8n + 2t, + 1.
#pragma unroll
  for (int n = 0; n < NT; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int tok = 8 * n + 2 * t + (e & 1), row = row0 + g + 8 * (e >> 1);
      if (tok >= tk.n(a) || row >= P.n_rows) continue;
      const int64_t o = static_cast<int64_t>(tk.y(tok)) * P.n_rows + row;
      if (P.splits > 1) {  // dense launches only (the grouped form does not split k)
        P.partial[static_cast<int64_t>(z) * a.n_tokens * P.n_rows + o] = acc.v[n][e];
        continue;
      }
      float v = acc.v[n][e];
      if (P.bias != nullptr) v += P.bias[row];
      if (P.residual != nullptr) v += P.residual[o];  // may alias y: read before write
      P.y[o] = v;
    }
  }
}

// grid (1, row blocks of kMmaCtaRows over all parts, max splits), 4 warps.
template <MatVecKernel K, int NT>
__global__ void __launch_bounds__(kMmaThreads) MatVecMmaKernel(const MatVecArgs a) {
  const MatVecPart P = PartAt(a, PartOfBlock(a));
  const int z = static_cast<int>(blockIdx.z);
  if (z >= P.splits) return;  // a part with fewer splits than the launch's grid.z
  MmaRows<K, NT, false>(a, P, z, MmaDenseTokens{});
}

// grid (tiles, row blocks of kMmaCtaRows over all parts), 4 warps: CTA
// (x, y) multiplies tile x's routes (MmaGroupArgs) by its expert's rows.
template <MatVecKernel K, int NT>
__global__ void __launch_bounds__(kMmaThreads) MatVecMmaGroupedKernel(const MatVecArgs a, const MmaGroupArgs g) {
  constexpr int T = 8 * NT;
  __shared__ int rows[2][T];  // the tile's activation rows, then output rows
  GridDependencyWait();       // the tiles come from RouteGroups
  const int tile = static_cast<int>(blockIdx.x);
  if (tile >= g.n_tiles[0]) return;
  const int e = min(max(g.tiles[3 * tile], 0), g.n_expert - 1);
  const int first = g.tiles[3 * tile + 1], n = g.tiles[3 * tile + 2];
  if (threadIdx.x < T) {
    const int r = g.order[first + min(static_cast<int>(threadIdx.x), n - 1)];
    rows[0][threadIdx.x] = r / g.x_div;
    rows[1][threadIdx.x] = r;
  }
  __syncthreads();
  const int m = PartOfBlock(a);
  MatVecPart P = PartAt(a, m);
  P.w += static_cast<int64_t>(e) * (m == 0 ? g.expert_stride[0] : m == 1 ? g.expert_stride[1] : g.expert_stride[2]);
  MmaRows<K, NT, true>(a, P, 0, MmaRouteTokens{n, rows[0], rows[1]});
}

//   y[t, r] = (sum_z partial[z, t, r]) (+ bias[r]) (+ residual[t, r])
// for the parts with splits > 1, z in order. grid (elements / 256, n_parts).
__global__ void __launch_bounds__(256) MmaSumSplits(const MatVecArgs a) {
  const MatVecPart P = PartAt(a, static_cast<int>(blockIdx.y));
  GridDependencyWait();
  GridLaunchDependents();
  const int64_t n = static_cast<int64_t>(a.n_tokens) * P.n_rows;
  const int64_t o = static_cast<int64_t>(blockIdx.x) * 256 + threadIdx.x;
  if (P.splits <= 1 || o >= n) return;
  float v = P.partial[o];
  for (int z = 1; z < P.splits; ++z) v += P.partial[z * n + o];
  if (P.bias != nullptr) v += P.bias[o % P.n_rows];
  if (P.residual != nullptr) v += P.residual[o];
  P.y[o] = v;
}

template <MatVecKernel K>
void (*PickKernel(int n_tokens))(MatVecArgs) {
  if (n_tokens <= 8) return MatVecMmaKernel<K, 1>;
  if (n_tokens <= 16) return MatVecMmaKernel<K, 2>;
  if (n_tokens <= 32) return MatVecMmaKernel<K, 4>;
  return MatVecMmaKernel<K, 8>;
}

}  // namespace

absl::Status LaunchMatVecMma(MatVecKernel kernel, const MatVecArgs& args, int64_t grid_y, bool pdl,
                             cudaStream_t stream) {
  if (args.n_tokens < 1 || args.n_tokens > kMmaMaxTokens || args.n_cols % 256 != 0 ||
      args.xq == nullptr || args.xd == nullptr || args.xs == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("matvec mma: ", args.n_tokens, " tokens, ",
                                                   args.n_cols, " columns or no int8 activations"));
  }
  int splits = 1;
  for (int i = 0; i < args.n_parts; ++i) {
    const MatVecPart& p = args.part[i];
    if (p.splits < 1 || p.splits > args.n_cols / 256 || (p.splits > 1 && p.partial == nullptr)) {
      return absl::InvalidArgumentError(absl::StrCat("matvec mma: part ", i, " splits k ", p.splits,
                                                     " ways (1..", args.n_cols / 256,
                                                     ", partials needed for more than 1)"));
    }
    splits = std::max(splits, p.splits);
  }
  void (*fn)(MatVecArgs) = nullptr;
  if (kernel == MatVecKernel::kQ4K) fn = PickKernel<MatVecKernel::kQ4K>(args.n_tokens);
  if (kernel == MatVecKernel::kQ6KDpl) fn = PickKernel<MatVecKernel::kQ6KDpl>(args.n_tokens);
  if (kernel == MatVecKernel::kQ6KRaw) fn = PickKernel<MatVecKernel::kQ6KRaw>(args.n_tokens);
  if (kernel == MatVecKernel::kQ5K) fn = PickKernel<MatVecKernel::kQ5K>(args.n_tokens);
  if (kernel == MatVecKernel::kQ8_0) fn = PickKernel<MatVecKernel::kQ8_0>(args.n_tokens);
  if (kernel == MatVecKernel::kQ8_0Dpl) fn = PickKernel<MatVecKernel::kQ8_0Dpl>(args.n_tokens);
  if (fn == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("matvec mma: no tensor-core kernel for kernel ", static_cast<int>(kernel)));
  }
  DPL_RETURN_IF_ERROR(LaunchKernel(fn, dim3(1, static_cast<unsigned>(grid_y), splits),
                                   dim3(kMmaThreads), 0, stream, pdl, args));
  return LaunchMmaSumSplits(args, pdl, stream);
}

absl::Status LaunchMatVecMmaGrouped(MatVecKernel kernel, const MatVecArgs& args, int64_t grid_y,
                                    const MmaGroupArgs& groups, int tile_tokens, int64_t max_tiles, bool pdl,
                                    cudaStream_t stream) {
  if (tile_tokens < 8 || tile_tokens > kMmaMaxTokens || tile_tokens % 8 != 0 || args.n_cols % 256 != 0 ||
      args.xq == nullptr || args.xd == nullptr || args.xs == nullptr || groups.n_tiles == nullptr ||
      groups.order == nullptr || groups.tiles == nullptr || groups.n_expert < 1 || groups.x_div < 1 ||
      max_tiles < 1 || max_tiles > 0x7fffffff) {
    return absl::InvalidArgumentError(absl::StrCat("grouped matvec mma: tiles of ", tile_tokens, " tokens, ",
                                                   args.n_cols, " columns, ", max_tiles,
                                                   " tiles, or no activations or groups"));
  }
  for (int i = 0; i < args.n_parts; ++i) {
    if (args.part[i].splits != 1) {
      return absl::InvalidArgumentError(absl::StrCat("grouped matvec mma: part ", i, " splits k"));
    }
  }
  const int nt = tile_tokens / 8;
  using Fn = void (*)(MatVecArgs, MmaGroupArgs);
  auto pick = [nt](auto k) -> Fn {
    constexpr MatVecKernel K = decltype(k)::value;
    switch (nt) {
      case 1: return MatVecMmaGroupedKernel<K, 1>;
      case 2: return MatVecMmaGroupedKernel<K, 2>;
      case 4: return MatVecMmaGroupedKernel<K, 4>;
      case 8: return MatVecMmaGroupedKernel<K, 8>;
    }
    return nullptr;
  };
  Fn fn = nullptr;
  switch (kernel) {
    case MatVecKernel::kQ4K: fn = pick(std::integral_constant<MatVecKernel, MatVecKernel::kQ4K>{}); break;
    case MatVecKernel::kQ5K: fn = pick(std::integral_constant<MatVecKernel, MatVecKernel::kQ5K>{}); break;
    case MatVecKernel::kQ6KRaw: fn = pick(std::integral_constant<MatVecKernel, MatVecKernel::kQ6KRaw>{}); break;
    case MatVecKernel::kQ6KDpl: fn = pick(std::integral_constant<MatVecKernel, MatVecKernel::kQ6KDpl>{}); break;
    case MatVecKernel::kQ8_0: fn = pick(std::integral_constant<MatVecKernel, MatVecKernel::kQ8_0>{}); break;
    case MatVecKernel::kQ8_0Dpl: fn = pick(std::integral_constant<MatVecKernel, MatVecKernel::kQ8_0Dpl>{}); break;
    default: break;
  }
  if (fn == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("grouped matvec mma: no kernel for kernel ",
                                                   static_cast<int>(kernel), " at ", tile_tokens, " tokens"));
  }
  return LaunchKernel(fn, dim3(static_cast<unsigned>(max_tiles), static_cast<unsigned>(grid_y)),
                      dim3(kMmaThreads), 0, stream, pdl, args, groups);
}

absl::Status LaunchMmaSumSplits(const MatVecArgs& args, bool pdl, cudaStream_t stream) {
  int64_t max_rows = 0;
  bool split = false;
  for (int i = 0; i < args.n_parts; ++i) {
    max_rows = std::max<int64_t>(max_rows, args.part[i].n_rows);
    split = split || args.part[i].splits > 1;
  }
  if (!split) return absl::OkStatus();
  const int64_t elems = max_rows * args.n_tokens;
  return LaunchKernel(MmaSumSplits, dim3(static_cast<unsigned>((elems + 255) / 256), args.n_parts),
                      dim3(256), 0, stream, pdl, args);
}

}  // namespace dpl::kernels
