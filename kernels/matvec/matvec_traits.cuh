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
#include "kernels/matvec/matvec_kernels.h"

namespace dpl::kernels {

// ---- Weight loads: read-only, streamed once, so they bypass L1 allocation
// (no_allocate) and leave L1 to the activations every row re-reads.
__device__ __forceinline__ uint4 LdW16(const uint8_t* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}
__device__ __forceinline__ uint2 LdW8(const uint8_t* p) {
  uint2 v;
  asm("ld.global.nc.L1::no_allocate.v2.u32 {%0,%1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}
__device__ __forceinline__ uint32_t LdW4(const uint8_t* p) {
  uint32_t v;
  asm("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
}
__device__ __forceinline__ uint32_t LdW2(const uint8_t* p) {
  unsigned short v;
  asm("ld.global.nc.L1::no_allocate.u16 %0, [%1];" : "=h"(v) : "l"(p));
  return v;
}

// N little-endian 32-bit words starting at a 2-byte aligned address p (raw
// q8_0/q5_0/q6_K blocks have 34/22/210-byte strides, so their fields are only
// 2-byte aligned). Reads the aligned words covering [p, p + 4N) and funnels
// them together; the extra word is read only when p is not 4-aligned, and it
// is the aligned word holding p's last bytes, so it never leaves the row.
template <int N>
__device__ __forceinline__ void LdWords2(const uint8_t* p, uint32_t (&w)[N]) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  const uint8_t* base = reinterpret_cast<const uint8_t*>(a & ~uintptr_t{3});
  const uint32_t shift = static_cast<uint32_t>(a & 2) * 8;  // 0 or 16
  uint32_t cur = LdW4(base);
#pragma unroll
  for (int i = 0; i < N; ++i) {
    uint32_t nxt = 0;
    if (i + 1 < N) {
      nxt = LdW4(base + 4 * (i + 1));
    } else if (shift != 0) {
      nxt = LdW4(base + 4 * N);
    }
    w[i] = __funnelshift_r(cur, nxt, shift);  // (nxt:cur) >> shift
    cur = nxt;
  }
}

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
    r.hdr = LdW16(blk);
    r.qs = LdW16(blk + 16 + 16 * p);
    return true;
  }
  __device__ static float Dot(const Regs& r, const XView& x, int it, int p) {
    const int c = p >> 1;
    const int t0 = (p & 1) * 16;
    const int k = 2 * (c & 1);  // byte index into the scale words (see below)
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
    // 6-bit scale/min of sub-blocks j = 2c, 2c+1 (scales s[0..11] in hdr.y..w):
    //   j < 4:  sc = s[j] & 63,  m = s[j+4] & 63
    //   j >= 4: sc = (s[j+4] & 15) | (s[j-4] >> 6) << 4,  m = (s[j+4] >> 4) | (s[j] >> 6) << 4
    // For c < 2, s[j] is byte k of hdr.y and s[j+4] byte k of hdr.z; for c >= 2,
    // s[j+4], s[j-4], s[j] are byte k of hdr.w, hdr.y, hdr.z (k = 2 (c & 1)).
    uint32_t sc0, sc1, m0, m1;
    const uint32_t y0 = Byte(r.hdr.y, k), y1 = Byte(r.hdr.y, k + 1);
    const uint32_t z0 = Byte(r.hdr.z, k), z1 = Byte(r.hdr.z, k + 1);
    if (c < 2) {
      sc0 = y0 & 63;
      sc1 = y1 & 63;
      m0 = z0 & 63;
      m1 = z1 & 63;
    } else {
      const uint32_t w0 = Byte(r.hdr.w, k), w1 = Byte(r.hdr.w, k + 1);
      sc0 = (w0 & 15) | ((y0 >> 6) << 4);
      sc1 = (w1 & 15) | ((y1 >> 6) << 4);
      m0 = (w0 >> 4) | ((z0 >> 6) << 4);
      m1 = (w1 >> 4) | ((z1 >> 6) << 4);
    }
    const float d = Half(r.hdr.x & 0xFFFFu);
    const float dmin = Half(r.hdr.x >> 16);
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

// ---------------------------------------------------------------------------
// q8_0 (raw, 34-byte blocks: d f16, qs int8[32]).
//   y_r += sum_b d_b * xd_b * dot(qs_b, xq_b)
// Step it: lane p takes block 8it + p (the 8 lanes read 272 contiguous bytes).
struct Q8_0 {
  struct Regs {
    uint32_t q[8];
    uint32_t d;
  };
  __device__ static int Steps(const MatVecArgs& a) { return (a.n_cols / 32 + 7) / 8; }
  __device__ static bool Load(Regs& r, const uint8_t* row, const MatVecArgs& a, int it, int p) {
    const int kb = 8 * it + p;
    if (kb >= a.n_cols / 32) return false;
    const uint8_t* blk = row + static_cast<int64_t>(kb) * 34;
    r.d = LdW2(blk);
    LdWords2<8>(blk + 2, r.q);
    return true;
  }
  __device__ static float Dot(const Regs& r, const XView& x, int it, int p) {
    const int kb = 8 * it + p;
    const int4 xa = LdX16(x.q + kb * 32);
    const int4 xb = LdX16(x.q + kb * 32 + 16);
    int s = 0;
    s = __dp4a(static_cast<int>(r.q[0]), xa.x, s);
    s = __dp4a(static_cast<int>(r.q[1]), xa.y, s);
    s = __dp4a(static_cast<int>(r.q[2]), xa.z, s);
    s = __dp4a(static_cast<int>(r.q[3]), xa.w, s);
    s = __dp4a(static_cast<int>(r.q[4]), xb.x, s);
    s = __dp4a(static_cast<int>(r.q[5]), xb.y, s);
    s = __dp4a(static_cast<int>(r.q[6]), xb.z, s);
    s = __dp4a(static_cast<int>(r.q[7]), xb.w, s);
    return Half(r.d) * __ldg(x.d + kb) * static_cast<float>(s);
  }
};

// ---------------------------------------------------------------------------
// q5_0 (raw, 22-byte blocks: d f16, qh u32, qs[16]).
//   q_j = (qs[j] & 15) | ((qh >> j) & 1) << 4,  q_{j+16} = (qs[j] >> 4) | ((qh >> (j+16)) & 1) << 4
//   y_r += sum_b d_b * xd_b * dot(q_b - 16, xq_b)
// Step it: lane p takes block 8it + p.
struct Q5_0 {
  struct Regs {
    uint32_t w[5];  // qh, qs[0..3], qs[4..7], qs[8..11], qs[12..15]
    uint32_t d;
  };
  __device__ static int Steps(const MatVecArgs& a) { return (a.n_cols / 32 + 7) / 8; }
  __device__ static bool Load(Regs& r, const uint8_t* row, const MatVecArgs& a, int it, int p) {
    const int kb = 8 * it + p;
    if (kb >= a.n_cols / 32) return false;
    const uint8_t* blk = row + static_cast<int64_t>(kb) * 22;
    r.d = LdW2(blk);
    LdWords2<5>(blk + 2, r.w);
    return true;
  }
  __device__ static float Dot(const Regs& r, const XView& x, int it, int p) {
    const int kb = 8 * it + p;
    const int4 xa = LdX16(x.q + kb * 32);       // elements 0..15
    const int4 xb = LdX16(x.q + kb * 32 + 16);  // elements 16..31
    const int xl[4] = {xa.x, xa.y, xa.z, xa.w};
    const int xh[4] = {xb.x, xb.y, xb.z, xb.w};
    const uint32_t qh = r.w[0];
    int s = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t qs = r.w[1 + i];
      const uint32_t lo = (qs & 0x0F0F0F0Fu) | (Spread4((qh >> (4 * i)) & 15u) << 4);
      const uint32_t hi = ((qs >> 4) & 0x0F0F0F0Fu) | (Spread4((qh >> (16 + 4 * i)) & 15u) << 4);
      s = __dp4a(Q5Signed(lo), xl[i], s);
      s = __dp4a(Q5Signed(hi), xh[i], s);
    }
    return Half(r.d) * __ldg(x.d + kb) * static_cast<float>(s);
  }
};

// ---------------------------------------------------------------------------
// f32 / f16 weights with f32 activations:  y_r += sum_i w_ri * x_i.
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

struct F16Vec {
  struct Regs { uint4 w; };
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
    float v = Half(r.w.x & 0xFFFFu) * xa.x;
    v = fmaf(Half(r.w.x >> 16), xa.y, v);
    v = fmaf(Half(r.w.y & 0xFFFFu), xa.z, v);
    v = fmaf(Half(r.w.y >> 16), xa.w, v);
    v = fmaf(Half(r.w.z & 0xFFFFu), xb.x, v);
    v = fmaf(Half(r.w.z >> 16), xb.y, v);
    v = fmaf(Half(r.w.w & 0xFFFFu), xb.z, v);
    v = fmaf(Half(r.w.w >> 16), xb.w, v);
    return v;
  }
};

// Scalar forms for rows that are not 16-byte aligned: lane p takes element
// 8it + p (f32 rows are 4-byte aligned, f16 rows 2-byte aligned).
template <bool kHalf>
struct FloatScalar {
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
    const float w = kHalf ? Half(r.w) : __uint_as_float(r.w);
    return w * __ldg(x.f + e);
  }
};

}  // namespace dpl::kernels
