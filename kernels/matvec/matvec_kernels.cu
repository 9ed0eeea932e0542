// The matvec kernels: y[t] = W x[t] (+ bias) (+ residual[t]) for quantized
// and float weight matrices, one or a tile of tokens per CTA.
//
// Per type, Load and Dot live in matvec_traits.cuh (why int8 activations:
// see there).
//
// Geometry (matvec_geometry.h): 8 lanes per row, 4 rows per warp; one
// skeleton (MatVecT) takes the token tile, k-split, load depth and pipelining
// as template knobs, and PlanMatVec picks them per matrix from the H200
// sweep (matvec_plan.h).
//
// Accumulation order (fixed, relied on by the dpl-vs-raw bitwise test): each
// lane sums its steps in ascending order (step it, then it+1), then the 8 lanes
// of a row are combined by xor-shuffles over distances 4, 2, 1.
#include "kernels/cuda_check.h"
#include "kernels/matvec/matvec_kernels.h"
#include "kernels/matvec/matvec_traits.cuh"

namespace dpl::kernels {
namespace {

// ---------------------------------------------------------------------------
// The one kernel skeleton, for every type U and geometry (matvec_geometry.h):
//   y[t, r] = sum over steps of U::Dot (+ bias[r]) (+ residual[t, r])
// for the T tokens tok0 .. tok0+T-1 of this CTA's tile (grid.x) and the rows
// of its row block (grid.y). A CTA holds max(4, KS) warps; KS consecutive
// warps share one group of 4 rows (warp w: group w / KS, part w % KS), part s
// takes the D consecutive steps starting at D (s + KS j), and the parts are
// added in part order through shared memory. Weights are loaded once per
// tile and dotted with each token's activations. kPipe loads the next D
// steps before dotting the current D (a register double buffer).
// (~85 lines, one function on purpose: each instantiation is one register
// allocation, and the order of loads and dots above is easiest to check
// where it is written out in full.)
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

template <class U, int T, int KS, int D, bool kPipe>
__global__ void __launch_bounds__(32 * WarpsPerCta(KS)) MatVecT(const MatVecArgs a) {
  constexpr int kWarps = WarpsPerCta(KS);
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int p = lane & (kLanesPerRow - 1);
  const int g = lane / kLanesPerRow;  // row within the group's 4 rows
  const int part = warp % KS;
  const int64_t row0 =
      static_cast<int64_t>(blockIdx.y) * RowsPerCta(KS) + (warp / KS) * kRowsPerWarp;
  if (KS == 1 && row0 >= a.n_rows) return;  // the whole warp is past the last row
  const int64_t row = row0 + g;
  const bool row_ok = row < a.n_rows;
  // A single-token launch has one token tile (grid.x == 1): say so to the
  // compiler, which then keeps no token index in registers.
  const int tok0 = T == 1 ? 0 : static_cast<int>(blockIdx.x) * T;
  const int nt = T == 1 ? 1 : min(T, a.n_tokens - tok0);
  XView xv[T];
#pragma unroll
  for (int t = 0; t < T; ++t) xv[t] = TokenX(a, tok0 + (t < nt ? t : 0));
  float acc[T];
#pragma unroll
  for (int t = 0; t < T; ++t) acc[t] = 0.f;
  if (row_ok) {
    const uint8_t* wrow = a.w + row * a.row_stride;  // (row_stride) bytes
    const int steps = U::Steps(a);
    typename U::Regs r[D];
    bool ok[D];
    if constexpr (kPipe) {
      int it = D * part;
      LoadSteps<U, D>(r, ok, wrow, a, it, steps, p);
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
      for (int it = D * part; it < steps; it += D * KS) {
        LoadSteps<U, D>(r, ok, wrow, a, it, steps, p);
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
    if (part != 0) return;
#pragma unroll
    for (int t = 0; t < T; ++t) {
      float v = parts[warp][t][g];
#pragma unroll
      for (int k = 1; k < KS; ++k) v += parts[warp + k][t][g];
      acc[t] = v;
    }
  }
#pragma unroll
  for (int t = 0; t < T; ++t) {
    if (row_ok && p == 0 && (T == 1 || t < nt)) {
      const int64_t o = static_cast<int64_t>(tok0 + t) * a.n_rows + row;
      float v = acc[t];
      if (a.bias != nullptr) v += a.bias[row];
      if (a.residual != nullptr) v += a.residual[o];  // may alias y: read before write
      a.y[o] = v;
    }
  }
}

// Activation quantization, one warp per block of 32 values:
//   d = max|x| / 127,  q_i = clamp(rint(x_i / d), -127, 127)  (0 when d == 0),
//   s = d * sum_i q_i   (the q4_K min term uses it)
__global__ void __launch_bounds__(256) QuantizeKernel(const float* __restrict__ x,  // (n_blocks*32)
                                                      int64_t n_blocks,
                                                      int8_t* __restrict__ q,  // (n_blocks*32)
                                                      float* __restrict__ d,   // (n_blocks)
                                                      float* __restrict__ s) {  // (n_blocks)
  const int64_t blk = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (blk >= n_blocks) return;  // warp-uniform
  const int lane = threadIdx.x & 31;
  const float v = x[blk * 32 + lane];
  float amax = fabsf(v);
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
  const float dv = amax / 127.0f;
  int qi = 0;
  if (amax > 0.f) qi = max(-127, min(127, __float2int_rn(v / dv)));
  q[blk * 32 + lane] = static_cast<int8_t>(qi);
  int sum = qi;
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  if (lane == 0) {
    d[blk] = dv;
    s[blk] = dv * static_cast<float>(sum);
  }
}


using KernelFn = void (*)(MatVecArgs);

template <class U, int KS>
KernelFn PickDecode(int depth, bool pipe) {
  switch (depth) {
    case 1: return pipe ? MatVecT<U, 1, KS, 1, true> : MatVecT<U, 1, KS, 1, false>;
    case 2: return pipe ? MatVecT<U, 1, KS, 2, true> : MatVecT<U, 1, KS, 2, false>;
    case 4: return pipe ? MatVecT<U, 1, KS, 4, true> : MatVecT<U, 1, KS, 4, false>;
  }
  return nullptr;
}

// The instantiation for geometry g (IsCompiledGeometry(g) checked by the caller).
template <class U>
KernelFn PickGeometry(const MatVecGeometry& g) {
  if (g.token_tile == kTokenTile) {
    return g.ksplit == 1 ? MatVecT<U, kTokenTile, 1, 2, false> : MatVecT<U, kTokenTile, 4, 2, false>;
  }
  switch (g.ksplit) {
    case 1: return PickDecode<U, 1>(g.depth, g.pipe);
    case 2: return PickDecode<U, 2>(g.depth, g.pipe);
    case 4: return PickDecode<U, 4>(g.depth, g.pipe);
    case 8: return PickDecode<U, 8>(g.depth, g.pipe);
  }
  return nullptr;
}

KernelFn PickKernel(MatVecKernel kernel, const MatVecGeometry& g) {
  if (!IsCompiledGeometry(g)) return nullptr;
  switch (kernel) {
    case MatVecKernel::kF32: return PickGeometry<F32Vec>(g);
    case MatVecKernel::kF32Scalar: return PickGeometry<FloatScalar<false>>(g);
    case MatVecKernel::kF16: return PickGeometry<F16Vec>(g);
    case MatVecKernel::kF16Scalar: return PickGeometry<FloatScalar<true>>(g);
    case MatVecKernel::kQ8_0: return PickGeometry<Q8_0>(g);
    case MatVecKernel::kQ5_0: return PickGeometry<Q5_0>(g);
    case MatVecKernel::kQ4K: return PickGeometry<Q4K>(g);
    case MatVecKernel::kQ6KRaw: return PickGeometry<Q6K<false>>(g);
    case MatVecKernel::kQ6KDpl: return PickGeometry<Q6K<true>>(g);
  }
  return nullptr;
}

absl::Status NotCompiled(MatVecKernel kernel, const MatVecGeometry& g) {
  return absl::InvalidArgumentError(
      absl::StrCat("matvec: kernel ", static_cast<int>(kernel), " with token tile ", g.token_tile,
                   " / k-split ", g.ksplit, " / depth ", g.depth, " / pipe ", g.pipe,
                   " is not compiled"));
}

}  // namespace

absl::Status LaunchMatVec(MatVecKernel kernel, const MatVecArgs& a, const MatVecGeometry& g,
                          int64_t grid_x, int64_t grid_y, cudaStream_t stream) {
  const KernelFn fn = PickKernel(kernel, g);
  if (fn == nullptr) return NotCompiled(kernel, g);
  if (g.token_tile == 1 && a.n_tokens != 1) {
    return absl::InvalidArgumentError("matvec: a token tile of 1 needs exactly one token");
  }
  const dim3 grid(static_cast<unsigned>(grid_x), static_cast<unsigned>(grid_y));
  fn<<<grid, 32 * WarpsPerCta(g.ksplit), 0, stream>>>(a);
  DPL_CUDA_CHECK_LAUNCH();
  return absl::OkStatus();
}

absl::StatusOr<int> MatVecCtasPerSm(MatVecKernel kernel, const MatVecGeometry& g) {
  const KernelFn fn = PickKernel(kernel, g);
  if (fn == nullptr) return NotCompiled(kernel, g);
  int n = 0;
  DPL_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
      &n, fn, 32 * WarpsPerCta(g.ksplit), 0));
  return n;
}

absl::Status LaunchQuantizeActivations(const float* x, int64_t n_blocks, int8_t* q, float* d,
                                       float* s, cudaStream_t stream) {
  if (n_blocks <= 0) return absl::OkStatus();
  const int64_t grid = (n_blocks + 7) / 8;
  if (grid > 0x7fffffff) {
    return absl::InvalidArgumentError(absl::StrCat("quantize activations: ", n_blocks,
                                                   " blocks is too many"));
  }
  QuantizeKernel<<<static_cast<unsigned>(grid), 256, 0, stream>>>(x, n_blocks, q, d, s);
  DPL_CUDA_CHECK_LAUNCH();
  return absl::OkStatus();
}

}  // namespace dpl::kernels
