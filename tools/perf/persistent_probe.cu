// Probe for issue 34 (not part of the build): does ONE persistent kernel that
// runs a decode layer's dependent products in order, its CTAs waiting on
// counters in global memory, beat the same products as one kernel each in a
// CUDA graph (programmatic dependent launch, weights fetched before the
// wait), and how near does each come to the HBM rate?
//
// One token through L layers of a 7B's shapes (E 3584, Q/K/V 4608 rows, O
// 3584, gate/up 2 x 18944, down 3584 x 18944), four dependent ops a layer:
//   QKV:  qkv = Wqkv rmsnorm(x)        (every CTA recomputes the norm: no op of its own)
//   O:    x += Wo qkv[0:E]             (a stand-in for attention's output)
//   GU:   g = silu(Wg h) * (Wu h), h = rmsnorm(x)   (gate and up rows interleaved, the
//         SwiGLU in the rows' epilogue: no op of its own)
//   DOWN: x += Wd g
// Weights: 4 bits with an f16 scale per 32 (0.5625 bytes a weight, as q4_K),
// a row its nibbles (byte k of a block: weight k low, k + 16 high) then its
// scales. Activations: int8 per 32 with a float scale (as the decoder's),
// quantized by every CTA from the f32 vector in L2; products by dp4a.
// Every op's rows are dealt in G equal chunks, G = the CTAs resident at once;
// chunk c is the same work in every variant:
//   graph:      one kernel an op (grid G), each CTA prefetching its chunk's first
//               kPrefetch bytes of weights into L2, then griddepcontrol.wait; PDL
//   graph-nopdl the same, plain launches
//   persistent: one kernel (grid G) running the 4L ops; before op i's activations a
//               CTA prefetches its chunk the same way, then spins until op i-1's
//               counter reaches G (acquire), computes, and adds 1 to op i's
//               counter (release)
//   persistent-noprefetch: the same without the L2 prefetch
// All variants compute identical bits (checked), and the first layer's QKV is
// checked against a float64 product of the same quantized activations.
//
// Prediction (written before any run; H100, whose reads stream at ~3.0 TB/s of
// 3.35): a layer is 131 MB (QKV 9.3, O 7.2, GU 76.4, DOWN 38.2): ~44 us at
// 3.0 TB/s. The graph pays each of the 4 boundaries ~2.5 us (launch, ramp,
// tail; docs/PERF.md's one-row probe): ~54 us a layer; the persistent kernel
// a counter round trip and the slowest chunk's tail (~1 us): ~48 us. So ~10%
// between them on this chain, more on a real step's 8-9 boundaries a layer.
//
// Third round (sixteenth session, 2026-12-07; not yet run): ncu showed the
// products latency-bound (752 GB/s at one CTA a SM, half the stalls on
// global loads) and more CTAs a SM did not help, because every CTA also
// quantized the op's whole input first, redundantly (the down op's 74 KB of
// g read by each of up to 528 CTAs, a serial prologue before its weights).
// PROBE_PREQ=1 runs the runtime's structure instead: a quantize op before
// each product (QuantOp: the blocks dealt over the CTAs, the norm's sum
// recomputed by each from x in L2) writing int8 blocks to global memory,
// and each product copying them into shared memory (16-byte loads, one
// round trip): 8 ops a layer, 8 boundaries, as a real step has ~9.
// Prediction: the products near the runtime's (~2.5 TB/s: a layer ~55-60 us
// in the graph at 4-5 CTAs a SM); the persistent kernel then pays a counter
// round trip a boundary where the graph pays a launch's ramp and tail, so
// if boundaries cost what docs/PERF.md guesses (~2.5 us against ~1), it
// gains ~8 x 1.5 = 12 us a layer (~20%); under 5%, issue 34's instruction
// list is not worth its size.
//
// Build and run (device): nvcc -O3 -std=c++17 -arch=sm_90a -o persistprobe persistent_probe.cu && ./persistprobe
// (PROBE_PREQ=1 ./persistprobe: the third round's ops)
#include <cuda_fp16.h>

#include <cmath>
#include <cstring>

#include "probe_util.cuh"

namespace {

constexpr int kE = 3584, kQkv = 4608, kFf = 18944;
constexpr int kThreads = 256, kWarps = kThreads / 32;
constexpr int kPrefetch = 64 * 1024;  // bytes of a chunk's weights prefetched into L2 before the wait
constexpr float kEps = 1e-6f;
static_assert(kE % kThreads == 0, "QuantizeInput: the norm's loads a thread");

enum OpKind : int { kOpQkv = 0, kOpO = 1, kOpGu = 2, kOpDown = 3, kOpQuant = 4 };
// What a quantize op reads (kOpQuant's src): rmsnorm(x), qkv[0:E] or g.
enum QuantSrc : int { kSrcNormX = 0, kSrcQkv = 1, kSrcG = 2 };

struct Op {
  int kind;
  int rows;           // output rows (GU: gate/up pairs, 18944); kOpQuant: blocks of 32
  int cols;           // K
  const uint8_t* w;   // (rows (x2 for GU), stride)
  int64_t stride;     // bytes a weight row
  const float* norm;  // (E) QKV, GU: the RMSNorm weights
  int src = 0;        // kOpQuant: a QuantSrc
  bool preq = false;  // a product reading its input from Bufs::act (a quantize op before it)
};

struct Bufs {
  float* x;    // (E) the residual stream
  float* qkv;  // (kQkv)
  float* g;    // (kFf)
  unsigned* done;  // (n_ops) CTAs finished with each op (persistent)
  int8_t* act_q;   // (kFf) the last quantize op's int8 values
  float* act_d;    // (kFf / 32) their block scales
  int* act_s;      // (kFf / 32) their block sums
};

__host__ __device__ constexpr int64_t RowStride(int cols) { return cols / 2 + cols / 16; }

// int8 activations in shared memory: q[K], d[K / 32] (per-32 scale), s[K / 32]
// (per-32 sum of q: the offset-8 term). Sized for the largest K.
struct Acts {
  int8_t q[kFf];
  float d[kFf / 32];
  int s[kFf / 32];
};

// rsqrt(mean(x^2) + eps) over the E values of x, by the whole CTA (red:
// kWarps floats of shared memory, free again on return). kE / kThreads = 14
// loads a thread, all in flight at once (a loop of dependent L2 round trips
// cost the first run ~1 us an op).
__device__ float NormScale(const float* x, float* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float v[kE / kThreads];
#pragma unroll
  for (int m = 0; m < kE / kThreads; ++m) v[m] = __ldcg(x + threadIdx.x + kThreads * m);
  float ss = 0.f;
#pragma unroll
  for (int m = 0; m < kE / kThreads; ++m) ss += v[m] * v[m];
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if (lane == 0) red[warp] = ss;
  __syncthreads();
  float t = 0.f;
  for (int w = 0; w < kWarps; ++w) t += red[w];
  __syncthreads();
  return rsqrtf(t / kE + kEps);
}

// One block of 32 (this lane's value x) quantized by its warp: q into q[lane],
// and by lane 0 the block's scale into *d and its sum of q into *s.
__device__ __forceinline__ void QuantizeBlock(float x, int8_t* q, float* d, int* s) {
  const int lane = threadIdx.x & 31;
  float m = fabsf(x);
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  const float bd = m / 127.f;
  const int v = bd > 0.f ? __float2int_rn(x / bd) : 0;
  q[lane] = static_cast<int8_t>(v);
  int sum = v;
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  if (lane == 0) {
    *d = bd;
    *s = sum;
  }
}

// v = the op's input (x normed, qkv[0:E] or g) quantized per 32: one warp a
// block. Reads bypass L1 (other SMs wrote them during this launch).
__device__ void QuantizeInput(const Op& op, const Bufs& b, Acts& a, float* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const float* src = op.kind == kOpQkv || op.kind == kOpGu ? b.x : op.kind == kOpO ? b.qkv : b.g;
  // rmsnorm: every CTA sums x^2 itself
  const float scale = op.kind == kOpQkv || op.kind == kOpGu ? NormScale(src, red) : 1.f;
  // Warp w quantizes blocks w, w + kWarps, ...: kGroup blocks' loads issued
  // before any is reduced (the first run's one load a round trip made the
  // down op's 74 blocks a warp ~10 us of serial L2 latency in every CTA,
  // and its product ran at ~1 TB/s).
  constexpr int kGroup = 8;
  const int nb = op.cols / 32;
  for (int blk0 = warp; blk0 < nb; blk0 += kWarps * kGroup) {
    float v[kGroup];
#pragma unroll
    for (int u = 0; u < kGroup; ++u) {
      const int blk = blk0 + kWarps * u;
      v[u] = blk < nb ? __ldcg(src + 32 * blk + lane) : 0.f;
    }
#pragma unroll
    for (int u = 0; u < kGroup; ++u) {
      const int blk = blk0 + kWarps * u;
      if (blk >= nb) break;
      const int i = 32 * blk + lane;
      float x = v[u];
      if (op.norm != nullptr) x *= scale * op.norm[i];
      QuantizeBlock(x, a.q + 32 * blk, a.d + blk, a.s + blk);
    }
  }
}

// kOpQuant, chunk c of G: blocks [nb c / G, nb (c + 1) / G) of the source
// quantized into Bufs::act_* (one warp a block, as QuantizeInput's), the
// norm's sum of squares recomputed by every CTA from x in L2.
__device__ void QuantOp(const Op& op, int c, int G, const Bufs& b, float* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const float* src = op.src == kSrcNormX ? b.x : op.src == kSrcQkv ? b.qkv : b.g;
  const float scale = op.src == kSrcNormX ? NormScale(src, red) : 1.f;
  const int b0 = static_cast<int>(static_cast<int64_t>(op.rows) * c / G);
  const int b1 = static_cast<int>(static_cast<int64_t>(op.rows) * (c + 1) / G);
  for (int blk = b0 + warp; blk < b1; blk += kWarps) {
    const int i = 32 * blk + lane;
    float x = __ldcg(src + i);
    if (op.norm != nullptr) x *= scale * op.norm[i];
    QuantizeBlock(x, b.act_q + 32 * blk, b.act_d + blk, b.act_s + blk);
  }
}

// A product's input from the quantize op before it: Bufs::act_* into
// shared memory, 16 bytes a thread a load, all issued before any is used.
__device__ void LoadActs(const Op& op, const Bufs& b, Acts& a) {
  const int n16 = op.cols / 16, nb = op.cols / 32;
  for (int i = threadIdx.x; i < n16; i += kThreads) {
    reinterpret_cast<int4*>(a.q)[i] = __ldcg(reinterpret_cast<const int4*>(b.act_q) + i);
  }
  for (int i = threadIdx.x; i < nb; i += kThreads) {
    a.d[i] = __ldcg(b.act_d + i);
    a.s[i] = __ldcg(b.act_s + i);
  }
}

// The op's input into shared memory (a product) or its quantized blocks
// into global memory (a quantize op); false for a quantize op (no product).
__device__ bool PrepareOp(const Op& op, int c, int G, const Bufs& b, Acts& a, float* red) {
  if (op.kind == kOpQuant) {
    QuantOp(op, c, G, b, red);
    return false;
  }
  if (op.preq) {
    LoadActs(op, b, a);
  } else {
    QuantizeInput(op, b, a, red);
  }
  return true;
}

// One 32-weight block: scale_w d_x (dot(q_w, q_x) - 8 s_x).
__device__ __forceinline__ float BlockDot(const uint4& w, float scale, const Acts& a, int blk) {
  const int4* xq = reinterpret_cast<const int4*>(a.q + 32 * blk);
  const int4 x0 = xq[0], x1 = xq[1];  // weights 0..15, 16..31
  const uint32_t ws[4] = {w.x, w.y, w.z, w.w};
  const int xl[4] = {x0.x, x0.y, x0.z, x0.w}, xh[4] = {x1.x, x1.y, x1.z, x1.w};
  int dot = 0;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    dot = __dp4a(static_cast<int>(ws[k] & 0x0F0F0F0Fu), xl[k], dot);
    dot = __dp4a(static_cast<int>((ws[k] >> 4) & 0x0F0F0F0Fu), xh[k], dot);
  }
  return scale * a.d[blk] * static_cast<float>(dot - 8 * a.s[blk]);
}

// Two rows at once (twice the loads in flight a warp): the sums over their
// 32-weight blocks, lane l taking blocks l, l + 32, ...; each warp's sum in
// every lane. r1 may be null (one row).
__device__ __forceinline__ void RowDot2(const uint8_t* r0, const uint8_t* r1, int cols, const Acts& a,
                                        float* y0, float* y1) {
  const int lane = threadIdx.x & 31;
  const int nb = cols / 32;
  const __half* s0 = reinterpret_cast<const __half*>(r0 + cols / 2);
  const __half* s1 = r1 != nullptr ? reinterpret_cast<const __half*>(r1 + cols / 2) : s0;
  const uint8_t* n1 = r1 != nullptr ? r1 : r0;
  float a0 = 0.f, a1 = 0.f;
  // Unrolled 4 deep: 8 loads of 16 B a lane in flight (the first run's 2
  // deep left the product at ~1 TB/s, latency-bound).
#pragma unroll 4
  for (int blk = lane; blk < nb; blk += 32) {
    const uint4 w0 = __ldcs(reinterpret_cast<const uint4*>(r0 + 16 * blk));  // streamed once
    const uint4 w1 = __ldcs(reinterpret_cast<const uint4*>(n1 + 16 * blk));
    const float c0 = __half2float(s0[blk]), c1 = __half2float(s1[blk]);
    a0 += BlockDot(w0, c0, a, blk);
    a1 += BlockDot(w1, c1, a, blk);
  }
  for (int o = 16; o > 0; o >>= 1) {
    a0 += __shfl_xor_sync(0xffffffffu, a0, o);
    a1 += __shfl_xor_sync(0xffffffffu, a1, o);
  }
  *y0 = a0;
  *y1 = a1;
}

__device__ __forceinline__ void PrefetchL2(const void* p, int bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(p), "r"(bytes) : "memory");
}

// The chunk c of G of op: rows [r0, r1) (GU: pairs).
__device__ __forceinline__ void Chunk(const Op& op, int c, int G, int* r0, int* r1) {
  *r0 = static_cast<int>(static_cast<int64_t>(op.rows) * c / G);
  *r1 = static_cast<int>(static_cast<int64_t>(op.rows) * (c + 1) / G);
}

// The first kPrefetch bytes (at most the chunk) of chunk c's weights into L2:
// one thread, one bulk prefetch (contiguous rows).
__device__ void PrefetchChunk(const Op& op, int c, int G) {
  if (threadIdx.x != 0) return;
  int r0, r1;
  Chunk(op, c, G, &r0, &r1);
  const int per = op.kind == kOpGu ? 2 : 1;
  const int64_t bytes = static_cast<int64_t>(r1 - r0) * per * op.stride;
  const int n = static_cast<int>(bytes < kPrefetch ? bytes : kPrefetch) & ~15;
  if (n > 0) PrefetchL2(op.w + static_cast<int64_t>(r0) * per * op.stride, n);
}

// The chunk's rows, warp w taking rows r0 + w, r0 + w + kWarps, ...
__device__ void ComputeChunk(const Op& op, int c, int G, const Bufs& b, const Acts& a) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int r0, r1;
  Chunk(op, c, G, &r0, &r1);
  if (op.kind == kOpGu) {  // a pair's gate and up rows together
    for (int r = r0 + warp; r < r1; r += kWarps) {
      float gate, up;
      RowDot2(op.w + (2 * static_cast<int64_t>(r)) * op.stride, op.w + (2 * static_cast<int64_t>(r) + 1) * op.stride,
              op.cols, a, &gate, &up);
      if (lane == 0) b.g[r] = gate / (1.f + expf(-gate)) * up;
    }
    return;
  }
  // Rows r and r + kWarps together.
  for (int r = r0 + warp; r < r1; r += 2 * kWarps) {
    const bool two = r + kWarps < r1;
    float y[2];
    RowDot2(op.w + static_cast<int64_t>(r) * op.stride, two ? op.w + static_cast<int64_t>(r + kWarps) * op.stride : nullptr,
            op.cols, a, &y[0], &y[1]);
    if (lane != 0) continue;
    for (int i = 0; i < (two ? 2 : 1); ++i) {
      const int row = r + i * kWarps;
      if (op.kind == kOpQkv) {
        b.qkv[row] = y[i];
      } else {
        b.x[row] = __ldcg(b.x + row) + y[i];  // O, DOWN: residual in place (own rows only)
      }
    }
  }
}

// ---- graph variant: one kernel an op.
__global__ void __launch_bounds__(kThreads) OpKernel(const Op op, const Bufs b) {
  extern __shared__ __align__(16) uint8_t smem[];
  Acts& a = *reinterpret_cast<Acts*>(smem);
  __shared__ float red[kWarps];
  PrefetchChunk(op, blockIdx.x, gridDim.x);
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  const bool product = PrepareOp(op, blockIdx.x, gridDim.x, b, a, red);
  __syncthreads();
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
  if (product) ComputeChunk(op, blockIdx.x, gridDim.x, b, a);
}

// ---- persistent variant: every op in order, dependencies through b.done.
__device__ __forceinline__ unsigned LoadAcquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}

template <bool kPrefetchWeights>
__global__ void __launch_bounds__(kThreads) PersistentKernel(const Op* __restrict__ ops, int n_ops,
                                                             const Bufs b) {
  extern __shared__ __align__(16) uint8_t smem[];
  Acts& a = *reinterpret_cast<Acts*>(smem);
  __shared__ float red[kWarps];
  const int G = gridDim.x, c = blockIdx.x;
  for (int i = 0; i < n_ops; ++i) {
    const Op op = ops[i];
    if (kPrefetchWeights) PrefetchChunk(op, c, G);
    if (i > 0) {
      if (threadIdx.x == 0) {
        while (LoadAcquire(b.done + i - 1) < static_cast<unsigned>(G)) {
        }
      }
      __syncthreads();
    }
    const bool product = PrepareOp(op, c, G, b, a, red);
    __syncthreads();
    if (product) ComputeChunk(op, c, G, b, a);
    __syncthreads();  // every warp's outputs written ...
    if (threadIdx.x == 0) {
      __threadfence();  // ... and visible GPU-wide before the count
      atomicAdd(b.done + i, 1u);
    }
  }
}

// ---- the host side.
std::vector<uint8_t> RandomWeights(int rows, int cols, std::mt19937& rng) {
  const int64_t stride = RowStride(cols);
  std::vector<uint8_t> h(static_cast<size_t>(rows * stride));
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> s(0.002f, 0.02f);
  for (int r = 0; r < rows; ++r) {
    uint8_t* row = h.data() + r * stride;
    for (int i = 0; i < cols / 2; ++i) row[i] = static_cast<uint8_t>(byte(rng));
    __half* sc = reinterpret_cast<__half*>(row + cols / 2);
    for (int blk = 0; blk < cols / 32; ++blk) sc[blk] = __float2half(s(rng));
  }
  return h;
}

uint8_t* Upload(const std::vector<uint8_t>& h) {
  uint8_t* d = nullptr;
  CK(cudaMalloc(&d, h.size()));
  CK(cudaMemcpy(d, h.data(), h.size(), cudaMemcpyHostToDevice));
  return d;
}

}  // namespace

int main() {
  int dev = 0, sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  cudaDeviceProp p;
  CK(cudaGetDeviceProperties(&p, dev));
  const int smem = static_cast<int>(sizeof(Acts));
  CK(cudaFuncSetAttribute(OpKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  CK(cudaFuncSetAttribute(PersistentKernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  CK(cudaFuncSetAttribute(PersistentKernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  int max_per_sm = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&max_per_sm, PersistentKernel<true>, kThreads, smem));
  std::printf("%s, %d SMs, at most %d CTAs a SM (%d B of shared memory a CTA)\n", p.name, sms, max_per_sm, smem);

  // L layers of distinct weights (L x 131 MB, past L2).
  const int L = 8;
  const char* preq_env = std::getenv("PROBE_PREQ");
  const bool preq = preq_env != nullptr && std::atoi(preq_env) != 0;
  std::printf("%s\n", preq ? "PROBE_PREQ: a quantize op before each product (8 ops a layer)"
                           : "each product quantizes its own input (4 ops a layer)");
  std::mt19937 rng(7);
  std::vector<Op> ops;
  std::vector<uint8_t> w_qkv0;  // layer 0's QKV, for the reference
  std::vector<float> hnorm(kE);
  for (float& v : hnorm) v = 0.5f + std::uniform_real_distribution<float>(0.f, 1.f)(rng);
  float* dnorm = nullptr;
  CK(cudaMalloc(&dnorm, kE * 4));
  CK(cudaMemcpy(dnorm, hnorm.data(), kE * 4, cudaMemcpyHostToDevice));
  double layer_bytes = 0;
  for (int l = 0; l < L; ++l) {
    const std::vector<uint8_t> qkv = RandomWeights(kQkv, kE, rng), o = RandomWeights(kE, kE, rng),
                               gu = RandomWeights(2 * kFf, kE, rng), down = RandomWeights(kE, kFf, rng);
    if (l == 0) w_qkv0 = qkv;
    // PROBE_PREQ: each product's input quantized by an op of its own first.
    auto quant = [&](int cols, int src, const float* norm) {
      if (preq) ops.push_back({kOpQuant, cols / 32, cols, nullptr, 0, norm, src});
    };
    quant(kE, kSrcNormX, dnorm);
    ops.push_back({kOpQkv, kQkv, kE, Upload(qkv), RowStride(kE), dnorm, 0, preq});
    quant(kE, kSrcQkv, nullptr);
    ops.push_back({kOpO, kE, kE, Upload(o), RowStride(kE), nullptr, 0, preq});
    quant(kE, kSrcNormX, dnorm);
    ops.push_back({kOpGu, kFf, kE, Upload(gu), RowStride(kE), dnorm, 0, preq});
    quant(kFf, kSrcG, nullptr);
    ops.push_back({kOpDown, kE, kFf, Upload(down), RowStride(kFf), nullptr, 0, preq});
    if (l == 0) layer_bytes = static_cast<double>(qkv.size() + o.size() + gu.size() + down.size());
  }
  const int n_ops = static_cast<int>(ops.size());
  Op* dops = nullptr;
  CK(cudaMalloc(&dops, n_ops * sizeof(Op)));
  CK(cudaMemcpy(dops, ops.data(), n_ops * sizeof(Op), cudaMemcpyHostToDevice));
  Bufs b;
  CK(cudaMalloc(&b.x, kE * 4));
  CK(cudaMalloc(&b.qkv, kQkv * 4));
  CK(cudaMalloc(&b.g, kFf * 4));
  CK(cudaMalloc(&b.done, n_ops * 4));
  CK(cudaMalloc(&b.act_q, kFf));
  CK(cudaMalloc(&b.act_d, kFf / 32 * 4));
  CK(cudaMalloc(&b.act_s, kFf / 32 * 4));
  std::vector<float> x0(kE);
  for (float& v : x0) v = std::uniform_real_distribution<float>(-1.f, 1.f)(rng);

  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  // G: CTAs a SM x SMs, all resident at once (so the spin waits cannot
  // deadlock): one CTA a SM as a megakernel would, two, and the most that fit.
  for (int per_sm : {1, 2, max_per_sm}) {
  if (per_sm > max_per_sm) continue;
  const int G = sms * per_sm;
  std::printf("=== G = %d (%d a SM)\n", G, per_sm);
  auto reset = [&](cudaStream_t st) {
    CK(cudaMemcpyAsync(b.x, x0.data(), kE * 4, cudaMemcpyHostToDevice, st));
    CK(cudaMemsetAsync(b.done, 0, n_ops * 4, st));
  };
  // One variant's run, captured: 0 graph (PDL), 1 graph without PDL, 2
  // persistent, 3 persistent without the prefetch.
  auto capture = [&](int v) {
    cudaGraph_t g;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    CK(cudaMemsetAsync(b.done, 0, n_ops * 4, s));
    if (v <= 1) {
      for (const Op& op : ops) {
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(G);
        cfg.blockDim = dim3(kThreads);
        cfg.dynamicSmemBytes = smem;
        cfg.stream = s;
        cudaLaunchAttribute attr[1];
        attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[0].val.programmaticStreamSerializationAllowed = 1;
        cfg.attrs = attr;
        cfg.numAttrs = v == 0 ? 1 : 0;
        CK(cudaLaunchKernelEx(&cfg, OpKernel, op, b));
      }
    } else if (v == 2) {
      PersistentKernel<true><<<G, kThreads, smem, s>>>(dops, n_ops, b);
    } else {
      PersistentKernel<false><<<G, kThreads, smem, s>>>(dops, n_ops, b);
    }
    CK(cudaStreamEndCapture(s, &g));
    cudaGraphExec_t e;
    CK(cudaGraphInstantiate(&e, g, 0));
    CK(cudaGraphDestroy(g));
    return e;
  };
  const char* names[4] = {"graph, PDL", "graph, no PDL", "persistent", "persistent, no prefetch"};
  cudaGraphExec_t exec[4];
  for (int v = 0; v < 4; ++v) exec[v] = capture(v);

  // Correctness: every variant's x after the L layers, bit for bit; layer
  // 0's QKV against float64 on the same int8 activations.
  std::vector<float> xs[4];
  for (int v = 0; v < 4; ++v) {
    reset(s);
    CK(cudaGraphLaunch(exec[v], s));
    CK(cudaStreamSynchronize(s));
    xs[v].resize(kE);
    CK(cudaMemcpy(xs[v].data(), b.x, kE * 4, cudaMemcpyDeviceToHost));
  }
  for (int v = 1; v < 4; ++v) {
    const bool same = std::memcmp(xs[v].data(), xs[0].data(), kE * 4) == 0;
    std::printf("%-24s x after %d layers %s the graph's\n", names[v], L, same ? "==" : "DIFFERS from");
  }
  {
    // Layer 0's QKV alone (one op of the graph variant; its quantize op
    // first under PROBE_PREQ) against the host.
    reset(s);
    if (preq) OpKernel<<<G, kThreads, smem, s>>>(ops[0], b);
    OpKernel<<<G, kThreads, smem, s>>>(ops[preq ? 1 : 0], b);
    CK(cudaStreamSynchronize(s));
    std::vector<float> got(kQkv);
    CK(cudaMemcpy(got.data(), b.qkv, kQkv * 4, cudaMemcpyDeviceToHost));
    double ss = 0;
    for (float v : x0) ss += static_cast<double>(v) * v;
    const float scale = 1.f / std::sqrt(static_cast<float>(ss / kE) + kEps);
    std::vector<int8_t> q(kE);
    std::vector<float> d(kE / 32);
    std::vector<int> sq(kE / 32);
    for (int blk = 0; blk < kE / 32; ++blk) {
      float m = 0;
      for (int i = 0; i < 32; ++i) m = std::max(m, std::fabs(x0[32 * blk + i] * scale * hnorm[32 * blk + i]));
      d[blk] = m / 127.f;
      sq[blk] = 0;
      for (int i = 0; i < 32; ++i) {
        const float v = x0[32 * blk + i] * scale * hnorm[32 * blk + i];
        q[32 * blk + i] = static_cast<int8_t>(d[blk] > 0 ? std::lrintf(v / d[blk]) : 0);
        sq[blk] += q[32 * blk + i];
      }
    }
    double e2 = 0, r2 = 0;
    const int64_t stride = RowStride(kE);
    for (int r = 0; r < kQkv; ++r) {
      const uint8_t* row = w_qkv0.data() + r * stride;
      const __half* sc = reinterpret_cast<const __half*>(row + kE / 2);
      double y = 0;
      for (int blk = 0; blk < kE / 32; ++blk) {
        long dot = 0;
        for (int k = 0; k < 16; ++k) {
          const uint8_t byte = row[16 * blk + k];
          dot += static_cast<long>(byte & 15) * q[32 * blk + k] + static_cast<long>(byte >> 4) * q[32 * blk + 16 + k];
        }
        y += static_cast<double>(__half2float(sc[blk])) * d[blk] * static_cast<double>(dot - 8L * sq[blk]);
      }
      e2 += (got[r] - y) * (got[r] - y);
      r2 += y * y;
    }
    std::printf("layer 0 QKV against float64 on the same int8 activations: rel. RMS %.2e\n", std::sqrt(e2 / r2));
  }

  // Timing: 20 replays each, the variants interleaved, 3 rounds.
  static cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  for (int round = 0; round < 3; ++round) {
    for (int v = 0; v < 4; ++v) {
      const int reps = 20;
      float total = 0;
      for (int r = 0; r < reps; ++r) {
        reset(s);
        CK(cudaEventRecord(e0, s));
        CK(cudaGraphLaunch(exec[v], s));
        CK(cudaEventRecord(e1, s));
        CK(cudaEventSynchronize(e1));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        total += ms;
      }
      const double us_layer = 1e3 * total / reps / L;
      std::printf("round %d %-24s %7.2f us a layer, %6.0f GB/s\n", round, names[v], us_layer,
                  layer_bytes / (us_layer * 1e-6) / 1e9);
    }
  }
  for (int v = 0; v < 4; ++v) CK(cudaGraphExecDestroy(exec[v]));
  }
  return 0;
}
