// Probe for issue 29 (not part of the build): q4_K weights times T = 8..64
// f16 token rows on the f16 tensor cores, Marlin's way: each weight is
// dequantized in registers straight into an f16 A fragment,
//   w = q * (d sc_j) - (dmin m_j)        (f16: q exact via 0x6400 | q - 1024)
// and the mma accumulates in f32 across the whole k range, so no per-32
// scaling of int32 results (what bounds the int8 form at 32-64 tokens: per
// mma 4 I2F + 4 FMUL + 8 FFMA per thread, docs/PERF.md). Activations f16,
// staged once per CTA per 256-column block (cp.async, two stages); a warp
// takes 16 MT rows so each B fragment load serves MT mmas per k-step.
//
// Count (7B ffn_gate/up 18944 x 3584, T = 64): 2.1 M m16n8k16 mmas, ~16 k a
// SM: ~9 us at one mma per clock; B from shared memory 1 wavefront per mma
// at MT = 2; weights 38.2 MB: 8.5 us at 4.5 TB/s. Prediction: 15-25 us
// against the int8 form's 73.8 (matvec_bench, 2026-12-04).
//
// Build and run (device): nvcc -O3 -std=c++17 -arch=sm_90a -o f16probe mma_f16_probe.cu && ./f16probe
#include "probe_util.cuh"

namespace {

using probe::Byte;
using probe::Half;
using probe::Q4KScaleMin;
using probe::SumSplits;
using dpl::kernels::CpAsync16ZeroFill;
using dpl::kernels::CpAsync4ZeroFill;
using dpl::kernels::CpAsyncCommit;
using dpl::kernels::CpAsyncWait;
using dpl::kernels::SmemAddr;

__device__ __forceinline__ void Mma16816F16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                            uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}


__device__ __forceinline__ uint32_t H2(__half2 h) { return *reinterpret_cast<uint32_t*>(&h); }
__device__ __forceinline__ __half2 AsH2(uint32_t u) { return *reinterpret_cast<__half2*>(&u); }

// Two f16 weights (nibbles at bits sh..sh+3 and 16+sh..) of word p:
// q * s - m, q made exact as (0x6400 | q) - 1024.
__device__ __forceinline__ uint32_t Deq2(uint32_t p, int sh, __half2 s, __half2 negm) {
  const uint32_t v = ((p >> sh) & 0x000F000Fu) | 0x64006400u;
  const __half2 q = __hsub2(AsH2(v), __half2half2(__ushort_as_half(0x6400)));
  return H2(__hfma2(q, s, negm));
}

constexpr int kRowHalves = 288;  // 256 + 32: 8 lanes' 16-byte B loads on distinct banks

// grid (row blocks of 16 MT W, 1, splits); block 32 W.
template <int NT, int MT, int W>
__global__ void __launch_bounds__(32 * W) F16Q4K(const uint8_t* __restrict__ w, int64_t row_stride, int n_rows,
                                                 int n_cols, const __half* __restrict__ x, int n_tokens,
                                                 float* __restrict__ out /* (splits, T, rows) */) {
  constexpr int T = 8 * NT;
  extern __shared__ __align__(16) __half sx[];  // [2][T][kRowHalves]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int row0 = blockIdx.x * 16 * MT * W + warp * 16 * MT;
  const uint8_t* wr[MT][2];
#pragma unroll
  for (int i = 0; i < MT; ++i) {
    wr[i][0] = w + static_cast<int64_t>(min(row0 + 16 * i + g, n_rows - 1)) * row_stride;
    wr[i][1] = w + static_cast<int64_t>(min(row0 + 16 * i + g + 8, n_rows - 1)) * row_stride;
  }
  const int nbe = n_cols / 256;
  const int splits = gridDim.z, z = blockIdx.z;
  const int kb0 = nbe * z / splits, kb1 = nbe * (z + 1) / splits;
  auto stage = [&](int kb, int buf) {
    __half* s = sx + buf * T * kRowHalves;
    for (int c = threadIdx.x; c < T * 32; c += 32 * W) {
      const int tok = c >> 5, ch = c & 31;
      const bool ok = tok < n_tokens;
      CpAsync16ZeroFill(SmemAddr(s + tok * kRowHalves + 8 * ch),
          x + static_cast<int64_t>(ok ? tok : 0) * n_cols + kb * 256 + 8 * ch, ok);
    }
  };
  float acc[MT][NT][4];
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int n = 0; n < NT; ++n) acc[i][n][0] = acc[i][n][1] = acc[i][n][2] = acc[i][n][3] = 0.f;
  if (kb0 < kb1) {
    stage(kb0, 0);
    CpAsyncCommit();
    for (int kb = kb0; kb < kb1; ++kb) {
      const int buf = (kb - kb0) & 1;
      if (kb + 1 < kb1) stage(kb + 1, buf ^ 1);
      CpAsyncCommit();
      uint4 hd[MT][2];
      uint2 qv[MT][2][4];
#pragma unroll
      for (int i = 0; i < MT; ++i) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const uint8_t* b = wr[i][r] + static_cast<int64_t>(kb) * 144;
          hd[i][r] = __ldg(reinterpret_cast<const uint4*>(b));
#pragma unroll
          for (int c = 0; c < 4; ++c) qv[i][r][c] = __ldg(reinterpret_cast<const uint2*>(b + 16 + 32 * c + 8 * t));
        }
      }
      CpAsyncWait<1>();
      __syncthreads();
      const __half* s = sx + buf * T * kRowHalves;
#pragma unroll
      for (int c = 0; c < 4; ++c) {
#pragma unroll
        for (int hi = 0; hi < 2; ++hi) {
          const int j = 2 * c + hi, sh = 4 * hi;
          uint32_t A[MT][2][4];  // [m tile][k step][a0..a3]
#pragma unroll
          for (int i = 0; i < MT; ++i) {
#pragma unroll
            for (int r = 0; r < 2; ++r) {
              float sc, m;
              Q4KScaleMin(hd[i][r], j, &sc, &m);
              const float d = __half2float(__ushort_as_half(static_cast<unsigned short>(hd[i][r].x & 0xFFFF)));
              const float dm = __half2float(__ushort_as_half(static_cast<unsigned short>(hd[i][r].x >> 16)));
              const __half2 s2 = __float2half2_rn(d * sc), nm2 = __float2half2_rn(-dm * m);
#pragma unroll
              for (int st = 0; st < 2; ++st) {
                const uint32_t p = __byte_perm(st ? qv[i][r][c].y : qv[i][r][c].x, 0, 0x3120);
                A[i][st][r] = Deq2(p, sh, s2, nm2);          // a0 / a1: columns 0, 1 of the 4
                A[i][st][2 + r] = Deq2(p, sh + 8, s2, nm2);  // a2 / a3: columns 2, 3
              }
            }
          }
#pragma unroll
          for (int n = 0; n < NT; ++n) {
            const uint4 b = *reinterpret_cast<const uint4*>(s + (8 * n + g) * kRowHalves + 32 * j + 8 * t);
#pragma unroll
            for (int i = 0; i < MT; ++i) {
              Mma16816F16(acc[i][n], A[i][0][0], A[i][0][1], A[i][0][2], A[i][0][3], b.x, b.y);
              Mma16816F16(acc[i][n], A[i][1][0], A[i][1][1], A[i][1][2], A[i][1][3], b.z, b.w);
            }
          }
        }
      }
      __syncthreads();
    }
  }
  float* o = out + static_cast<int64_t>(z) * n_tokens * n_rows;
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int tok = 8 * n + 2 * t + (e & 1), row = row0 + 16 * i + g + 8 * (e >> 1);
        if (tok < n_tokens && row < n_rows) o[static_cast<int64_t>(tok) * n_rows + row] = acc[i][n][e];
      }
}


// One thread per (row, token): the formula in f32 with exact weights.
__global__ void Reference(const uint8_t* w, int64_t row_stride, int n_rows, int n_cols, const __half* x, int n_tokens,
                          float* y) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x, tok = blockIdx.y;
  if (r >= n_rows) return;
  float v = 0.f;
  for (int kb = 0; kb < n_cols / 256; ++kb) {
    const uint8_t* b = w + r * row_stride + kb * 144;
    const uint4 h = *reinterpret_cast<const uint4*>(b);
    const float d = __half2float(__ushort_as_half(static_cast<unsigned short>(h.x & 0xFFFF)));
    const float dm = __half2float(__ushort_as_half(static_cast<unsigned short>(h.x >> 16)));
    for (int j = 0; j < 8; ++j) {
      float sc, m;
      Q4KScaleMin(h, j, &sc, &m);
      for (int l = 0; l < 32; ++l) {
        const int q = (b[16 + 32 * (j / 2) + l] >> (4 * (j & 1))) & 15;
        v += (d * sc * q - dm * m) * __half2float(x[tok * n_cols + kb * 256 + 32 * j + l]);
      }
    }
  }
  y[tok * n_rows + r] = v;
}

template <int NT, int MT, int W>
float RunTile(const uint8_t* w, int64_t stride, int rows, int cols, const __half* x, int tokens, int splits,
              float* part, float* y, int copies, int64_t slot, int iters) {
  constexpr int T = 8 * NT;
  auto* fn = F16Q4K<NT, MT, W>;
  const int smem = 2 * T * kRowHalves * 2;
  CK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const dim3 grid((rows + 16 * MT * W - 1) / (16 * MT * W), 1, splits);
  const int64_t n = static_cast<int64_t>(tokens) * rows;
  auto launch = [&](int i) {
    fn<<<grid, 32 * W, smem>>>(w + (i % copies) * slot, stride, rows, cols, x, tokens, splits > 1 ? part : y);
    if (splits > 1) SumSplits<<<(n + 255) / 256, 256>>>(part, splits, n, y);
  };
  return probe::TimeLaunches(launch, iters);
}

using RunFn = float (*)(const uint8_t*, int64_t, int, int, const __half*, int, int, float*, float*, int, int64_t, int);

template <int NT>
RunFn Pick(int mt) {
  return mt == 1 ? RunTile<NT, 1, 4> : RunTile<NT, 2, 4>;
}
RunFn PickAny(int tokens, int mt) {
  if (tokens <= 8) return Pick<1>(mt);
  if (tokens <= 16) return Pick<2>(mt);
  if (tokens <= 32) return Pick<4>(mt);
  return Pick<8>(mt);
}

}  // namespace

int main(int argc, char** argv) {
  // ./f16probe SHAPE_INDEX TOKENS MT SPLITS: that configuration alone (for ncu).
  const bool one = argc == 5;
  const int one_shape = one ? std::atoi(argv[1]) : -1, one_t = one ? std::atoi(argv[2]) : 0;
  const int one_mt = one ? std::atoi(argv[3]) : 0, one_s = one ? std::atoi(argv[4]) : 0;
  struct Shape {
    const char* name;
    int rows, cols;
    double int8_us[5];  // the int8 staged mma form at 4, 8, 16, 32, 64 tokens (matvec_bench, 2026-12-04)
  };
  const Shape shapes[] = {
      {"attn_q/o 3584x3584", 3584, 3584, {9.47, 8.84, 10.88, 16.91, 25.43}},
      {"ffn_gate/up 18944x3584", 18944, 3584, {25.25, 25.80, 32.64, 48.73, 73.81}},
      {"ffn_down 3584x18944", 3584, 18944, {23.81, 23.95, 30.62, 58.67, 79.23}},
  };
  const int token_counts[] = {4, 8, 16, 32, 64};
  std::mt19937 rng(7);
  for (int si = 0; si < 3; ++si) {
    const Shape& sh = shapes[si];
    if (one && si != one_shape) continue;
    const int nbe = sh.cols / 256;
    std::vector<uint8_t> hw;
    const probe::Q4KDevice wd = probe::RandomQ4K(sh.rows, sh.cols, rng, &hw);
    uint8_t* dw = wd.w;
    const int64_t stride = wd.stride, bytes = wd.bytes, slot = wd.slot;
    const int copies = wd.copies;
    const int T = 64;
    std::vector<__half> hx(static_cast<size_t>(T) * sh.cols);
    std::normal_distribution<float> nd(0.f, 1.f);
    for (auto& v : hx) v = __float2half(nd(rng));
    __half* dx;
    float *dy, *dref, *dpart;
    CK(cudaMalloc(&dx, hx.size() * 2));
    CK(cudaMalloc(&dy, static_cast<size_t>(T) * sh.rows * 4));
    CK(cudaMalloc(&dref, static_cast<size_t>(T) * sh.rows * 4));
    CK(cudaMalloc(&dpart, static_cast<size_t>(8) * T * sh.rows * 4));
    CK(cudaMemcpy(dx, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice));
    std::printf("%s: %.1f MB of weights (%d copies), floor at 4.5 TB/s %.1f us\n", sh.name, bytes / 1e6, copies,
                bytes / 4.5e12 * 1e6);
    for (int ti = 0; ti < 5; ++ti) {
      const int tokens = token_counts[ti];
      if (one && tokens != one_t) continue;
      Reference<<<dim3((sh.rows + 127) / 128, tokens), 128>>>(dw, stride, sh.rows, sh.cols, dx, tokens, dref);
      CK(cudaDeviceSynchronize());
      std::vector<float> ref(static_cast<size_t>(tokens) * sh.rows);
      CK(cudaMemcpy(ref.data(), dref, ref.size() * 4, cudaMemcpyDeviceToHost));
      float best = 1e30f;
      int best_mt = 0, best_s = 0;
      double worst = 0;
      for (int mt : {1, 2}) {
        for (int splits : {1, 2, 4, 8}) {
          if (splits > nbe || (one && (mt != one_mt || splits != one_s))) continue;
          const float us =
              PickAny(tokens, mt)(dw, stride, sh.rows, sh.cols, dx, tokens, splits, dpart, dy, copies, slot, one ? 3 : 50);
          const double err = probe::RelRmsErr(dy, ref);
          worst = std::max(worst, err);
          std::printf("  T %2d MT %d splits %d: %8.2f us  %7.1f GB/s  %6.1f TFLOP/s  rel.rms err %.2e\n", tokens, mt,
                      splits, us, bytes / (us * 1e-6) / 1e9, 2.0 * sh.rows * sh.cols * tokens / (us * 1e-6) / 1e12, err);
          if (us < best) best = us, best_mt = mt, best_s = splits;
        }
      }
      std::printf("  => T %2d: best %.2f us (MT %d, splits %d) vs the int8 form %.2f us: %.2fx; worst err %.1e\n", tokens,
                  best, best_mt, best_s, sh.int8_us[ti], sh.int8_us[ti] / best, worst);
    }
    cudaFree(dw);
    cudaFree(dx);
    cudaFree(dy);
    cudaFree(dref);
    cudaFree(dpart);
  }
  return 0;
}
