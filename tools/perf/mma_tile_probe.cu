// Probe for issue 29 (not part of the build): q4_K weights times T = 4..64
// int8 token rows on the tensor cores with the activations staged ONCE per
// CTA in shared memory (cp.async, two stages) and the CTA's warps splitting
// rows instead of k, against today's mma form (kernels/matvec/matvec_mma.cu:
// 16 rows a CTA, warps split k, every warp reading its activations and
// scales from L1/L2).
//
//   y[t, r] = sum_kb sum_j d_r sc_rj xd_tj dot(q_rj, xq_tj) - dmin_r m_rj xs_tj
//
// Prediction (H200): today's gate/up (18944 x 3584) takes 27.6 / 45.2 / 260 us
// at 4 / 16 / 64 tokens (docs/PERF.md); its 38.2 MB of weights need 8.5 us at
// 4.5 TB/s. With 64 rows a CTA the activations cross L2 -> SM 4x less, and
// from shared memory a warp's B fragment is 2 wavefronts and a token pair's
// (d, s) one: ~3 shared-memory clocks per mma, so at 64 tokens ~12 us of
// shared-memory time, and at 4-16 tokens the weight stream (~9-10 us) bounds it.
//
// Build and run (device): nvcc -O3 -std=c++17 -arch=sm_90a -o probe mma_tile_probe.cu && ./probe
// Results: docs/PERF.md, "Batched rows: activations staged once per CTA"; the
// two variants that lost (v2, v3) are docs/logs/2026-12-04-mma-tile-probe-v2-v3.patch.
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

__device__ __forceinline__ void Mma16832(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}


struct Q4KRegs {
  uint4 h0, h1;
  uint2 q0[4], q1[4];
};
__device__ __forceinline__ Q4KRegs Q4KLoad(const uint8_t* w0, const uint8_t* w1, int kb, int t) {
  const uint8_t* b0 = w0 + static_cast<int64_t>(kb) * 144;
  const uint8_t* b1 = w1 + static_cast<int64_t>(kb) * 144;
  Q4KRegs r;
  r.h0 = __ldg(reinterpret_cast<const uint4*>(b0));
  r.h1 = __ldg(reinterpret_cast<const uint4*>(b1));
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    r.q0[c] = __ldg(reinterpret_cast<const uint2*>(b0 + 16 + 32 * c + 8 * t));
    r.q1[c] = __ldg(reinterpret_cast<const uint2*>(b1 + 16 + 32 * c + 8 * t));
  }
  return r;
}

// Shared-memory stage of one 256-column block for T tokens: the int8 values
// (token rows of 288 bytes: 256 + 32 padding, so a half-warp's 8-byte B loads
// of 4 tokens x 4 lanes hit 32 distinct banks) and per sub-block j the tokens'
// (d, s) pairs, two tokens' pairs one float4.
template <int T>
struct Stage {
  static constexpr int kRow = 288;
  int8_t q[T][kRow];
  float ds[8][T][2];
};

// grid (row blocks of 16 W, 1, k splits); block 32 W threads.
template <int NT, int W>
__global__ void __launch_bounds__(32 * W) TileQ4K(const uint8_t* __restrict__ w, int64_t row_stride, int n_rows,
                                                  int n_cols, const int8_t* __restrict__ xq,
                                                  const float* __restrict__ xd, const float* __restrict__ xs,
                                                  int n_tokens, float* __restrict__ out /* (splits, T, rows) */) {
  constexpr int T = 8 * NT;
  extern __shared__ __align__(16) uint8_t smem[];
  Stage<T>* st = reinterpret_cast<Stage<T>*>(smem);  // [2]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int row0 = blockIdx.x * 16 * W + warp * 16;
  const int r0 = min(row0 + g, n_rows - 1), r1 = min(row0 + g + 8, n_rows - 1);
  const uint8_t* w0 = w + static_cast<int64_t>(r0) * row_stride;
  const uint8_t* w1 = w + static_cast<int64_t>(r1) * row_stride;
  const int nbe = n_cols / 256, nb = n_cols / 32;
  const int splits = gridDim.z, z = blockIdx.z;
  const int kb0 = nbe * z / splits, kb1 = nbe * (z + 1) / splits;

  auto stage = [&](int kb, int buf) {
    Stage<T>& s = st[buf];
    for (int i = threadIdx.x; i < T * 16; i += 32 * W) {
      const int tok = i >> 4, c = i & 15;
      const bool ok = tok < n_tokens;
      CpAsync16ZeroFill(SmemAddr(&s.q[tok][16 * c]),
          xq + static_cast<int64_t>(ok ? tok : 0) * n_cols + kb * 256 + 16 * c, ok);
    }
    for (int i = threadIdx.x; i < T * 16; i += 32 * W) {
      const int tok = i >> 4, j = (i >> 1) & 7, which = i & 1;
      const bool ok = tok < n_tokens;
      const float* src = (which ? xs : xd) + static_cast<int64_t>(ok ? tok : 0) * nb + kb * 8 + j;
      CpAsync4ZeroFill(SmemAddr(&s.ds[j][tok][which]), src, ok);
    }
  };

  float acc[NT][4];
#pragma unroll
  for (int n = 0; n < NT; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;

  if (kb0 < kb1) {
    stage(kb0, 0);
    CpAsyncCommit();
    Q4KRegs cur = Q4KLoad(w0, w1, kb0, t);
    for (int kb = kb0; kb < kb1; ++kb) {
      const int buf = (kb - kb0) & 1;
      if (kb + 1 < kb1) stage(kb + 1, buf ^ 1);
      CpAsyncCommit();
      Q4KRegs next = cur;
      if (kb + 1 < kb1) next = Q4KLoad(w0, w1, kb + 1, t);
      CpAsyncWait<1>();
      __syncthreads();
      const Stage<T>& s = st[buf];
      const float d0 = Half(cur.h0.x & 0xFFFFu), dm0 = Half(cur.h0.x >> 16);
      const float d1 = Half(cur.h1.x & 0xFFFFu), dm1 = Half(cur.h1.x >> 16);
#pragma unroll
      for (int c = 0; c < 4; ++c) {
#pragma unroll
        for (int hi = 0; hi < 2; ++hi) {
          const int j = 2 * c + hi, sh = 4 * hi;
          const uint32_t a0 = (cur.q0[c].x >> sh) & 0x0F0F0F0Fu, a2 = (cur.q0[c].y >> sh) & 0x0F0F0F0Fu;
          const uint32_t a1 = (cur.q1[c].x >> sh) & 0x0F0F0F0Fu, a3 = (cur.q1[c].y >> sh) & 0x0F0F0F0Fu;
          float sc0, m0, sc1, m1;
          Q4KScaleMin(cur.h0, j, &sc0, &m0);
          Q4KScaleMin(cur.h1, j, &sc1, &m1);
          const float ds0 = d0 * sc0, ds1 = d1 * sc1, mm0 = dm0 * m0, mm1 = dm1 * m1;
#pragma unroll
          for (int n = 0; n < NT; ++n) {
            const uint2 bx = *reinterpret_cast<const uint2*>(&s.q[8 * n + g][32 * j + 8 * t]);
            const float4 xa = *reinterpret_cast<const float4*>(&s.ds[j][8 * n + 2 * t][0]);  // d_a s_a d_b s_b
            int c4[4] = {0, 0, 0, 0};
            Mma16832(c4, a0, a1, a2, a3, bx.x, bx.y);
            float* v = acc[n];
            v[0] = fmaf(static_cast<float>(c4[0]), ds0 * xa.x, v[0]) - mm0 * xa.y;
            v[1] = fmaf(static_cast<float>(c4[1]), ds0 * xa.z, v[1]) - mm0 * xa.w;
            v[2] = fmaf(static_cast<float>(c4[2]), ds1 * xa.x, v[2]) - mm1 * xa.y;
            v[3] = fmaf(static_cast<float>(c4[3]), ds1 * xa.z, v[3]) - mm1 * xa.w;
          }
        }
      }
      __syncthreads();  // the next iteration's stage overwrites this buffer
      cur = next;
    }
  }
  float* o = out + static_cast<int64_t>(z) * n_tokens * n_rows;
#pragma unroll
  for (int n = 0; n < NT; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int tok = 8 * n + 2 * t + (e & 1), row = row0 + g + 8 * (e >> 1);
      if (tok < n_tokens && row < n_rows) o[static_cast<int64_t>(tok) * n_rows + row] = acc[n][e];
    }
  }
}


// One thread per (row, token): the formula, straight.
__global__ void Reference(const uint8_t* w, int64_t row_stride, int n_rows, int n_cols, const int8_t* xq,
                          const float* xd, const float* xs, int n_tokens, float* y) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x, tok = blockIdx.y;
  if (r >= n_rows) return;
  const int nbe = n_cols / 256, nb = n_cols / 32;
  float v = 0.f;
  for (int kb = 0; kb < nbe; ++kb) {
    const uint8_t* b = w + r * row_stride + kb * 144;
    const uint4 h = *reinterpret_cast<const uint4*>(b);
    const float d = Half(h.x & 0xFFFFu), dm = Half(h.x >> 16);
    for (int j = 0; j < 8; ++j) {
      float sc, m;
      Q4KScaleMin(h, j, &sc, &m);
      int dot = 0;
      for (int l = 0; l < 32; ++l) {
        const int q = (b[16 + 32 * (j / 2) + l] >> (4 * (j & 1))) & 15;
        dot += q * xq[tok * n_cols + kb * 256 + 32 * j + l];
      }
      v += d * sc * xd[tok * nb + kb * 8 + j] * dot - dm * m * xs[tok * nb + kb * 8 + j];
    }
  }
  y[tok * n_rows + r] = v;
}

template <int NT, int W>
float RunTile(const uint8_t* w, int64_t stride, int rows, int cols, const int8_t* xq, const float* xd,
              const float* xs, int tokens, int splits, float* part, float* y, int copies, int64_t slot, int iters) {
  constexpr int T = 8 * NT;
  auto* fn = TileQ4K<NT, W>;
  const size_t smem = 2 * sizeof(Stage<T>);
  CK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  const dim3 grid((rows + 16 * W - 1) / (16 * W), 1, splits);
  const int64_t n = static_cast<int64_t>(tokens) * rows;
  auto launch = [&](int i) {
    fn<<<grid, 32 * W, smem>>>(w + (i % copies) * slot, stride, rows, cols, xq, xd, xs, tokens,
                               splits > 1 ? part : y);
    if (splits > 1) SumSplits<<<(n + 255) / 256, 256>>>(part, splits, n, y);
  };
  return probe::TimeLaunches(launch, iters);
}

template <int NT>
float Run(int W, const uint8_t* w, int64_t stride, int rows, int cols, const int8_t* xq, const float* xd,
          const float* xs, int tokens, int splits, float* part, float* y, int copies, int64_t slot, int iters) {
  return W == 8 ? RunTile<NT, 8>(w, stride, rows, cols, xq, xd, xs, tokens, splits, part, y, copies, slot, iters)
                : RunTile<NT, 4>(w, stride, rows, cols, xq, xd, xs, tokens, splits, part, y, copies, slot, iters);
}

float RunAny(int W, const uint8_t* w, int64_t stride, int rows, int cols, const int8_t* xq, const float* xd,
             const float* xs, int tokens, int splits, float* part, float* y, int copies, int64_t slot, int iters) {
  if (tokens <= 8) return Run<1>(W, w, stride, rows, cols, xq, xd, xs, tokens, splits, part, y, copies, slot, iters);
  if (tokens <= 16) return Run<2>(W, w, stride, rows, cols, xq, xd, xs, tokens, splits, part, y, copies, slot, iters);
  if (tokens <= 32) return Run<4>(W, w, stride, rows, cols, xq, xd, xs, tokens, splits, part, y, copies, slot, iters);
  return Run<8>(W, w, stride, rows, cols, xq, xd, xs, tokens, splits, part, y, copies, slot, iters);
}

}  // namespace

int main(int argc, char** argv) {
  // ./probe SHAPE_INDEX TOKENS W SPLITS 1: that configuration alone (for ncu).
  const bool one = argc == 6;
  const int one_shape = one ? std::atoi(argv[1]) : -1, one_t = one ? std::atoi(argv[2]) : 0;
  const int one_w = one ? std::atoi(argv[3]) : 0, one_s = one ? std::atoi(argv[4]) : 0;
  struct Shape {
    const char* name;
    int rows, cols;
    double base_us[5];  // today's mma form at 4, 8, 16, 32, 64 tokens (matvec_bench, same GPU, 2026-12-04)
  };
  const Shape shapes[] = {
      {"attn_q/o 3584x3584", 3584, 3584, {9.63, 10.11, 16.11, 26.62, 54.56}},
      {"attn_k/v 512x3584", 512, 3584, {7.95, 8.18, 10.59, 22.34, 48.35}},
      {"ffn_gate/up 18944x3584", 18944, 3584, {27.55, 32.76, 45.15, 121.03, 260.14}},
      {"ffn_down 3584x18944", 3584, 18944, {31.41, 34.19, 45.86, 133.35, 247.46}},
  };
  const int token_counts[] = {4, 8, 16, 32, 64};
  std::mt19937 rng(7);
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  for (int si = 0; si < 4; ++si) {
    const Shape& sh = shapes[si];
    if (one && si != one_shape) continue;
    const int nbe = sh.cols / 256, nb = sh.cols / 32;
    std::vector<uint8_t> hw;
    const probe::Q4KDevice wd = probe::RandomQ4K(sh.rows, sh.cols, rng, &hw);
    uint8_t* dw = wd.w;
    const int64_t stride = wd.stride, bytes = wd.bytes, slot = wd.slot;
    const int copies = wd.copies;
    const int T = 64;
    std::vector<int8_t> hq(static_cast<size_t>(T) * sh.cols);
    std::vector<float> hd(static_cast<size_t>(T) * nb), hs(hd.size());
    std::uniform_int_distribution<int> q8(-127, 127), byte(0, 255);
    for (auto& v : hq) v = static_cast<int8_t>(q8(rng));
    for (int tok = 0; tok < T; ++tok) {
      for (int b = 0; b < nb; ++b) {
        const float d = 0.01f + 0.02f * (byte(rng) / 255.f);
        int sum = 0;
        for (int l = 0; l < 32; ++l) sum += hq[static_cast<size_t>(tok) * sh.cols + 32 * b + l];
        hd[tok * nb + b] = d;
        hs[tok * nb + b] = d * sum;
      }
    }
    int8_t* dq;
    float *dd, *ds, *dy, *dref, *dpart;
    CK(cudaMalloc(&dq, hq.size()));
    CK(cudaMalloc(&dd, hd.size() * 4));
    CK(cudaMalloc(&ds, hs.size() * 4));
    CK(cudaMalloc(&dy, static_cast<size_t>(T) * sh.rows * 4));
    CK(cudaMalloc(&dref, static_cast<size_t>(T) * sh.rows * 4));
    CK(cudaMalloc(&dpart, static_cast<size_t>(8) * T * sh.rows * 4));
    CK(cudaMemcpy(dq, hq.data(), hq.size(), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dd, hd.data(), hd.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(ds, hs.data(), hs.size() * 4, cudaMemcpyHostToDevice));
    std::printf("%s: %.1f MB of weights (%d copies), floor at 4.5 TB/s %.1f us\n", sh.name, bytes / 1e6, copies,
                bytes / 4.5e12 * 1e6);
    for (int ti = 0; ti < 5; ++ti) {
      const int tokens = token_counts[ti];
      if (one && tokens != one_t) continue;
      Reference<<<dim3((sh.rows + 127) / 128, tokens), 128>>>(dw, stride, sh.rows, sh.cols, dq, dd, ds, tokens, dref);
      CK(cudaDeviceSynchronize());
      std::vector<float> ref(static_cast<size_t>(tokens) * sh.rows);
      CK(cudaMemcpy(ref.data(), dref, ref.size() * 4, cudaMemcpyDeviceToHost));
      {
      const int variant = 1;
      float best = 1e30f;
      int best_w = 0, best_s = 0;
      double worst_err = 0;
      for (int W : {4, 8}) {
        for (int splits : {1, 2, 4, 8}) {
          if (splits > nbe || (one && (W != one_w || splits != one_s))) continue;
          const float us = RunAny(W, dw, stride, sh.rows, sh.cols, dq, dd, ds, tokens, splits, dpart, dy, copies, slot, one ? 5 : 50);
          // Check the last run's output (weights copy (3 + 49) % copies: all copies hold the same bytes).
          const double err = probe::RelRmsErr(dy, ref);
          worst_err = std::max(worst_err, err);
          const int ctas = (sh.rows + 16 * W - 1) / (16 * W) * splits;
          std::printf("  v%d T %2d W %d splits %d (%4d CTAs, %.1f waves-ish): %8.2f us  %7.1f GB/s  rel.rms err %.2e\n",
                      variant, tokens, W, splits, ctas, ctas / static_cast<double>(sms), us, bytes / (us * 1e-6) / 1e9, err);
          if (us < best) best = us, best_w = W, best_s = splits;
        }
      }
      std::printf("  => v%d T %2d: best %.2f us (W %d, splits %d) vs today's mma form %.2f us: %.2fx; worst err %.1e\n",
                  variant, tokens, best, best_w, best_s, sh.base_us[ti], sh.base_us[ti] / best, worst_err);
      }
    }
    cudaFree(dw);
    cudaFree(dq);
    cudaFree(dd);
    cudaFree(ds);
    cudaFree(dy);
    cudaFree(dref);
    cudaFree(dpart);
  }
  return 0;
}
