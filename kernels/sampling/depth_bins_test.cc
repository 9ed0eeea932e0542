// The candidate cutoff of depth_bins.h on the CPU: the bins are monotone and
// as wide as documented, ChooseCutoff follows its rule, and on the rows the
// GPU test samples (sampling_gpu_test's VocabLogits, bans, masks) the
// logits it keeps hold everything the chain needs: FinalKernel's chain run
// on them alone (emulated here) draws what generate::Sampler draws on the
// whole row, draw after draw, with no truncation.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/sampling/depth_bins.h"
#include "kernels/sampling/sampling_util.h"
#include "kernels/sampling/test_rows.h"
#include "runtime/generate/sampler.h"

namespace dpl::kernels {
namespace {

using sampling_rows::TopIds;
using sampling_rows::VocabLogits;

constexpr float kInf = std::numeric_limits<float>::infinity();

TEST_CASE("depth bins: edges, widths, monotone") {
  CHECK(kDepthBins == 1537);
  const float m = 25.6f;
  CHECK(DepthBin(m, m) == 0);
  CHECK(DepthBin(m, m - 1.0f / 128) == 1);        // 1/128 wide at the top
  CHECK(DepthBin(m, m - 2.0f) == 256);             // [2, 6): 1/64
  CHECK(DepthBin(m, m - 2.0f - 1.0f / 64) == 257);
  CHECK(DepthBin(m, m - 6.0f) == 512);             // [6, 14): 1/32
  CHECK(DepthBin(m, m - 14.0f) == 768);
  CHECK(DepthBin(m, m - 30.0f) == 1024);
  CHECK(DepthBin(m, m - 62.0f) == 1280);
  CHECK(DepthBin(m, m - 125.0f) == 1532);
  CHECK(DepthBin(m, m - 127.0f) == kDepthOverflowBin);
  CHECK(DepthBin(m, -kInf) == kDepthOverflowBin);
  CHECK(DepthBin(m, std::nanf("")) == kDepthOverflowBin);
  CHECK(DepthBin(-kInf, -kInf) == kDepthOverflowBin);  // an all -inf row: NaN depth
  CHECK(DepthBin(m, m + 1.0f) == 0);               // above the max: clamped
  CHECK(DepthBin(0.0f, -0.0f) == 0);
  // Monotone on sorted logits, for maxima of several magnitudes.
  std::mt19937 rng(3);
  for (float scale : {0.01f, 1.0f, 2.5f, 30.0f, 1000.0f}) {
    std::normal_distribution<float> d(0.0f, scale);
    std::vector<float> l(20000);
    for (auto& x : l) x = d(rng);
    l.push_back(-kInf);
    std::sort(l.begin(), l.end(), std::greater<float>());
    const float max_l = l[0];
    int prev = 0;
    for (float x : l) {
      const int b = DepthBin(max_l, x);
      REQUIRE(b >= prev);
      REQUIRE(b <= kDepthOverflowBin);
      prev = b;
    }
  }
}

// Inclusive prefix sums of a histogram given as (bin, count, mass) entries.
struct Cum {
  std::vector<uint32_t> count = std::vector<uint32_t>(kDepthBins, 0);
  std::vector<double> mass = std::vector<double>(kDepthBins, 0.0);
  void Add(int bin, uint32_t c, double m) {
    for (int b = bin; b < kDepthBins; ++b) count[b] += c, mass[b] += m;
  }
};

TEST_CASE("ChooseCutoff: the shallowest rule, then the cap") {
  Cum h;
  h.Add(0, 1, 1.0);     // the max
  h.Add(10, 5, 2.0);
  h.Add(200, 40, 1.0);
  h.Add(300, 3000, 0.5);
  h.Add(kDepthOverflowBin, 100000, 0.0);
  CutoffRule r;
  r.cap = 2048;
  // All off: every bin, more than the cap: the deepest bin that fits.
  CHECK(ChooseCutoff(h.count.data(), h.mass.data(), r).truncated);
  CHECK(ChooseCutoff(h.count.data(), h.mass.data(), r).bin == 299);
  r.top_k = 6;
  CHECK(ChooseCutoff(h.count.data(), h.mass.data(), r).bin == 10);
  CHECK(!ChooseCutoff(h.count.data(), h.mass.data(), r).truncated);
  r.top_k = 7;
  CHECK(ChooseCutoff(h.count.data(), h.mass.data(), r).bin == 200);
  r.max_bin = 50;  // min-p shallower than top-k
  CHECK(ChooseCutoff(h.count.data(), h.mass.data(), r).bin == 50);
  r = CutoffRule{};
  r.cap = 2048;
  r.by_mass = true;
  r.mass_target = 2.9;  // 1 + 2 reached at bin 10
  CHECK(ChooseCutoff(h.count.data(), h.mass.data(), r).bin == 10);
  r.mass_target = 3.5;  // bin 200
  CHECK(ChooseCutoff(h.count.data(), h.mass.data(), r).bin == 200);
  r.mass_target = 10.0;  // never: everything, truncated to what fits
  const Cutoff c = ChooseCutoff(h.count.data(), h.mass.data(), r);
  CHECK(c.bin == 299);
  CHECK(c.truncated);
  // One bin alone over the cap: that bin (the first kCap arrivals of it).
  Cum flat;
  flat.Add(3, 5000, 1.0);
  CutoffRule all;
  all.cap = 2048;
  const Cutoff f = ChooseCutoff(flat.count.data(), flat.mass.data(), all);
  CHECK(f.bin == 3);
  CHECK(f.truncated);
}

// What the device computes for one row: the rule, the histogram (as
// HistKernel: bins down to rule.max_bin; masses and Z_all as float exps),
// the cutoff (CutoffKernel), the candidates (CollectKernel), sorted as
// FinalKernel sorts them.
struct DeviceRow {
  float max_l = 0;
  CutoffRule rule;
  Cutoff cut;
  double z_all = 0;
  std::vector<std::pair<float, int>> cand;  // descending logit, then ascending id
};

DeviceRow Emulate(const std::vector<float>& l, const SamplingParams& p) {
  DeviceRow d;
  const int n = static_cast<int>(l.size());
  d.max_l = *std::max_element(l.begin(), l.end());
  d.rule = CutoffRuleFor(p, n, d.max_l, kSamplingMaxCandidates);
  std::vector<uint32_t> count(kDepthBins, 0);
  std::vector<float> mass(kDepthBins, 0.0f);
  for (int i = 0; i < n; ++i) {
    const int b = DepthBin(d.max_l, l[i]);
    const float m = std::exp(l[i] - d.max_l);
    if (d.rule.by_mass) d.z_all += m;
    if (b > d.rule.max_bin) continue;
    count[b] += 1;
    mass[b] += m;
  }
  std::vector<uint32_t> cum_c(kDepthBins);
  std::vector<double> cum_m(kDepthBins);
  uint32_t c = 0;
  double m = 0;
  for (int b = 0; b < kDepthBins; ++b) cum_c[b] = c += count[b], cum_m[b] = m += mass[b];
  d.rule.mass_target = static_cast<double>(p.top_p) * d.z_all * (1.0 + 1e-4);
  d.cut = ChooseCutoff(cum_c.data(), cum_m.data(), d.rule);
  for (int i = 0; i < n; ++i) {
    if (DepthBin(d.max_l, l[i]) <= d.cut.bin) d.cand.push_back({l[i], i});
  }
  std::sort(d.cand.begin(), d.cand.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  });
  return d;
}

// FinalKernel's chain on the sorted candidates (sampling.cu), draw `step`.
int FinalChain(const DeviceRow& d, const SamplingParams& p, int n_vocab, uint64_t step) {
  const auto& c = d.cand;
  const int n = std::min<int>(static_cast<int>(c.size()), kSamplingMaxCandidates);
  int keep = n;
  if (p.top_k > 0 && p.top_k < keep) keep = p.top_k;
  const float l0 = c[0].first;
  if (p.top_p < 1.0f) {
    std::vector<double> cum(keep);
    double s = 0;
    for (int i = 0; i < keep; ++i) cum[i] = s += std::exp(static_cast<double>(c[i].first) - l0);
    const bool topk_on = p.top_k > 0 && p.top_k < n_vocab;
    const double total = topk_on ? cum[keep - 1] : d.z_all;
    for (int i = 0; i < keep; ++i) {
      if (cum[i] / total >= static_cast<double>(p.top_p)) {
        keep = i + 1;
        break;
      }
    }
  }
  if (p.min_p > 0.0f) {
    const float threshold = l0 + std::log(p.min_p);
    for (int i = 1; i < keep; ++i) {
      if (!(c[i].first >= threshold)) {
        keep = i;
        break;
      }
    }
  }
  if (l0 == -kInf) keep = 1;
  for (int i = 1; i < keep; ++i) {
    if (c[i].first == -kInf) {
      keep = i;
      break;
    }
  }
  std::vector<double> cum(keep);
  double s = 0;
  const double max_t = static_cast<double>(l0 / p.temperature);
  for (int i = 0; i < keep; ++i) cum[i] = s += std::exp(static_cast<double>(c[i].first / p.temperature) - max_t);
  const double u = UniformFromCounter(p.seed, step) * cum[keep - 1];
  for (int i = 0; i < keep; ++i) {
    if (u < cum[i]) return c[i].second;
  }
  return c[keep - 1].second;
}

std::string Describe(const SamplingParams& p) {
  return "T " + std::to_string(p.temperature) + " top_k " + std::to_string(p.top_k) + " top_p " +
         std::to_string(p.top_p) + " min_p " + std::to_string(p.min_p);
}

// The candidates suffice: draw after draw, the chain on them alone equals
// generate::Sampler on the whole row; and they fit without truncation.
void ExpectSameDraws(const std::vector<float>& l, const SamplingParams& p, int draws) {
  INFO(Describe(p));
  const DeviceRow d = Emulate(l, p);
  INFO("cutoff bin " << d.cut.bin << ", " << d.cand.size() << " candidates, rule: top_k " << d.rule.top_k
                     << " by_mass " << d.rule.by_mass << " max_bin " << d.rule.max_bin);
  CHECK(!d.cut.truncated);
  CHECK(d.cand.size() <= static_cast<size_t>(kSamplingMaxCandidates));
  generate::Sampler cpu(p);
  int differ = 0, first_step = -1, first_want = -1, first_got = -1;
  for (int s = 0; s < draws; ++s) {
    const int want = cpu.Sample(l);
    const int got = FinalChain(d, p, static_cast<int>(l.size()), s);
    if (want != got && differ++ == 0) first_step = s, first_want = want, first_got = got;
  }
  INFO("first difference at draw " << first_step << ": CPU " << first_want << ", candidates " << first_got);
  CHECK(differ == 0);
}

SamplingParams Chain(float t, int k, float top_p, float min_p, uint64_t seed) {
  SamplingParams p{t, k, top_p, min_p, 1.0f, 0, seed};
  return p;
}

// The parameter sets of sampling_gpu_test (and a few more).
const std::vector<SamplingParams>& GpuTestParams() {
  static const std::vector<SamplingParams> params = {
      Chain(0.8f, 40, 0.95f, 0.05f, 1234), Chain(1.0f, 0, 0.9f, 0.0f, 12), Chain(1.2f, 200, 1.0f, 0.0f, 5),
      Chain(0.7f, 0, 1.0f, 0.02f, 7),      Chain(1.0f, 1000, 0.99f, 0.0f, 9), Chain(0.9f, 40, 1.0f, 0.0f, 11),
      Chain(0.7f, 0, 1.0f, 0.05f, 13),     Chain(1.5f, 1, 1.0f, 0.0f, 16),  Chain(1.0f, 200, 0.95f, 0.0f, 19),
      Chain(1.2f, 100, 1.0f, 0.0f, 5),     Chain(1.3f, 0, 1.0f, 0.1f, 33),  Chain(1.5f, 0, 1.0f, 0.05f, 42),
      Chain(1.0f, 1800, 1.0f, 0.0f, 3),    Chain(1.0f, 0, 0.5f, 0.0f, 4),   Chain(0.8f, 0, 0.95f, 0.05f, 8),
  };
  return params;
}

TEST_CASE("the cutoff keeps what the chain draws from: the GPU test's rows") {
  // Seeds of the GPU test's rows (9: the full-chain case; 41: the timing
  // rows; 300 + r: the batched rows). ~10 ms a CPU draw: 40 draws each.
  for (uint32_t seed : {9u, 41u, 300u, 363u}) {
    CAPTURE(seed);
    const auto l = VocabLogits(152064, seed);
    for (const SamplingParams& p : GpuTestParams()) ExpectSameDraws(l, p, 40);
  }
}

TEST_CASE("the cutoff keeps what the chain draws from: bans, -100 biases, masks") {
  const int n = 152064;
  // sampling_gpu_test's logit-bias row 2: the best thirty at -100, the next five banned.
  auto l = VocabLogits(n, 302);
  const std::vector<int> top = TopIds(l, 35);
  for (int i = 0; i < 30; ++i) l[top[i]] -= 100.0f;
  for (int i = 30; i < 35; ++i) l[top[i]] = -kInf;
  ExpectSameDraws(l, Chain(1.0f, 50, 0.9f, 0.0f, 32), 60);
  ExpectSameDraws(l, Chain(0.8f, 40, 0.95f, 0.05f, 31), 60);
  // A mask of 5% of the vocab (the rest -inf): the default chain.
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> any(0, n - 1);
  auto base = VocabLogits(n, 301);
  std::vector<float> masked(n, -kInf);
  for (int i = 0; i < n / 20; ++i) {
    const int t = any(rng);
    masked[t] = base[t];
  }
  ExpectSameDraws(masked, Chain(0.8f, 40, 0.95f, 0.05f, 31), 60);
  ExpectSameDraws(masked, Chain(1.0f, 0, 0.9f, 0.0f, 3), 60);
}

TEST_CASE("the cutoff on a small vocabulary with every filter off: the whole row") {
  const std::vector<float> l = {1.0f, 2.0f, 0.5f, -1.0f, 3.0f, 2.5f, 0.0f, 1.5f};
  ExpectSameDraws(l, Chain(0.9f, 0, 1.0f, 0.0f, 77), 2000);
  const DeviceRow d = Emulate(l, Chain(0.9f, 0, 1.0f, 0.0f, 77));
  CHECK(d.cut.bin == kDepthOverflowBin);
  CHECK(d.cand.size() == l.size());
}

// Masks of a few tokens: the top-k set is mostly -inf, deeper than any
// bin; the cutoff truncates to the finite tokens (as issue 12's did) and the
// draw is still the CPU's.
TEST_CASE("the cutoff with a mask of three tokens: truncated to them, the same draws") {
  const int n = 152064;
  std::vector<float> l(n, -kInf);
  l[7] = 3.0f, l[1007] = 2.5f, l[2007] = -1.0f;
  for (const SamplingParams& p : {Chain(1.0f, 0, 1.0f, 0.0f, 32), Chain(0.8f, 40, 0.95f, 0.05f, 33)}) {
    INFO(Describe(p));
    const DeviceRow d = Emulate(l, p);
    CHECK(d.cand.size() == 3u);
    generate::Sampler cpu(p);
    for (int s = 0; s < 30; ++s) CHECK(FinalChain(d, p, n, s) == cpu.Sample(l));
  }
}

}  // namespace
}  // namespace dpl::kernels
