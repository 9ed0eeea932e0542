// Where a weight row's bytes are, for device code: the fields of block i of
// a row in either layout (raw GGUF blocks or the dpl split planes of
// formats/tensor_layout.h), their alignment, and the read-only loads that
// alignment allows. The dequantizers (dequant.cuh) and the matvec traits
// (matvec/matvec_traits.cuh) both read blocks through BlockRow, so a type's
// raw and dpl layouts differ only in the address of each field: the values
// loaded are identical, and so are the results, bit for bit.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "formats/ggml_types.h"
#include "formats/tensor_layout.h"

namespace dpl::kernels {

// ---- Read-only weight loads. Streamed once, so they bypass L1 allocation
// (no_allocate) and leave L1 to the activations every row re-reads.
__device__ __forceinline__ uint4 LdW16(const uint8_t* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}
// The same load with the L2::256B prefetch hint: a miss fetches the whole
// 256-byte span (8 sectors) holding p, not only p's sectors. Why: a q4_K
// warp step reads four rows' 144-byte blocks at a row stride apart, so the
// next step's bytes of each row are in the span already requested.
// Measured on the H200 (probe sweep, 2026-12-02, q4_K, best geometry):
// 3584x18944 17.5 -> 16.2 us, 5120x13824 16.1 -> 15.1, 37888x3584 27.0 ->
// 26.1; on q6_K dpl rows it costs 1-4% (19.1 -> 19.3, 111 -> 116 us), so
// only the q4_K trait uses it.
__device__ __forceinline__ uint4 LdW16Span(const uint8_t* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
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

// N words at p, which is kAlign-byte aligned (2, 4, 8 or 16): the widest
// loads that alignment allows. Same words whatever kAlign.
template <int N, int kAlign>
__device__ __forceinline__ void LdWords(const uint8_t* p, uint32_t (&w)[N]) {
  if constexpr (kAlign >= 16 && N % 4 == 0) {
#pragma unroll
    for (int i = 0; i < N; i += 4) {
      const uint4 v = LdW16(p + 4 * i);
      w[i] = v.x, w[i + 1] = v.y, w[i + 2] = v.z, w[i + 3] = v.w;
    }
  } else if constexpr (kAlign >= 8 && N % 2 == 0) {
#pragma unroll
    for (int i = 0; i < N; i += 2) {
      const uint2 v = LdW8(p + 4 * i);
      w[i] = v.x, w[i + 1] = v.y;
    }
  } else if constexpr (kAlign >= 4) {
#pragma unroll
    for (int i = 0; i < N; ++i) w[i] = LdW4(p + 4 * i);
  } else {
    static_assert(kAlign == 2, "LdWords: 2-, 4-, 8- or 16-byte alignment");
    LdWords2<N>(p, w);
  }
}

// ---- Block geometry as constants of the type (nvcc folds them).
constexpr uint32_t Pow2Factor(uint64_t n) {  // largest power of two dividing n, at most 16
  uint32_t a = 1;
  while (a < 16 && n % (2 * a) == 0) a *= 2;
  return a;
}

// Block i of a row of nbe blocks of kType, raw (kDpl false) or in dpl planes.
// Field f is the f-th entry of formats::DplPlanesOf(kType) (each type's
// traits name them: kQs, kD, ...). Types without planes (q4_K, q5_K, float
// types) have no BlockRow: their raw blocks are already 16-byte friendly.
template <formats::GgmlType kType, bool kDpl>
struct BlockRow {
  static constexpr formats::DplPlaneSpec kSpec = formats::DplPlanesOf(kType);
  static_assert(kSpec.n > 0, "BlockRow: the type has no field table");
  static constexpr uint32_t kBlockBytes = [] {
    uint32_t b = 0;
    for (uint32_t k = 0; k < kSpec.n; ++k) b += kSpec.f[k].bytes;
    return b;
  }();

  // Alignment (bytes, at most 16) of field f of every block, given a 16-byte
  // aligned row start: raw, the block stride and the field's offset in it;
  // dpl, the plane's start (nbe times the bytes of the planes before it) and
  // the field's size (its stride in the plane).
  static constexpr uint32_t Align(uint32_t f) {
    if constexpr (kDpl) {
      uint32_t before = 0;
      for (uint32_t k = 0; k < f; ++k) before += kSpec.f[k].bytes;
      const uint32_t a = Pow2Factor(before == 0 ? 16 : before);
      const uint32_t b = Pow2Factor(kSpec.f[f].bytes);
      return a < b ? a : b;
    } else {
      const uint32_t a = Pow2Factor(kBlockBytes);
      const uint32_t b = Pow2Factor(kSpec.f[f].offset == 0 ? 16 : kSpec.f[f].offset);
      return a < b ? a : b;
    }
  }

  const uint8_t* row;  // the row's first byte, 16-byte aligned for dpl rows
  int64_t nbe;         // blocks per row

  // Field kF of block i.
  template <uint32_t kF>
  __device__ __forceinline__ const uint8_t* Field(int64_t i) const {
    constexpr int64_t kBefore = static_cast<int64_t>(formats::DplPlaneOffset(kSpec, kF, 1));
    constexpr int64_t kBytes = kSpec.f[kF].bytes, kOffset = kSpec.f[kF].offset;
    if constexpr (kDpl) {
      return row + kBefore * nbe + i * kBytes;
    } else {
      return row + i * kBlockBytes + kOffset;
    }
  }
  // The first 4 bytes of field kF of block i, as one little-endian word.
  template <uint32_t kF>
  __device__ __forceinline__ uint32_t Word(int64_t i) const {
    uint32_t w[1];
    LdWords<1, (Align(kF) < 4 ? Align(kF) : 4)>(Field<kF>(i), w);
    return w[0];
  }
  // A scale field of block i: d (2 bytes, f16 bits) or, kWide, d | m << 16.
  template <uint32_t kF, bool kWide = false>
  __device__ __forceinline__ uint32_t Scale(int64_t i) const {
    if constexpr (kWide) {
      return Word<kF>(i);
    } else {
      return LdW2(Field<kF>(i));
    }
  }
};

}  // namespace dpl::kernels
