#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kernels/cuda_check.h"
#include "kernels/sampling/depth_bins.h"
#include "kernels/sampling/sampling.h"
#include "kernels/sampling/sampling_util.h"

namespace dpl::kernels {
namespace {

// Sizes of the work (one row: 152064 f32 logits, 594 KB; a batch of 64: 39 MB,
// ~10 us a read at ~4 TB/s). A sampled call reads a row three times (Max,
// Hist, Collect); everything else touches a few KiB a row.
constexpr int kCap = kSamplingMaxCandidates;
// The three row passes share one work unit, a part: one warp reads
// kPartElems consecutive logits, lane l elements l, l + 32, ..., l + 224,
// all eight loads issued before the first is used. (The loops before issue
// 12 loaded one float per iteration and used it at once: ~1.1 TB/s at batch
// 64, latency bound. 8 x 4 B in flight a thread x 2048 threads a SM is 64
// KiB a SM, enough for HBM's latency; not yet measured.)
constexpr int kPartElems = 256;
constexpr int kLoadsPerLane = kPartElems / 32;
// Parts a row may have: Z_all (top-p alone) is the sum of fixed per-part
// sums kept in the workspace, so a row longer than kMaxParts * kPartElems
// (2097152 logits) gets parts of a multiple of kPartElems (RowParts).
constexpr int kMaxParts = 8192;
constexpr int kPassThreads = 512;
constexpr int kPassWarps = kPassThreads / 32;
// Blocks of the three passes: 4 of 512 threads a SM (2048 threads, the
// most a SM holds; Hist's 12 KiB of shared histogram allows it), so the
// whole batch is one wave; not yet measured against 2 x 1024.
constexpr int kPassBlocksPerSm = 4;
constexpr int kBinsAlloc = (kDepthBins + 7) / 8 * 8;
static_assert(kDepthBins <= 2 * 1024, "CutoffKernel scans two bins a thread");

// Workspace of one row (bytes): Prepare zeroes the header's accumulators and
// the histogram.
struct Header {
  unsigned long long argmax_key;  // max CandidateKey over the vocab
  unsigned int n_cand;            // candidates appended (may exceed kCap)
  int cutoff_bin;                 // deepest depth bin kept (depth_bins.h)
  double z_all;                   // sum over the vocab of exp(l - max), fixed order (top-p alone)
  unsigned int pad[58];
};
static_assert(sizeof(Header) == 256, "header is one 256-byte slot");
struct Workspace {
  Header h;
  unsigned int count[kBinsAlloc];   // logits per depth bin (bins deeper than min-p's: not counted)
  float mass[kBinsAlloc];           // sum of exp(l - max) per depth bin (filled only for top-p alone)
  unsigned long long cand[kCap];    // CandidateKey of each candidate
  double part_mass[kMaxParts];      // HistKernel's per-part mass sums (top-p alone)
};
// Rows lie kRowBytes apart (a 256-byte multiple: every row's header aligned).
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
  int part_len;                  // logits a part (a multiple of kPartElems; RowParts)
  int n_parts;                   // parts a row: ceil(n_vocab / part_len) <= kMaxParts
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

// One block per row (grid.x = row): zeroes the header's accumulators and the
// depth histogram (the first kernel of every call, so no memset node), adds the logit biases
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
  for (int b = threadIdx.x; b < kBinsAlloc; b += blockDim.x) {  // 12 KiB
    w.ws->count[b] = 0;
    w.ws->mass[b] = 0.0f;
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

// The row's max logit (the float of argmax_key's high half).
__device__ __forceinline__ float MaxLogit(const Workspace* ws) {
  return __uint_as_float(KeyToFloatBits(static_cast<uint32_t>(ws->h.argmax_key >> 32)));
}

// The parts of row blockIdx.y a warp of a pass grid (blocks per row, batch)
// reads: v = FirstPart(), + PartStep(), ... ; part v is the logits
// [v * part_len, min(n_vocab, (v + 1) * part_len)).
__device__ __forceinline__ int FirstPart() { return blockIdx.x * kPassWarps + threadIdx.x / 32; }
__device__ __forceinline__ int PartStep() { return gridDim.x * kPassWarps; }
__device__ __forceinline__ int PartEnd(const Rows& a, int v) {
  const int end = (v + 1) * a.part_len;
  return end < a.n_vocab ? end : a.n_vocab;
}

// The lane's kLoadsPerLane logits of the kPartElems from `base` (element
// base + lane + 32 j; one 128-byte line a load instruction), all issued
// before any is used; at or past `end`: -inf (callers check the index too).
// ld.global.cg: global (not generic) loads cached in L2 only, coherent with
// MaxKernel's in-place mask writes; a batch's logits (39 MB at 64 rows) may
// stay in the 50 MB L2 from one pass to the next.
__device__ __forceinline__ void LoadPart(const float* row, int base, int end, float (&l)[kLoadsPerLane]) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int j = 0; j < kLoadsPerLane; ++j) {
    const int i = base + lane + 32 * j;
    l[j] = i < end ? __ldcg(row + i) : -INFINITY;
  }
}

// grid (blocks per row, batch), every row: argmax_key = max_i
// CandidateKey(l_i, i) (the greedy token and the max logit; a max, so the
// grid does not change it). A masked-out token's logit becomes -inf here,
// rewritten in place for the later passes. One global atomic a block.
__global__ void __launch_bounds__(kPassThreads, kPassBlocksPerSm) MaxKernel(Rows a) {
  const Row w = LoadRow(a, blockIdx.y);
  if (!w.active) return;
  __shared__ unsigned long long s_best[kPassWarps];
  const int lane = threadIdx.x & 31;
  unsigned long long best = 0;
  for (int v = FirstPart(); v < a.n_parts; v += PartStep()) {
    const int end = PartEnd(a, v);
    for (int base = v * a.part_len; base < end; base += kPartElems) {
      float l[kLoadsPerLane];
      LoadPart(w.logits, base, end, l);
#pragma unroll
      for (int j = 0; j < kLoadsPerLane; ++j) {
        const int i = base + lane + 32 * j;
        if (i >= end) continue;
        if (w.allowed != nullptr && ((w.allowed[i >> 5] >> (i & 31)) & 1u) == 0) {
          l[j] = -INFINITY;  // the mask: this row's later passes read -inf, weight 0
          w.logits[i] = l[j];
        }
        const unsigned long long k = CandidateKey(__float_as_uint(l[j]), i);
        best = k > best ? k : best;
      }
    }
  }
  for (int o = 16; o > 0; o >>= 1) {
    const unsigned long long other = __shfl_xor_sync(0xffffffffu, best, o);
    best = other > best ? other : best;
  }
  if (lane == 0) s_best[threadIdx.x / 32] = best;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int k = 1; k < kPassWarps; ++k) best = s_best[k] > best ? s_best[k] : best;
    atomicMax(&w.ws->h.argmax_key, best);
  }
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

// grid (blocks per row, batch), sampling rows only: the depth histogram of
// depth_bins.h, bin = DepthBin(max, l):
//   count[bin] += 1                  every logit down to rule.max_bin (min-p's
//                                    bound; deeper ones can never be kept)
//   mass[bin] += exp(l - max)        top-p alone (the only rule that reads mass)
//   part_mass[v] = sum over part v of exp(l - max), top-p alone: per lane in
//     index order, then a fixed shuffle tree, so Z_all = sum of the parts in
//     order has the same bits whatever the grid (a batch of 1 or 64)
// Privatized: a shared-memory atomic a logit (12 KiB of bins a block), then
// one global atomic per non-empty bin a block (the bulk of an N(0, 2.5) row
// spans ~600 bins: ~0.3 M at batch 64, 8 blocks a row), where issue 12 made
// two global atomics a logit (19.5 M at batch 64, 352 us). Not yet measured.
__global__ void __launch_bounds__(kPassThreads, kPassBlocksPerSm) HistKernel(Rows a) {
  const Row w = LoadRow(a, blockIdx.y);
  if (!w.active || w.greedy) return;
  __shared__ unsigned int s_count[kBinsAlloc];
  __shared__ float s_mass[kBinsAlloc];
  Workspace* ws = w.ws;
  const float max_l = MaxLogit(ws);
  const CutoffRule rule = CutoffRuleFor(w.p, a.n_vocab, max_l, kCap);
  const bool want_mass = rule.by_mass;
  const int bound = rule.max_bin;
  for (int b = threadIdx.x; b < kBinsAlloc; b += blockDim.x) {
    s_count[b] = 0;
    s_mass[b] = 0.0f;
  }
  __syncthreads();
  const int lane = threadIdx.x & 31;
  for (int v = FirstPart(); v < a.n_parts; v += PartStep()) {
    const int end = PartEnd(a, v);
    double part = 0.0;
    for (int base = v * a.part_len; base < end; base += kPartElems) {
      float l[kLoadsPerLane];
      LoadPart(w.logits, base, end, l);
#pragma unroll
      for (int j = 0; j < kLoadsPerLane; ++j) {
        if (base + lane + 32 * j >= end) continue;
        const int b = DepthBin(max_l, l[j]);
        if (want_mass) {
          const float m = expf(l[j] - max_l);
          part += m;
          if (b <= bound) atomicAdd(&s_mass[b], m);
        }
        if (b <= bound) atomicAdd(&s_count[b], 1u);
      }
    }
    if (want_mass) {  // row-uniform: the whole warp shuffles
      for (int o = 16; o > 0; o >>= 1) part += __shfl_xor_sync(0xffffffffu, part, o);
      if (lane == 0) ws->part_mass[v] = part;
    }
  }
  __syncthreads();
  for (int b = threadIdx.x; b < kDepthBins; b += blockDim.x) {
    const unsigned int c = s_count[b];
    if (c == 0) continue;
    atomicAdd(&ws->count[b], c);
    if (want_mass) atomicAdd(&ws->mass[b], s_mass[b]);
  }
}

// Inclusive scan of x over the 1024 threads of a block (thread order);
// s_warp: 32 T of shared scratch, reusable when it returns.
template <typename T>
__device__ T BlockInclusiveScan1024(T x, T* s_warp) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int o = 1; o < 32; o <<= 1) {
    const T y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
  if (lane == 31) s_warp[warp] = x;
  __syncthreads();
  if (warp == 0) {
    T s = s_warp[lane];
    for (int o = 1; o < 32; o <<= 1) {
      const T y = __shfl_up_sync(0xffffffffu, s, o);
      if (lane >= o) s += y;
    }
    s_warp[lane] = s;
  }
  __syncthreads();
  if (warp > 0) x += s_warp[warp - 1];
  __syncthreads();
  return x;
}

// Inclusive prefix sums of v[0..kDepthBins) into s_cum, 1024 threads, thread
// t owning bins 2t and 2t + 1 (coalesced: 12 KiB a row of counts, where
// issue 12's one-block cutoff walked 512 KiB of bins).
template <typename T, typename Load>
__device__ void ScanBins(Load v, T* s_cum, T* s_warp) {
  const int b0 = 2 * threadIdx.x, b1 = b0 + 1;
  const T x0 = b0 < kDepthBins ? v(b0) : T(0);
  const T x1 = b1 < kDepthBins ? v(b1) : T(0);
  const T pair = x0 + x1;
  const T before = BlockInclusiveScan1024(pair, s_warp) - pair;
  if (b0 < kDepthBins) s_cum[b0] = before + x0;
  if (b1 < kDepthBins) s_cum[b1] = before + pair;
}

// One block of 1024 threads per row (grid.x = row), sampling rows only: the
// prefix sums of the depth histogram (counts; masses too for top-p alone),
// Z_all = the part sums in a fixed order (top-p alone), then thread 0 picks
// the cutoff with ChooseCutoff's binary searches (depth_bins.h) and counts a
// truncation.
__global__ void __launch_bounds__(1024) CutoffKernel(Rows a) {
  const Row w = LoadRow(a, blockIdx.x);
  if (!w.active || w.greedy) return;
  __shared__ unsigned int s_cum_count[kBinsAlloc];
  __shared__ double s_cum_mass[kBinsAlloc];
  __shared__ unsigned int s_warp_c[32];
  __shared__ double s_warp_m[32];
  const Workspace* ws = w.ws;
  const float max_l = MaxLogit(ws);
  CutoffRule rule = CutoffRuleFor(w.p, a.n_vocab, max_l, kCap);
  const int t = threadIdx.x;
  ScanBins<unsigned int>([&](int b) { return ws->count[b]; }, s_cum_count, s_warp_c);
  double z = 0.0;
  if (rule.by_mass) {  // row-uniform: every thread reaches the barriers inside
    ScanBins<double>([&](int b) { return static_cast<double>(ws->mass[b]); }, s_cum_mass, s_warp_m);
    // Z_all: thread t sums parts t, t + 1024, ... in order, then a fixed
    // shuffle tree, then the warp totals in order: depends on n_parts only.
    double zt = 0.0;
    for (int v = t; v < a.n_parts; v += 1024) zt += ws->part_mass[v];
    for (int o = 16; o > 0; o >>= 1) zt += __shfl_xor_sync(0xffffffffu, zt, o);
    if ((t & 31) == 0) s_warp_m[t >> 5] = zt;
    __syncthreads();
    for (int k = 0; k < 32; ++k) z += s_warp_m[k];
  }
  __syncthreads();
  if (t == 0) {
    rule.mass_target = static_cast<double>(w.p.top_p) * z * (1.0 + 1e-4);
    const Cutoff cut = ChooseCutoff(s_cum_count, s_cum_mass, rule);
    w.ws->h.cutoff_bin = cut.bin;
    w.ws->h.z_all = z;
    if (cut.truncated) w.state->truncations += 1;
  }
}

// grid (blocks per row, batch), sampling rows only: append CandidateKey of
// every logit with DepthBin <= cutoff (warp-aggregated slots; the first kCap
// arrivals are kept when a truncated cutoff's one bin holds more).
__global__ void __launch_bounds__(kPassThreads, kPassBlocksPerSm) CollectKernel(Rows a) {
  const Row w = LoadRow(a, blockIdx.y);
  if (!w.active || w.greedy) return;
  Workspace* ws = w.ws;
  const int cut = ws->h.cutoff_bin;
  const float max_l = MaxLogit(ws);
  const int lane = threadIdx.x & 31;
  for (int v = FirstPart(); v < a.n_parts; v += PartStep()) {
    const int end = PartEnd(a, v);
    for (int base = v * a.part_len; base < end; base += kPartElems) {
      float l[kLoadsPerLane];
      LoadPart(w.logits, base, end, l);
#pragma unroll
      for (int j = 0; j < kLoadsPerLane; ++j) {
        const int i = base + lane + 32 * j;
        const bool take = i < end && DepthBin(max_l, l[j]) <= cut;
        const unsigned mask = __ballot_sync(0xffffffffu, take);
        if (mask == 0) continue;
        const int leader = __ffs(mask) - 1;
        unsigned int first = 0;
        if (lane == leader) first = atomicAdd(&ws->h.n_cand, __popc(mask));
        first = __shfl_sync(0xffffffffu, first, leader);
        if (take) {
          const unsigned int slot = first + __popc(mask & ((1u << lane) - 1));
          if (slot < kCap) ws->cand[slot] = CandidateKey(__float_as_uint(l[j]), i);
        }
      }
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

// A row's parts: kPartElems logits each, or a multiple of that when the row
// is longer than kMaxParts * kPartElems (n_parts <= kMaxParts always).
void RowParts(int n_vocab, int* part_len, int* n_parts) {
  const long long units = (static_cast<long long>(n_vocab) + kPartElems - 1) / kPartElems;
  const long long per = (units + kMaxParts - 1) / kMaxParts;
  *part_len = static_cast<int>(per * kPartElems);
  *n_parts = static_cast<int>((static_cast<long long>(n_vocab) + *part_len - 1) / *part_len);
}

// Blocks per row of the three row passes: kPassBlocksPerSm a SM over the
// whole batch (one wave), at most one part a warp, at least one block.
absl::Status PassBlocksPerRow(int batch, int n_parts, int* out) {
  int device = 0, sms = 0;
  DPL_CUDA_CHECK(cudaGetDevice(&device));
  DPL_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const long long want = static_cast<long long>(kPassBlocksPerSm) * sms / batch;
  const long long most = (n_parts + kPassWarps - 1) / kPassWarps;
  *out = static_cast<int>(want < 1 ? 1 : want > most ? most : want);
  return absl::OkStatus();
}

// The six launches of one call. `sampled_passes` false skips the histogram,
// cutoff and collect passes, whose blocks would all return at once (SampleToken
// with greedy params: the host knows them); SampleTokens always launches all six.
absl::Status Launch(Rows a, int batch, bool sampled_passes, cudaStream_t stream) {
  RowParts(a.n_vocab, &a.part_len, &a.n_parts);
  int bpr = 0;
  DPL_RETURN_IF_ERROR(PassBlocksPerRow(batch, a.n_parts, &bpr));
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
