// What the standalone issue-29 probes (mma_tile_probe.cu, mma_f16_probe.cu)
// share: the project's cp.async helpers (kernels/cp_async.cuh), a CUDA check, q4_K scale decoding, random q4_K rows replicated past
// L2, the ordered split sum, event timing of back-to-back launches and the
// relative RMS error against a reference. Not part of the build; each probe
// is one nvcc command (see its header).
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "../../kernels/cp_async.cuh"  // the project's cp.async helpers

#define CK(x)                                                                                 \
  do {                                                                                        \
    cudaError_t e_ = (x);                                                                     \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)

namespace probe {

__device__ __forceinline__ float Half(uint32_t bits) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
}
__device__ __forceinline__ uint32_t Byte(uint32_t w, int i) { return (w >> (8 * i)) & 0xFF; }

// 6-bit scale and min of q4_K sub-block j from the block header (d | dmin,
// scales[0..11] in hdr.y, hdr.z, hdr.w).
__device__ __forceinline__ void Q4KScaleMin(const uint4& hdr, int j, float* sc, float* m) {
  const uint32_t s[12] = {Byte(hdr.y, 0), Byte(hdr.y, 1), Byte(hdr.y, 2), Byte(hdr.y, 3),
                          Byte(hdr.z, 0), Byte(hdr.z, 1), Byte(hdr.z, 2), Byte(hdr.z, 3),
                          Byte(hdr.w, 0), Byte(hdr.w, 1), Byte(hdr.w, 2), Byte(hdr.w, 3)};
  if (j < 4) {
    *sc = static_cast<float>(s[j] & 63);
    *m = static_cast<float>(s[j + 4] & 63);
  } else {
    *sc = static_cast<float>((s[j + 4] & 15) | ((s[j - 4] >> 6) << 4));
    *m = static_cast<float>((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
  }
}

// The splits' partials (splits, n) summed in split order (deterministic).
__global__ void SumSplits(const float* part, int splits, int64_t n, float* y) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  float v = part[i];
  for (int z = 1; z < splits; ++z) v += part[z * n + i];
  y[i] = v;
}

// rows x cols q4_K weights (raw 144-byte blocks, random quants, sane f16 d
// and dmin) on the device, `copies` times over >= 200 MB so that timed
// launches rotating through them read HBM, not L2.
struct Q4KDevice {
  uint8_t* w = nullptr;
  int64_t stride = 0, bytes = 0, slot = 0;
  int copies = 0;
  const uint8_t* at(int i) const { return w + (i % copies) * slot; }
};
inline Q4KDevice RandomQ4K(int rows, int cols, std::mt19937& rng, std::vector<uint8_t>* host) {
  Q4KDevice d;
  const int nbe = cols / 256;
  d.stride = static_cast<int64_t>(nbe) * 144;
  d.bytes = d.stride * rows;
  host->assign(d.bytes, 0);
  std::uniform_int_distribution<int> byte(0, 255);
  for (int64_t r = 0; r < rows; ++r) {
    for (int kb = 0; kb < nbe; ++kb) {
      uint8_t* b = host->data() + r * d.stride + kb * 144;
      for (int i = 4; i < 144; ++i) b[i] = static_cast<uint8_t>(byte(rng));
      const __half dd = __float2half(0.001f + 0.002f * (byte(rng) / 255.f));
      const __half dm = __float2half(0.001f * (byte(rng) / 255.f));
      std::memcpy(b, &dd, 2);
      std::memcpy(b + 2, &dm, 2);
    }
  }
  d.copies = static_cast<int>(std::max<int64_t>(1, (200ll << 20) / d.bytes));
  d.slot = (d.bytes + 255) / 256 * 256;
  CK(cudaMalloc(&d.w, d.slot * d.copies));
  for (int c = 0; c < d.copies; ++c) {
    CK(cudaMemcpy(d.w + c * d.slot, host->data(), d.bytes, cudaMemcpyHostToDevice));
  }
  return d;
}

// Microseconds per call of launch(i), i = 0.. iters - 1, back to back on
// the default stream after 3 warm-up calls (CUDA events).
template <typename F>
float TimeLaunches(F&& launch, int iters) {
  for (int i = 0; i < 3; ++i) launch(i);
  CK(cudaGetLastError());
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  CK(cudaEventRecord(e0));
  for (int i = 0; i < iters; ++i) launch(i);
  CK(cudaEventRecord(e1));
  CK(cudaEventSynchronize(e1));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, e0, e1));
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  return ms * 1e3f / iters;
}

// sqrt(sum (got - ref)^2 / sum ref^2) of a device result against a host reference.
inline double RelRmsErr(const float* d_got, const std::vector<float>& ref) {
  std::vector<float> got(ref.size());
  CK(cudaMemcpy(got.data(), d_got, got.size() * 4, cudaMemcpyDeviceToHost));
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    num += (got[i] - ref[i]) * static_cast<double>(got[i] - ref[i]);
    den += ref[i] * static_cast<double>(ref[i]);
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

}  // namespace probe
