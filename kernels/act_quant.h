// The int8 activations every quantized matvec reads, as device pointers: one
// definition for the kernels that write them (the matvec package's
// activation kernels, the attention combine) and the matvecs that read them.
// Per block of 32 values (QuantizeBlock32 in act_quant.cuh):
//   d = max|v| / 127,  q_i = clamp(rint(v_i / d), -127, 127)  (0 when d == 0),
//   s = d * sum_i q_i   (the q4_K min term uses it)
// and, where h is set, v itself rounded to f16 (the f16 mma form's input)
// in that form's order (F16Index).
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

namespace dpl::kernels {

struct QuantOut {
  int8_t* q = nullptr;  // (n_tokens, n_cols) int8
  float* d = nullptr;   // (n_tokens, n_cols / 32) block scales
  float* s = nullptr;   // (n_tokens, n_cols / 32) d * sum(q) per block
  __half* h = nullptr;  // f16 copy of v at F16Index, or null: not written
  int32_t h_cols = 0;   // n_cols of the activations h holds
  int32_t h_slots = 0;  // F16TokenSlots(n_tokens)
};

// Where column c (0..31) of a block of 32 sits in the f16 copy h: c = 8 t +
// 4 s + 2 u + e goes to 16 s + 8 u + 2 t + e. Why: in the f16 mma form
// (matvec/matvec_mma_f16.cu) thread t of a quad dequantizes the weights of
// columns 8t..8t+7 of a block (one 8-byte load a row) into the A fragment's
// k = 2t, 2t+1 (columns +0, +1) and 2t+8, 2t+9 (+2, +3) of k16 step s = 0,
// then of s = 1 (+4..+7); the wgmma reads B from shared memory in k order,
// so the activations must already be in that order: each 16-byte chunk of h
// is one row of a B core matrix (k 8u..8u+7 of step s), copied as is.
__host__ __device__ constexpr int F16MmaPos(int c) {
  return 16 * ((c >> 2) & 1) + 8 * ((c >> 1) & 1) + 2 * (c >> 3) + (c & 1);
}

// The f16 copy's token tile: at most this many token slots lie together
// in its chunk-major order; a copy of more tokens is a run of such tiles.
inline constexpr int kF16TileTokens = 64;

// Token slots of the f16 copy: the f16 mma form's token tile (8, 16, 32 or
// 64) for n_tokens up to 64; past 64, whole 64-token tiles (the wide form,
// one CTA a tile: matvec/matvec_mma_f16.cu).
__host__ __device__ constexpr int F16TokenSlots(int n_tokens) {
  return n_tokens <= 8    ? 8
         : n_tokens <= 16 ? 16
         : n_tokens <= 32 ? 32
                          : (n_tokens + kF16TileTokens - 1) / kF16TileTokens * kF16TileTokens;
}

// Where value (token, column) sits in h: in 64-token tiles (h_cols columns
// each), and in a tile 16-byte chunk-major,
//   h[tile * 64 h_cols + (chunk * slots + token % 64) * 8 + e],
//   tile = token / 64, slots = min(h_slots, 64),
//   chunk * 8 + e = 32 (column / 32) + F16MmaPos(column % 32),
// so that the chunks of one stage of the f16 form, for every token slot of
// a tile, are one contiguous run of bytes: the kernel copies them linearly
// into shared memory, where they already are the wgmma's B core matrices (8
// token slots x 16 bytes). Why linear: cp.async writes whose shared
// destinations do not follow the threads' order cost a shared-memory
// wavefront each (ncu, H100, 7B gate/up at 64 tokens: 6.1 M wavefronts
// against 2.6 M, the kernel 90 us against 58, when a token-major copy was
// scattered into this layout in shared memory). Up to 64 tokens there is
// one tile: the layout of every earlier session.
__host__ __device__ constexpr int64_t F16Index(int token, int column, int h_slots, int h_cols) {
  const int p = 32 * (column / 32) + F16MmaPos(column % 32);
  const int slots = h_slots < kF16TileTokens ? h_slots : kF16TileTokens;
  return static_cast<int64_t>(token / kF16TileTokens) * kF16TileTokens * h_cols +
         (static_cast<int64_t>(p / 8) * slots + token % kF16TileTokens) * 8 + p % 8;
}

}  // namespace dpl::kernels
