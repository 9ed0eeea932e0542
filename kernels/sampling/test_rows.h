// The logit rows the sampling tests draw from, one definition for the GPU
// test (sampling_gpu_test) and the CPU test of its cutoff rule
// (depth_bins_test), so both always test the same rows. Host only.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

namespace dpl::kernels::sampling_rows {

// n logits drawn from N(0, 2.5), and thirty strong candidates near 14, as
// real lm-head logits have.
inline std::vector<float> VocabLogits(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 2.5f);
  std::vector<float> l(n);
  for (auto& x : l) x = d(rng);
  for (int i = 0; i < 30; ++i) l[(i * 7919 + seed) % n] = 14.0f + 0.4f * i * ((i % 3) - 1);
  return l;
}

// The ids of the `k` largest logits (ties to the lower id).
inline std::vector<int> TopIds(const std::vector<float>& l, int k) {
  std::vector<int> idx(l.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                    [&](int a, int b) { return l[a] != l[b] ? l[a] > l[b] : a < b; });
  idx.resize(k);
  return idx;
}

}  // namespace dpl::kernels::sampling_rows
