// The RoPE rotation of one (x0, x1) pair, for every kernel that applies it
// (the RoPE + KV write kernel in kernels/ops, the Q/K/V matvec epilogue in
// kernels/matvec): one expression, so both round the same bits. Header only,
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

// The rotation by theta = pos * inv_freq.
__device__ __forceinline__ void RopeRotate(double x0, double x1, double theta, double* r0,
                                           double* r1) {
  double s, c;
  sincos(theta, &s, &c);
  RopeApply(x0, x1, s, c, r0, r1);
}

}  // namespace dpl::kernels
