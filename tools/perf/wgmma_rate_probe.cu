// Probe for issue 29 (not part of the build): how fast does the f16 form's
// inner loop run with no copies at all? The 64-token form's steady state
// (docs/PERF.md, "where a 64-token product's time goes: waves") takes ~2.1 us
// a stage-round on an H200 (two CTAs a SM, one 256-column stage each:
// 2 x 32 wgmma m64n64k16 = 4.2 M FMA, ~1.0 us of tensor-core peak), so
// either the wgmma stream itself runs at half rate (A from registers, B
// re-read from shared memory by every m64 tile) or what surrounds it (the
// dequantization, the shared-memory weight loads, the copies) does not
// overlap it. Each variant runs exactly the form's stage loop shape:
//   per half (128 columns): weight words from shared memory (kLds: the 8
//   8-byte quant loads and the header a thread makes), then per 32-column
//   sub-block the A fragments (kDeq: q4_K's Deq2Lo / Deq2Hi on those words,
//   or a fixed A) and 2 tiles x 2 k16 steps of wgmma m64nNk16 (B the staged
//   activations), one commit group, wait_group 1; wait_group 0 a stage.
// CTAs of one warpgroup, `ctas` a SM (shared memory padded to force it),
// every SM busy, `stages` stages a CTA, events around 20 launches.
//
// Build and run (device): nvcc -O3 -std=c++17 -arch=sm_90a -o wgmmaprobe wgmma_rate_probe.cu && ./wgmmaprobe
#include <cuda_fp16.h>

#include "../../kernels/wgmma.cuh"
#include "probe_util.cuh"

namespace {

using dpl::kernels::SmemAddr;
using dpl::kernels::WgmmaCommit;
using dpl::kernels::WgmmaDesc;
using dpl::kernels::WgmmaF16;
using dpl::kernels::WgmmaFence;
using dpl::kernels::WgmmaFenceOperands;
using dpl::kernels::WgmmaWait;

__device__ __forceinline__ uint32_t U32(__half2 h) { return *reinterpret_cast<uint32_t*>(&h); }
__device__ __forceinline__ __half2 H2(uint32_t u) { return *reinterpret_cast<__half2*>(&u); }
__device__ __forceinline__ uint32_t Deq2Lo(uint32_t p, __half2 s, __half2 neg_m) {
  const __half2 q = __hsub2(H2((p & 0x000F000Fu) | 0x64006400u), H2(0x64006400u));
  return U32(__hfma2(q, s, neg_m));
}
__device__ __forceinline__ uint32_t Deq2Hi(uint32_t p, __half2 s, __half2 neg_m) {
  const __half2 q = __hfma2(H2((p & 0x00F000F0u) | 0x64006400u), H2(0x2C002C00u), H2(0xD400D400u));
  return U32(__hfma2(q, s, neg_m));
}

constexpr int kThreads = 128;
constexpr int kWRow = 160;  // the form's q4_K smem row (144 bytes used)

// smem: weights [128][160] then activations [32 chunks][N][8 halves] (one stage).
// Second round (twelfth session, after the first table): why do the dequant
// and the wgmmas add up instead of overlapping? kMma false drops the wgmmas
// (the dequant's own issue time: if "both" = "wgmma only" + this, nothing
// overlaps); kFenceAfter false drops the accumulator pins after the wait;
// kHalf batches a half's four sub-blocks: all 64 A registers first, then its
// 16 wgmmas as one group (wait_group 1 retires the previous half), so a
// whole half's products (512 tensor clocks a CTA) cover the next half's
// dequant instead of one sub-block's (128).
//
// Third round (same session, after the SASS cuts): kWgs 2 runs two
// warpgroups in one CTA, each on its own 128 rows and the shared stage of
// activations, as two CTAs a SM would; kOrdered makes them take turns at
// the tensor cores (FlashAttention-3's ping-pong): warpgroup w issues a
// sub-block's wgmmas only after the other issued its previous one (named
// barriers 1 and 2), so one dequantizes while the other's products run.
// If the loop's dequant and wgmmas fail to overlap because both
// warpgroups reach them at once, ordering them pays; if the tensor core
// and the dequant cannot overlap within an SM at all, it does not.
template <int N, bool kLds, bool kDeq, bool kMma = true, bool kFenceAfter = true, bool kHalf = false,
          int kWgs = 1, bool kOrdered = false>
__global__ void __launch_bounds__(kThreads * kWgs) StageLoop(int stages, float* out) {
  extern __shared__ __align__(16) uint8_t smem[];
  constexpr int kAll = kThreads * kWgs;
  const int wg = static_cast<int>(threadIdx.x) / kThreads;
  uint8_t* w = smem + wg * 128 * kWRow;
  __half* x = reinterpret_cast<__half*>(smem + kWgs * 128 * kWRow);
  for (int i = threadIdx.x; i < kWgs * 128 * kWRow / 4; i += kAll) {
    reinterpret_cast<uint32_t*>(smem)[i] = 0x3C003C00u ^ (i * 2654435761u & 0x03FF03FFu);
  }
  for (int i = threadIdx.x; i < 32 * N * 8; i += kAll) {
    x[i] = __float2half(0.001f * ((i * 7919) % 97 - 48));
  }
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();
  // Warpgroup 1 lets warpgroup 0 go first.
  if (kOrdered && wg == 1) asm volatile("bar.arrive 1, %0;\n" ::"n"(kAll) : "memory");
  const int lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & 3, g = lane >> 2, t = lane & 3;
  constexpr int NT = N / 8;
  float acc[2][NT][4];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int n = 0; n < NT; ++n) acc[i][n][0] = acc[i][n][1] = acc[i][n][2] = acc[i][n][3] = 0.f;
  const uint32_t xs = SmemAddr(x);
  constexpr uint32_t kChunkBytes = 16 * N;
  uint32_t fixed = 0x3C003C00u ^ threadIdx.x;
  for (int it = 0; it < stages; ++it) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      uint2 q[2][2][2];
      uint4 hdr = make_uint4(fixed, fixed + 1, fixed + 2, it);
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int r = 0; r < 2; ++r)
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            const int row = 64 * i + 16 * warp + g + 8 * r;
            if (kLds) {
              q[i][r][c] = *reinterpret_cast<const uint2*>(&w[row * kWRow + 16 + 64 * h + 32 * c + 8 * t]);
            } else {
              q[i][r][c] = make_uint2(fixed + row + it, fixed ^ (row + c));
            }
          }
      if (kLds) hdr = *reinterpret_cast<const uint4*>(&w[(64 * (t >> 1) + 16 * warp + g) * kWRow]);
      const __half2 s = H2(hdr.x), m = H2(hdr.y ^ hdr.w);
      uint32_t AH[4][2][2][4];  // kHalf: the half's four sub-blocks
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) {
        uint32_t (&A)[2][2][4] = AH[jj];
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
          for (int r = 0; r < 2; ++r)
#pragma unroll
            for (int step = 0; step < 2; ++step) {
              const uint32_t p = __byte_perm(step ? q[i][r][jj >> 1].y : q[i][r][jj >> 1].x, 0, 0x3120);
              if (kDeq) {
                A[i][step][r] = (jj & 1) ? Deq2Hi(p, s, m) : Deq2Lo(p, s, m);
                A[i][step][2 + r] = (jj & 1) ? Deq2Hi(p >> 8, s, m) : Deq2Lo(p >> 8, s, m);
              } else {
                A[i][step][r] = p & 0x3BFF3BFFu;
                A[i][step][2 + r] = (p >> 8) & 0x3BFF3BFFu;
              }
            }
        if (!kMma) {
#pragma unroll
          for (int i = 0; i < 2; ++i)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][e & 1][e] += __uint_as_float(A[i][0][e] ^ A[i][1][e]);
          continue;
        }
        if (kHalf && jj < 3) continue;
        if (kOrdered) {  // my turn (barrier 1 + wg): the other has issued its previous sub-block
          asm volatile("bar.sync %0, %1;\n" ::"r"(1 + wg), "n"(kAll) : "memory");
        }
#pragma unroll
        for (int j0 = kHalf ? 0 : jj; j0 <= jj; ++j0) {
          if (j0 == (kHalf ? 0 : jj)) {
            WgmmaFenceOperands(acc[0]);
            WgmmaFenceOperands(acc[1]);
            WgmmaFence();
          }
#pragma unroll
          for (int step = 0; step < 2; ++step) {
            const uint32_t c = static_cast<uint32_t>(16 * h + 4 * j0 + 2 * step);
            const uint64_t desc = WgmmaDesc(xs + c * kChunkBytes, kChunkBytes, 128);
#pragma unroll
            for (int i = 0; i < 2; ++i) WgmmaF16<N>(acc[i], AH[j0][i][step], desc);
          }
        }
        WgmmaCommit();
        if (kOrdered) {  // the other's turn (barrier 2 - wg); no branch in the loop
          asm volatile("bar.arrive %0, %1;\n" ::"r"(2 - wg), "n"(kAll) : "memory");
        }
        WgmmaWait<1>();
        if (kFenceAfter) {
          WgmmaFenceOperands(acc[0]);
          WgmmaFenceOperands(acc[1]);
        }
      }
    }
    WgmmaWait<0>();
    WgmmaFenceOperands(acc[0]);
    WgmmaFenceOperands(acc[1]);
  }
  // Warpgroup 1's last hand-over (one more than warpgroup 0 waited for).
  if (kOrdered && wg == 0) asm volatile("bar.sync 1, %0;\n" ::"n"(kAll) : "memory");
  float v = 0.f;
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int n = 0; n < NT; ++n) v += acc[i][n][0] + acc[i][n][1] + acc[i][n][2] + acc[i][n][3];
  if (v == 12345.f) out[0] = v;  // keeps the products live
}

template <int N, bool kLds, bool kDeq, bool kMma = true, bool kFenceAfter = true, bool kHalf = false,
          int kWgs = 1, bool kOrdered = false>
void Run(int num_sms, int ctas, int stages, const char* name) {
  auto k = StageLoop<N, kLds, kDeq, kMma, kFenceAfter, kHalf, kWgs, kOrdered>;
  const int need = kWgs * 128 * kWRow + 32 * N * 16;
  const int smem = std::max(need, (227 * 1024) / ctas - 1024);
  CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  int per_sm = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, kThreads * kWgs, smem));
  float* out;
  CK(cudaMalloc(&out, 4));
  const int blocks = num_sms * ctas;
  k<<<blocks, kThreads * kWgs, smem>>>(stages, out);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  const int reps = 20;
  CK(cudaEventRecord(a));
  for (int r = 0; r < reps; ++r) k<<<blocks, kThreads * kWgs, smem>>>(stages, out);
  CK(cudaEventRecord(b));
  CK(cudaEventSynchronize(b));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, a, b));
  const double us = 1e3 * ms / reps;
  const double fma = double(blocks) * kWgs * stages * 32 * 64.0 * N * 16;
  std::printf("%-26s N=%2d ctas/SM %d (fit %d) stages %4d: %8.1f us, %6.1f TFLOP/s, %.3f us a stage-round\n",
              name, N, ctas, per_sm, stages, us, 2 * fma / (us * 1e-6) / 1e12, us / stages);
  if (per_sm < ctas) std::printf("  (only %d fit a SM: the row above ran in more waves)\n", per_sm);
  CK(cudaFree(out));
}

}  // namespace

int main() {
  int dev = 0, sms = 0, clock = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  CK(cudaDeviceGetAttribute(&clock, cudaDevAttrClockRate, dev));
  cudaDeviceProp p;
  CK(cudaGetDeviceProperties(&p, dev));
  std::printf("%s, %d SMs, %d MHz\n", p.name, sms, clock / 1000);
  // Third round first: two warpgroups a CTA, taking turns or not, against
  // two CTAs a SM (the form's loop, "both").
  for (int n : {64, 16}) {
    if (n == 64) {
      Run<64, true, true>(sms, 2, 200, "both, 2 CTAs of 1 WG");
      Run<64, true, true, true, true, false, 2, false>(sms, 1, 200, "both, 1 CTA of 2 WGs");
      Run<64, true, true, true, true, false, 2, true>(sms, 1, 200, "both, 2 WGs taking turns");
      Run<64, false, false, true, true, false, 2, true>(sms, 1, 200, "wgmma only, 2 WGs turns");
    } else {
      Run<16, true, true>(sms, 2, 200, "N16 both, 2 CTAs of 1 WG");
      Run<16, true, true, true, true, false, 2, false>(sms, 1, 200, "N16 both, 1 CTA of 2 WGs");
      Run<16, true, true, true, true, false, 2, true>(sms, 1, 200, "N16 both, 2 WGs turns");
    }
  }
  // Second round: the overlap question.
  for (int ctas : {1, 2}) {
    Run<64, false, false>(sms, ctas, 200, "wgmma only");
    Run<64, true, true>(sms, ctas, 200, "+ both (the form's loop)");
    Run<64, true, true, false>(sms, ctas, 200, "both, no wgmma");
    Run<64, true, true, true, false>(sms, ctas, 200, "both, no pins after wait");
    Run<64, true, true, true, true, true>(sms, ctas, 200, "both, a half a group");
    Run<16, true, true>(sms, ctas, 200, "N16 both");
    Run<16, true, true, false>(sms, ctas, 200, "N16 both, no wgmma");
    Run<16, true, true, true, true, true>(sms, ctas, 200, "N16 both, a half a group");
  }
  for (int ctas : {1, 2, 3}) {
    Run<64, false, false>(sms, ctas, 200, "wgmma only");
    Run<64, false, true>(sms, ctas, 200, "+ dequant");
    Run<64, true, false>(sms, ctas, 200, "+ smem weight loads");
    Run<64, true, true>(sms, ctas, 200, "+ both (the form's loop)");
  }
  for (int ctas : {2, 3}) {
    Run<32, false, false>(sms, ctas, 200, "wgmma only");
    Run<32, true, true>(sms, ctas, 200, "+ both (the form's loop)");
    Run<16, false, false>(sms, ctas, 200, "wgmma only");
    Run<16, true, true>(sms, ctas, 200, "+ both (the form's loop)");
  }
  return 0;
}
