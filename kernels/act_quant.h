// The int8 activations every quantized matvec reads, as device pointers: one
// definition for the kernels that write them (the matvec package's
// activation kernels, the attention combine) and the matvecs that read them.
// Per block of 32 values (QuantizeBlock32 in act_quant.cuh):
//   d = max|v| / 127,  q_i = clamp(rint(v_i / d), -127, 127)  (0 when d == 0),
//   s = d * sum_i q_i   (the q4_K min term uses it)
// and, where h is set, v itself rounded to f16 (the f16 mma form's input).
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

namespace dpl::kernels {

struct QuantOut {
  int8_t* q = nullptr;  // (n_tokens, n_cols) int8
  float* d = nullptr;   // (n_tokens, n_cols / 32) block scales
  float* s = nullptr;   // (n_tokens, n_cols / 32) d * sum(q) per block
  __half* h = nullptr;  // (n_tokens, n_cols) f16 copy of v, or null: not written
};

}  // namespace dpl::kernels
