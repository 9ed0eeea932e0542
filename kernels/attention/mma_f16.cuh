// The f16 tensor-core building blocks both attention kernels use (decode:
// attention.cu, prompt: prompt_attention.cu): cp.async into padded shared-
// memory rows, ldmatrix, mma.sync m16n8k16 with f32 accumulation, and the
// fragment layouts they rely on. The f16 mma matvec
// (kernels/matvec/matvec_mma_f16.cu) multiplies with the same Mma16816.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>

#include "kernels/cp_async.cuh"

namespace dpl::kernels::attn_mma {

// Halves per shared-memory row of a K or V tile: HD + 8. Why the 8-half
// (16-byte) pad: the row stride becomes HD/2 + 4 words, i.e. 4 banks past a
// multiple of 32, so the 8 row addresses of one ldmatrix phase (8 rows x 16
// bytes) land on banks {0-3, 4-7, ..., 28-31}: conflict-free. Rows stay
// 16-byte aligned (272 / 144 bytes) for cp.async and ldmatrix. An unpadded
// row (256 / 128 bytes) would put all 8 rows on the same 4 banks: an 8-way
// conflict.
__host__ __device__ constexpr int PaddedRowHalves(int head_dim) { return head_dim + 8; }

// mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 fragment layouts (PTX ISA,
// "Matrix Fragments for mma.m16n8k16 with floating point type"), with
// groupID g = lane >> 2 and threadID_in_group t = lane % 4. A .f16x2 register
// holds two elements, the lower column (or k) index in the low 16 bits.
//   A (16 x 16, row-major), 4 x .f16x2:
//     a0: (row g,     cols 2t, 2t+1)      a1: (row g + 8, cols 2t, 2t+1)
//     a2: (row g,     cols 2t+8, 2t+9)    a3: (row g + 8, cols 2t+8, 2t+9)
//   B (16 x 8, k x n, "col"), 2 x .f16x2:
//     b0: (k 2t, 2t+1; col g)             b1: (k 2t+8, 2t+9; col g)
//   C/D (16 x 8, f32), 4 floats:
//     c0, c1: (row g, cols 2t, 2t+1)      c2, c3: (row g + 8, cols 2t, 2t+1)
//
// ldmatrix.sync.aligned.m8n8.x4.shared.b16: lanes 8i..8i+7 give the row
// addresses (16 bytes each) of matrix i; register ri of lane l receives
// matrix i's elements (row l/4, cols 2(l%4), 2(l%4)+1). With .trans it
// receives (rows 2(l%4), 2(l%4)+1; col l/4) instead, i.e. the transpose.
// So for rows of K (keys x dims) a plain ldmatrix gives B fragments of K^T
// (S = Q K^T), and for rows of V a transposing one gives B fragments of V
// (O = P V); the S accumulator of 8 keys (c0, c1 / c2, c3) is the A layout
// of P for those keys (a0 / a1 for keys 0-7 of a k-step, a2 / a3 for 8-15).

// Copies rows [row0, row0 + kRows) of one head's cache (rows of HD halves,
// contiguous) into a padded tile (PaddedRowHalves), 16 bytes per cp.async,
// the kThreads threads of a block on consecutive chunks of a row
// (coalesced). Rows r >= n_valid are zero-filled without being read: past
// the keys a block may use the cache may hold NaN or lie past n_ctx, and a
// zero V row times a zero probability stays 0 (a NaN row would not: 0 * NaN
// = NaN).
template <int HD, int kRows, int kThreads>
__device__ __forceinline__ void IssuePaddedRows(__half* dst,                          // (kRows, HD + 8)
                                                const __half* __restrict__ src_head,  // (n_ctx, HD)
                                                int row0, int n_valid, int tid) {
  constexpr int kChunksPerRow = HD / 8;
  constexpr int kPerThread = kRows * kChunksPerRow / kThreads;
  static_assert(kRows * kChunksPerRow % kThreads == 0, "chunks split evenly over the block");
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int c = tid + i * kThreads;
    const int r = c / kChunksPerRow, col = (c % kChunksPerRow) * 8;
    const bool valid = r < n_valid;
    const __half* src = src_head + (valid ? static_cast<size_t>(row0 + r) * HD + col : 0);
    CpAsync16ZeroFill(SmemAddr(dst + r * PaddedRowHalves(HD) + col), src, valid);
  }
}

// The paged form of IssuePaddedRows (kernels/kv_pages.h), for tiles whose
// rows need not be contiguous in memory (a 64-key tile may cross blocks of
// 16): row r < n_valid of the tile comes from src + row_offset(r), an
// element offset that row_offset computes from the block table; rows r >=
// n_valid are zero-filled, row_offset is never called for them (their
// table entries may not exist) and src + col stands in as the legal, never
// read, address. The chunks go to the threads exactly as in
// IssuePaddedRows (chunk c = tid + i * kThreads is row c / (HD / 8)), so a
// thread evaluates row_offset once per chunk it copies; with kPair the same
// rows of a second array (V beside K: one layout, one offset) go to dst2 in
// the same pass, so one table lookup serves both copies.
template <int HD, int kRows, int kThreads, bool kPair, typename RowOffset>
__device__ __forceinline__ void IssuePaddedRowsAt(
    __half* dst,                      // (kRows, HD + 8)
    const __half* __restrict__ src,   // a layer's K or V array (kernels/kv_pages.h)
    __half* dst2,                     // kPair: (kRows, HD + 8), else unused
    const __half* __restrict__ src2,  // kPair: the layer's other array (V beside K)
    int n_valid, int tid,
    RowOffset row_offset) {           // (int r) -> uint64_t: row r's element offset in src
  constexpr int kChunksPerRow = HD / 8;
  constexpr int kPerThread = kRows * kChunksPerRow / kThreads;
  static_assert(kRows * kChunksPerRow % kThreads == 0, "chunks split evenly over the block");
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int c = tid + i * kThreads;
    const int r = c / kChunksPerRow, col = (c % kChunksPerRow) * 8;
    const bool valid = r < n_valid;
    const uint64_t off = (valid ? row_offset(r) : 0) + col;
    CpAsync16ZeroFill(SmemAddr(dst + r * PaddedRowHalves(HD) + col), src + off, valid);
    if constexpr (kPair) {
      CpAsync16ZeroFill(SmemAddr(dst2 + r * PaddedRowHalves(HD) + col), src2 + off, valid);
    }
  }
}

__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
__device__ __forceinline__ void LdMatrixX4Trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

// d += a * b on tensor cores (layouts above).
__device__ __forceinline__ void Mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// (lo, hi) -> .f16x2 with lo in the low 16 bits (round to nearest even).
__device__ __forceinline__ uint32_t PackHalf2(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  uint32_t u;
  memcpy(&u, &h, sizeof(u));
  return u;
}

// The pair (x0, x1) as two .f16x2 terms, *hi = f16(x) and *lo = f16(x -
// f16(x)): hi + lo carries ~22 bits of each value (|x - hi - lo| <=
// 2^-22 |x| outside f16's subnormal range), so an MMA over hi and one over
// lo, summed in f32, is as precise as an f32 product with an f16 operand.
__device__ __forceinline__ void SplitHalf2(float x0, float x1, uint32_t* hi, uint32_t* lo) {
  const __half2 h = __floats2half2_rn(x0, x1);
  const float2 f = __half22float2(h);
  memcpy(hi, &h, sizeof(*hi));
  *lo = PackHalf2(x0 - f.x, x1 - f.y);
}

}  // namespace dpl::kernels::attn_mma
