// Device dequantization of ggml weights, bit-identical to formats/dequant.cc
// (the CPU reference): one definition per format of how 8 consecutive
// weights of a row are computed from its blocks (DeviceFormat::Load8), in
// the raw GGUF layout or the dpl split planes (kernels/block_row.cuh finds
// the fields). The prompt GEMM's f16 dequant (kernels/gemm) stores what Load8
// gives; the embedding gather (kernels/ops) does the same per 8 columns;
// float formats also read single elements (FloatElem) where rows are not
// aligned for the vector loads.
//
// Bit-exactness: every float step is an explicit __fmul_rn / __fadd_rn /
// __fsub_rn, which nvcc never contracts into an FMA, so the float32 rounding
// steps are those of formats/dequant.cc (d * sc rounded, then * q rounded,
// then - dmin * m rounded).
//
// Formats: f32, f16, bf16 (raw); q4_0, q4_1, q5_0, q5_1, q8_0, iq4_nl, q2_K,
// q3_K, q6_K, iq4_xs (raw or dpl planes); q4_K, q5_K (raw: 144- and 176-byte
// blocks are 16-byte multiples already). VisitDeviceFormat is the one list.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "formats/ggml_types.h"
#include "formats/tensor_layout.h"
#include "kernels/block_row.cuh"

namespace dpl::kernels {

__device__ __forceinline__ float F16BitsToFloat(uint32_t bits) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
}
__device__ __forceinline__ float Bf16BitsToFloat(uint32_t bits) {
  return __uint_as_float((bits & 0xFFFFu) << 16);
}
__device__ __forceinline__ uint32_t ByteOf(const uint32_t (&w)[2], int i) {
  return (w[i >> 2] >> (8 * (i & 3))) & 0xFFu;
}

// The 16 non-linear levels of iq4_nl and iq4_xs (ggml's kvalues_iq4nl).
__device__ __forceinline__ int Iq4NlValue(uint32_t q) {
  constexpr int8_t kValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                  1,    13,   25,  38,  53,  69,  89,  113};
  return kValues[q & 15];
}

// The 6-bit scale and min of sub-block s (0..7) of a q4_K / q5_K block from
// its 12 packed scale bytes sc8:
//   s < 4:  sc = sc8[s] & 63,  m = sc8[s + 4] & 63
//   s >= 4: sc = (sc8[s + 4] & 15) | (sc8[s - 4] >> 6) << 4,  m = (sc8[s + 4] >> 4) | (sc8[s] >> 6) << 4
__device__ __forceinline__ void KScaleMin(const uint8_t* sc8, int s, int* sc, int* m) {
  if (s < 4) {
    *sc = sc8[s] & 63;
    *m = sc8[s + 4] & 63;
  } else {
    *sc = (sc8[s + 4] & 0xF) | ((sc8[s - 4] >> 6) << 4);
    *m = (sc8[s + 4] >> 4) | ((sc8[s] >> 6) << 4);
  }
}
// d * sc, rounded once (a sub-block's scale or min).
__device__ __forceinline__ float SubScale(float d, int sc) {
  return __fmul_rn(d, static_cast<float>(sc));
}

// Per format: Load8(row, j0, n_cols, v) sets v[i] = weight j0 + i of the
// row (j0 % 8 == 0; the 8 never straddle a sub-block), and kRowAlign is the
// alignment (bytes) the row start must have for its loads.
template <formats::GgmlType kType, bool kDpl>
struct DeviceFormat;

using formats::GgmlType;

template <>
struct DeviceFormat<GgmlType::kF32, false> {
  static constexpr int kRowAlign = 16;
  __device__ static void Load8(const uint8_t* row, int64_t j0, int64_t, float (&v)[8]) {
    const float4* p = reinterpret_cast<const float4*>(row) + j0 / 4;
    const float4 a = __ldg(p), b = __ldg(p + 1);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  }
};

template <bool kBf16>
struct HalfFormat {
  static constexpr int kRowAlign = 16;
  __device__ static void Load8(const uint8_t* row, int64_t j0, int64_t, float (&v)[8]) {
    const uint4 h = __ldg(reinterpret_cast<const uint4*>(row + 2 * j0));
    const uint32_t w[4] = {h.x, h.y, h.z, h.w};
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const uint32_t bits = w[i / 2] >> (16 * (i & 1));
      v[i] = kBf16 ? Bf16BitsToFloat(bits) : F16BitsToFloat(bits);
    }
  }
};
template <>
struct DeviceFormat<GgmlType::kF16, false> : HalfFormat<false> {};
template <>
struct DeviceFormat<GgmlType::kBF16, false> : HalfFormat<true> {};

// Base of the block formats with a field table: row alignment from the
// layout (dpl rows are 16-byte aligned, raw ones as their blocks).
template <GgmlType kType, bool kDpl>
struct BlockFormat {
  using Row = BlockRow<kType, kDpl>;
  static constexpr int kRowAlign = kDpl ? 16 : static_cast<int>(Pow2Factor(Row::kBlockBytes));
  static constexpr int A(uint32_t f) { return static_cast<int>(Row::Align(f)); }
  // 8 bytes at field kF of block b, `off` bytes in (off % 8 == 0).
  template <uint32_t kF>
  __device__ static void Bytes8At(const Row& r, int64_t b, int off, uint32_t (&w)[2]) {
    constexpr int kAlign = A(kF) < 8 ? A(kF) : 8;
    LdWords<2, kAlign>(r.template Field<kF>(b) + off, w);
  }
  template <uint32_t kF>
  __device__ static uint32_t Word(const Row& r, int64_t b) {  // 4 bytes at field kF
    return r.template Word<kF>(b);
  }
  template <uint32_t kF>
  __device__ static uint32_t Half(const Row& r, int64_t b) {  // 2 bytes at field kF
    return r.template Scale<kF>(b);
  }
};

// ---- 32-weight blocks. Element e of a block: nibble formats take the low
// nibble of qs[e] (e < 16) or the high nibble of qs[e - 16].

// q8_0 (34 B: d, qs int8[32]) planes qs | d.  w = d * q
template <bool kDpl>
struct DeviceFormat<GgmlType::kQ8_0, kDpl> : BlockFormat<GgmlType::kQ8_0, kDpl> {
  enum : uint32_t { kQs = 0, kD = 1 };
  using B = BlockFormat<GgmlType::kQ8_0, kDpl>;
  __device__ static void Load8(const uint8_t* row, int64_t j0, int64_t n_cols, float (&v)[8]) {
    const typename B::Row r{row, n_cols / 32};
    const int64_t b = j0 / 32;
    const float d = F16BitsToFloat(B::template Half<kD>(r, b));
    uint32_t q[2];
    B::template Bytes8At<kQs>(r, b, static_cast<int>(j0 % 32), q);
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = __fmul_rn(d, static_cast<float>(static_cast<int8_t>(ByteOf(q, i))));
  }
};

// The nibbles of elements e0 .. e0 + 7 of a nibble block (e0 % 8 == 0), as
// 0..15: qs bytes (e0 % 16) .. + 7, low nibbles for e0 < 16.
__device__ __forceinline__ uint32_t NibbleOf(const uint32_t (&qs)[2], int e0, int i) {
  return (ByteOf(qs, i) >> (e0 < 16 ? 0 : 4)) & 0xFu;
}
// Bit e of the 32-bit qh of q5_0 / q5_1 as the fifth bit (16 or 0).
__device__ __forceinline__ uint32_t HighBitOf(uint32_t qh, int e) { return ((qh >> e) & 1u) << 4; }

// q4_0 (18 B: d, qs[16]) planes qs | d.  w = d * (q - 8)
// iq4_nl (18 B: d, qs[16]) planes qs | d.  w = d * kvalues[q]
template <GgmlType kType, bool kDpl>
struct Nibble32Format : BlockFormat<kType, kDpl> {
  enum : uint32_t { kQs = 0, kD = 1 };
  using B = BlockFormat<kType, kDpl>;
  __device__ static void Load8(const uint8_t* row, int64_t j0, int64_t n_cols, float (&v)[8]) {
    const typename B::Row r{row, n_cols / 32};
    const int64_t b = j0 / 32;
    const int e0 = static_cast<int>(j0 % 32);
    const float d = F16BitsToFloat(B::template Half<kD>(r, b));
    uint32_t qs[2];
    B::template Bytes8At<kQs>(r, b, e0 & 15, qs);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const uint32_t q = NibbleOf(qs, e0, i);
      const int level = kType == GgmlType::kIQ4_NL ? Iq4NlValue(q) : static_cast<int>(q) - 8;
      v[i] = __fmul_rn(d, static_cast<float>(level));
    }
  }
};
template <bool kDpl>
struct DeviceFormat<GgmlType::kQ4_0, kDpl> : Nibble32Format<GgmlType::kQ4_0, kDpl> {};
template <bool kDpl>
struct DeviceFormat<GgmlType::kIQ4_NL, kDpl> : Nibble32Format<GgmlType::kIQ4_NL, kDpl> {};

// q4_1 (20 B: d, m, qs[16]) planes qs | d,m.  w = (d * q) + m
template <bool kDpl>
struct DeviceFormat<GgmlType::kQ4_1, kDpl> : BlockFormat<GgmlType::kQ4_1, kDpl> {
  enum : uint32_t { kQs = 0, kDm = 1 };
  using B = BlockFormat<GgmlType::kQ4_1, kDpl>;
  __device__ static void Load8(const uint8_t* row, int64_t j0, int64_t n_cols, float (&v)[8]) {
    const typename B::Row r{row, n_cols / 32};
    const int64_t b = j0 / 32;
    const int e0 = static_cast<int>(j0 % 32);
    const uint32_t dm = B::template Word<kDm>(r, b);
    const float d = F16BitsToFloat(dm), m = F16BitsToFloat(dm >> 16);
    uint32_t qs[2];
    B::template Bytes8At<kQs>(r, b, e0 & 15, qs);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      v[i] = __fadd_rn(__fmul_rn(d, static_cast<float>(NibbleOf(qs, e0, i))), m);
    }
  }
};

// q5_0 (22 B: d, qh u32, qs[16]) planes qs | qh | d.  w = d * (q - 16)
// q5_1 (24 B: d, m, qh u32, qs[16]) planes qs | qh | d,m.  w = (d * q) + m
// q = nibble | bit e of qh << 4.
template <GgmlType kType, bool kDpl>
struct Nibble5Format : BlockFormat<kType, kDpl> {
  enum : uint32_t { kQs = 0, kQh = 1, kD = 2 };
  static constexpr bool kMin = kType == GgmlType::kQ5_1;
  using B = BlockFormat<kType, kDpl>;
  __device__ static void Load8(const uint8_t* row, int64_t j0, int64_t n_cols, float (&v)[8]) {
    const typename B::Row r{row, n_cols / 32};
    const int64_t b = j0 / 32;
    const int e0 = static_cast<int>(j0 % 32);
    float d, m = 0.f;
    if constexpr (kMin) {
      const uint32_t dm = B::template Word<kD>(r, b);
      d = F16BitsToFloat(dm);
      m = F16BitsToFloat(dm >> 16);
    } else {
      d = F16BitsToFloat(B::template Half<kD>(r, b));
    }
    const uint32_t qh = B::template Word<kQh>(r, b);
    uint32_t qs[2];
    B::template Bytes8At<kQs>(r, b, e0 & 15, qs);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int q = static_cast<int>(NibbleOf(qs, e0, i) | HighBitOf(qh, e0 + i));
      v[i] = kMin ? __fadd_rn(__fmul_rn(d, static_cast<float>(q)), m)
                  : __fmul_rn(d, static_cast<float>(q - 16));
    }
  }
};
template <bool kDpl>
struct DeviceFormat<GgmlType::kQ5_0, kDpl> : Nibble5Format<GgmlType::kQ5_0, kDpl> {};
template <bool kDpl>
struct DeviceFormat<GgmlType::kQ5_1, kDpl> : Nibble5Format<GgmlType::kQ5_1, kDpl> {};

// ---- 256-weight k-quant blocks.

// q4_K (144 B: d, dmin, scales[12], qs[128]) and q5_K (176 B: the same
// header, qh[32], qs[128]), raw. Sub-block s = e / 32: low 4 bits from
// qs[32 (e / 64) + e % 32] (low nibble for even s), q5_K's fifth bit = bit s
// of qh[e % 32].  w = (d * sc) * q - (dmin * m)
template <bool kQ5>
struct Q45KFormat {
  static constexpr int kRowAlign = 16;
  static constexpr int kBlockBytes = kQ5 ? 176 : 144;
  __device__ static void Load8(const uint8_t* row, int64_t j0, int64_t, float (&v)[8]) {
    const uint8_t* b = row + (j0 / 256) * kBlockBytes;
    const int e0 = static_cast<int>(j0 % 256), s = e0 / 32;
    const uint32_t dd = __ldg(reinterpret_cast<const unsigned int*>(b));  // d | dmin << 16
    int sc, m;
    KScaleMin(b + 4, s, &sc, &m);
    const float dl = SubScale(F16BitsToFloat(dd), sc);
    const float ml = SubScale(F16BitsToFloat(dd >> 16), m);
    const uint2 qs = __ldg(reinterpret_cast<const uint2*>(b + (kQ5 ? 48 : 16) + 32 * (e0 / 64) + e0 % 32));
    const uint32_t q4[2] = {qs.x, qs.y};
    uint32_t qh[2] = {0, 0};
    if constexpr (kQ5) {
      const uint2 h = __ldg(reinterpret_cast<const uint2*>(b + 16 + e0 % 32));
      qh[0] = h.x, qh[1] = h.y;
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      int q = static_cast<int>((ByteOf(q4, i) >> ((s & 1) * 4)) & 0xF);
      if constexpr (kQ5) q |= static_cast<int>(((ByteOf(qh, i) >> s) & 1) << 4);
      v[i] = __fsub_rn(__fmul_rn(dl, static_cast<float>(q)), ml);
    }
  }
};
template <>
struct DeviceFormat<GgmlType::kQ4_K, false> : Q45KFormat<false> {};
template <>
struct DeviceFormat<GgmlType::kQ5_K, false> : Q45KFormat<true> {};

// q6_K (210 B: ql[128], qh[64], sc int8[16], d) planes ql | qh | sc | d.
// Element e: half hf = e / 128, quarter t = (e % 128) / 32, l = e % 32:
//   q = ((ql[64hf + l + 32(t&1)] >> 4(t>>1)) & 0xF) | ((qh[32hf + l] >> 2t) & 3) << 4
//   w = (d * sc[8hf + l/16 + 2t]) * (q - 32)
// Elements e0 .. e0 + 7 share hf, t and l / 16: consecutive ql and qh bytes,
// one scale.
template <bool kDpl>
struct DeviceFormat<GgmlType::kQ6_K, kDpl> : BlockFormat<GgmlType::kQ6_K, kDpl> {
  enum : uint32_t { kQl = 0, kQh = 1, kSc = 2, kD = 3 };
  using B = BlockFormat<GgmlType::kQ6_K, kDpl>;
  __device__ static void Load8(const uint8_t* row, int64_t j0, int64_t n_cols, float (&v)[8]) {
    const typename B::Row r{row, n_cols / 256};
    const int64_t b = j0 / 256;
    const int e0 = static_cast<int>(j0 % 256);
    const int hf = e0 / 128, t = (e0 % 128) / 32, l = e0 % 32;
    uint32_t ql[2], qh[2];
    B::template Bytes8At<kQl>(r, b, 64 * hf + l + 32 * (t & 1), ql);
    B::template Bytes8At<kQh>(r, b, 32 * hf + l, qh);
    const int8_t sc = static_cast<int8_t>(*(r.template Field<kSc>(b) + 8 * hf + l / 16 + 2 * t));
    const float ds = SubScale(F16BitsToFloat(B::template Half<kD>(r, b)), sc);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const uint32_t lo = (ByteOf(ql, i) >> (4 * (t >> 1))) & 0xF;
      const uint32_t hi = (ByteOf(qh, i) >> (2 * t)) & 3;
      v[i] = __fmul_rn(ds, static_cast<float>(static_cast<int>(lo | (hi << 4)) - 32));
    }
  }
};

// q3_K (110 B: hmask[32], qs[64], scales[12], d) planes hmask | qs | scales | d.
// Element e = 128c + 32s + l: low 2 bits (qs[32c + l] >> 2s) & 3, high bit
// (hmask[l] >> (4c + s)) & 1, q = low - (high ? 0 : 4); sub-block k = e / 16
// has the signed 6-bit scale
//   sc_k = ((scales[k % 8] >> 4 (k / 8)) & 15 | ((scales[8 + k % 4] >> 2 (k / 4)) & 3) << 4) - 32.
//   w = (d * sc_k) * q
template <bool kDpl>
struct DeviceFormat<GgmlType::kQ3_K, kDpl> : BlockFormat<GgmlType::kQ3_K, kDpl> {
  enum : uint32_t { kHmask = 0, kQs = 1, kScales = 2, kD = 3 };
  using B = BlockFormat<GgmlType::kQ3_K, kDpl>;
  __device__ static void Load8(const uint8_t* row, int64_t j0, int64_t n_cols, float (&v)[8]) {
    const typename B::Row r{row, n_cols / 256};
    const int64_t b = j0 / 256;
    const int e0 = static_cast<int>(j0 % 256);
    const int c = e0 / 128, s = (e0 % 128) / 32, l = e0 % 32, k = e0 / 16;
    uint32_t qs[2], hm[2];
    B::template Bytes8At<kQs>(r, b, 32 * c + l, qs);
    B::template Bytes8At<kHmask>(r, b, l, hm);
    const uint8_t* scales = r.template Field<kScales>(b);
    const int lo = (scales[k % 8] >> (4 * (k / 8))) & 0xF;
    const int hi = (scales[8 + k % 4] >> (2 * (k / 4))) & 3;
    const float dl = SubScale(F16BitsToFloat(B::template Half<kD>(r, b)), (lo | (hi << 4)) - 32);
    const int bit = 4 * c + s;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int low = static_cast<int>((ByteOf(qs, i) >> (2 * s)) & 3);
      const int q = low - (((ByteOf(hm, i) >> bit) & 1) ? 0 : 4);
      v[i] = __fmul_rn(dl, static_cast<float>(q));
    }
  }
};

// q2_K (84 B: scales[16], qs[64], d, dmin) planes qs | scales | d,dmin.
// Element e = 128c + 32s + l: q = (qs[32c + l] >> 2s) & 3; sub-block k = e / 16
// has scale scales[k] & 15 and min scales[k] >> 4.
//   w = (d * sc_k) * q - (dmin * m_k)
template <bool kDpl>
struct DeviceFormat<GgmlType::kQ2_K, kDpl> : BlockFormat<GgmlType::kQ2_K, kDpl> {
  enum : uint32_t { kQs = 0, kScales = 1, kDm = 2 };
  using B = BlockFormat<GgmlType::kQ2_K, kDpl>;
  __device__ static void Load8(const uint8_t* row, int64_t j0, int64_t n_cols, float (&v)[8]) {
    const typename B::Row r{row, n_cols / 256};
    const int64_t b = j0 / 256;
    const int e0 = static_cast<int>(j0 % 256);
    const int c = e0 / 128, s = (e0 % 128) / 32, l = e0 % 32, k = e0 / 16;
    uint32_t qs[2];
    B::template Bytes8At<kQs>(r, b, 32 * c + l, qs);
    const uint32_t sm = *(r.template Field<kScales>(b) + k);
    const uint32_t dm = B::template Word<kDm>(r, b);
    const float dl = SubScale(F16BitsToFloat(dm), static_cast<int>(sm & 0xF));
    const float ml = SubScale(F16BitsToFloat(dm >> 16), static_cast<int>(sm >> 4));
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int q = static_cast<int>((ByteOf(qs, i) >> (2 * s)) & 3);
      v[i] = __fsub_rn(__fmul_rn(dl, static_cast<float>(q)), ml);
    }
  }
};

// iq4_xs (136 B: d, scales_h u16, scales_l[4], qs[128]) planes qs | d,scales_h,scales_l.
// Sub-block j = e / 32: ls = ((scales_l[j / 2] >> 4 (j % 2)) & 15 | ((scales_h >> 2j) & 3) << 4) - 32;
// element e % 32 < 16 is the low nibble of qs[16j + e % 16], else the high one.
//   w = (d * ls) * kvalues[q]
template <bool kDpl>
struct DeviceFormat<GgmlType::kIQ4_XS, kDpl> : BlockFormat<GgmlType::kIQ4_XS, kDpl> {
  enum : uint32_t { kQs = 0, kHdr = 1 };
  using B = BlockFormat<GgmlType::kIQ4_XS, kDpl>;
  __device__ static void Load8(const uint8_t* row, int64_t j0, int64_t n_cols, float (&v)[8]) {
    const typename B::Row r{row, n_cols / 256};
    const int64_t b = j0 / 256;
    const int e0 = static_cast<int>(j0 % 256), j = e0 / 32, e = e0 % 32;
    uint32_t hdr[2], qs[2];
    B::template Bytes8At<kHdr>(r, b, 0, hdr);  // d | scales_h << 16, scales_l[0..3]
    B::template Bytes8At<kQs>(r, b, 16 * j + (e & 15), qs);
    const int lo = (ByteOf(hdr, 4 + j / 2) >> (4 * (j % 2))) & 0xF;
    const int hi = ((hdr[0] >> 16) >> (2 * j)) & 3;
    const float dl = SubScale(F16BitsToFloat(hdr[0]), (lo | (hi << 4)) - 32);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      v[i] = __fmul_rn(dl, static_cast<float>(Iq4NlValue(NibbleOf(qs, e, i))));
    }
  }
};

// Whether a format is a plain float (f32, f16, bf16): read one element at a
// time where a row is not aligned for Load8's vector loads.
constexpr bool IsFloatFormat(GgmlType t) {
  return t == GgmlType::kF32 || t == GgmlType::kF16 || t == GgmlType::kBF16;
}

// Element j of one row of a float format (row: the row's first byte; byte
// loads, so any 2- or 4-aligned row). Block formats have no per-element
// path: their rows are always aligned (whole blocks from a 256-byte aligned
// tensor) and go through Load8.
template <GgmlType kType>
__device__ float FloatElem(const uint8_t* row, int64_t j) {
  static_assert(IsFloatFormat(kType), "FloatElem: f32, f16 or bf16 only");
  if constexpr (kType == GgmlType::kF32) {
    return reinterpret_cast<const float*>(row)[j];
  } else if constexpr (kType == GgmlType::kF16) {
    return F16BitsToFloat(static_cast<uint32_t>(row[2 * j] | (row[2 * j + 1] << 8)));
  } else {
    return Bf16BitsToFloat(static_cast<uint32_t>(row[2 * j] | (row[2 * j + 1] << 8)));
  }
}

// The device formats, listed once: calls f(type, dpl) with
// std::integral_constant<GgmlType, T> and std::bool_constant<kDpl> for the
// (type, layout) of a weight tensor and returns what it returns; a
// combination without a device dequantizer is an error naming `who`, the
// type and the layout.
template <class F>
absl::Status VisitDeviceFormat(GgmlType type, formats::TensorLayout layout, const char* who, F&& f) {
  using formats::TensorLayout;
  const bool dpl = layout == TensorLayout::kDpl;
  if (layout != TensorLayout::kRaw && !dpl) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": unknown tensor layout ", static_cast<uint32_t>(layout)));
  }
  auto both = [&](auto t) -> absl::Status {
    if (dpl) return f(t, std::true_type{});
    return f(t, std::false_type{});
  };
  auto raw_only = [&](auto t) -> absl::Status {
    if (dpl) {
      return absl::InvalidArgumentError(absl::StrCat(
          who, ": type ", formats::TraitsOf(type).name, " has no dpl layout"));
    }
    return f(t, std::false_type{});
  };
  using T = GgmlType;
  switch (type) {
    case T::kF32: return raw_only(std::integral_constant<T, T::kF32>{});
    case T::kF16: return raw_only(std::integral_constant<T, T::kF16>{});
    case T::kBF16: return raw_only(std::integral_constant<T, T::kBF16>{});
    case T::kQ4_K: return raw_only(std::integral_constant<T, T::kQ4_K>{});
    case T::kQ5_K: return raw_only(std::integral_constant<T, T::kQ5_K>{});
    case T::kQ8_0: return both(std::integral_constant<T, T::kQ8_0>{});
    case T::kQ4_0: return both(std::integral_constant<T, T::kQ4_0>{});
    case T::kQ4_1: return both(std::integral_constant<T, T::kQ4_1>{});
    case T::kQ5_0: return both(std::integral_constant<T, T::kQ5_0>{});
    case T::kQ5_1: return both(std::integral_constant<T, T::kQ5_1>{});
    case T::kIQ4_NL: return both(std::integral_constant<T, T::kIQ4_NL>{});
    case T::kQ2_K: return both(std::integral_constant<T, T::kQ2_K>{});
    case T::kQ3_K: return both(std::integral_constant<T, T::kQ3_K>{});
    case T::kQ6_K: return both(std::integral_constant<T, T::kQ6_K>{});
    case T::kIQ4_XS: return both(std::integral_constant<T, T::kIQ4_XS>{});
    default:
      return absl::UnimplementedError(absl::StrCat(who, ": no device dequantization for type ",
                                                   formats::TraitsOf(type).name));
  }
}

}  // namespace dpl::kernels
