// Hopper's warpgroup MMA (sm_90a), the form with A in registers and B in
// shared memory ("RS"): one warpgroup (4 warps, 128 threads) computes
//   D (64 x N, f32) += A (64 x 16, f16, registers) B (16 x N, f16, shared)
// asynchronously: the instruction returns at once and the tensor cores work
// while the warps go on (here: dequantizing the next A). PTX ISA,
// "Asynchronous Warpgroup Level Matrix Multiply-Accumulate".
//
// Fragments (lane = 4 g + t, warp w of the warpgroup):
//   A: warp w holds rows 16 w .. 16 w + 15 as mma.m16n8k16's A fragment:
//      a0 = (row g, k 2t..2t+1), a1 = (g + 8, 2t..), a2 = (g, 2t+8..), a3 = (g + 8, 2t+8..)
//   D: d[4 j + e] = row 16 w + g + 8 (e >> 1), column 8 j + 2 t + (e & 1)
// B in shared memory, K-major without swizzle: "core matrices" of 8 rows (N)
// x 16 bytes (8 k), each 128 contiguous bytes; the descriptor gives the start
// and the byte distances between core matrices adjacent in K (leading, LBO)
// and in N (stride, SBO).
//
// Rules the callers keep: WgmmaFence() after writing A registers (or
// touching D) and before the wgmma that reads them; A registers and D are
// not touched again until a WgmmaWait covers the group; shared memory
// written by the generic proxy (stores, cp.async) is made visible to the
// wgmma's async proxy by FenceProxyAsyncShared() before the barrier that
// publishes it.
//
// wgmma exists only in sm_90a machine code; the build's compute_90 PTX (for
// a driver to JIT elsewhere) has none, so there DPL_HAS_WGMMA is 0, the
// fence, commit and wait are nothing and callers take their mma.sync path.
#pragma once

#include <cstdint>

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define DPL_HAS_WGMMA 1
#else
#define DPL_HAS_WGMMA 0
#endif

namespace dpl::kernels {

__device__ __forceinline__ void WgmmaFence() {
#if DPL_HAS_WGMMA
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void WgmmaCommit() {
#if DPL_HAS_WGMMA
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
// Waits until at most N committed groups are still in flight.
template <int N>
__device__ __forceinline__ void WgmmaWait() {
#if DPL_HAS_WGMMA
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
__device__ __forceinline__ void FenceProxyAsyncShared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// Pins accumulator registers in place (an empty asm that reads and writes
// them): keeps the compiler from moving or copying them between wgmmas, which
// ptxas would otherwise answer by serializing the pipeline (C7515).
template <int N>
__device__ __forceinline__ void WgmmaFenceOperands(float (&d)[N][4]) {
#pragma unroll
  for (int j = 0; j < N; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[j][e])::"memory");
  }
}

// Descriptor of a no-swizzle K-major shared-memory matrix: bits 0-13 start
// address >> 4, 16-29 LBO >> 4, 32-45 SBO >> 4, swizzle mode (62-63) 0.
__device__ __forceinline__ uint64_t WgmmaDesc(uint32_t smem_addr, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((smem_addr & 0x3FFFFu) >> 4) |
         (static_cast<uint64_t>((lbo >> 4) & 0x3FFFu) << 16) |
         (static_cast<uint64_t>((sbo >> 4) & 0x3FFFu) << 32);
}

// desc with its start address moved by `bytes` (a multiple of 16). The
// address field is the low 14 bits (address >> 4) and shared memory ends
// below 256 KB, so the add stays in the low word: one add on it, the high
// word untouched (a 64-bit add, or building the descriptor again, costs
// more uniform instructions before every wgmma).
__device__ __forceinline__ uint64_t WgmmaDescAdvance(uint64_t desc, uint32_t bytes) {
  const uint32_t lo = static_cast<uint32_t>(desc) + (bytes >> 4);
  return (desc & 0xFFFFFFFF00000000ull) | lo;
}

// d += A B for N = 8, 16, 32 or 64 (d: N / 8 groups of 4 floats; the
// probe tools/perf/wgmma_rate_probe.cu adds 128 and 256 for its wider
// loops: the f16 form's 128-token CTAs lost, docs/PERF.md, "Eighteenth
// session").
template <int N>
__device__ __forceinline__ void WgmmaF16(float (&d)[N / 8][4], const uint32_t (&a)[4], uint64_t desc);

#if DPL_HAS_WGMMA

template <>
__device__ __forceinline__ void WgmmaF16<8>(float (&d)[1][4], const uint32_t (&a)[4], uint64_t desc) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, %8, 1, 1, 1, 0;\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc)
      : "memory");
}

template <>
__device__ __forceinline__ void WgmmaF16<16>(float (&d)[2][4], const uint32_t (&a)[4], uint64_t desc) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, %12, 1, 1, 1, 0;\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
        "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc)
      : "memory");
}

template <>
__device__ __forceinline__ void WgmmaF16<32>(float (&d)[4][4], const uint32_t (&a)[4], uint64_t desc) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
      "{%16, %17, %18, %19}, %20, 1, 1, 1, 0;\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
        "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
        "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc)
      : "memory");
}

template <>
__device__ __forceinline__ void WgmmaF16<64>(float (&d)[8][4], const uint32_t (&a)[4], uint64_t desc) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "{%32, %33, %34, %35}, %36, 1, 1, 1, 0;\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
        "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
        "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
        "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
        "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
        "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc)
      : "memory");
}

#endif  // DPL_HAS_WGMMA

}  // namespace dpl::kernels
