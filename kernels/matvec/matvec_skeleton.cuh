// The one matvec kernel skeleton (MatVecT) and its geometry dispatch, for
// the per-family translation units (matvec_float.cu, matvec_q32.cu,
// matvec_kquant.cu) that instantiate it for their types: explicit
// instantiations per family so nvcc builds them in parallel. Internal to
// kernels/matvec.
//
// Geometry (matvec_geometry.h): 8 lanes per row, 4 rows per warp; the
// skeleton takes the token tile, k-split, load depth and pipelining as
// template knobs, and PlanMatVec picks them per matrix (matvec_plan.h).
//
// Accumulation order (fixed, relied on by the dpl-vs-raw bitwise test): each
// lane sums its steps in ascending order (step it, then it+1), then the 8 lanes
// of a row are combined by xor-shuffles over distances 4, 2, 1.
#pragma once

#include <cuda_fp16.h>

#include <type_traits>

#include "kernels/launch.cuh"
#include "kernels/matvec/matvec_kernels.h"
#include "kernels/matvec/matvec_traits.cuh"
#include "kernels/rope.cuh"

namespace dpl::kernels {

using MatVecKernelFn = void (*)(MatVecArgs);

// The instantiation of `kernel` for geometry g, or nullptr when `kernel` is
// not one of this translation unit's family (each defined in its .cu).
MatVecKernelFn PickFloatMatVec(MatVecKernel kernel, const MatVecGeometry& g);
MatVecKernelFn PickQ32MatVec(MatVecKernel kernel, const MatVecGeometry& g);
MatVecKernelFn PickKQuantMatVec(MatVecKernel kernel, const MatVecGeometry& g);
// A mixed launch (MatVecMixedSupports): `kernel` for all parts but the last,
// `last` for the last; nullptr when not compiled.
MatVecKernelFn PickMixedMatVec(MatVecKernel kernel, MatVecKernel last, const MatVecGeometry& g);
// The folded-RoPE form (matvec_rope.h) of `kernel` (+ `last`: a mixed
// launch when != kernel), or nullptr where FoldsRope says no.
MatVecKernelFn PickRopeMatVec(MatVecKernel kernel, MatVecKernel last, const MatVecGeometry& g);

namespace matvec_detail {

template <class U, int T, int D>
__device__ __forceinline__ void DotSteps(const typename U::Regs (&r)[D], const bool (&ok)[D],
                                         const XView (&xv)[T], int nt, int it, int p,
                                         float (&acc)[T]) {
#pragma unroll
  for (int t = 0; t < T; ++t) {
    if (T == 1 || t < nt) {
#pragma unroll
      for (int k = 0; k < D; ++k) {
        if (ok[k]) acc[t] += U::Dot(r[k], xv[t], it + k, p);
      }
    }
  }
}

template <class U, int D>
__device__ __forceinline__ void LoadSteps(typename U::Regs (&r)[D], bool (&ok)[D],
                                          const uint8_t* wrow, const MatVecArgs& a, int it,
                                          int steps, int p) {
#pragma unroll
  for (int k = 0; k < D; ++k) ok[k] = it + k < steps && U::Load(r[k], wrow, a, it + k, p);
}

// Part m of a grouped launch, field by field (a computed index into the
// kernel's parameter array would go through local memory).
__device__ __forceinline__ MatVecPart PartOf(const MatVecArgs& a, int m) {
  MatVecPart p = a.part[0];
  if (m == 1) p = a.part[1];
  if (m == 2) p = a.part[2];
  return p;
}

// Under neox RoPE, the physical row of logical row l of a Q or K part: the
// logical pair (2j, 2j + 1) of a head is its dims (j, j + hd/2), so the two
// rows of a pair are a warp's rows g and g ^ 1 (matvec_rope.h).
__device__ __forceinline__ int64_t NeoxRow(int64_t l, int hd) {
  const int64_t h = l / hd;
  const int w = static_cast<int>(l - h * hd);
  return h * hd + (w >> 1) + (w & 1) * (hd >> 1);
}

// The epilogue of a RoPE-folded part (matvec_rope.h) for this lane's row:
// `row` physical, `lrow` logical (its pair partner is lrow ^ 1, lane ^ 8).
// Every lane of the warp calls it (the shuffle); lane p == 0 of a row writes.
__device__ __forceinline__ void RopeEpilogue(const MatVecArgs& a, const MatVecPart& P, float acc,
                                             int64_t lrow, int64_t row, bool row_ok, int p) {
  float v = acc;
  if (row_ok && P.bias != nullptr) v += P.bias[row];
  const float other = __shfl_xor_sync(0xffffffffu, v, 8);
  if (!row_ok || p != 0) return;
  const MatVecRope& r = a.rope;
  const int hd = r.head_dim;
  const int pos = r.d_pos[0];
  const int64_t head = row / hd;
  const int d = static_cast<int>(row - head * hd);
  const bool in_cache = pos >= 0 && pos < r.n_ctx;
  const int seq = r.d_seq != nullptr ? max(r.d_seq[0], 0) : 0;
  // The row's element (matvec_rope.h), only where one is written: paged, that
  // is where the table is read.
  auto cache = [&]() {
    return KvRowOffset(r.pages, seq, r.n_head_kv, r.n_ctx, static_cast<int>(head), pos, hd) + d;
  };
  if (P.role == MatVecRole::kCacheV) {
    if (in_cache) reinterpret_cast<__half*>(r.v_cache)[cache()] = __float2half_rn(v);
    return;
  }
  const int m = static_cast<int>(lrow & 1);
  const int j = static_cast<int>(lrow % hd) >> 1;
  const double2 cs = reinterpret_cast<const double2*>(r.cos_sin)[j];
  double r0, r1;
  RopeApply(m ? other : v, m ? v : other, cs.y, cs.x, &r0, &r1);
  const double out = m ? r1 : r0;
  if (P.role == MatVecRole::kRopeQ) {
    P.y[row] = static_cast<float>(out);
  } else if (in_cache) {
    reinterpret_cast<__half*>(r.k_cache)[cache()] = __double2half(out);
  }
}

// The tokens of a CTA's tile: Init<T>(a) finds them (where the body asks,
// after its first weight loads), then nt of them, and x(t) / y(t) the
// activation row and output row token t < nt reads and writes. A dense
// launch's tile is T consecutive tokens from blockIdx.x * T; the grouped
// expert launch (moe.cu) gathers one expert's routes instead.
struct ConsecutiveTokens {
  int tok0 = 0;
  int nt = 1;
  template <int T>
  __device__ __forceinline__ void Init(const MatVecArgs& a) {
    // A single-token launch has one token tile (grid.x == 1): say so to the
    // compiler, which then keeps no token index in registers.
    tok0 = T == 1 ? 0 : static_cast<int>(blockIdx.x) * T;
    nt = T == 1 ? 1 : min(T, a.n_tokens - tok0);
  }
  __device__ __forceinline__ int x(int t) const { return tok0 + t; }
  __device__ __forceinline__ int y(int t) const { return tok0 + t; }
};

// ---------------------------------------------------------------------------
// The skeleton, for every type U and geometry (matvec_geometry.h):
//   y[t, r] = sum over steps of U::Dot (+ bias[r]) (+ residual[t, r])
// for the nt <= T tokens of this CTA's tile (Tokens: consecutive tokens from
// grid.x * T for a dense launch) and the rows of its row block (grid.y,
// counted across the launch's parts). A CTA holds
// max(4, KS) warps; KS consecutive warps share one group of 4 rows (warp w:
// group w / KS, part w % KS), part s takes the D consecutive steps starting
// at D (s + KS j), and the parts are added in part order through shared
// memory. Weights are loaded once per tile and dotted with each token's
// activations. kPipe loads the next D steps before dotting the current D (a
// register double buffer). Under a programmatic dependent launch the first
// D steps of weights are loaded before GridDependencyWait (weights do not
// depend on the previous kernel; x and y do). kRope: the parts' roles may
// fold RoPE and the cache write into the epilogue (matvec_rope.h); only the
// forms FoldsRope names are compiled with it, so no other kernel carries its
// code or registers.
// (~90 lines, one function on purpose: each instantiation is one register
// allocation, and the order of loads and dots above is easiest to check
// where it is written out in full.)
template <class U, int T, int KS, int D, bool kPipe, bool kRope, class Tokens = ConsecutiveTokens>
__device__ __forceinline__ void MatVecBody(const MatVecArgs& a, Tokens tk = {}) {
  constexpr int kWarps = WarpsPerCta(KS);
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int p = lane & (kLanesPerRow - 1);
  const int g = lane / kLanesPerRow;  // row within the group's 4 rows
  const int split = warp % KS;
  const int m = (a.n_parts > 1 && static_cast<int>(blockIdx.y) >= a.part[1].row_block0) +
                (a.n_parts > 2 && static_cast<int>(blockIdx.y) >= a.part[2].row_block0);
  const MatVecPart P = PartOf(a, m);
  const int64_t row0 = static_cast<int64_t>(static_cast<int>(blockIdx.y) - P.row_block0) *
                           RowsPerCta(KS) +
                       (warp / KS) * kRowsPerWarp;
  const int64_t lrow = row0 + g;  // logical row: the physical one unless kRope pairs rows
  int64_t row = lrow;
  if constexpr (kRope) {
    if (a.rope.neox && (P.role == MatVecRole::kRopeQ || P.role == MatVecRole::kRopeK)) {
      row = NeoxRow(lrow, a.rope.head_dim);
    }
  }
  const bool row_ok = lrow < P.n_rows;
  tk.template Init<T>(a);
  const int nt = T == 1 ? 1 : tk.nt;
  const uint8_t* wrow = P.w + (row_ok ? row : 0) * P.row_stride;  // (row_stride) bytes
  const int steps = U::Steps(a);
  typename U::Regs r[D];
  bool ok[D];
  const int first = D * split;
  if (row_ok) LoadSteps<U, D>(r, ok, wrow, a, first, steps, p);
  GridDependencyWait();
  GridLaunchDependents();
  if (KS == 1 && row0 >= P.n_rows) return;  // the whole warp is past the last row
  XView xv[T];
#pragma unroll
  for (int t = 0; t < T; ++t) xv[t] = TokenX(a, tk.x(t < nt ? t : 0));
  float acc[T];
#pragma unroll
  for (int t = 0; t < T; ++t) acc[t] = 0.f;
  if (row_ok) {
    if constexpr (kPipe) {
      int it = first;
      while (it < steps) {
        const int nx = it + D * KS;
        typename U::Regs n[D];
        bool nok[D];
        LoadSteps<U, D>(n, nok, wrow, a, nx, steps, p);
        DotSteps<U, T, D>(r, ok, xv, nt, it, p, acc);
#pragma unroll
        for (int k = 0; k < D; ++k) {
          r[k] = n[k];
          ok[k] = nok[k];
        }
        it = nx;
      }
    } else {
      for (int it = first; it < steps; it += D * KS) {
        if (it != first) LoadSteps<U, D>(r, ok, wrow, a, it, steps, p);
        DotSteps<U, T, D>(r, ok, xv, nt, it, p, acc);
      }
    }
  }
#pragma unroll
  for (int t = 0; t < T; ++t) {
    float v = acc[t];
    v += __shfl_xor_sync(0xffffffffu, v, 4);
    v += __shfl_xor_sync(0xffffffffu, v, 2);
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    acc[t] = v;
  }
  if constexpr (KS > 1) {
    __shared__ float parts[kWarps][T][kRowsPerWarp];  // (warp, token, row) partial sums
    if (p == 0) {
#pragma unroll
      for (int t = 0; t < T; ++t) parts[warp][t][g] = acc[t];
    }
    __syncthreads();
    if (split != 0) return;
#pragma unroll
    for (int t = 0; t < T; ++t) {
      float v = parts[warp][t][g];
#pragma unroll
      for (int k = 1; k < KS; ++k) v += parts[warp + k][t][g];
      acc[t] = v;
    }
  }
  if constexpr (kRope) {
    if (P.role != MatVecRole::kPlain) {  // warp-uniform: the part is
      RopeEpilogue(a, P, acc[0], lrow, row, row_ok, p);
      return;
    }
  }
#pragma unroll
  for (int t = 0; t < T; ++t) {
    if (row_ok && p == 0 && (T == 1 || t < nt)) {
      const int64_t o = static_cast<int64_t>(tk.y(t)) * P.n_rows + row;
      float v = acc[t];
      if (P.bias != nullptr) v += P.bias[row];
      if (P.residual != nullptr) v += P.residual[o];  // may alias y: read before write
      P.y[o] = v;
    }
  }
}

// The kernel: MatVecBody for type U, or, for a mixed launch (ULast != U),
// ULast for the row blocks of the last part. Why mixed: a Q4_K_M layer's
// Q and K are q4_K and, in half the layers, V is q6_K; one launch for the
// three pays one ramp and tail instead of two (matvec_plan.h,
// PlanMatVecGroups). Each part is read exactly as a launch of its own type
// would read it, so the results are the same bits.
template <class U, int T, int KS, int D, bool kPipe, class ULast = U, bool kRope = false>
__global__ void __launch_bounds__(32 * WarpsPerCta(KS)) MatVecT(const MatVecArgs a) {
  if constexpr (!std::is_same_v<U, ULast>) {
    if (static_cast<int>(blockIdx.y) >= a.part[a.n_parts - 1].row_block0) {
      MatVecBody<ULast, T, KS, D, kPipe, kRope>(a);
      return;
    }
  }
  MatVecBody<U, T, KS, D, kPipe, kRope>(a);
}

template <class U, int KS>
MatVecKernelFn PickDecode(int depth, bool pipe) {
  if (pipe) return depth == 1 ? MatVecT<U, 1, KS, 1, true> : nullptr;
  switch (depth) {
    case 1: return MatVecT<U, 1, KS, 1, false>;
    case 2: return MatVecT<U, 1, KS, 2, false>;
    case 4: return MatVecT<U, 1, KS, 4, false>;
  }
  return nullptr;
}

// The instantiation of U for geometry g (IsCompiledGeometry(g) checked by
// the caller).
template <class U>
MatVecKernelFn PickGeometry(const MatVecGeometry& g) {
  if (g.token_tile == kTokenTile) {
    if (g.depth != 2 || g.pipe) return nullptr;
    return g.ksplit == 1 ? MatVecT<U, kTokenTile, 1, 2, false>
           : g.ksplit == 4 ? MatVecT<U, kTokenTile, 4, 2, false>
                           : nullptr;
  }
  switch (g.ksplit) {
    case 1: return PickDecode<U, 1>(g.depth, g.pipe);
    case 2: return PickDecode<U, 2>(g.depth, g.pipe);
    case 4: return PickDecode<U, 4>(g.depth, g.pipe);
    case 8: return PickDecode<U, 8>(g.depth, g.pipe);
  }
  return nullptr;
}

// The mixed instantiation of (U, ULast) for geometry g, or nullptr: mixed
// launches are compiled for single-token depth 1 pipelined geometries
// (k-split 1, 2, 4: what PlanMatVecGroups may pick for them, see
// IsMixedGeometry in matvec_geometry.h).
template <class U, class ULast>
MatVecKernelFn PickMixed(const MatVecGeometry& g) {
  if (!IsMixedGeometry(g)) return nullptr;
  switch (g.ksplit) {
    case 1: return MatVecT<U, 1, 1, 1, true, ULast>;
    case 2: return MatVecT<U, 1, 2, 1, true, ULast>;
    case 4: return MatVecT<U, 1, 4, 1, true, ULast>;
  }
  return nullptr;
}

// The folded-RoPE instantiation of (U, ULast) for geometry g, or nullptr
// (the geometries FoldsRope names: k-split 1, 2, 4 at depth 1 pipelined,
// and k-split 4 at depth 2, the plain geometry of 512-row K/V matrices).
template <class U, class ULast>
MatVecKernelFn PickRope(const MatVecGeometry& g) {
  if (g.token_tile != 1) return nullptr;
  if (g.depth == 1 && g.pipe) {
    switch (g.ksplit) {
      case 1: return MatVecT<U, 1, 1, 1, true, ULast, true>;
      case 2: return MatVecT<U, 1, 2, 1, true, ULast, true>;
      case 4: return MatVecT<U, 1, 4, 1, true, ULast, true>;
    }
    return nullptr;
  }
  if (std::is_same_v<U, ULast> && g.ksplit == 4 && g.depth == 2 && !g.pipe) {
    return MatVecT<U, 1, 4, 2, false, U, true>;
  }
  return nullptr;
}

}  // namespace matvec_detail
}  // namespace dpl::kernels
