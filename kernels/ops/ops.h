// Element-wise and per-row kernels of the decode step: RMSNorm, SwiGLU, RoPE
// fused with the KV cache write, and the token-embedding row gather. All
// float32 activations. (Residual adds are fused into the matvec epilogue.)
//
// CUDA-graph rules: nothing here allocates, syncs or copies from the host;
// the position and the token id are read from device memory (d_pos,
// d_token), so one captured graph serves every decode step.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/kv_pages.h"
#include "kernels/weight_matrix.h"
#include "model/hparams.h"

namespace dpl::kernels {

// y = x * w / sqrt(mean(x^2) + eps), one block per row.
//   x, y: (n_rows, n) floats (y may alias x); w: (n) floats.
absl::Status RmsNorm(const float* x, const float* w, float* y, int n_rows, int n, float eps,
                     cudaStream_t stream);

// The same y rounded to f16 (the bits of RmsNorm, then ConvertToF16), for
// the products on tensor cores: y (n_rows, n) f16 bits; must not overlap x.
// Why fused (a 512-token 7B pass writes and re-reads no float32 copy):
// docs/PERF.md, "Twentieth session".
absl::Status RmsNormF16(const float* x, const float* w, uint16_t* y, int n_rows, int n, float eps,
                        cudaStream_t stream);

// out = silu(gate) * up, silu(g) = g / (1 + exp(-g)) (full-precision expf).
//   gate, up, out: (n) floats; out may alias gate or up.
absl::Status SwiGlu(const float* gate, const float* up, float* out, int64_t n,
                    cudaStream_t stream);

// The same out rounded to f16 (SwiGlu, then ConvertToF16: the same bits):
// out (n) f16 bits, not overlapping gate or up.
absl::Status SwiGluF16(const float* gate, const float* up, uint16_t* out, int64_t n,
                       cudaStream_t stream);

using model::RopeStyle;  // kAdjacent (llama) or kNeox (qwen2): model/hparams.h


// RoPE for n_tokens tokens, token t at position p = d_pos[t], on q and k,
// fused with the KV cache write (one launch for a whole prompt chunk):
//   (x0, x1) <- (x0 cos t - x1 sin t, x0 sin t + x1 cos t), t = p * inv_freq[i]
// for pair i < n_rot/2; elements past n_rot pass through unchanged.
// Precision: inv_freq is a float64 table (RopeInvFreq), the angle, its sin/cos
// and the rotation are computed in float64 and rounded once to float32 (q) or
// f16 (k). A float32 angle would be off by up to 2e-3 rad at p = 32768.
//   d_pos:    (n_tokens) ints, device memory
//   q:        (n_tokens, n_head, head_dim) floats, rotated in place
//   k, v:     (n_tokens, n_head_kv, head_dim) floats, read only
//   inv_freq: (n_rot / 2) doubles, device memory
//   k_cache, v_cache: this layer's K and V arrays, f16 bits (kernels/kv_pages.h,
//             kernels/ops/kv_cache.h); row p of each kv head of token t's
//             sequence is written (rotated k, plain v), at element offset
//             KvRowOffset(pages, seq, n_head_kv, n_ctx, head, p, head_dim):
//               regions (pages.tables null): (n_seq, n_head_kv, n_ctx, head_dim),
//                 sequence s's region at s * n_head_kv * n_ctx * head_dim;
//               pages: the layer's whole pool, (n_blocks, n_head_kv,
//                 1 << pages.block_shift, head_dim); position p of sequence s
//                 in block pages.tables[s * max_blocks + (p >> block_shift)].
//   d_seq:    (n_tokens) ints, device memory: token t's sequence (a batched
//             decode step, one token per sequence; a packed prompt pass), or
//             null: every token in sequence 0 (e.g. a prompt chunk: offset the
//             cache pointers (regions) or pages.tables (pages, by s *
//             max_blocks) to reach sequence s). A negative entry means 0.
//   pages:    the block tables, or {} (regions). With pages, shape.n_ctx is
//             the positions a table reaches (at most max_blocks << block_shift),
//             block_shift is in [4, 10] (16 to 1024 positions) and every
//             table entry a written position reaches must be a block of the
//             pool (device memory: not checked here).
// A position outside [0, n_ctx) rotates q but writes no cache row (a graph
// kernel cannot report an error; the caller must never step past n_ctx;
// padding rows of a batched step use position -1 on purpose); paged, such a
// position reads no table entry either.
// With norms.q and norms.k (qwen3's attn_q_norm / attn_k_norm, both or
// neither), every head of q and of k is first RMS-normed over its head_dim
// values, x = x * w / sqrt(mean(x^2) + eps) in float32 as RmsNorm, then
// rotated. `pdl`: a programmatic dependent launch (kernels/launch.cuh).
struct RopeKvShape {
  int n_head = 0;
  int n_head_kv = 0;
  int head_dim = 0;  // even, <= 256
  int n_rot = 0;     // even, <= head_dim (usually == head_dim)
  int n_ctx = 0;     // positions per sequence (regions: rows per kv head of a region)
};
struct HeadNorms {
  const float* q = nullptr;  // (head_dim) or null
  const float* k = nullptr;  // (head_dim) or null
  float eps = 0.f;
};
// cos_sin[j] = (cos, sin)(d_pos[0] * inv_freq[j]) in float64 for j < n_half:
// one token's rotations, once per decode step, for the RoPE that the Q/K/V
// matvec folds (kernels/matvec/matvec_rope.h; the same sincos of the same
// angle as RopeWriteKv). `pdl`: a programmatic dependent launch.
absl::Status RopeTable(const int* d_pos, const double* inv_freq, int n_half, double* cos_sin,
                       cudaStream_t stream, bool pdl);

absl::Status RopeWriteKv(const RopeKvShape& shape, RopeStyle style, const int* d_pos,
                         const double* inv_freq, const HeadNorms& norms, float* q, const float* k,
                         const float* v, uint16_t* k_cache, uint16_t* v_cache, int n_tokens,
                         cudaStream_t stream, bool pdl = false, const int* d_seq = nullptr,
                         const KvPages& pages = {});

// out[t] = dequantized row d_tokens[t] of the embedding table, float32, for
// t < n_tokens (one launch for a prompt chunk).
//   table:    (n_rows, row_stride) bytes in `layout` (raw GGUF blocks, or dpl
//             q6_K planes); d_tokens: (n_tokens) ints, device memory;
//   out:      (n_tokens, n_cols) floats.
// Types: every format of kernels/dequant.cuh (VisitDeviceFormat), in its
// raw or dpl layout. Values are bit-identical to formats::DequantizeRow (same
// float32 operation order, no FMA contraction). A token id outside
// [0, n_rows) writes NaN to every value of its row.
absl::Status EmbedRows(const WeightMatrix& table, const int* d_tokens, int n_tokens, float* out,
                       cudaStream_t stream);

}  // namespace dpl::kernels
