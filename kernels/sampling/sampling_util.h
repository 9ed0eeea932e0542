// Host/device helpers of the sampler: the order-preserving float key, the
// counter-based random numbers and the repetition-penalty ring buffer.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

#if defined(__CUDACC__)
#define DPL_SAMPLING_HD __host__ __device__ __forceinline__
#else
#define DPL_SAMPLING_HD inline
#endif

namespace dpl::kernels {

// Unsigned key with a < b  <=>  OrderedKey(a) < OrderedKey(b) for non-NaN
// floats (-0 sorts just below +0): flip all bits of negatives, the sign of
// positives.
DPL_SAMPLING_HD uint32_t OrderedKey(uint32_t float_bits) {
  return (float_bits & 0x80000000u) ? ~float_bits : (float_bits | 0x80000000u);
}
DPL_SAMPLING_HD uint32_t KeyToFloatBits(uint32_t key) {
  return (key & 0x80000000u) ? (key & 0x7fffffffu) : ~key;
}

// 64-bit candidate key: larger logit first, then lower id (so a descending
// sort or a max gives llama.cpp's "ties go to the lowest id").
DPL_SAMPLING_HD uint64_t CandidateKey(uint32_t float_bits, uint32_t id) {
  return (static_cast<uint64_t>(OrderedKey(float_bits)) << 32) | (0xffffffffu - id);
}
DPL_SAMPLING_HD uint32_t CandidateId(uint64_t key) {
  return 0xffffffffu - static_cast<uint32_t>(key);
}

// The sampling chain's parameters, llama.cpp's flags and defaults; one
// struct for the host sampler (runtime/generate) and the device kernel.
struct SamplingParams {
  float temperature = 0.8f;     // <= 0: greedy
  int32_t top_k = 40;           // <= 0: off
  float top_p = 0.95f;          // >= 1: off
  float min_p = 0.05f;          // <= 0: off
  float repeat_penalty = 1.0f;  // 1: off
  int32_t repeat_last_n = 64;   // tokens the penalty looks back over (device: ring slots)
  uint64_t seed = 0;
  // OpenAI's (llama.cpp's penalties sampler, over the same window, after the
  // repetition penalty): l -= frequency_penalty count + presence_penalty
  // for each token the window holds `count` times. 0: off.
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
};

// OpenAI's logit_bias: `bias` is added to `token`'s logit before every other
// step of the chain (llama.cpp's logit-bias sampler comes first), so the
// penalties and filters see the biased logit; -inf (llama-server's `false`)
// means the token is never drawn. The host sampler takes a list
// (generate::Sampler), the device one a list per sequence in device memory
// (SampleBatch::bias).
struct LogitBias {
  int32_t token = 0;
  float bias = 0.0f;
};
// Entries a list may hold: the device keeps this many per sequence (8 KiB).
inline constexpr int kMaxLogitBias = 1024;
// A usable list: at most kMaxLogitBias entries, tokens distinct and in
// [0, n_vocab) (two entries of one token would race on the device), biases
// finite in [-100, 100] or -inf, not every token banned. InvalidArgument
// naming the entry otherwise.
absl::Status CheckLogitBias(absl::Span<const LogitBias> bias, int64_t n_vocab);

DPL_SAMPLING_HD uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Uniform in [0, 1) with 53 random bits from (seed, step): the same formula as
// the CPU sampler (runtime/generate/sampler.cc), so both draw the same numbers.
DPL_SAMPLING_HD double UniformFromCounter(uint64_t seed, uint64_t step) {
  const uint64_t bits = SplitMix64(seed ^ SplitMix64(step));
  return static_cast<double>(bits >> 11) * (1.0 / 9007199254740992.0);
}

// The repetition-penalty window as the device keeps it: `tokens` has
// repeat_last_n slots; the newest token goes to slots[head], then head
// advances modulo repeat_last_n; count saturates at repeat_last_n.
struct RecentRing {
  std::vector<int32_t> tokens;  // (repeat_last_n) slots, -1 when unused
  int32_t head = 0;
  int32_t count = 0;
};

// The ring after pushing `history` (oldest first) into an empty ring: what
// the caller uploads after the prompt. repeat_last_n <= 0 gives an empty ring.
RecentRing MakeRecentRing(absl::Span<const int32_t> history, int32_t repeat_last_n);

}  // namespace dpl::kernels
