// Which logits of a row can survive top-k / top-p / min-p, decided from a
// histogram of their depth below the row's max: the rule sampling.cu's Hist,
// Cutoff and Collect kernels follow, host and device (the CPU test
// depth_bins_test runs it on the same rows as the GPU test).
//
// Depth bins. d = max - l >= 0 and x = d + kDepthOffset (float, rounded to
// nearest); bin = (bits(x) >> 15) - (bits(kDepthOffset) >> 15): the top 8
// mantissa bits of x, 256 bins a binade of x:
//   d in [0, 2): 1/128 logit wide   [2, 6): 1/64   [6, 14): 1/32
//   [14, 30): 1/16   [30, 62): 1/8   [62, 126): 1/4
// and kDepthOverflowBin for everything deeper (-inf, and NaN). Finest at the
// top, where top-k and min-p cutoffs fall on real logits (top-40 and min-p
// 0.05 sit a few logits below the max); coarser in the bulk (10-40 logits
// below), where only a large top-k or a flat top-p reaches: there a bin of
// an N(0, 2.5) row of 152064 holds ~100 logits, so a top-k up to ~1800
// fits the 2048 candidates (depth_bins_test; issue 12's bins of the
// absolute logit fitted about as many). The bin is monotone: a larger logit
// never gets a deeper bin, so "bin <= cut" is always a prefix of the row
// sorted descending, ties included.
//
// The cutoff (ChooseCutoff): the deepest bin the chain may need, from the
// inclusive prefix sums over bins 0, 1, ... of the counts and softmax masses
// exp(l - max):
//   top-k on:                   the first bin where the count reaches top_k
//   top-p on, top-k off:        the first bin where the mass reaches
//                               top_p * Z_all (1 + 1e-4) (margin: float sums)
//   min-p on (unless top-k and top-p are both on: top-p then normalizes over
//   the whole top-k set):       no deeper than the bin of max + log(min_p)
// (the shallowest of those; every bin when none is on). More than `cap`
// logits in bins <= cut: the deepest bin that fits, at least the first
// non-empty one, and `truncated` (the chain then runs on the top of the
// row only, as sampling.h says).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/sampling/sampling_util.h"

namespace dpl::kernels {

// Candidates the device's chain sorts and runs on (FinalKernel, one block).
inline constexpr int kSamplingMaxCandidates = 2048;

inline constexpr float kDepthOffset = 2.0f;
inline constexpr int kDepthShift = 15;  // 23 - 15 = 8 mantissa bits
inline constexpr int kDepthBinsPerBinade = 1 << (23 - kDepthShift);
inline constexpr int kDepthBinades = 6;  // x in [2, 128): d in [0, 126)
inline constexpr int kDepthOverflowBin = kDepthBinsPerBinade * kDepthBinades;  // 1536
inline constexpr int kDepthBins = kDepthOverflowBin + 1;

DPL_SAMPLING_HD uint32_t DepthFloatBits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return u;
#endif
}

// The bin of logit l in a row whose max is max_l (see the top). Both
// operations round to nearest on host and device (no contraction: there is
// no product), so every kernel and the CPU test get the same bin.
DPL_SAMPLING_HD int DepthBin(float max_l, float l) {
#if defined(__CUDA_ARCH__)
  const float x = __fadd_rn(__fsub_rn(max_l, l), kDepthOffset);
#else
  const float x = (max_l - l) + kDepthOffset;
#endif
  if (!(x < 128.0f)) return kDepthOverflowBin;  // deeper than 126, -inf, NaN
  if (!(x >= kDepthOffset)) return 0;           // l > max_l: not for a true max
  return static_cast<int>(DepthFloatBits(x) >> kDepthShift) -
         static_cast<int>(DepthFloatBits(kDepthOffset) >> kDepthShift);
}

// What one row asks of the cutoff (CutoffRuleFor).
struct CutoffRule {
  uint32_t top_k = 0;          // > 0: the top_k largest must be kept
  bool by_mass = false;        // top-p alone: keep until the mass reaches mass_target
  double mass_target = 0.0;    // top_p * Z_all * (1 + 1e-4), when by_mass
  int max_bin = kDepthOverflowBin;  // min-p: nothing deeper survives (the Hist pass skips it)
  uint32_t cap = 0;            // candidates the sort holds (kSamplingMaxCandidates)
};

// The row's rule from its (sanitized) params and max; mass_target is filled
// once Z_all is known (only when by_mass).
DPL_SAMPLING_HD CutoffRule CutoffRuleFor(const SamplingParams& p, int n_vocab, float max_l, uint32_t cap) {
  CutoffRule r;
  r.cap = cap;
  const bool topk_on = p.top_k > 0 && p.top_k < n_vocab;
  const bool topp_on = p.top_p < 1.0f;  // NaN: off
  if (topk_on) r.top_k = static_cast<uint32_t>(p.top_k);
  r.by_mass = topp_on && !topk_on;
  if (p.min_p > 0.0f && !(topk_on && topp_on)) {
    // FinalKernel keeps l >= max + logf(min_p): the same float threshold.
    r.max_bin = DepthBin(max_l, max_l + logf(p.min_p));
  }
  return r;
}

// First index in [0, n) with v[i] >= target (v non-decreasing), n - 1 if none.
template <typename T>
DPL_SAMPLING_HD int FirstAtLeast(const T* v, int n, T target) {
  int lo = 0, hi = n - 1;  // the answer lies in [lo, hi]
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (v[mid] >= target) hi = mid;
    else lo = mid + 1;
  }
  return lo;
}

// Last index in [0, n) with v[i] <= target (v non-decreasing), -1 if none.
template <typename T>
DPL_SAMPLING_HD int LastAtMost(const T* v, int n, T target) {
  int lo = -1, hi = n - 1;  // the answer lies in [lo, hi]
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (v[mid] <= target) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

struct Cutoff {
  int bin = kDepthOverflowBin;  // keep the logits with DepthBin <= bin
  bool truncated = false;
};

// cum_count / cum_mass: inclusive prefix sums over the kDepthBins bins
// (cum_mass read only when rule.by_mass). Binary searches: one thread does it.
DPL_SAMPLING_HD Cutoff ChooseCutoff(const uint32_t* cum_count, const double* cum_mass, const CutoffRule& rule) {
  Cutoff c;
  int cut = kDepthOverflowBin;
  if (rule.top_k > 0) {
    cut = FirstAtLeast(cum_count, kDepthBins, rule.top_k);
  } else if (rule.by_mass) {
    cut = FirstAtLeast(cum_mass, kDepthBins, rule.mass_target);
  }
  cut = rule.max_bin < cut ? rule.max_bin : cut;
  if (cum_count[cut] > rule.cap) {
    const int fits = LastAtMost(cum_count, kDepthBins, rule.cap);
    const int first = FirstAtLeast(cum_count, kDepthBins, 1u);
    cut = fits > first ? fits : first;
    c.truncated = true;
  }
  c.bin = cut;
  return c;
}

}  // namespace dpl::kernels
