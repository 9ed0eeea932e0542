#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kernels/cuda_check.h"
#include "kernels/sampling/sampling.h"
#include "kernels/sampling/sampling_util.h"

namespace dpl::kernels {
namespace {

constexpr int kBins = 65536;  // top 16 bits of the ordered key: 7 mantissa bits
constexpr int kCap = kSamplingMaxCandidates;
constexpr int kPassThreads = 256;
// The histogram pass's mass partition, fixed whatever grid runs it: block_mass[v]
// sums exp(l - max) over i = v * kPassThreads + t + j * kPassBlocks * kPassThreads
// (per thread in j order, then a fixed shuffle tree), so z_all, summed over v
// in order, has the same bits for a batch of 1 or 64 (the grid is sized per call).
constexpr int kPassBlocks = 264;
constexpr int kPassBlocksPerSm = 8;  // the batched grid: 8 blocks of 256 per SM in all

// Workspace of one row (bytes): Prepare zeroes the header's accumulators, the
// max pass the histogram (only for rows that sample).
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
  float mass[kBins];                // sum of exp(l - max) per bin (zeroed and filled only with top-p on)
  unsigned long long cand[kCap];    // CandidateKey of each candidate
  double block_mass[kPassBlocks];   // HistKernel's per-partition mass sums
};
// Rows lie kRowBytes apart: a 256-byte multiple keeps every row's header and
// its uint4-zeroed histogram aligned.
constexpr size_t kRowBytes = (sizeof(Workspace) + 255) / 256 * 256;

// One call as every kernel sees it, passed by value (a captured graph bakes it
// in; what changes per step, params included, lives in the memory it points to).
struct Rows {
  const SamplingParams* params;  // (n_seqs) device memory; null: `single` is sequence 0's
  SamplingParams single;         // SampleToken's host params
  const int* slots;              // (batch) row r -> sequence slots[r]; null: row r is sequence r
  int n_seqs;
  float* logits;                 // (batch, n_vocab)
  int n_vocab;
  int* rings;                    // (n_seqs, ring_stride); null when ring_stride == 0
  int ring_stride;
  SamplerState* states;          // (n_seqs)
  char* ws;                      // (batch, kRowBytes): Workspace of row r at ws + r * kRowBytes
  int* tokens_out;               // (batch)
  const uint32_t* allowed;       // (n_seqs, AllowedWords(n_vocab)) token masks; null: none
  const int* allowed_on;         // (n_seqs) nonzero: the sequence's mask applies
  const LogitBias* bias;         // (n_seqs, kMaxLogitBias) logit biases; null: none
  const int* n_bias;             // (n_seqs) entries of each sequence's list
};

// One row as a block sees it. Every thread loads it (a broadcast read): the
// params are only known on the device, so each block decides for itself.
struct Row {
  bool active = false;  // false: a padding row (slot outside [0, n_seqs)): write nothing
  bool greedy = false;  // temperature <= 0 (or NaN)
  SamplingParams p;     // made safe: repeat_last_n in [0, ring_stride], repeat_penalty !(> 0) -> 1 (off)
  float* logits = nullptr;    // (n_vocab)
  int* ring = nullptr;        // (p.repeat_last_n) slots
  SamplerState* state = nullptr;
  Workspace* ws = nullptr;
  int* token_out = nullptr;
  const uint32_t* allowed = nullptr;  // (AllowedWords(n_vocab)) the row's mask; null: every token
  const LogitBias* bias = nullptr;    // (n_bias) the row's biases
  int n_bias = 0;                     // in [0, kMaxLogitBias]
};

__device__ Row LoadRow(const Rows& a, int r) {
  Row w;
  const int seq = a.slots ? a.slots[r] : r;
  if (seq < 0 || seq >= a.n_seqs) return w;
  w.active = true;
  w.p = a.params ? a.params[seq] : a.single;
  int n = w.p.repeat_last_n;
  n = n < 0 ? 0 : n;
  w.p.repeat_last_n = n < a.ring_stride ? n : a.ring_stride;
  if (!(w.p.repeat_penalty > 0.0f)) w.p.repeat_penalty = 1.0f;
  if (!(w.p.presence_penalty == w.p.presence_penalty)) w.p.presence_penalty = 0.0f;  // NaN: off
  if (!(w.p.frequency_penalty == w.p.frequency_penalty)) w.p.frequency_penalty = 0.0f;
  w.greedy = !(w.p.temperature > 0.0f);
  w.logits = a.logits + static_cast<size_t>(r) * a.n_vocab;
  w.ring = a.rings ? a.rings + static_cast<size_t>(seq) * a.ring_stride : nullptr;
  w.state = a.states + seq;
  w.ws = reinterpret_cast<Workspace*>(a.ws + static_cast<size_t>(r) * kRowBytes);
  w.token_out = a.tokens_out + r;
  if (a.allowed != nullptr && a.allowed_on[seq] != 0) {
    w.allowed = a.allowed + static_cast<size_t>(seq) * AllowedWords(a.n_vocab);
  }
  if (a.bias != nullptr) {
    const int n = a.n_bias[seq];
    w.n_bias = n < 0 ? 0 : n < kMaxLogitBias ? n : kMaxLogitBias;
    w.bias = a.bias + static_cast<size_t>(seq) * kMaxLogitBias;
  }
  return w;
}

// One block per row (grid.x = row): zeroes the header's accumulators (the
// first kernel of every call, so no memset node), adds the logit biases
// (l += bias, one thread an entry: the tokens are distinct), then the
// penalties, each distinct ring token once (count: its occurrences in the
// window), on the biased logits (llama.cpp's order):
//   l = l > 0 ? l / repeat : l * repeat;  l -= frequency count + presence
__global__ void PrepareKernel(Rows a) {
  const Row w = LoadRow(a, blockIdx.x);
  if (!w.active) return;
  if (threadIdx.x == 0) {
    w.ws->h.argmax_key = 0;
    w.ws->h.n_cand = 0;
  }
  if (w.n_bias > 0) {  // the whole block or none (every thread loaded the same row)
    for (int i = threadIdx.x; i < w.n_bias; i += blockDim.x) {
      const LogitBias e = w.bias[i];
      if (e.token >= 0 && e.token < a.n_vocab) w.logits[e.token] += e.bias;
    }
    __syncthreads();  // the penalty loop below reads logits another thread biased
  }
  const int n_slots = w.p.repeat_last_n;
  const bool additive = w.p.presence_penalty != 0.0f || w.p.frequency_penalty != 0.0f;
  if ((w.p.repeat_penalty == 1.0f && !additive) || n_slots == 0) return;
  const int count = w.state->ring_count < n_slots ? w.state->ring_count : n_slots;
  const int* ring = w.ring;
  for (int i = threadIdx.x; i < count; i += blockDim.x) {
    const int t = ring[i];
    bool first = t >= 0 && t < a.n_vocab;
    for (int j = 0; j < i && first; ++j) first = ring[j] != t;
    if (first) {
      float l = w.logits[t];
      l = l > 0.0f ? l / w.p.repeat_penalty : l * w.p.repeat_penalty;
      if (additive) {
        int n = 0;
        for (int j = i; j < count; ++j) n += ring[j] == t;
        l -= static_cast<float>(n) * w.p.frequency_penalty + w.p.presence_penalty;
      }
      w.logits[t] = l;
    }
  }
}

// grid (blocks per row, batch): argmax_key = max_i CandidateKey(logit_i, i),
// the greedy token and the max logit; a row that samples also zeroes the
// histogram HistKernel fills next (its mass only when top-p reads it).
__global__ void MaxKernel(Rows a) {
  const Row w = LoadRow(a, blockIdx.y);
  if (!w.active) return;
  const int first = blockIdx.x * blockDim.x + threadIdx.x;
  const int stride = gridDim.x * blockDim.x;
  if (!w.greedy) {
    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
    uint4* count = reinterpret_cast<uint4*>(w.ws->count);
    for (int i = first; i < kBins / 4; i += stride) count[i] = zero;
    if (w.p.top_p < 1.0f) {
      uint4* mass = reinterpret_cast<uint4*>(w.ws->mass);
      for (int i = first; i < kBins / 4; i += stride) mass[i] = zero;
    }
  }
  unsigned long long best = 0;
  for (int i = first; i < a.n_vocab; i += stride) {
    float l = w.logits[i];
    if (w.allowed != nullptr && ((w.allowed[i >> 5] >> (i & 31)) & 1u) == 0) {
      l = -INFINITY;  // the mask: this row's later passes read -inf, weight 0
      w.logits[i] = l;
    }
    const unsigned long long k = CandidateKey(__float_as_uint(l), i);
    best = k > best ? k : best;
  }
  for (int o = 16; o > 0; o >>= 1) {
    const unsigned long long other = __shfl_xor_sync(0xffffffffu, best, o);
    best = other > best ? other : best;
  }
  if (threadIdx.x % 32 == 0) atomicMax(&w.ws->h.argmax_key, best);
}

// The newest token into ring[head]; a head outside [0, n_slots) (a state left
// by another repeat_last_n) restarts at slot 0 rather than write out of bounds.
__device__ void PushRing(int token, int* ring, int n_slots, SamplerState* state) {
  if (n_slots <= 0) return;
  int head = state->ring_head;
  if (head < 0 || head >= n_slots) head = 0;
  ring[head] = token;
  state->ring_head = (head + 1) % n_slots;
  const int count = state->ring_count;
  state->ring_count = count < n_slots ? (count > 0 ? count : 0) + 1 : n_slots;
}

// grid (blocks per row, batch), sampling rows only: the histogram of bin =
// OrderedKey >> 16, count and mass exp(l - max), one global atomic per element
// and field (warp-aggregating peers with __match_any_sync trips a ptxas
// register-allocation failure in CUDA 13.0). Block b runs the partitions
// v = b, b + gridDim.x, ... of kPassBlocks (see kPassBlocks).
__global__ void HistKernel(Rows a) {
  const Row w = LoadRow(a, blockIdx.y);
  if (!w.active || w.greedy) return;
  __shared__ double s_part[kPassThreads / 32];
  Workspace* ws = w.ws;
  const bool want_mass = w.p.top_p < 1.0f;
  const float max_l = __uint_as_float(KeyToFloatBits(static_cast<uint32_t>(ws->h.argmax_key >> 32)));
  for (int v = blockIdx.x; v < kPassBlocks; v += gridDim.x) {
    double my_mass = 0.0;
    for (int i = v * kPassThreads + threadIdx.x; i < a.n_vocab; i += kPassBlocks * kPassThreads) {
      const float l = w.logits[i];
      const int bin = static_cast<int>(OrderedKey(__float_as_uint(l)) >> 16);
      atomicAdd(&ws->count[bin], 1u);
      if (want_mass) {
        const float m = expf(l - max_l);
        my_mass += m;
        atomicAdd(&ws->mass[bin], m);
      }
    }
    // Deterministic partition sum (fixed shuffle tree), summed in order later.
    for (int o = 16; o > 0; o >>= 1) my_mass += __shfl_xor_sync(0xffffffffu, my_mass, o);
    if (threadIdx.x % 32 == 0) s_part[threadIdx.x / 32] = my_mass;
    __syncthreads();
    if (threadIdx.x == 0) {
      double b = 0.0;
      for (int k = 0; k < kPassThreads / 32; ++k) b += s_part[k];
      ws->block_mass[v] = b;
    }
    __syncthreads();  // s_part is reused by the next partition
  }
}

// One block of 1024 threads per row (grid.x = row), sampling rows only:
// thread t owns the 64 bins [65535 - 64t - 63, 65535 - 64t] (descending). The
// kept bins (>= cutoff) must hold every token that can survive the chain, and,
// when top-k and top-p are both on, the whole top-k set (top-p normalizes over it):
//   top-k on:  cutoff <= bin_k, the bin where the descending count reaches k
//   top-p on, top-k off: cutoff <= bin_p, where the mass reaches top_p * Z_all
//     (Z_all from the fixed-order partition sums, so it is the same every run)
//   min-p on (unless top-k and top-p both on): cutoff <= bin of max + log(min_p)
// and the cutoff is the highest bin allowed by all of them; raised (truncation,
// counted in state) when more than kCap elements lie in bins >= cutoff.
__global__ void __launch_bounds__(1024) CutoffKernel(Rows a) {
  const Row w = LoadRow(a, blockIdx.x);
  if (!w.active || w.greedy) return;
  __shared__ unsigned int s_cnt[1024];
  __shared__ double s_mass[1024];
  __shared__ int s_bin_k, s_bin_p, s_bin_cap, s_top_bin;
  Workspace* ws = w.ws;
  const SamplingParams& p = w.p;
  const int n_vocab = a.n_vocab;
  const bool topk_on = p.top_k > 0 && p.top_k < n_vocab;
  const bool topp_on = p.top_p < 1.0f;  // the mass was zeroed and filled only then
  const int t = threadIdx.x;
  const int hi = kBins - 1 - 64 * t;  // this thread's bins: hi, hi-1, ..., hi-63
  unsigned int c = 0;
  double m = 0.0;
#pragma unroll 16
  for (int b = hi; b > hi - 64; --b) {
    c += ws->count[b];
    if (topp_on) m += ws->mass[b];
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
    if (topp_on) cum_m += ws->mass[b];
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
      w.state->truncations += 1;
    }
    ws->h.cutoff_bin = cut;
  }
}

// grid (blocks per row, batch), sampling rows only: append CandidateKey of
// every logit in bins >= cutoff (warp-aggregated slots).
__global__ void CollectKernel(Rows a) {
  const Row w = LoadRow(a, blockIdx.y);
  if (!w.active || w.greedy) return;
  Workspace* ws = w.ws;
  const int n_vocab = a.n_vocab;
  const int cutoff = ws->h.cutoff_bin;
  const int stride = gridDim.x * blockDim.x;
  const int n_round = (n_vocab + stride - 1) / stride * stride;
  const int lane = threadIdx.x % 32;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n_round; i += stride) {
    const uint32_t bits = i < n_vocab ? __float_as_uint(w.logits[i]) : 0u;
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

// One block of 1024 threads per row (grid.x = row). A greedy row writes the
// argmax and pushes it (no draw: step stays). A sampling row sorts its
// candidates (descending key), then top-k, top-p, min-p, temperature and the
// draw, exactly as in sampling.h. (~90 lines: the chain is one block-wide
// sequence with __syncthreads between its steps; it reads in the order of
// llama.cpp's sampler chain.)
__global__ void __launch_bounds__(1024) FinalKernel(Rows a) {
  const Row w = LoadRow(a, blockIdx.x);
  if (!w.active) return;
  __shared__ unsigned long long s_key[kCap];
  __shared__ double s_w[kCap];
  __shared__ double s_tmp[32];
  __shared__ int s_cut;
  const Workspace* ws = w.ws;
  const SamplingParams& p = w.p;
  const int n_vocab = a.n_vocab;
  const int t = threadIdx.x;
  if (w.greedy) {
    if (t == 0) {
      const int token = static_cast<int>(CandidateId(ws->h.argmax_key));
      *w.token_out = token;
      PushRing(token, w.ring, p.repeat_last_n, w.state);
    }
    return;
  }
  const int n = ws->h.n_cand < kCap ? static_cast<int>(ws->h.n_cand) : kCap;
  if (n == 0) {  // valid params never get here (min_p > 1 can): the argmax
    if (t == 0) {
      const int token = static_cast<int>(CandidateId(ws->h.argmax_key));
      *w.token_out = token;
      w.state->step += 1;
      PushRing(token, w.ring, p.repeat_last_n, w.state);
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
          const unsigned long long x = s_key[i], y = s_key[ixj];
          const bool desc = (i & k) == 0;
          if (desc ? x < y : x > y) {
            s_key[i] = y;
            s_key[ixj] = x;
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
  // Never a -inf token (a logit_bias ban, a mask): the sorted tail of -inf
  // is cut, at least one kept, so not even the draw's fallback (the last
  // kept) can pick one; as the CPU sampler.
  if (t == 0) s_cut = l0 == -INFINITY ? 1 : keep;
  __syncthreads();
  for (int i = 1 + t; i < keep; i += blockDim.x) {
    if (logit(i) == -INFINITY && logit(i - 1) != -INFINITY) s_cut = i;  // one boundary: one writer
  }
  __syncthreads();
  keep = s_cut;
  __syncthreads();
  // Temperature, weights, draw.
  const double max_t = static_cast<double>(l0 / p.temperature);
  for (int i = t; i < keep; i += blockDim.x) {
    s_w[i] = exp(static_cast<double>(logit(i) / p.temperature) - max_t);
  }
  if (t == 0) s_cut = keep - 1;
  __syncthreads();
  BlockScan(s_w, keep, s_tmp);
  const double u = UniformFromCounter(p.seed, w.state->step) * s_w[keep - 1];
  for (int i = t; i < keep; i += blockDim.x) {
    const double prev = i > 0 ? s_w[i - 1] : 0.0;
    if (u < s_w[i] && u >= prev) atomicMin(&s_cut, i);
  }
  __syncthreads();
  if (t == 0) {
    const int token = static_cast<int>(CandidateId(s_key[s_cut]));
    *w.token_out = token;
    w.state->step += 1;
    PushRing(token, w.ring, p.repeat_last_n, w.state);
  }
}

// Blocks per row of the three vocab passes: kPassBlocksPerSm blocks per SM
// over the whole batch, at most kPassBlocks per row (a batch of one: 264 on
// an H200, as before batching), at least one.
absl::Status PassBlocksPerRow(int batch, int* out) {
  int device = 0, sms = 0;
  DPL_CUDA_CHECK(cudaGetDevice(&device));
  DPL_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const long long want = (static_cast<long long>(kPassBlocksPerSm) * sms + batch - 1) / batch;
  *out = static_cast<int>(want < 1 ? 1 : want > kPassBlocks ? kPassBlocks : want);
  return absl::OkStatus();
}

// The six launches of one call. `sampled_passes` false skips the histogram,
// cutoff and collect passes, whose blocks would all return at once (SampleToken
// with greedy params: the host knows them); SampleTokens always launches all six.
absl::Status Launch(const Rows& a, int batch, bool sampled_passes, cudaStream_t stream) {
  int bpr = 0;
  DPL_RETURN_IF_ERROR(PassBlocksPerRow(batch, &bpr));
  const dim3 pass_grid(bpr, batch);
  PrepareKernel<<<batch, 256, 0, stream>>>(a);
  DPL_CUDA_CHECK_LAUNCH();
  MaxKernel<<<pass_grid, kPassThreads, 0, stream>>>(a);
  DPL_CUDA_CHECK_LAUNCH();
  if (sampled_passes) {
    HistKernel<<<pass_grid, kPassThreads, 0, stream>>>(a);
    DPL_CUDA_CHECK_LAUNCH();
    CutoffKernel<<<batch, 1024, 0, stream>>>(a);
    DPL_CUDA_CHECK_LAUNCH();
    CollectKernel<<<pass_grid, kPassThreads, 0, stream>>>(a);
    DPL_CUDA_CHECK_LAUNCH();
  }
  FinalKernel<<<batch, 1024, 0, stream>>>(a);
  DPL_CUDA_CHECK_LAUNCH();
  return absl::OkStatus();
}

}  // namespace

uint64_t SamplingWorkspaceBytes(int batch) {
  return batch > 0 ? static_cast<uint64_t>(batch) * kRowBytes : 0;
}

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
  // A batch of one: sequence 0, its params by value in the launches.
  const int n_slots = p.repeat_last_n > 0 ? p.repeat_last_n : 0;
  Rows a{};
  a.params = nullptr;
  a.single = p;
  a.slots = nullptr;
  a.n_seqs = 1;
  a.logits = logits;
  a.n_vocab = n_vocab;
  a.rings = n_slots > 0 ? d_ring : nullptr;
  a.ring_stride = n_slots;
  a.states = state;
  a.ws = static_cast<char*>(workspace);
  a.tokens_out = d_token_out;
  const bool greedy = !(p.temperature > 0.0f);
  return Annotate(Launch(a, 1, !greedy, stream), "SampleToken");
}

absl::Status SampleTokens(const SampleBatch& b, cudaStream_t stream) {
  if (!b.params || !b.slots || !b.logits || !b.states || !b.workspace || !b.tokens_out) {
    return absl::InvalidArgumentError(absl::StrCat(
        "SampleTokens: null pointer (params ", b.params != nullptr, ", slots ", b.slots != nullptr,
        ", logits ", b.logits != nullptr, ", states ", b.states != nullptr, ", workspace ",
        b.workspace != nullptr, ", tokens_out ", b.tokens_out != nullptr, ")"));
  }
  if (b.n_vocab <= 0 || b.batch <= 0 || b.batch > 65535 || b.n_seqs < 1 || b.ring_stride < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "SampleTokens: need n_vocab > 0, 0 < batch <= 65535, n_seqs >= 1, ring_stride >= 0; got n_vocab ",
        b.n_vocab, ", batch ", b.batch, ", n_seqs ", b.n_seqs, ", ring_stride ", b.ring_stride));
  }
  if ((b.allowed == nullptr) != (b.allowed_on == nullptr)) {
    return absl::InvalidArgumentError("SampleTokens: allowed masks need both allowed and allowed_on");
  }
  if ((b.bias == nullptr) != (b.n_bias == nullptr)) {
    return absl::InvalidArgumentError("SampleTokens: logit biases need both bias and n_bias");
  }
  if (b.ring_stride > 0 && !b.rings) {
    return absl::InvalidArgumentError(
        absl::StrCat("SampleTokens: ring_stride ", b.ring_stride, " needs device rings"));
  }
  if (reinterpret_cast<uintptr_t>(b.workspace) % 256 != 0) {
    return absl::InvalidArgumentError("SampleTokens: workspace must be 256-byte aligned");
  }
  Rows a{};
  a.params = b.params;
  a.slots = b.slots;
  a.n_seqs = b.n_seqs;
  a.logits = b.logits;
  a.n_vocab = b.n_vocab;
  a.rings = b.ring_stride > 0 ? b.rings : nullptr;
  a.ring_stride = b.ring_stride;
  a.states = b.states;
  a.ws = static_cast<char*>(b.workspace);
  a.tokens_out = b.tokens_out;
  a.allowed = b.allowed_on != nullptr ? b.allowed : nullptr;
  a.allowed_on = b.allowed_on;
  a.bias = b.n_bias != nullptr ? b.bias : nullptr;
  a.n_bias = b.n_bias;
  return Annotate(Launch(a, b.batch, /*sampled_passes=*/true, stream),
                  absl::StrCat("SampleTokens (batch ", b.batch, ")"));
}

}  // namespace dpl::kernels
