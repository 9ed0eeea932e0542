// The matvec launchers and the activation kernels that feed them. The
// matvec kernels themselves are the skeleton of matvec_skeleton.cuh,
// instantiated per type family in matvec_float.cu, matvec_q32.cu and
// matvec_kquant.cu (per type, Load and Dot live in matvec_traits.cuh; why
// int8 activations: see there).
//
// The activation kernels write the int8 blocks every quantized matvec reads
// (QuantizeBlock32, one warp per block of 32 values), alone or fused with
// the op that produces the values: RMSNorm before Q/K/V and gate/up, SwiGLU
// before down. Fused, the decode step spends one launch where it spent two.
#include <cuda_runtime.h>

#include <cmath>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kernels/cuda_check.h"
#include "kernels/act_quant.cuh"
#include "kernels/launch.cuh"
#include "kernels/matvec/matvec_kernels.h"
#include "kernels/matvec/matvec_skeleton.cuh"

namespace dpl::kernels {
namespace {

constexpr int kActThreads = 256;             // 8 warps: 8 blocks of 32 per CTA
constexpr int kActBlocksPerCta = kActThreads / 32;

__global__ void __launch_bounds__(kActThreads) QuantizeKernel(const float* __restrict__ x,  // (n_blocks*32)
                                                              int64_t n_blocks, QuantOut out) {
  GridDependencyWait();
  GridLaunchDependents();
  const int64_t blk = static_cast<int64_t>(blockIdx.x) * kActBlocksPerCta + threadIdx.x / 32;
  if (blk >= n_blocks) return;  // warp-uniform
  QuantizeBlock32(x[blk * 32 + (threadIdx.x & 31)], blk, out);
}

// 1 / sqrt(mean(x^2) + eps) of a row of n from each thread's partial sum of
// squares ss: the warp's in a fixed shuffle order, then the CTA's warps in
// order (partial: kActBlocksPerCta floats of shared memory). Every kernel
// that normalizes a row takes its scale from here, so one that sums the
// same partials gets the same bits. IEEE sqrt and division (not rsqrtf)
// keep the scale within 1 ulp.
__device__ __forceinline__ float RmsScale(float ss, float* partial, int n, float eps) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if (lane == 0) partial[warp] = ss;
  __syncthreads();
  float total = 0.f;
#pragma unroll
  for (int k = 0; k < kActBlocksPerCta; ++k) total += partial[k];
  return 1.0f / sqrtf(total / static_cast<float>(n) + eps);
}

// h = x * w / sqrt(mean(x^2) + eps), then h quantized. grid (CTAs per row,
// n_tokens): every CTA of a row sums the row's squares itself (in the same
// order, so each gets the same scale; the row is in L2), then its 8 warps
// normalize and quantize 8 blocks of 32.
__global__ void __launch_bounds__(kActThreads)
    NormQuantizeKernel(const float* __restrict__ x,  // (n_tokens, n)
                       const float* __restrict__ w,  // (n)
                       int n, float eps,
                       float* __restrict__ h,  // (n_tokens, n)
                       QuantOut out) {
  __shared__ float partial[kActBlocksPerCta];
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const int b = blockIdx.x * kActBlocksPerCta + warp;  // block of 32 within the row
  const int i = b * 32 + lane;
  const float wi = b * 32 < n ? w[i] : 0.f;  // the weights do not depend on the previous kernel
  GridDependencyWait();
  GridLaunchDependents();
  const int64_t t = blockIdx.y;
  const float* xr = x + t * n;
  float ss = 0.f;
  for (int i = threadIdx.x; i < n; i += kActThreads) {
    const float v = xr[i];
    ss += v * v;
  }
  const float scale = RmsScale(ss, partial, n, eps);
  if (b * 32 >= n) return;  // warp-uniform
  const float v = (xr[i] * scale) * wi;
  h[t * n + i] = v;
  QuantizeBlock32(v, t * (n / 32) + b, out);
}

// g = silu(gate) * up = gate / (1 + exp(-gate)) * up, then g quantized; one
// warp per block of 32.
__global__ void __launch_bounds__(kActThreads)
    SwiGluQuantizeKernel(const float* gate,  // (n_blocks * 32)
                         const float* __restrict__ up, int64_t n_blocks,
                         float* g,  // (n_blocks * 32), may alias gate
                         QuantOut out) {
  GridDependencyWait();
  GridLaunchDependents();
  const int64_t blk = static_cast<int64_t>(blockIdx.x) * kActBlocksPerCta + threadIdx.x / 32;
  if (blk >= n_blocks) return;  // warp-uniform
  const int64_t i = blk * 32 + (threadIdx.x & 31);
  const float gv = gate[i];
  const float v = gv / (1.0f + expf(-gv)) * up[i];
  g[i] = v;
  QuantizeBlock32(v, blk, out);
}

MatVecKernelFn PickKernel(MatVecKernel kernel, const MatVecGeometry& g) {
  if (!IsCompiledFor(kernel, g)) return nullptr;
  if (MatVecKernelFn f = PickFloatMatVec(kernel, g)) return f;
  if (MatVecKernelFn f = PickQ32MatVec(kernel, g)) return f;
  return PickKQuantMatVec(kernel, g);
}

absl::Status NotCompiled(MatVecKernel kernel, const MatVecGeometry& g) {
  return absl::InvalidArgumentError(
      absl::StrCat("matvec: kernel ", static_cast<int>(kernel), " with token tile ", g.token_tile,
                   " / k-split ", g.ksplit, " / depth ", g.depth, " / pipe ", g.pipe,
                   " is not compiled"));
}

absl::Status CheckGrid(int64_t grid, const char* what) {
  if (grid <= 0 || grid > 0x7fffffff) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": grid of ", grid, " CTAs"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status LaunchMatVec(MatVecKernel kernel, const MatVecArgs& a, const MatVecGeometry& g,
                          int64_t grid_x, int64_t grid_y, bool pdl, cudaStream_t stream,
                          MatVecKernel last) {
  bool rope = false;
  for (int i = 0; i < a.n_parts && i < kMaxMatVecParts; ++i) {
    rope = rope || a.part[i].role != MatVecRole::kPlain;
  }
  const MatVecKernelFn fn = rope            ? PickRopeMatVec(kernel, last, g)
                            : last == kernel ? PickKernel(kernel, g)
                                             : PickMixedMatVec(kernel, last, g);
  if (fn == nullptr) return NotCompiled(kernel, g);
  if (g.token_tile == 1 && a.n_tokens != 1) {
    return absl::InvalidArgumentError("matvec: a token tile of 1 needs exactly one token");
  }
  if (a.n_parts < 1 || a.n_parts > kMaxMatVecParts) {
    return absl::InvalidArgumentError(absl::StrCat("matvec: ", a.n_parts, " parts"));
  }
  const dim3 grid(static_cast<unsigned>(grid_x), static_cast<unsigned>(grid_y));
  return LaunchKernel(fn, grid, dim3(32 * WarpsPerCta(g.ksplit)), 0, stream, pdl, a);
}

absl::StatusOr<int> MatVecCtasPerSm(MatVecKernel kernel, const MatVecGeometry& g) {
  const MatVecKernelFn fn = PickKernel(kernel, g);
  if (fn == nullptr) return NotCompiled(kernel, g);
  int n = 0;
  DPL_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
      &n, fn, 32 * WarpsPerCta(g.ksplit), 0));
  return n;
}

absl::Status LaunchQuantizeActivations(const float* x, int64_t n_blocks, const QuantOut& out,
                                       bool pdl, cudaStream_t stream) {
  if (n_blocks <= 0) return absl::OkStatus();
  const int64_t grid = (n_blocks + kActBlocksPerCta - 1) / kActBlocksPerCta;
  DPL_RETURN_IF_ERROR(CheckGrid(grid, "quantize activations"));
  return LaunchKernel(QuantizeKernel, dim3(static_cast<unsigned>(grid)), dim3(kActThreads), 0,
                      stream, pdl, x, n_blocks, out);
}

absl::Status LaunchNormQuantize(const float* x, const float* w, float eps, int64_t n_cols,
                                int64_t n_tokens, float* h, const QuantOut& out, bool pdl,
                                cudaStream_t stream) {
  if (n_cols <= 0 || n_cols % 32 != 0 || n_cols > (int64_t{1} << 30) || n_tokens <= 0 ||
      n_tokens > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("norm + quantize: bad shape ", n_tokens, " x ",
                                                   n_cols, " (n_cols a multiple of 32)"));
  }
  const int64_t per_row = (n_cols / 32 + kActBlocksPerCta - 1) / kActBlocksPerCta;
  const dim3 grid(static_cast<unsigned>(per_row), static_cast<unsigned>(n_tokens));
  return LaunchKernel(NormQuantizeKernel, grid, dim3(kActThreads), 0, stream, pdl, x, w,
                      static_cast<int>(n_cols), eps, h, out);
}

absl::Status LaunchSwiGluQuantize(const float* gate, const float* up, int64_t n_cols,
                                  int64_t n_tokens, float* g, const QuantOut& out, bool pdl,
                                  cudaStream_t stream) {
  if (n_cols <= 0 || n_cols % 32 != 0 || n_tokens <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("SwiGLU + quantize: bad shape ", n_tokens,
                                                   " x ", n_cols, " (n_cols a multiple of 32)"));
  }
  const int64_t n_blocks = n_cols / 32 * n_tokens;
  const int64_t grid = (n_blocks + kActBlocksPerCta - 1) / kActBlocksPerCta;
  DPL_RETURN_IF_ERROR(CheckGrid(grid, "SwiGLU + quantize"));
  return LaunchKernel(SwiGluQuantizeKernel, dim3(static_cast<unsigned>(grid)), dim3(kActThreads),
                      0, stream, pdl, gate, up, n_blocks, g, out);
}

}  // namespace dpl::kernels
