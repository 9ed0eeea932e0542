// Device side of act_quant.h: one warp quantizes one block of 32 values.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/act_quant.h"

namespace dpl::kernels {

// Lane i holds v_i of block `blk` (the whole warp calls it):
//   d = max|v| / 127,  q_i = clamp(rint(v_i / d), -127, 127)  (0 when d == 0),
//   s = d * sum_i q_i,   h[F16Index(token, column)] = f16(v_i) when out.h is set
__device__ __forceinline__ void QuantizeBlock32(float v, int64_t blk, const QuantOut& out) {
  const int lane = threadIdx.x & 31;
  float amax = fabsf(v);
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
  const float dv = amax / 127.0f;
  int qi = 0;
  if (amax > 0.f) qi = max(-127, min(127, __float2int_rn(v / dv)));
  out.q[blk * 32 + lane] = static_cast<int8_t>(qi);
  if (out.h != nullptr) {  // blk fits 32 bits (a pass's tokens x columns / 32: no 64-bit division)
    const uint32_t per_row = static_cast<uint32_t>(out.h_cols) / 32, b = static_cast<uint32_t>(blk);
    out.h[F16Index(static_cast<int>(b / per_row), static_cast<int>(b % per_row) * 32 + lane, out.h_slots,
                   out.h_cols)] =
        __float2half_rn(v);
  }
  int sum = qi;
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  if (lane == 0) {
    out.d[blk] = dv;
    out.s[blk] = dv * static_cast<float>(sum);
  }
}

}  // namespace dpl::kernels
