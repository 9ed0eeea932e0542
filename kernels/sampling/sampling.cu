#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/cuda_check.h"
#include "kernels/sampling/sampling.h"
#include "kernels/sampling/sampling_util.h"

namespace dpl::kernels {
namespace {

constexpr int kBins = 65536;  // top 16 bits of the ordered key: 7 mantissa bits
constexpr int kCap = kSamplingMaxCandidates;
constexpr int kPassThreads = 256;
constexpr int kPassBlocks = 264;  // 2 per SM on H200; grid-stride beyond

// Workspace layout (bytes): the header and histograms are zeroed per call.
struct Header {
  unsigned long long argmax_key;  // max CandidateKey over the vocab
  unsigned int n_cand;            // candidates appended (may exceed kCap)
  int cutoff_bin;                 // lowest histogram bin kept
  double z_all;                   // sum over the vocab of exp(l - max), fixed order
  unsigned int pad[58];
};
static_assert(sizeof(Header) == 256, "header is one 256-byte slot");
struct Workspace {
  Header h;
  unsigned int count[kBins];        // elements per bin
  float mass[kBins];                // sum of exp(l - max) per bin
  unsigned long long cand[kCap];    // CandidateKey of each candidate
  double block_mass[kPassBlocks];   // HistKernel's per-block mass sums
};
constexpr size_t kZeroBytes = sizeof(Header) + sizeof(unsigned int) * kBins + sizeof(float) * kBins;

// Repetition penalty, one block: each distinct ring token once.
//   l = l > 0 ? l / penalty : l * penalty
__global__ void PenaltyKernel(float* logits, int n_vocab, const int* ring, int n_slots,
                              const SamplerState* state, float penalty) {
  const int count = state->ring_count < n_slots ? state->ring_count : n_slots;
  for (int i = threadIdx.x; i < count; i += blockDim.x) {
    const int t = ring[i];
    bool first = t >= 0 && t < n_vocab;
    for (int j = 0; j < i && first; ++j) first = ring[j] != t;
    if (first) {
      const float l = logits[t];
      logits[t] = l > 0.0f ? l / penalty : l * penalty;
    }
  }
}

// argmax_key = max_i CandidateKey(logit_i, i): the greedy token and the max logit.
__global__ void MaxKernel(const float* logits, int n_vocab, Workspace* ws) {
  unsigned long long best = 0;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n_vocab; i += gridDim.x * blockDim.x) {
    const unsigned long long k = CandidateKey(__float_as_uint(logits[i]), i);
    best = k > best ? k : best;
  }
  for (int o = 16; o > 0; o >>= 1) {
    const unsigned long long other = __shfl_xor_sync(0xffffffffu, best, o);
    best = other > best ? other : best;
  }
  if (threadIdx.x % 32 == 0) atomicMax(&ws->h.argmax_key, best);
}

__device__ void PushRing(int token, int* ring, int n_slots, SamplerState* state) {
  if (n_slots <= 0) return;
  const int head = state->ring_head;
  ring[head] = token;
  state->ring_head = (head + 1) % n_slots;
  if (state->ring_count < n_slots) state->ring_count += 1;
}

__global__ void GreedyFinishKernel(const Workspace* ws, int* ring, int n_slots,
                                   SamplerState* state, int* token_out) {
  const int token = static_cast<int>(CandidateId(ws->h.argmax_key));
  *token_out = token;
  PushRing(token, ring, n_slots, state);
}

// Histogram of bin = OrderedKey >> 16: count and mass exp(l - max), one
// global atomic per element and field (warp-aggregating peers with
// __match_any_sync trips a ptxas register-allocation failure in CUDA 13.0).
__global__ void HistKernel(const float* logits, int n_vocab, Workspace* ws, bool want_mass) {
  __shared__ double s_part[kPassThreads / 32];
  double my_mass = 0.0;
  const float max_l = __uint_as_float(KeyToFloatBits(static_cast<uint32_t>(ws->h.argmax_key >> 32)));
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n_vocab; i += gridDim.x * blockDim.x) {
    const float l = logits[i];
    const int bin = static_cast<int>(OrderedKey(__float_as_uint(l)) >> 16);
    atomicAdd(&ws->count[bin], 1u);
    if (want_mass) {
      const float m = expf(l - max_l);
      my_mass += m;
      atomicAdd(&ws->mass[bin], m);
    }
  }
  // Deterministic block sum (fixed shuffle tree), summed in block order later.
  for (int o = 16; o > 0; o >>= 1) my_mass += __shfl_xor_sync(0xffffffffu, my_mass, o);
  if (threadIdx.x % 32 == 0) s_part[threadIdx.x / 32] = my_mass;
  __syncthreads();
  if (threadIdx.x == 0) {
    double b = 0.0;
    for (int w = 0; w < kPassThreads / 32; ++w) b += s_part[w];
    ws->block_mass[blockIdx.x] = b;
  }
}

// One block of 1024 threads: thread t owns the 64 bins [65535 - 64t - 63,
// 65535 - 64t] (descending). The kept bins (>= cutoff) must hold every token
// that can survive the chain, and, when top-k and top-p are both on, the whole
// top-k set (top-p normalizes over it):
//   top-k on:  cutoff <= bin_k, the bin where the descending count reaches k
//   top-p on, top-k off: cutoff <= bin_p, where the mass reaches top_p * Z_all
//     (Z_all from the fixed-order block sums, so it is the same every run)
//   min-p on (unless top-k and top-p both on): cutoff <= bin of max + log(min_p)
// and the cutoff is the highest bin allowed by all of them; raised (truncation,
// counted in state) when more than kCap elements lie in bins >= cutoff.
__global__ void __launch_bounds__(1024) CutoffKernel(Workspace* ws, SamplingParams p,
                                                     int n_vocab, SamplerState* state) {
  __shared__ unsigned int s_cnt[1024];
  __shared__ double s_mass[1024];
  __shared__ int s_bin_k, s_bin_p, s_bin_cap, s_top_bin;
  const int t = threadIdx.x;
  const int hi = kBins - 1 - 64 * t;  // this thread's bins: hi, hi-1, ..., hi-63
  unsigned int c = 0;
  double m = 0.0;
#pragma unroll 16
  for (int b = hi; b > hi - 64; --b) {
    c += ws->count[b];
    m += ws->mass[b];
  }
  s_cnt[t] = c;
  s_mass[t] = m;
  if (t == 0) {
    s_bin_k = 0;
    s_bin_p = 0;
    s_bin_cap = kBins;
    s_top_bin = 0;
  }
  __syncthreads();
  // Inclusive scan (Hillis-Steele) over threads = over descending bins.
  for (int o = 1; o < 1024; o <<= 1) {
    const unsigned int c2 = t >= o ? s_cnt[t - o] : 0;
    const double m2 = t >= o ? s_mass[t - o] : 0.0;
    __syncthreads();
    s_cnt[t] += c2;
    s_mass[t] += m2;
    __syncthreads();
  }
  const bool topk_on = p.top_k > 0 && p.top_k < n_vocab;
  const bool topp_on = p.top_p < 1.0f;
  const double total_mass = s_mass[1023];  // float atomics: only steers the cutoff
  unsigned int cum_c = t > 0 ? s_cnt[t - 1] : 0;
  double cum_m = t > 0 ? s_mass[t - 1] : 0.0;
  // Margin 1e-4 on the mass: a lower cutoff only adds candidates.
  const double p_target = static_cast<double>(p.top_p) * total_mass * (1.0 + 1e-4);
  const unsigned int k_target = topk_on ? static_cast<unsigned int>(p.top_k) : 0u;
  int my_cap = kBins, my_top = 0;  // one shared atomic per thread, not per bin
#pragma unroll 16
  for (int b = hi; b > hi - 64; --b) {
    const unsigned int prev_c = cum_c;
    const double prev_m = cum_m;
    cum_c += ws->count[b];
    cum_m += ws->mass[b];
    // The first (highest) bin where each target is reached: one writer each.
    if (topk_on && prev_c < k_target && cum_c >= k_target) s_bin_k = b;
    if (topp_on && prev_m < p_target && cum_m >= p_target) s_bin_p = b;
    if (cum_c <= kCap) my_cap = b;  // b descends: the last hit is the lowest
    if (ws->count[b] > 0 && my_top == 0) my_top = b;  // the first hit is the highest
  }
  atomicMin(&s_bin_cap, my_cap);
  atomicMax(&s_top_bin, my_top);
  __syncthreads();
  if (t == 0) {
    double z = 0.0;
    for (int i = 0; i < kPassBlocks; ++i) z += ws->block_mass[i];
    ws->h.z_all = z;
    int cut = 0;
    if (topk_on) cut = s_bin_k;
    if (topp_on && !topk_on) cut = s_bin_p;
    if (p.min_p > 0.0f && !(topk_on && topp_on)) {
      const float max_l = __uint_as_float(KeyToFloatBits(static_cast<uint32_t>(ws->h.argmax_key >> 32)));
      const int bin_min = static_cast<int>(OrderedKey(__float_as_uint(max_l + logf(p.min_p))) >> 16);
      cut = bin_min > cut ? bin_min : cut;
    }
    if (cut < s_bin_cap) {
      // Too many candidates: keep the highest bins that fit, at least the
      // highest non-empty bin (then its first kCap arrivals).
      cut = s_bin_cap < s_top_bin ? s_bin_cap : s_top_bin;
      state->truncations += 1;
    }
    ws->h.cutoff_bin = cut;
  }
}

// Append CandidateKey of every logit in bins >= cutoff (warp-aggregated slots).
__global__ void CollectKernel(const float* logits, int n_vocab, Workspace* ws) {
  const int cutoff = ws->h.cutoff_bin;
  const int stride = gridDim.x * blockDim.x;
  const int n_round = (n_vocab + stride - 1) / stride * stride;
  const int lane = threadIdx.x % 32;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n_round; i += stride) {
    const uint32_t bits = i < n_vocab ? __float_as_uint(logits[i]) : 0u;
    const bool take = i < n_vocab && static_cast<int>(OrderedKey(bits) >> 16) >= cutoff;
    const unsigned mask = __ballot_sync(0xffffffffu, take);
    if (mask == 0) continue;
    unsigned int base = 0;
    if (lane == __ffs(mask) - 1) base = atomicAdd(&ws->h.n_cand, __popc(mask));
    base = __shfl_sync(0xffffffffu, base, __ffs(mask) - 1);
    if (take) {
      const unsigned int slot = base + __popc(mask & ((1u << lane) - 1));
      if (slot < kCap) ws->cand[slot] = CandidateKey(bits, i);
    }
  }
}

// Inclusive scan of s_v[0..n) (n <= kCap) in place, 1024 threads, each owning
// 2 consecutive elements. s_tmp: 32 doubles.
__device__ void BlockScan(double* s_v, int n, double* s_tmp) {
  const int t = threadIdx.x, lane = t % 32, warp = t / 32;
  const int i0 = 2 * t;
  double a = i0 < n ? s_v[i0] : 0.0;
  double b = i0 + 1 < n ? s_v[i0 + 1] : 0.0;
  b += a;
  double x = b;
  for (int o = 1; o < 32; o <<= 1) {
    const double y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
  if (lane == 31) s_tmp[warp] = x;
  __syncthreads();
  if (warp == 0) {
    double w = s_tmp[lane];
    for (int o = 1; o < 32; o <<= 1) {
      const double y = __shfl_up_sync(0xffffffffu, w, o);
      if (lane >= o) w += y;
    }
    s_tmp[lane] = w;
  }
  __syncthreads();
  const double offset = (warp > 0 ? s_tmp[warp - 1] : 0.0) + (x - b);
  if (i0 < n) s_v[i0] = a + offset;
  if (i0 + 1 < n) s_v[i0 + 1] = b + offset;
  __syncthreads();
}

// One block: sort the candidates (descending key), then top-k, top-p, min-p,
// temperature and the draw, exactly as in sampling.h. (~90 lines: the chain
// is one block-wide sequence with __syncthreads between its steps; it reads
// in the order of llama.cpp's sampler chain.)
__global__ void __launch_bounds__(1024) FinalKernel(const Workspace* ws, SamplingParams p,
                                                    int n_vocab, int* ring, SamplerState* state,
                                                    int* token_out) {
  __shared__ unsigned long long s_key[kCap];
  __shared__ double s_w[kCap];
  __shared__ double s_tmp[32];
  __shared__ int s_cut;
  const int t = threadIdx.x;
  const int n = ws->h.n_cand < kCap ? static_cast<int>(ws->h.n_cand) : kCap;
  if (n == 0) {  // unreachable (the cutoff bin is never above the max), but safe
    if (t == 0) {
      *token_out = static_cast<int>(CandidateId(ws->h.argmax_key));
      state->step += 1;
    }
    return;
  }
  int n_sort = 64;
  while (n_sort < n) n_sort <<= 1;
  for (int i = t; i < n_sort; i += blockDim.x) s_key[i] = i < n ? ws->cand[i] : 0ull;
  __syncthreads();
  // Bitonic sort, descending.
  for (int k = 2; k <= n_sort; k <<= 1) {
    for (int j = k >> 1; j > 0; j >>= 1) {
      for (int i = t; i < n_sort; i += blockDim.x) {
        const int ixj = i ^ j;
        if (ixj > i) {
          const unsigned long long a = s_key[i], b = s_key[ixj];
          const bool desc = (i & k) == 0;
          if (desc ? a < b : a > b) {
            s_key[i] = b;
            s_key[ixj] = a;
          }
        }
      }
      __syncthreads();
    }
  }
  auto logit = [&](int i) {
    return __uint_as_float(KeyToFloatBits(static_cast<uint32_t>(s_key[i] >> 32)));
  };
  // top-k
  int keep = n;
  if (p.top_k > 0 && p.top_k < keep) keep = p.top_k;
  const float l0 = logit(0);
  // top-p over softmax(kept logits).
  if (p.top_p < 1.0f) {
    for (int i = t; i < keep; i += blockDim.x) s_w[i] = exp(static_cast<double>(logit(i)) - l0);
    if (t == 0) s_cut = keep;
    __syncthreads();
    BlockScan(s_w, keep, s_tmp);
    // Normalizer: the kept top-k set, or the whole vocab when top-k is off
    // (the candidates are then only a prefix of it).
    const bool topk_on = p.top_k > 0 && p.top_k < n_vocab;
    const double total = topk_on ? s_w[keep - 1] : ws->h.z_all;
    for (int i = t; i < keep; i += blockDim.x) {
      if (s_w[i] / total >= static_cast<double>(p.top_p)) atomicMin(&s_cut, i + 1);
    }
    __syncthreads();
    keep = s_cut;
    __syncthreads();
  }
  // min-p: logit >= l0 + log(min_p), at least one.
  if (p.min_p > 0.0f) {
    const float threshold = l0 + logf(p.min_p);
    if (t == 0) s_cut = keep;
    __syncthreads();
    for (int i = 1 + t; i < keep; i += blockDim.x) {
      if (!(logit(i) >= threshold)) atomicMin(&s_cut, i);
    }
    __syncthreads();
    keep = s_cut;
    __syncthreads();
  }
  // Temperature, weights, draw.
  const double max_t = static_cast<double>(l0 / p.temperature);
  for (int i = t; i < keep; i += blockDim.x) {
    s_w[i] = exp(static_cast<double>(logit(i) / p.temperature) - max_t);
  }
  if (t == 0) s_cut = keep - 1;
  __syncthreads();
  BlockScan(s_w, keep, s_tmp);
  const double u = UniformFromCounter(p.seed, state->step) * s_w[keep - 1];
  for (int i = t; i < keep; i += blockDim.x) {
    const double prev = i > 0 ? s_w[i - 1] : 0.0;
    if (u < s_w[i] && u >= prev) atomicMin(&s_cut, i);
  }
  __syncthreads();
  if (t == 0) {
    const int token = static_cast<int>(CandidateId(s_key[s_cut]));
    *token_out = token;
    state->step += 1;
    PushRing(token, ring, p.repeat_last_n, state);
  }
}

}  // namespace

uint64_t SamplingWorkspaceBytes() { return sizeof(Workspace); }

absl::Status SampleToken(const SamplingParams& p, float* logits, int n_vocab, int* d_ring,
                         SamplerState* state, void* workspace, int* d_token_out,
                         cudaStream_t stream) {
  if (!logits || !state || !workspace || !d_token_out || n_vocab <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("SampleToken: null pointer or n_vocab ", n_vocab));
  }
  if (p.repeat_last_n > 0 && !d_ring) {
    return absl::InvalidArgumentError(absl::StrCat(
        "SampleToken: repeat_last_n ", p.repeat_last_n, " needs a device ring buffer"));
  }
  if (!(p.repeat_penalty > 0.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("SampleToken: repeat_penalty must be > 0, got ", p.repeat_penalty));
  }
  if (reinterpret_cast<uintptr_t>(workspace) % 256 != 0) {
    return absl::InvalidArgumentError("SampleToken: workspace must be 256-byte aligned");
  }
  auto* ws = static_cast<Workspace*>(workspace);
  const int n_slots = p.repeat_last_n > 0 ? p.repeat_last_n : 0;
  const bool greedy = !(p.temperature > 0.0f);
  DPL_CUDA_CHECK(cudaMemsetAsync(ws, 0, greedy ? sizeof(Header) : kZeroBytes, stream));
  if (p.repeat_penalty != 1.0f && n_slots > 0) {
    PenaltyKernel<<<1, 256, 0, stream>>>(logits, n_vocab, d_ring, n_slots, state,
                                         p.repeat_penalty);
    DPL_CUDA_CHECK_LAUNCH();
  }
  MaxKernel<<<kPassBlocks, kPassThreads, 0, stream>>>(logits, n_vocab, ws);
  DPL_CUDA_CHECK_LAUNCH();
  if (greedy) {
    GreedyFinishKernel<<<1, 1, 0, stream>>>(ws, d_ring, n_slots, state, d_token_out);
    DPL_CUDA_CHECK_LAUNCH();
    return absl::OkStatus();
  }
  HistKernel<<<kPassBlocks, kPassThreads, 0, stream>>>(logits, n_vocab, ws, p.top_p < 1.0f);
  DPL_CUDA_CHECK_LAUNCH();
  CutoffKernel<<<1, 1024, 0, stream>>>(ws, p, n_vocab, state);
  DPL_CUDA_CHECK_LAUNCH();
  CollectKernel<<<kPassBlocks, kPassThreads, 0, stream>>>(logits, n_vocab, ws);
  DPL_CUDA_CHECK_LAUNCH();
  SamplingParams fp = p;
  fp.repeat_last_n = n_slots;
  FinalKernel<<<1, 1024, 0, stream>>>(ws, fp, n_vocab, d_ring, state, d_token_out);
  DPL_CUDA_CHECK_LAUNCH();
  return absl::OkStatus();
}

}  // namespace dpl::kernels
