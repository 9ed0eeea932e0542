// Asynchronous global -> shared copies (cp.async, sm_80+), in one place for
// the kernels that stage tiles through shared memory (prompt attention's K
// and V, the mma matvec's activations). A thread issues copies, commits them
// as a group, and waits until at most N of its groups are pending; a
// __syncthreads() after the wait makes every thread's copies visible to all.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dpl::kernels {

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared (dst, src 16-byte aligned); with valid == false,
// src-size 0: the 16 bytes are zero-filled and nothing is read from src
// (which must still be a legal address). .cg: cached in L2 only.
__device__ __forceinline__ void CpAsync16ZeroFill(uint32_t dst, const void* src, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes)
               : "memory");
}

// 4 bytes global -> shared, zero-filled when !valid (as above). .ca: the
// 16-byte form exists only as .cg.
__device__ __forceinline__ void CpAsync4ZeroFill(uint32_t dst, const void* src, bool valid) {
  const int src_bytes = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes)
               : "memory");
}

__device__ __forceinline__ void CpAsyncCommit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Waits until at most N of this thread's committed groups are pending.
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

}  // namespace dpl::kernels
