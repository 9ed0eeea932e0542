// Device dequantization of ggml weights, bit-identical to formats/dequant.cc
// (the CPU reference): one definition per format of where its fields are and
// how a weight is computed from them. The embedding gather (kernels/ops) reads
// single elements through DequantElem; the prompt GEMM's f16 dequant
// (kernels/gemm) loads 8 weights at a time with wider loads but computes each
// through the same per-format functions below.
//
// Bit-exactness: every float step is an explicit __fmul_rn / __fsub_rn, which
// nvcc never contracts into an FMA, so the float32 rounding steps are those of
// formats/dequant.cc (d * sc rounded, then * q rounded, then - dmin * m
// rounded). Formats: f32, f16, bf16, q8_0, q5_0, q4_K, q6_K (raw GGUF blocks
// or the dpl split-plane layout of formats/tensor_layout.h).
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "formats/ggml_types.h"
#include "formats/tensor_layout.h"

namespace dpl::kernels {

// ---- Scalar loads. Byte loads: q8_0 (34 B) and q5_0 (22 B) blocks, and raw
// q6_K (210 B) blocks, are only 2-byte aligned, and a row may be less.
__device__ __forceinline__ float F16BitsToFloat(uint32_t bits) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
}
__device__ __forceinline__ float Bf16BitsToFloat(uint32_t bits) {
  return __uint_as_float((bits & 0xFFFFu) << 16);
}
__device__ __forceinline__ float LoadF16(const uint8_t* p) {
  return F16BitsToFloat(static_cast<uint32_t>(p[0] | (p[1] << 8)));
}

// ---- q8_0: 34-byte blocks of 32 weights: d f16, qs int8[32].  w = d * q
inline constexpr int kQ8_0BlockBytes = 34;
__device__ __forceinline__ float Q8_0Weight(float d, int8_t q) {
  return __fmul_rn(d, static_cast<float>(q));
}

// ---- q5_0: 22-byte blocks of 32 weights: d f16, qh u32 (LE), qs u8[16].
// Element e (0..31): low nibble of qs[e] (e < 16) or high nibble of
// qs[e - 16], fifth bit = bit e of qh.  w = d * (q - 16)
inline constexpr int kQ5_0BlockBytes = 22;
__device__ __forceinline__ int Q5_0Quant(uint32_t qs_byte, uint32_t qh, int e) {
  const uint32_t nib = e < 16 ? (qs_byte & 0xF) : (qs_byte >> 4);
  return static_cast<int>(nib | (((qh >> e) & 1) << 4));
}
__device__ __forceinline__ float Q5_0Weight(float d, int q) {
  return __fmul_rn(d, static_cast<float>(q - 16));
}

// ---- q4_K: 144-byte blocks of 256 weights: d f16, dmin f16, scales u8[12],
// qs u8[128]. Sub-block s = e / 32 has a 6-bit scale sc and min m; its 4-bit
// q is the low (even s) or high (odd s) nibble of qs[32 (e / 64) + e % 32].
//   w = (d * sc) * q - (dmin * m)
inline constexpr int kQ4KBlockBytes = 144;
__device__ __forceinline__ void Q4KScaleMin(const uint8_t* sc8, int s, int* sc, int* m) {
  if (s < 4) {
    *sc = sc8[s] & 63;
    *m = sc8[s + 4] & 63;
  } else {
    *sc = (sc8[s + 4] & 0xF) | ((sc8[s - 4] >> 6) << 4);
    *m = (sc8[s + 4] >> 4) | ((sc8[s] >> 6) << 4);
  }
}
__device__ __forceinline__ int Q4KQuant(uint32_t qs_byte, int s) {
  return static_cast<int>((qs_byte >> ((s & 1) * 4)) & 0xF);
}
// dl = d * sc and ml = dmin * m, once per sub-block.
__device__ __forceinline__ float KSubScale(float d, int sc) {
  return __fmul_rn(d, static_cast<float>(sc));
}
__device__ __forceinline__ float Q4KWeight(float dl, float ml, int q) {
  return __fsub_rn(__fmul_rn(dl, static_cast<float>(q)), ml);
}

// ---- q6_K: 256 weights from ql u8[128], qh u8[64], sc int8[16], d f16 (one
// raw 210-byte block, or index blk of each dpl plane). Element e: half
// hf = e / 128, quarter t = (e % 128) / 32, l = e % 32:
//   q = ((ql[64hf + l + 32(t&1)] >> 4(t>>1)) & 0xF) | ((qh[32hf + l] >> 2t) & 3) << 4
//   w = (d * sc[8hf + l/16 + 2t]) * (q - 32)
struct Q6KFields {
  const uint8_t* ql;
  const uint8_t* qh;
  const uint8_t* sc;
  const uint8_t* d;
};
// Block blk of a row of n_cols weights.
template <bool kDpl>
__device__ __forceinline__ Q6KFields Q6KBlock(const uint8_t* row, int64_t blk, int64_t n_cols) {
  if constexpr (kDpl) {
    const formats::Q6KPlanes pl = formats::Q6KDplPlanes(static_cast<uint64_t>(n_cols / 256));
    return {row + pl.ql + blk * formats::kQ6KQlBytes, row + pl.qh + blk * formats::kQ6KQhBytes,
            row + pl.sc + blk * formats::kQ6KScBytes, row + pl.d + blk * formats::kQ6KDBytes};
  } else {
    const uint8_t* b = row + blk * formats::kQ6KBlockBytes;
    return {b + formats::kQ6KQlOffset, b + formats::kQ6KQhOffset, b + formats::kQ6KScOffset,
            b + formats::kQ6KDOffset};
  }
}
// Byte offsets inside the ql / qh / sc fields of element e's values.
__device__ __forceinline__ int Q6KQlIndex(int e) {
  return 64 * (e / 128) + e % 32 + 32 * (((e % 128) / 32) & 1);
}
__device__ __forceinline__ int Q6KQhIndex(int e) { return 32 * (e / 128) + e % 32; }
__device__ __forceinline__ int Q6KScIndex(int e) {
  return 8 * (e / 128) + (e % 32) / 16 + 2 * ((e % 128) / 32);
}
// The 6-bit q (0..63) of element e from its ql and qh bytes.
__device__ __forceinline__ int Q6KQuant(uint32_t ql_byte, uint32_t qh_byte, int e) {
  const int t = (e % 128) / 32;
  const uint32_t lo = (ql_byte >> (4 * (t >> 1))) & 0xF;
  const uint32_t hi = (qh_byte >> (2 * t)) & 3;
  return static_cast<int>(lo | (hi << 4));
}
__device__ __forceinline__ float Q6KSubScale(float d, int8_t sc) {
  return __fmul_rn(d, static_cast<float>(sc));
}
__device__ __forceinline__ float Q6KWeight(float ds, int q) {
  return __fmul_rn(ds, static_cast<float>(q - 32));
}

// Element j of one row of n_cols weights (row: the row's first byte).
template <formats::GgmlType kType, bool kDpl>
__device__ float DequantElem(const uint8_t* row, int64_t j, int64_t n_cols) {
  using formats::GgmlType;
  if constexpr (kType == GgmlType::kF32) {
    return reinterpret_cast<const float*>(row)[j];
  } else if constexpr (kType == GgmlType::kF16) {
    return LoadF16(row + 2 * j);
  } else if constexpr (kType == GgmlType::kBF16) {
    return Bf16BitsToFloat(static_cast<uint32_t>(row[2 * j] | (row[2 * j + 1] << 8)));
  } else if constexpr (kType == GgmlType::kQ8_0) {
    const uint8_t* b = row + (j / 32) * kQ8_0BlockBytes;
    return Q8_0Weight(LoadF16(b), static_cast<int8_t>(b[2 + j % 32]));
  } else if constexpr (kType == GgmlType::kQ5_0) {
    const uint8_t* b = row + (j / 32) * kQ5_0BlockBytes;
    const int e = static_cast<int>(j % 32);
    const uint32_t qh = b[2] | (b[3] << 8) | (b[4] << 16) | (static_cast<uint32_t>(b[5]) << 24);
    return Q5_0Weight(LoadF16(b), Q5_0Quant(b[6 + (e & 15)], qh, e));
  } else if constexpr (kType == GgmlType::kQ4_K) {
    const uint8_t* b = row + (j / 256) * kQ4KBlockBytes;
    const int e = static_cast<int>(j % 256), s = e / 32;
    int sc, m;
    Q4KScaleMin(b + 4, s, &sc, &m);
    const int q = Q4KQuant(b[16 + 32 * (e / 64) + e % 32], s);
    return Q4KWeight(KSubScale(LoadF16(b), sc), KSubScale(LoadF16(b + 2), m), q);
  } else {
    static_assert(kType == GgmlType::kQ6_K, "DequantElem: no device dequant for this type");
    const Q6KFields f = Q6KBlock<kDpl>(row, j / 256, n_cols);
    const int e = static_cast<int>(j % 256);
    const int q = Q6KQuant(f.ql[Q6KQlIndex(e)], f.qh[Q6KQhIndex(e)], e);
    return Q6KWeight(Q6KSubScale(LoadF16(f.d), static_cast<int8_t>(f.sc[Q6KScIndex(e)])), q);
  }
}

}  // namespace dpl::kernels
