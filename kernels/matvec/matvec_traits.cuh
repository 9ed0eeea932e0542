// The matvec kernels' per-type traits: for each weight encoding, where a lane's
// bytes of one step are (Load) and how they are dotted with the int8 (or f32)
// activations (Dot). MatVecT (matvec_kernels.cu) is the one skeleton that
// walks a row with them; a new type or layout is one more struct here.
//
// Activation path (why q8 activations): batch-1 decode must stream weights at
// >= 75% of HBM bandwidth. Dequantizing q4_K/q6_K to float in registers costs
// ~4 ALU ops per weight (unpack, int->float, FMA), which at ~8e12 weights/s
// needs more FP32/INT throughput than an H200 has. Quantizing x once per step
// to int8 (per 32 values: scale d = amax/127, q = rint(x/d)) lets every 4
// weights cost one dp4a plus 1-2 bit operations, as llama.cpp's MMVQ does.
// The price is ~0.5% relative error (x is rounded to 8 bits), inside the
// runtime's 4% end-to-end budget. f32/f16 weights keep exact f32 activations.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "formats/tensor_layout.h"
#include "kernels/block_row.cuh"
#include "kernels/matvec/matvec_kernels.h"

namespace dpl::kernels {

__device__ __forceinline__ uint32_t Byte(uint32_t w, int k) { return (w >> (8 * k)) & 0xFFu; }

__device__ __forceinline__ float Half(uint32_t bits) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
}

// Per byte: the 6-bit q6_K value q (0..63) -> the int8 q - 32. Why it works:
// q + 0x60 stays below 0x100 (no carry into the next byte), and flipping bit 7
// of q + 0x60 is exactly q - 32 in two's complement.
__device__ __forceinline__ int Q6Signed(uint32_t q) {
  return static_cast<int>((q + 0x60606060u) ^ 0x80808080u);
}
// Per byte: the 5-bit q5_0 value q (0..31) -> the int8 q - 16 (same trick).
__device__ __forceinline__ int Q5Signed(uint32_t q) {
  return static_cast<int>((q + 0x70707070u) ^ 0x80808080u);
}
// 4 bits b3..b0 -> bytes (b3, b2, b1, b0) each 0 or 1: the product places bit
// k at bits k, k+7, k+14, k+21 (never colliding), and bit k lands on 8k.
__device__ __forceinline__ uint32_t Spread4(uint32_t nib) {
  return (nib * 0x00204081u) & 0x01010101u;
}

__device__ __forceinline__ int4 LdX16(const int8_t* p) {
  return __ldg(reinterpret_cast<const int4*>(p));
}

// Per-token views of the activations.
struct XView {
  const int8_t* q;  // (n_cols) int8
  const float* d;   // (n_cols / 32) scales
  const float* s;   // (n_cols / 32) d * sum(q)
  const float* f;   // (n_cols) f32
};

__device__ __forceinline__ XView TokenX(const MatVecArgs& a, int t) {
  XView v;
  const int64_t nb = a.n_cols / kActBlock;
  v.q = a.xq ? a.xq + static_cast<int64_t>(t) * a.n_cols : nullptr;
  v.d = a.xd ? a.xd + t * nb : nullptr;
  v.s = a.xs ? a.xs + t * nb : nullptr;
  v.f = a.x ? a.x + static_cast<int64_t>(t) * a.n_cols : nullptr;
  return v;
}

// The q4_K / q5_K step of lane p (chunk c = p / 2: sub-blocks 2c, 2c + 1)
// from its two integer dots dl, dh and the block header hdr (d|dmin,
// scales[0..11]):  d * (sc_2c xd_2c dl + sc_2c+1 xd_2c+1 dh) - dmin * (m_2c
// xs_2c + m_2c+1 xs_2c+1), the min term added once, by the even lane.
__device__ __forceinline__ float KScaledSum(const uint4& hdr, const XView& x, int it, int p, int dl,
                                            int dh) {
  const int c = p >> 1;
  const int k = 2 * (c & 1);  // byte index into the scale words (see below)
  // 6-bit scale/min of sub-blocks j = 2c, 2c+1 (scales s[0..11] in hdr.y..w):
  //   j < 4:  sc = s[j] & 63,  m = s[j+4] & 63
  //   j >= 4: sc = (s[j+4] & 15) | (s[j-4] >> 6) << 4,  m = (s[j+4] >> 4) | (s[j] >> 6) << 4
  // For c < 2, s[j] is byte k of hdr.y and s[j+4] byte k of hdr.z; for c >= 2,
  // s[j+4], s[j-4], s[j] are byte k of hdr.w, hdr.y, hdr.z (k = 2 (c & 1)).
  uint32_t sc0, sc1, m0, m1;
  const uint32_t y0 = Byte(hdr.y, k), y1 = Byte(hdr.y, k + 1);
  const uint32_t z0 = Byte(hdr.z, k), z1 = Byte(hdr.z, k + 1);
  if (c < 2) {
    sc0 = y0 & 63;
    sc1 = y1 & 63;
    m0 = z0 & 63;
    m1 = z1 & 63;
  } else {
    const uint32_t w0 = Byte(hdr.w, k), w1 = Byte(hdr.w, k + 1);
    sc0 = (w0 & 15) | ((y0 >> 6) << 4);
    sc1 = (w1 & 15) | ((y1 >> 6) << 4);
    m0 = (w0 >> 4) | ((z0 >> 6) << 4);
    m1 = (w1 >> 4) | ((z1 >> 6) << 4);
  }
  const float d = Half(hdr.x & 0xFFFFu);
  const float dmin = Half(hdr.x >> 16);
  const int xb = it * 8 + 2 * c;
  const float2 dd = __ldg(reinterpret_cast<const float2*>(x.d + xb));
  float v = d * (static_cast<float>(sc0) * dd.x * static_cast<float>(dl) +
                 static_cast<float>(sc1) * dd.y * static_cast<float>(dh));
  if ((p & 1) == 0) {
    const float2 ss = __ldg(reinterpret_cast<const float2*>(x.s + xb));
    v -= dmin * (static_cast<float>(m0) * ss.x + static_cast<float>(m1) * ss.y);
  }
  return v;
}

// ---------------------------------------------------------------------------
// q4_K (raw GGUF, 144-byte blocks: d f16, dmin f16, scales[12], qs[128]).
//   w = d * sc_j * q - dmin * m_j        (sub-block j of 32 weights, q 4-bit)
//   y_r += d * sum_j sc_j * xd_j * dot(q_j, xq_j)  -  dmin * sum_j m_j * xs_j
// where xd_j, xs_j = xd_j * sum(xq_j) belong to the activation block j covers.
// Step it = block it of the row; lane p (0..7) owns qs[16p, 16p+16): chunk
// c = p/2 of 64 weights, its low nibbles are sub-block 2c elements
// t0..t0+15 (t0 = 16 (p&1)), its high nibbles sub-block 2c+1 elements t0...
// The min term of a sub-block is added once, by the even lane.
struct Q4K {
  struct Regs {
    uint4 hdr;  // d|dmin, scales[0..3], scales[4..7], scales[8..11]
    uint4 qs;   // qs[16p .. 16p+15]
  };
  __device__ static int Steps(const MatVecArgs& a) { return a.n_cols / 256; }
  __device__ static bool Load(Regs& r, const uint8_t* row, const MatVecArgs& a, int it, int p) {
    const uint8_t* blk = row + static_cast<int64_t>(it) * 144;
    r.hdr = LdW16Span(blk);
    r.qs = LdW16Span(blk + 16 + 16 * p);
    return true;
  }
  __device__ static float Dot(const Regs& r, const XView& x, int it, int p) {
    const int c = p >> 1;
    const int t0 = (p & 1) * 16;
    const int8_t* xp = x.q + static_cast<int64_t>(it) * 256 + 64 * c + t0;
    const int4 xl = LdX16(xp);
    const int4 xh = LdX16(xp + 32);
    int dl = 0, dh = 0;
    dl = __dp4a(static_cast<int>(r.qs.x & 0x0F0F0F0Fu), xl.x, dl);
    dl = __dp4a(static_cast<int>(r.qs.y & 0x0F0F0F0Fu), xl.y, dl);
    dl = __dp4a(static_cast<int>(r.qs.z & 0x0F0F0F0Fu), xl.z, dl);
    dl = __dp4a(static_cast<int>(r.qs.w & 0x0F0F0F0Fu), xl.w, dl);
    dh = __dp4a(static_cast<int>((r.qs.x >> 4) & 0x0F0F0F0Fu), xh.x, dh);
    dh = __dp4a(static_cast<int>((r.qs.y >> 4) & 0x0F0F0F0Fu), xh.y, dh);
    dh = __dp4a(static_cast<int>((r.qs.z >> 4) & 0x0F0F0F0Fu), xh.z, dh);
    dh = __dp4a(static_cast<int>((r.qs.w >> 4) & 0x0F0F0F0Fu), xh.w, dh);
    return KScaledSum(r.hdr, x, it, p, dl, dh);
  }
};

// ---------------------------------------------------------------------------
// q6_K, raw GGUF blocks (kDpl = false: 210 B, [ql 128][qh 64][sc 16][d 2]) or
// dpl rows (kDpl = true: planes [ql nbe*128][qh nbe*64][sc nbe*16][d nbe*2]).
//   w = d * sc_s * (q - 32)     (sub-block s of 16 weights, q 6-bit)
//   y_r += sum_blocks d * sum_{q=0..3} sc_{s_q} * xd_{b_q} * dot(q - 32, xq)
// Step it covers blocks 2it and 2it+1; lane p: block 2it + p/4, half
// h = (p/2)&1, columns l0..l0+15 with l0 = 16 (p&1). Within the half, column
// l gives weights l, l+32, l+64, l+96 (quarters q = 0..3), from
// ql[l] / ql[l+32] low nibbles and high nibbles, and qh[l] bit pairs 0,2,4,6;
// quarter q is sub-block s = 8h + l0/16 + 2q and activation block 8b + 4h + q.
// The two layouts differ ONLY in where Load finds the bytes: the registers it
// fills hold identical values, and Dot is shared, so outputs are bitwise equal.
template <bool kDpl>
struct Q6K {
  struct Regs {
    uint32_t qa[4];  // ql[64h + l0 .. +16]
    uint32_t qb[4];  // ql[64h + 32 + l0 .. +16]
    uint32_t qh[4];  // qh[32h + l0 .. +16]
    uint32_t sc[2];  // scales[8h .. 8h+8]
    uint32_t d;      // f16 bits
  };
  __device__ static int Steps(const MatVecArgs& a) { return (a.n_cols / 256 + 1) / 2; }
  __device__ static bool Load(Regs& r, const uint8_t* row, const MatVecArgs& a, int it, int p) {
    const int nbe = a.n_cols / 256;
    const int kb = 2 * it + (p >> 2);
    if (kb >= nbe) return false;
    const int h = (p >> 1) & 1;
    const int l0 = (p & 1) * 16;
    using namespace formats;  // q6_K field sizes and offsets (tensor_layout.h)
    if (kDpl) {
      // 16-byte aligned: plane offsets are multiples of 16 (nbe*128, nbe*192)
      // and rows are 16-byte aligned by the dpl stride.
      const Q6KPlanes pl = Q6KDplPlanes(nbe);
      const uint8_t* ql = row + pl.ql + static_cast<int64_t>(kb) * kQ6KQlBytes + 64 * h + l0;
      const uint4 a4 = LdW16(ql);
      const uint4 b4 = LdW16(ql + 32);
      const uint4 h4 = LdW16(row + pl.qh + kb * kQ6KQhBytes + 32 * h + l0);
      const uint2 s2 = LdW8(row + pl.sc + kb * kQ6KScBytes + 8 * h);
      r.qa[0] = a4.x; r.qa[1] = a4.y; r.qa[2] = a4.z; r.qa[3] = a4.w;
      r.qb[0] = b4.x; r.qb[1] = b4.y; r.qb[2] = b4.z; r.qb[3] = b4.w;
      r.qh[0] = h4.x; r.qh[1] = h4.y; r.qh[2] = h4.z; r.qh[3] = h4.w;
      r.sc[0] = s2.x; r.sc[1] = s2.y;
      r.d = LdW2(row + pl.d + kb * kQ6KDBytes);
    } else {
      const uint8_t* blk = row + static_cast<int64_t>(kb) * kQ6KBlockBytes;
      LdWords2<4>(blk + kQ6KQlOffset + 64 * h + l0, r.qa);
      LdWords2<4>(blk + kQ6KQlOffset + 64 * h + 32 + l0, r.qb);
      LdWords2<4>(blk + kQ6KQhOffset + 32 * h + l0, r.qh);
      LdWords2<2>(blk + kQ6KScOffset + 8 * h, r.sc);
      r.d = LdW2(blk + kQ6KDOffset);
    }
    return true;
  }
  __device__ static float Dot(const Regs& r, const XView& x, int it, int p) {
    const int kb = 2 * it + (p >> 2);
    const int h = (p >> 1) & 1;
    const int l0 = (p & 1) * 16;
    const int i0 = l0 >> 4;
    const int8_t* xp = x.q + static_cast<int64_t>(kb) * 256 + 128 * h + l0;
    const int4 x0 = LdX16(xp);
    const int4 x1 = LdX16(xp + 32);
    const int4 x2 = LdX16(xp + 64);
    const int4 x3 = LdX16(xp + 96);
    const int xw0[4] = {x0.x, x0.y, x0.z, x0.w};
    const int xw1[4] = {x1.x, x1.y, x1.z, x1.w};
    const int xw2[4] = {x2.x, x2.y, x2.z, x2.w};
    const int xw3[4] = {x3.x, x3.y, x3.z, x3.w};
    int d0 = 0, d1 = 0, d2 = 0, d3 = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t a = r.qa[i], b = r.qb[i], hh = r.qh[i];
      const uint32_t v0 = (a & 0x0F0F0F0Fu) | ((hh << 4) & 0x30303030u);
      const uint32_t v1 = (b & 0x0F0F0F0Fu) | ((hh << 2) & 0x30303030u);
      const uint32_t v2 = ((a >> 4) & 0x0F0F0F0Fu) | (hh & 0x30303030u);
      const uint32_t v3 = ((b >> 4) & 0x0F0F0F0Fu) | ((hh >> 2) & 0x30303030u);
      d0 = __dp4a(Q6Signed(v0), xw0[i], d0);
      d1 = __dp4a(Q6Signed(v1), xw1[i], d1);
      d2 = __dp4a(Q6Signed(v2), xw2[i], d2);
      d3 = __dp4a(Q6Signed(v3), xw3[i], d3);
    }
    // Sub-block scale bytes i0 + 2q of scales[8h .. 8h+8] (int8).
    const float s0 = static_cast<float>(static_cast<int8_t>(Byte(r.sc[0], i0)));
    const float s1 = static_cast<float>(static_cast<int8_t>(Byte(r.sc[0], i0 + 2)));
    const float s2 = static_cast<float>(static_cast<int8_t>(Byte(r.sc[1], i0)));
    const float s3 = static_cast<float>(static_cast<int8_t>(Byte(r.sc[1], i0 + 2)));
    const float4 dx = __ldg(reinterpret_cast<const float4*>(x.d + kb * 8 + 4 * h));
    const float d = Half(r.d);
    return d * (s0 * dx.x * static_cast<float>(d0) + s1 * dx.y * static_cast<float>(d1) +
                s2 * dx.z * static_cast<float>(d2) + s3 * dx.w * static_cast<float>(d3));
  }
};

// ---- Shared pieces of the block traits below.

using formats::GgmlType;

// Per byte: the 3-bit q3_K value v (0..7) -> the int8 v - 4 (same trick as
// Q6Signed: v + 0x7C stays below 0x100, and flipping bit 7 subtracts 128).
__device__ __forceinline__ int Q3Signed(uint32_t v) {
  return static_cast<int>((v + 0x7C7C7C7Cu) ^ 0x80808080u);
}

// Per byte: the 4-bit index q (0..15) -> ggml's iq4_nl level kvalues[q] as
// an int8. Two byte permutes look up the low and the high half of the
// 16-entry table with q's low 3 bits; bit 3 picks between them.
__device__ __forceinline__ int Iq4Levels(uint32_t q) {
  constexpr uint32_t kT0 = 0xBFAD9881u;  // -127 -104 -83 -65
  constexpr uint32_t kT1 = 0xF6EADDCFu;  //  -49  -35 -22 -10
  constexpr uint32_t kT2 = 0x26190D01u;  //    1   13  25  38
  constexpr uint32_t kT3 = 0x71594535u;  //   53   69  89 113
  const uint32_t x = q & 0x07070707u;
  const uint32_t y = x | (x >> 4);                     // byte 0: b0 | b1 << 4, byte 2: b2 | b3 << 4
  const uint32_t sel = (y & 0xFFu) | ((y >> 8) & 0xFF00u);  // nibble i: byte i's index
  const uint32_t lo = __byte_perm(kT0, kT1, sel), hi = __byte_perm(kT2, kT3, sel);
  const uint32_t m = ((q >> 3) & 0x01010101u) * 0xFFu;  // 0xFF where the index is >= 8
  return static_cast<int>(lo ^ ((lo ^ hi) & m));
}

// Lane p's 16 + 16 activations of a 32-weight block: elements 0..15 and 16..31.
__device__ __forceinline__ void Block32X(const XView& x, int64_t b, int4* lo, int4* hi) {
  *lo = LdX16(x.q + b * 32);
  *hi = LdX16(x.q + b * 32 + 16);
}
// dot(lo nibbles, x 0..15) + dot(hi nibbles, x 16..31) for values already
// mapped to int8 bytes.
__device__ __forceinline__ int Dot32(const uint32_t (&lo)[4], const uint32_t (&hi)[4], int4 xl, int4 xh) {
  int s = 0;
  s = __dp4a(static_cast<int>(lo[0]), xl.x, s);
  s = __dp4a(static_cast<int>(lo[1]), xl.y, s);
  s = __dp4a(static_cast<int>(lo[2]), xl.z, s);
  s = __dp4a(static_cast<int>(lo[3]), xl.w, s);
  s = __dp4a(static_cast<int>(hi[0]), xh.x, s);
  s = __dp4a(static_cast<int>(hi[1]), xh.y, s);
  s = __dp4a(static_cast<int>(hi[2]), xh.z, s);
  s = __dp4a(static_cast<int>(hi[3]), xh.w, s);
  return s;
}

// ---------------------------------------------------------------------------
// q8_0 (34 B: d f16, qs int8[32]), raw blocks or dpl planes qs | d.
//   y_r += sum_b d_b * xd_b * dot(qs_b, xq_b)
// Step it covers blocks 4it .. 4it + 3: lane p takes half p & 1 (16 weights)
// of block 4it + p / 2, so in the dpl layout the 8 lanes of a row read 128
// contiguous qs bytes with one aligned 16-byte load each (raw blocks are only
// 2-byte aligned: the same words come from funnelled 4-byte loads).
template <bool kDpl>
struct Q8_0 {
  using Row = BlockRow<GgmlType::kQ8_0, kDpl>;
  enum : uint32_t { kQs = 0, kD = 1 };
  struct Regs {
    uint32_t q[4];
    uint32_t d;
  };
  __device__ static int Steps(const MatVecArgs& a) { return (a.n_cols / 32 + 3) / 4; }
  __device__ static bool Load(Regs& r, const uint8_t* row, const MatVecArgs& a, int it, int p) {
    const int b = 4 * it + (p >> 1);
    if (b >= a.n_cols / 32) return false;
    const Row w{row, a.n_cols / 32};
    LdWords<4, Row::Align(kQs)>(w.template Field<kQs>(b) + 16 * (p & 1), r.q);
    r.d = w.template Scale<kD>(b);
    return true;
  }
  __device__ static float Dot(const Regs& r, const XView& x, int it, int p) {
    const int b = 4 * it + (p >> 1);
    const int4 xv = LdX16(x.q + b * 32 + 16 * (p & 1));
    int s = 0;
    s = __dp4a(static_cast<int>(r.q[0]), xv.x, s);
    s = __dp4a(static_cast<int>(r.q[1]), xv.y, s);
    s = __dp4a(static_cast<int>(r.q[2]), xv.z, s);
    s = __dp4a(static_cast<int>(r.q[3]), xv.w, s);
    return Half(r.d) * __ldg(x.d + b) * static_cast<float>(s);
  }
};

// ---------------------------------------------------------------------------
// 4-bit 32-weight blocks, raw or dpl planes qs | d (| m): element j < 16 is
// the low nibble of qs[j], element j + 16 the high nibble. Step it: lane p
// takes block 8it + p (16 qs bytes: one aligned load in the dpl layout).
//   q4_0  (18 B: d, qs[16]):     y_r += sum_b d_b (xd_b dot(q_b, xq_b) - 8 xs_b)
//   iq4_nl (18 B: d, qs[16]):    y_r += sum_b d_b xd_b dot(kvalues[q_b], xq_b)
//   q4_1  (20 B: d, m, qs[16]):  y_r += sum_b d_b xd_b dot(q_b, xq_b) + m_b xs_b
// (xs_b = xd_b * sum(xq_b): the -8 offset and the min cost one multiply.)
template <GgmlType kType, bool kDpl>
struct Nib4 {
  using Row = BlockRow<kType, kDpl>;
  enum : uint32_t { kQs = 0, kD = 1 };  // kD: d (q4_0, iq4_nl) or d | m << 16 (q4_1)
  static constexpr bool kMin = kType == GgmlType::kQ4_1;
  struct Regs {
    uint32_t q[4];
    uint32_t d;
  };
  __device__ static int Steps(const MatVecArgs& a) { return (a.n_cols / 32 + 7) / 8; }
  __device__ static bool Load(Regs& r, const uint8_t* row, const MatVecArgs& a, int it, int p) {
    const int b = 8 * it + p;
    if (b >= a.n_cols / 32) return false;
    const Row w{row, a.n_cols / 32};
    LdWords<4, Row::Align(kQs)>(w.template Field<kQs>(b), r.q);
    r.d = w.template Scale<kD, kMin>(b);
    return true;
  }
  __device__ static float Dot(const Regs& r, const XView& x, int it, int p) {
    const int b = 8 * it + p;
    int4 xl, xh;
    Block32X(x, b, &xl, &xh);
    uint32_t lo[4], hi[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      lo[i] = r.q[i] & 0x0F0F0F0Fu;
      hi[i] = (r.q[i] >> 4) & 0x0F0F0F0Fu;
      if constexpr (kType == GgmlType::kIQ4_NL) {
        lo[i] = static_cast<uint32_t>(Iq4Levels(lo[i]));
        hi[i] = static_cast<uint32_t>(Iq4Levels(hi[i]));
      }
    }
    const float s = static_cast<float>(Dot32(lo, hi, xl, xh));
    const float d = Half(r.d & 0xFFFFu);
    if constexpr (kType == GgmlType::kQ4_0) {
      return d * (__ldg(x.d + b) * s - 8.0f * __ldg(x.s + b));
    } else if constexpr (kMin) {
      return d * __ldg(x.d + b) * s + Half(r.d >> 16) * __ldg(x.s + b);
    } else {
      return d * __ldg(x.d + b) * s;
    }
  }
};

// ---------------------------------------------------------------------------
// 5-bit 32-weight blocks, raw or dpl planes qs | qh | d (| m):
//   q_j = (qs[j] & 15) | ((qh >> j) & 1) << 4,  q_{j+16} = (qs[j] >> 4) | ((qh >> (j+16)) & 1) << 4
//   q5_0 (22 B: d, qh u32, qs[16]):     y_r += sum_b d_b xd_b dot(q_b - 16, xq_b)
//   q5_1 (24 B: d, m, qh u32, qs[16]):  y_r += sum_b d_b xd_b dot(q_b, xq_b) + m_b xs_b
// Step it: lane p takes block 8it + p.
template <GgmlType kType, bool kDpl>
struct Nib5 {
  using Row = BlockRow<kType, kDpl>;
  enum : uint32_t { kQs = 0, kQh = 1, kD = 2 };
  static constexpr bool kMin = kType == GgmlType::kQ5_1;
  struct Regs {
    uint32_t w[5];  // qh, qs[0..3], qs[4..7], qs[8..11], qs[12..15]
    uint32_t d;     // d (q5_0) or d | m << 16 (q5_1)
  };
  __device__ static int Steps(const MatVecArgs& a) { return (a.n_cols / 32 + 7) / 8; }
  __device__ static bool Load(Regs& r, const uint8_t* row, const MatVecArgs& a, int it, int p) {
    const int b = 8 * it + p;
    if (b >= a.n_cols / 32) return false;
    const Row w{row, a.n_cols / 32};
    uint32_t qs[4];
    LdWords<4, Row::Align(kQs)>(w.template Field<kQs>(b), qs);
    r.w[0] = w.template Word<kQh>(b), r.w[1] = qs[0], r.w[2] = qs[1], r.w[3] = qs[2], r.w[4] = qs[3];
    r.d = w.template Scale<kD, kMin>(b);
    return true;
  }
  __device__ static float Dot(const Regs& r, const XView& x, int it, int p) {
    const int b = 8 * it + p;
    int4 xa, xb;
    Block32X(x, b, &xa, &xb);
    const uint32_t qh = r.w[0];
    uint32_t lo[4], hi[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t qs = r.w[1 + i];
      lo[i] = (qs & 0x0F0F0F0Fu) | (Spread4((qh >> (4 * i)) & 15u) << 4);
      hi[i] = ((qs >> 4) & 0x0F0F0F0Fu) | (Spread4((qh >> (16 + 4 * i)) & 15u) << 4);
      if constexpr (!kMin) {
        lo[i] = static_cast<uint32_t>(Q5Signed(lo[i]));
        hi[i] = static_cast<uint32_t>(Q5Signed(hi[i]));
      }
    }
    const float s = static_cast<float>(Dot32(lo, hi, xa, xb));
    const float v = Half(r.d & 0xFFFFu) * __ldg(x.d + b) * s;
    if constexpr (kMin) return v + Half(r.d >> 16) * __ldg(x.s + b);
    return v;
  }
};

// ---------------------------------------------------------------------------
// 2- and 3-bit k-quants (256-weight blocks of 16 sub-blocks of 16), raw or
// dpl planes. Weight i = 128c + 32s + l (c 0..1, s 0..3, l 0..31) takes its
// low 2 bits from (qs[32c + l] >> 2s) & 3, and sub-block k = i / 16.
//   q2_K (84 B: scales[16], qs[64], d, dmin), planes qs | scales | d,dmin:
//     w = d (scales[k] & 15) q - dmin (scales[k] >> 4)
//     y_r += sum d sum_s sc_s xd_s dot_s - dmin sum_s m_s xd_s sum(xq_s)
//   q3_K (110 B: hmask[32], qs[64], scales[12], d), planes hmask | qs | scales | d:
//     q = low - ((hmask[l] >> (4c + s)) & 1 ? 0 : 4), sc_k the signed 6-bit scale
//     y_r += sum d sum_s sc_s xd_s dot(q_s, xq_s)
// Step it covers blocks 2it and 2it + 1 (as q6_K): lane p takes block
// 2it + p / 4, half c = (p / 2) & 1, columns l0 .. l0 + 15 (l0 = 16 (p & 1)):
// 16 qs bytes give its 64 weights (quarters s = 0..3, sub-block 8c + l0/16 +
// 2s, activation block 8b + 4c + s).
template <GgmlType kType, bool kDpl>
struct K23 {
  using Row = BlockRow<kType, kDpl>;
  static constexpr bool kQ3 = kType == GgmlType::kQ3_K;
  // Plane indices (formats::DplPlanesOf).
  static constexpr uint32_t kQs = kQ3 ? 1 : 0;
  static constexpr uint32_t kHmask = 0;           // q3_K
  static constexpr uint32_t kScales = kQ3 ? 2 : 1;
  static constexpr uint32_t kD = 3;               // q3_K: d
  static constexpr uint32_t kDm = 2;              // q2_K: d | dmin << 16
  struct Regs {
    uint32_t qs[4];  // qs[32c + l0 .. +16]
    uint32_t hm[4];  // q3_K: hmask[l0 .. +16]
    uint32_t sc[3];  // q2_K: scales[8c .. 8c + 8] in sc[0..1]; q3_K: scales[0..12]
    uint32_t d;      // q3_K: d; q2_K: d | dmin << 16
  };
  __device__ static int Steps(const MatVecArgs& a) { return (a.n_cols / 256 + 1) / 2; }
  __device__ static bool Load(Regs& r, const uint8_t* row, const MatVecArgs& a, int it, int p) {
    const int nbe = a.n_cols / 256;
    const int b = 2 * it + (p >> 2);
    if (b >= nbe) return false;
    const int c = (p >> 1) & 1, l0 = 16 * (p & 1);
    const Row w{row, nbe};
    LdWords<4, Row::Align(kQs)>(w.template Field<kQs>(b) + 32 * c + l0, r.qs);
    if constexpr (kQ3) {
      LdWords<4, Row::Align(kHmask)>(w.template Field<kHmask>(b) + l0, r.hm);
      LdWords<3, (Row::Align(kScales) < 4 ? Row::Align(kScales) : 4)>(w.template Field<kScales>(b), r.sc);
      r.d = w.template Scale<kD>(b);
    } else {
      uint32_t sc[2];
      LdWords<2, Row::Align(kScales)>(w.template Field<kScales>(b) + 8 * c, sc);
      r.sc[0] = sc[0], r.sc[1] = sc[1], r.sc[2] = 0;
      r.d = w.template Scale<kDm, true>(b);
    }
    return true;
  }
  __device__ static float Dot(const Regs& r, const XView& x, int it, int p) {
    const int b = 2 * it + (p >> 2);
    const int c = (p >> 1) & 1, l0 = 16 * (p & 1), i0 = l0 >> 4;
    const int8_t* xp = x.q + static_cast<int64_t>(b) * 256 + 128 * c + l0;
    const float4 dx = __ldg(reinterpret_cast<const float4*>(x.d + b * 8 + 4 * c));
    const float dxs[4] = {dx.x, dx.y, dx.z, dx.w};
    float acc = 0.f, acc_min = 0.f;
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      const int4 xv = LdX16(xp + 32 * s);
      const int xw[4] = {xv.x, xv.y, xv.z, xv.w};
      int dot = 0, sum = 0;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        uint32_t v = (r.qs[i] >> (2 * s)) & 0x03030303u;
        if constexpr (kQ3) {
          v |= ((r.hm[i] >> (4 * c + s)) & 0x01010101u) << 2;
          dot = __dp4a(Q3Signed(v), xw[i], dot);
        } else {
          dot = __dp4a(static_cast<int>(v), xw[i], dot);
          sum = __dp4a(0x01010101, xw[i], sum);
        }
      }
      const int k = 8 * c + i0 + 2 * s;  // sub-block
      if constexpr (kQ3) {
        const uint32_t lo = (Byte(r.sc[(k % 8) >> 2], (k % 8) & 3) >> (4 * (k / 8))) & 0xFu;
        const uint32_t hi = (Byte(r.sc[2], k % 4) >> (2 * (k / 4))) & 3u;
        const float sc = static_cast<float>(static_cast<int>(lo | (hi << 4)) - 32);
        acc += sc * dxs[s] * static_cast<float>(dot);
      } else {
        const uint32_t sm = Byte(r.sc[(i0 + 2 * s) >> 2], (i0 + 2 * s) & 3);  // scales[8c + i0 + 2s]
        acc += static_cast<float>(sm & 15u) * dxs[s] * static_cast<float>(dot);
        acc_min += static_cast<float>(sm >> 4) * dxs[s] * static_cast<float>(sum);
      }
    }
    if constexpr (kQ3) return Half(r.d) * acc;
    return Half(r.d & 0xFFFFu) * acc - Half(r.d >> 16) * acc_min;
  }
};

// ---------------------------------------------------------------------------
// iq4_xs (136 B: d, scales_h u16, scales_l[4], qs[128]), raw or dpl planes
// qs | d,scales_h,scales_l. Sub-block j (32 weights): low nibbles of
// qs[16j .. 16j + 15] are its elements 0..15, high nibbles 16..31;
//   ls_j = ((scales_l[j / 2] >> 4 (j % 2)) & 15 | ((scales_h >> 2j) & 3) << 4) - 32
//   y_r += sum_b d_b sum_j ls_j xd_j dot(kvalues[q_j], xq_j)
// Step it = block it: lane p takes sub-block p.
template <bool kDpl>
struct IQ4XS {
  using Row = BlockRow<GgmlType::kIQ4_XS, kDpl>;
  enum : uint32_t { kQs = 0, kHdr = 1 };
  struct Regs {
    uint32_t q[4];    // qs[16p .. 16p + 15]
    uint32_t hdr[2];  // d | scales_h << 16, scales_l[0..3]
  };
  __device__ static int Steps(const MatVecArgs& a) { return a.n_cols / 256; }
  __device__ static bool Load(Regs& r, const uint8_t* row, const MatVecArgs& a, int it, int p) {
    const Row w{row, a.n_cols / 256};
    LdWords<4, Row::Align(kQs)>(w.template Field<kQs>(it) + 16 * p, r.q);
    LdWords<2, Row::Align(kHdr)>(w.template Field<kHdr>(it), r.hdr);
    return true;
  }
  __device__ static float Dot(const Regs& r, const XView& x, int it, int p) {
    const int64_t b = static_cast<int64_t>(it) * 8 + p;  // activation block = sub-block
    int4 xl, xh;
    Block32X(x, b, &xl, &xh);
    uint32_t lo[4], hi[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      lo[i] = static_cast<uint32_t>(Iq4Levels(r.q[i] & 0x0F0F0F0Fu));
      hi[i] = static_cast<uint32_t>(Iq4Levels((r.q[i] >> 4) & 0x0F0F0F0Fu));
    }
    const uint32_t ls_lo = (Byte(r.hdr[1], p >> 1) >> (4 * (p & 1))) & 0xFu;
    const uint32_t ls_hi = ((r.hdr[0] >> 16) >> (2 * p)) & 3u;
    const float ls = static_cast<float>(static_cast<int>(ls_lo | (ls_hi << 4)) - 32);
    return Half(r.hdr[0] & 0xFFFFu) * ls * __ldg(x.d + b) * static_cast<float>(Dot32(lo, hi, xl, xh));
  }
};

// ---------------------------------------------------------------------------
// q5_K (raw, 176-byte blocks: d, dmin, scales[12], qh[32], qs[128]): q4_K
// with a fifth bit, bit j of qh[l] for element l of sub-block j. Same lanes
// as Q4K: lane p owns qs[16p, 16p + 16) (chunk c = p / 2: sub-blocks 2c and
// 2c + 1, elements t0 .. t0 + 15, t0 = 16 (p & 1)) and reads qh[t0 .. t0 + 15].
//   y_r += d * sum_j sc_j * xd_j * dot(q_j, xq_j)  -  dmin * sum_j m_j * xs_j
struct Q5K {
  struct Regs {
    uint4 hdr;  // d|dmin, scales[0..3], scales[4..7], scales[8..11]
    uint4 qs;   // qs[16p .. 16p+15]
    uint4 qh;   // qh[t0 .. t0+15]
  };
  __device__ static int Steps(const MatVecArgs& a) { return a.n_cols / 256; }
  __device__ static bool Load(Regs& r, const uint8_t* row, const MatVecArgs& a, int it, int p) {
    const uint8_t* blk = row + static_cast<int64_t>(it) * 176;
    r.hdr = LdW16(blk);
    r.qh = LdW16(blk + 16 + 16 * (p & 1));
    r.qs = LdW16(blk + 48 + 16 * p);
    return true;
  }
  __device__ static float Dot(const Regs& r, const XView& x, int it, int p) {
    const int c = p >> 1;
    const int t0 = (p & 1) * 16;
    const int8_t* xp = x.q + static_cast<int64_t>(it) * 256 + 64 * c + t0;
    const int4 xl = LdX16(xp);
    const int4 xh = LdX16(xp + 32);
    const uint32_t qs[4] = {r.qs.x, r.qs.y, r.qs.z, r.qs.w};
    const uint32_t qh[4] = {r.qh.x, r.qh.y, r.qh.z, r.qh.w};
    uint32_t lo[4], hi[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      lo[i] = (qs[i] & 0x0F0F0F0Fu) | (((qh[i] >> (2 * c)) & 0x01010101u) << 4);
      hi[i] = ((qs[i] >> 4) & 0x0F0F0F0Fu) | (((qh[i] >> (2 * c + 1)) & 0x01010101u) << 4);
    }
    int dl = 0, dh = 0;
    dl = __dp4a(static_cast<int>(lo[0]), xl.x, dl);
    dl = __dp4a(static_cast<int>(lo[1]), xl.y, dl);
    dl = __dp4a(static_cast<int>(lo[2]), xl.z, dl);
    dl = __dp4a(static_cast<int>(lo[3]), xl.w, dl);
    dh = __dp4a(static_cast<int>(hi[0]), xh.x, dh);
    dh = __dp4a(static_cast<int>(hi[1]), xh.y, dh);
    dh = __dp4a(static_cast<int>(hi[2]), xh.z, dh);
    dh = __dp4a(static_cast<int>(hi[3]), xh.w, dh);
    return KScaledSum(r.hdr, x, it, p, dl, dh);
  }
};

// ---------------------------------------------------------------------------
// f32 / f16 / bf16 weights with f32 activations:  y_r += sum_i w_ri * x_i.
// Vector forms: step it, lane p takes 16 bytes at (8it + p) * 16 of the row.
struct F32Vec {
  struct Regs { uint4 w; };
  __device__ static int Steps(const MatVecArgs& a) { return (a.n_cols / 4 + 7) / 8; }
  __device__ static bool Load(Regs& r, const uint8_t* row, const MatVecArgs& a, int it, int p) {
    const int e4 = 8 * it + p;
    if (e4 >= a.n_cols / 4) return false;
    r.w = LdW16(row + static_cast<int64_t>(e4) * 16);
    return true;
  }
  __device__ static float Dot(const Regs& r, const XView& x, int it, int p) {
    const int e4 = 8 * it + p;
    const float4 xv = __ldg(reinterpret_cast<const float4*>(x.f) + e4);
    float v = __uint_as_float(r.w.x) * xv.x;
    v = fmaf(__uint_as_float(r.w.y), xv.y, v);
    v = fmaf(__uint_as_float(r.w.z), xv.z, v);
    v = fmaf(__uint_as_float(r.w.w), xv.w, v);
    return v;
  }
};

__device__ __forceinline__ float Bf16(uint32_t bits) { return __uint_as_float((bits & 0xFFFFu) << 16); }

template <bool kBf16>
struct HalfVec {
  struct Regs { uint4 w; };
  __device__ static float H(uint32_t bits) { return kBf16 ? Bf16(bits) : Half(bits & 0xFFFFu); }
  __device__ static int Steps(const MatVecArgs& a) { return (a.n_cols / 8 + 7) / 8; }
  __device__ static bool Load(Regs& r, const uint8_t* row, const MatVecArgs& a, int it, int p) {
    const int e8 = 8 * it + p;
    if (e8 >= a.n_cols / 8) return false;
    r.w = LdW16(row + static_cast<int64_t>(e8) * 16);
    return true;
  }
  __device__ static float Dot(const Regs& r, const XView& x, int it, int p) {
    const int e8 = 8 * it + p;
    const float4 xa = __ldg(reinterpret_cast<const float4*>(x.f) + 2 * e8);
    const float4 xb = __ldg(reinterpret_cast<const float4*>(x.f) + 2 * e8 + 1);
    float v = H(r.w.x) * xa.x;
    v = fmaf(H(r.w.x >> 16), xa.y, v);
    v = fmaf(H(r.w.y), xa.z, v);
    v = fmaf(H(r.w.y >> 16), xa.w, v);
    v = fmaf(H(r.w.z), xb.x, v);
    v = fmaf(H(r.w.z >> 16), xb.y, v);
    v = fmaf(H(r.w.w), xb.z, v);
    v = fmaf(H(r.w.w >> 16), xb.w, v);
    return v;
  }
};
using F16Vec = HalfVec<false>;
using BF16Vec = HalfVec<true>;

// Scalar forms for rows that are not 16-byte aligned: lane p takes element
// 8it + p (f32 rows are 4-byte aligned, f16 and bf16 rows 2-byte aligned).
template <GgmlType kType>
struct FloatScalar {
  static constexpr bool kHalf = kType != GgmlType::kF32;
  struct Regs { uint32_t w; };
  __device__ static int Steps(const MatVecArgs& a) { return (a.n_cols + 7) / 8; }
  __device__ static bool Load(Regs& r, const uint8_t* row, const MatVecArgs& a, int it, int p) {
    const int e = 8 * it + p;
    if (e >= a.n_cols) return false;
    r.w = kHalf ? LdW2(row + static_cast<int64_t>(e) * 2) : LdW4(row + static_cast<int64_t>(e) * 4);
    return true;
  }
  __device__ static float Dot(const Regs& r, const XView& x, int it, int p) {
    const int e = 8 * it + p;
    const float w = kType == GgmlType::kF32    ? __uint_as_float(r.w)
                    : kType == GgmlType::kBF16 ? Bf16(r.w)
                                               : Half(r.w);
    return w * __ldg(x.f + e);
  }
};

}  // namespace dpl::kernels
