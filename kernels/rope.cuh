// The RoPE angle and the rotation of one (x0, x1) pair, for every kernel that
// applies it (the RoPE + KV write kernel and RopeTable in kernels/ops, the
// Q/K/V matvec epilogue in kernels/matvec): one expression each, so all round
// the same bits. Header only,
// for nvcc.
#pragma once

#include <cuda_runtime.h>

namespace dpl::kernels {

// (r0, r1) = (x0 c - x1 s, x0 s + x1 c) for (s, c) = (sin, cos) theta, all in
// float64.
__device__ __forceinline__ void RopeApply(double x0, double x1, double s, double c, double* r0,
                                          double* r1) {
  *r0 = x0 * c - x1 * s;
  *r1 = x0 * s + x1 * c;
}

// (s, c) = (sin, cos) of theta = pos * inv_freq, the angle of a pair at
// position pos (the RoPE kernel per pair, RopeTable once per step).
__device__ __forceinline__ void RopeSinCos(int pos, double inv_freq, double* s, double* c) {
  sincos(static_cast<double>(pos) * inv_freq, s, c);
}

}  // namespace dpl::kernels
