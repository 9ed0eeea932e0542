// RoPE and the KV-cache write folded into the single-token Q/K/V matvec's
// epilogue (one launch fewer per layer). Plain data, shared by the launchers
// (matvec.h) and the kernel skeleton (matvec_skeleton.cuh).
//
// Why it is the same math: each output row is the same sum in the same order
// as without the fold; only which warp computes which row changes (under
// neox RoPE the rows d and d + head_dim/2 of a head are a warp's rows g and
// g ^ 1, so lane p = 0 of each holds both values of its pair after the
// reduction), and the pair is rotated by RopeApply (kernels/rope.cuh), the
// RoPE kernel's expression, with the step's sincos values computed once per
// step (RopeTable, kernels/ops/ops.h, through the RoPE kernel's RopeSinCos). So
// the fold is bit-identical to the RoPE kernel.
#pragma once

#include <cstdint>

#include "kernels/kv_pages.h"
#include "kernels/matvec/matvec_geometry.h"

namespace dpl::kernels {

// What a part's epilogue does with its rows.
enum class MatVecRole : int {
  kPlain = 0,  // y = W x (+ bias) (+ residual)
  kRopeQ,      // y = rope(W x + bias): the query, rotated in the output
  kRopeK,      // k_cache[pos] = f16(rope(W x + bias)); y is not written
  kCacheV,     // v_cache[pos] = f16(W x + bias); y is not written
};

// The launches whose kernel has the folded epilogue: one token, q4_K or
// q6_K (a mixed q4_K + q6_K launch too), at depth 1 pipelined with k-split
// 1, 2 or 4 (what the planner gives their Q/K/V launches) or k-split 4 depth
// 2 unpipelined (a lone 512-row K or V). Why not every kernel: compiled into
// all, the epilogue cost the whole step 3-6% (docs/PERF.md).
inline bool FoldsRope(MatVecKernel kernel, MatVecKernel last, const MatVecGeometry& g) {
  auto type_ok = [](MatVecKernel k) {
    return k == MatVecKernel::kQ4K || k == MatVecKernel::kQ6KDpl || k == MatVecKernel::kQ6KRaw;
  };
  if (!type_ok(kernel) || !type_ok(last) || g.token_tile != 1) return false;
  if (last != kernel && (kernel != MatVecKernel::kQ4K || last == MatVecKernel::kQ4K)) return false;
  if (g.depth == 1 && g.pipe) return g.ksplit == 1 || g.ksplit == 2 || g.ksplit == 4;
  return last == kernel && g.ksplit == 4 && g.depth == 2 && !g.pipe;
}

// The cache rows (kernels/kv_pages.h): head h of the token's sequence
// s = max(*d_seq, 0) (0 with a null d_seq) at position pos is written at
//   KvRowOffset(pages, s, n_head_kv, n_ctx, h, pos, head_dim) + d
// for its dim d: regions ((s n_head_kv + h) n_ctx + pos) head_dim + d; pages
// the same row of block tables[s max_blocks + (pos >> block_shift)] (one
// table load per written row).
struct MatVecRope {
  const int* d_pos = nullptr;        // (1) the token's position; outside [0, n_ctx): no cache row
  const int* d_seq = nullptr;        // (1) its sequence, or null: sequence 0 (negative: 0)
  const double* cos_sin = nullptr;   // (head_dim / 2, 2): cos, sin of pos * inv_freq[j] (RopeTable)
  uint16_t* k_cache = nullptr;       // f16 bits, this layer's K: regions (n_seq, n_head_kv, n_ctx,
                                     // head_dim); pages (n_blocks, n_head_kv, block, head_dim)
  uint16_t* v_cache = nullptr;       // same, V
  int head_dim = 0;                  // even; RoPE rotates all of it (n_rot == head_dim)
  int n_head_kv = 0;
  int n_ctx = 0;                     // positions per sequence (pages: at most max_blocks << block_shift)
  bool neox = false;                 // pairs (d, d + head_dim/2); else (2i, 2i + 1)
  KvPages pages;                     // block tables (device memory), or {}: regions
};

}  // namespace dpl::kernels
