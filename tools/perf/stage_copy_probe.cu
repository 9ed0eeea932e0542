// Probe for issue 29 (not part of the build): how fast do the f16 mma form's
// stage copies alone move a q4_K matrix, with no arithmetic? If the copies by
// themselves stay near the form's ~1.3 TB/s (H100, 7B gate/up at 4 tokens,
// docs/PERF.md), the data movement, not the dequantize + mma chain, is what
// bounds the form at low token counts.
//
// Each CTA (128 threads) takes 128 rows and `nh / splits` 128-column stages,
// as MatVecMmaF16Kernel does: per stage and row the block header (16 bytes)
// and the half's 64 quant bytes by cp.async 16 bytes a thread-copy, kS
// stages in flight, one wait + barrier a stage. Variants:
//   half:  exactly that (5 chunks a row a stage, 96-byte smem rows);
//   block: a stage is a whole 256-column block (9 chunks, 144 bytes a row);
//   ldg:   no shared memory: each thread loads the same chunks with 16-byte
//          global loads into registers, kS stages ahead (register ring);
//   bulk:  the bulk-copy engine (TMA's 1-D form, cp.async.bulk): thread r
//          copies row r's kB whole blocks (144 kB bytes) with one
//          instruction, completion counted on one mbarrier a stage.
// `pad` bytes of extra dynamic shared memory limit CTAs per SM.
//
// Build and run (device): nvcc -O3 -std=c++17 -arch=sm_90a -o copyprobe stage_copy_probe.cu && ./copyprobe
#include <cuda/ptx>

#include "probe_util.cuh"

namespace {

using dpl::kernels::CpAsync16ZeroFill;
using dpl::kernels::CpAsyncCommit;
using dpl::kernels::CpAsyncWait;
using dpl::kernels::SmemAddr;

constexpr int kThreads = 128, kRows = 128;

template <bool kBlock>
__device__ __forceinline__ int64_t ChunkOffset(int kh, int c) {
  if (kBlock) return static_cast<int64_t>(kh) * 144 + 16 * c;  // kh counts blocks here
  return static_cast<int64_t>(kh >> 1) * 144 + (c == 0 ? 0 : 16 + 64 * (kh & 1) + 16 * (c - 1));
}

// kTiled (whole blocks only): the bytes as a tile-major layout would hold
// them, the CTA's 128 rows' block kb contiguous (18 KB), row blocks one
// after another: what a converter could write for this kernel.
template <int kS, bool kBlock, bool kTiled = false>
__global__ void __launch_bounds__(kThreads) CopySmem(const uint8_t* w, int64_t stride, int n_rows,
                                                     int n_stages, int splits, uint32_t* sink) {
  static_assert(kBlock || !kTiled, "tiles are whole blocks");
  constexpr int kChunks = kBlock ? 9 : 5, kRowBytes = kBlock ? 160 : 96;
  constexpr int kCopies = kRows * kChunks / kThreads;
  extern __shared__ __align__(16) uint8_t smem[];
  const int row0 = blockIdx.y * kRows, z = blockIdx.z;
  const int kh0 = n_stages * z / splits, n_it = n_stages * (z + 1) / splits - kh0;
  const uint8_t* src[kCopies];
  uint32_t dst[kCopies];
  int ch[kCopies];
#pragma unroll
  for (int k = 0; k < kCopies; ++k) {
    const int i = threadIdx.x + k * kThreads, r = i / kChunks;
    ch[k] = i % kChunks;
    src[k] = kTiled ? w + (static_cast<int64_t>(blockIdx.y) * n_stages * kRows + r) * 144
                    : w + static_cast<int64_t>(min(row0 + r, n_rows - 1)) * stride;
    dst[k] = SmemAddr(smem) + r * kRowBytes + 16 * ch[k];
  }
  constexpr int kStage = kRows * kRowBytes;
  auto issue = [&](int kh, int s) {
#pragma unroll
    for (int k = 0; k < kCopies; ++k) {
      const int64_t at = kTiled ? static_cast<int64_t>(kh) * kRows * 144 + 16 * ch[k]
                                : ChunkOffset<kBlock>(kh, ch[k]);
      CpAsync16ZeroFill(dst[k] + s * kStage, src[k] + at, true);
    }
  };
  for (int s = 0; s < kS - 1; ++s) {
    if (s < n_it) issue(kh0 + s, s);
    CpAsyncCommit();
  }
  uint32_t acc = 0;
  for (int it = 0; it < n_it; ++it) {
    CpAsyncWait<kS - 2>();
    __syncthreads();
    const int nx = it + kS - 1;
    if (nx < n_it) issue(kh0 + nx, nx % kS);
    CpAsyncCommit();
    acc ^= *reinterpret_cast<const uint32_t*>(smem + (it % kS) * kStage + 4 * threadIdx.x);
  }
  if (acc == 0x12345679u) sink[0] = acc;  // keeps the loads
}

template <int kS>
__global__ void __launch_bounds__(kThreads) CopyLdg(const uint8_t* w, int64_t stride, int n_rows,
                                                    int n_stages, int splits, uint32_t* sink) {
  constexpr int kChunks = 5, kCopies = kRows * kChunks / kThreads;
  const int row0 = blockIdx.y * kRows, z = blockIdx.z;
  const int kh0 = n_stages * z / splits, n_it = n_stages * (z + 1) / splits - kh0;
  const uint8_t* src[kCopies];
  int ch[kCopies];
#pragma unroll
  for (int k = 0; k < kCopies; ++k) {
    const int i = threadIdx.x + k * kThreads;
    ch[k] = i % kChunks;
    src[k] = w + static_cast<int64_t>(min(row0 + i / kChunks, n_rows - 1)) * stride;
  }
  uint4 ring[kS][kCopies];
  auto load = [&](int kh, uint4 (&r)[kCopies]) {
#pragma unroll
    for (int k = 0; k < kCopies; ++k) {
      r[k] = __ldg(reinterpret_cast<const uint4*>(src[k] + ChunkOffset<false>(kh, ch[k])));
    }
  };
#pragma unroll
  for (int s = 0; s < kS; ++s) {
    if (s < n_it) load(kh0 + s, ring[s]);
  }
  uint32_t acc = 0;
  for (int it = 0; it < n_it; it += kS) {
#pragma unroll
    for (int s = 0; s < kS; ++s) {
      if (it + s < n_it) {
#pragma unroll
        for (int k = 0; k < kCopies; ++k) acc ^= ring[s][k].x ^ ring[s][k].w;
        if (it + s + kS < n_it) load(kh0 + it + s + kS, ring[s]);
      }
    }
  }
  if (acc == 0x12345679u) sink[0] = acc;
}

// kB whole blocks a row a stage, kS stages.
template <int kS, int kB>
__global__ void __launch_bounds__(kThreads) CopyBulk(const uint8_t* w, int64_t stride, int n_rows,
                                                     int nbe, int splits, uint32_t* sink) {
  namespace ptx = cuda::ptx;
  constexpr int kRowBytes = 144 * kB + 16, kStage = kRows * kRowBytes;
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ uint64_t bar[kS];
  const int row0 = blockIdx.y * kRows, z = blockIdx.z;
  const int ns = nbe / kB;
  const int ks0 = ns * z / splits, n_it = ns * (z + 1) / splits - ks0;
  if (threadIdx.x < kS) ptx::mbarrier_init(&bar[threadIdx.x], kThreads);
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  __syncthreads();
  const uint8_t* src = w + static_cast<int64_t>(min(row0 + static_cast<int>(threadIdx.x), n_rows - 1)) * stride;
  auto issue = [&](int ks, int s) {
    ptx::mbarrier_arrive_expect_tx(ptx::sem_release, ptx::scope_cta, ptx::space_shared, &bar[s],
                                   144u * kB);
    ptx::cp_async_bulk(ptx::space_cluster, ptx::space_global,
                       smem + s * kStage + threadIdx.x * kRowBytes, src + static_cast<int64_t>(ks) * kB * 144,
                       144u * kB, &bar[s]);
  };
  for (int s = 0; s < kS - 1 && s < n_it; ++s) issue(ks0 + s, s);
  uint32_t acc = 0;
  for (int it = 0; it < n_it; ++it) {
    const int s = it % kS;
    while (!ptx::mbarrier_try_wait_parity(&bar[s], static_cast<uint32_t>((it / kS) & 1))) {
    }
    __syncthreads();  // every thread is past stage it - 1, whose buffer is refilled next
    const int nx = it + kS - 1;
    if (nx < n_it) issue(ks0 + nx, nx % kS);
    acc ^= *reinterpret_cast<const uint32_t*>(smem + s * kStage + 4 * threadIdx.x);
  }
  if (acc == 0x12345679u) sink[0] = acc;
}

}  // namespace

// ./copyprobe: every variant; ./copyprobe bulk: the bulk ones and the
// whole-block cp.async ones beside them.
int main(int argc, char** argv) {
  const bool only_bulk = argc > 1 && std::strcmp(argv[1], "bulk") == 0;
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device %s, %d SMs\n", prop.name, prop.multiProcessorCount);
  std::mt19937 rng(5);
  std::vector<uint8_t> host;
  const int rows = 18944, cols = 3584;  // 7B ffn_gate/up
  const probe::Q4KDevice d = probe::RandomQ4K(rows, cols, rng, &host);
  uint32_t* sink = nullptr;
  CK(cudaMalloc(&sink, 4));
  const int nh = cols / 128, nbe = cols / 256;
  const dim3 block(kThreads);
  auto report = [&](const char* what, int splits, int pad, float us) {
    std::printf("%-6s splits %d pad %6d: %7.2f us %7.1f GB/s\n", what, splits, pad, us,
                d.bytes / (us * 1e-6) / 1e9);
  };
  // row_bytes: a stage row in shared memory; n: stages along a row.
  auto smem_copy = [&](auto kernel, int stages, int row_bytes, int n, int splits, int pad,
                       const char* name) {
    const int smem = stages * kRows * row_bytes + pad;
    CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    const dim3 grid(1, (rows + kRows - 1) / kRows, splits);
    report(name, splits, pad, probe::TimeLaunches([&](int i) {
             kernel<<<grid, block, smem>>>(d.at(i), d.stride, rows, n, splits, sink);
           }, 100));
  };
  auto half = [&](auto kernel, int stages, int splits, int pad, const char* name) {
    smem_copy(kernel, stages, 96, nh, splits, pad, name);
  };
  auto whole = [&](auto kernel, int stages, int splits, int pad, const char* name) {
    smem_copy(kernel, stages, 160, nbe, splits, pad, name);
  };
  auto ldg = [&](auto kernel, int splits, const char* name) {
    const dim3 grid(1, (rows + kRows - 1) / kRows, splits);
    report(name, splits, 0, probe::TimeLaunches([&](int i) {
             kernel<<<grid, block>>>(d.at(i), d.stride, rows, nh, splits, sink);
           }, 100));
  };
  auto bulk = [&](auto kernel, int stages, int blocks, int splits, const char* name) {
    const int smem = stages * kRows * (144 * blocks + 16);
    CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    const dim3 grid(1, (rows + kRows - 1) / kRows, splits);
    report(name, splits, 0, probe::TimeLaunches([&](int i) {
             kernel<<<grid, block, smem>>>(d.at(i), d.stride, rows, nbe, splits, sink);
           }, 100));
  };
  for (int splits : {1, 2, 4, 7}) {
    bulk(CopyBulk<3, 1>, 3, 1, splits, "bulk3");
    bulk(CopyBulk<4, 1>, 4, 1, splits, "bulk4");
    bulk(CopyBulk<2, 2>, 2, 2, splits, "bulk2x2");
    bulk(CopyBulk<3, 2>, 3, 2, splits, "bulk3x2");
    whole(CopySmem<3, true>, 3, splits, 0, "block3");
    whole(CopySmem<3, true, true>, 3, splits, 0, "tiled3");
    whole(CopySmem<2, true, true>, 2, splits, 0, "tiled2");
  }
  for (int splits : {1, 2, 4, 7}) {
    if (only_bulk) break;
    half(CopySmem<4, false>, 4, splits, 0, "half4");
    half(CopySmem<3, false>, 3, splits, 0, "half3");
    half(CopySmem<2, false>, 2, splits, 0, "half2");
    half(CopySmem<4, false>, 4, splits, 60 * 1024, "half4");  // 2 CTAs a SM
    whole(CopySmem<3, true>, 3, splits, 0, "block3");
    whole(CopySmem<2, true>, 2, splits, 0, "block2");
    ldg(CopyLdg<2>, splits, "ldg2");
    ldg(CopyLdg<4>, splits, "ldg4");
  }
  return 0;
}
