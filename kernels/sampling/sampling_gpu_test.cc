// On-device sampling vs a float64 CPU implementation of the same chain
// (tags gpu, manual).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/gpu_test.h"
#include "kernels/sampling/sampling.h"
#include "kernels/sampling/sampling_util.h"

namespace dpl::kernels {
namespace {


// Device buffers of one sampler.
struct Dev {
  float* logits = nullptr;
  int* ring = nullptr;
  SamplerState* state = nullptr;
  void* ws = nullptr;
  int* token = nullptr;  // followed by 15 sentinel ints
  int n_vocab = 0, n_slots = 0;

  Dev(const std::vector<float>& l, int slots) : n_vocab(static_cast<int>(l.size())), n_slots(slots) {
    REQUIRE(cudaMalloc(&logits, l.size() * 4) == cudaSuccess);
    REQUIRE(cudaMemcpy(logits, l.data(), l.size() * 4, cudaMemcpyHostToDevice) == cudaSuccess);
    REQUIRE(cudaMalloc(&ring, std::max(slots, 1) * 4) == cudaSuccess);
    REQUIRE(cudaMemset(ring, 0xff, std::max(slots, 1) * 4) == cudaSuccess);
    REQUIRE(cudaMalloc(&state, sizeof(SamplerState)) == cudaSuccess);
    REQUIRE(cudaMemset(state, 0, sizeof(SamplerState)) == cudaSuccess);
    REQUIRE(cudaMalloc(&ws, SamplingWorkspaceBytes()) == cudaSuccess);
    REQUIRE(cudaMalloc(&token, 16 * 4) == cudaSuccess);
    REQUIRE(cudaMemset(token, 0x5a, 16 * 4) == cudaSuccess);
  }
  ~Dev() {
    cudaFree(logits), cudaFree(ring), cudaFree(state), cudaFree(ws), cudaFree(token);
  }
  int Sample(const SamplingParams& p) {
    SamplingParams q = p;
    q.repeat_last_n = n_slots;
    const absl::Status st = SampleToken(q, logits, n_vocab, ring, state, ws, token, 0);
    REQUIRE(st.ok());
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    int out[16];
    REQUIRE(cudaMemcpy(out, token, sizeof(out), cudaMemcpyDeviceToHost) == cudaSuccess);
    for (int i = 1; i < 16; ++i) REQUIRE(out[i] == 0x5a5a5a5a);
    return out[0];
  }
  SamplerState State() {
    SamplerState s;
    REQUIRE(cudaMemcpy(&s, state, sizeof(s), cudaMemcpyDeviceToHost) == cudaSuccess);
    return s;
  }
  std::vector<int> Ring() {
    std::vector<int> r(n_slots);
    REQUIRE(cudaMemcpy(r.data(), ring, n_slots * 4, cudaMemcpyDeviceToHost) == cudaSuccess);
    return r;
  }
};

// The chain of sampling.h in float64 (as runtime/generate/sampler.cc).
int CpuSample(const std::vector<float>& logits, const SamplingParams& p, uint64_t step) {
  const int n = static_cast<int>(logits.size());
  std::vector<int> idx(n);
  std::iota(idx.begin(), idx.end(), 0);
  auto better = [&](int a, int b) { return logits[a] != logits[b] ? logits[a] > logits[b] : a < b; };
  if (!(p.temperature > 0)) return *std::min_element(idx.begin(), idx.end(), better);
  std::sort(idx.begin(), idx.end(), better);
  int keep = n;
  if (p.top_k > 0 && p.top_k < n) keep = p.top_k;
  const double l0 = logits[idx[0]];
  if (p.top_p < 1.0f) {
    double total = 0;
    for (int i = 0; i < keep; ++i) total += std::exp(logits[idx[i]] - l0);
    double cum = 0;
    for (int i = 0; i < keep; ++i) {
      cum += std::exp(logits[idx[i]] - l0);
      if (cum / total >= p.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  if (p.min_p > 0) {
    const float thr = logits[idx[0]] + std::log(p.min_p);
    int cut = 1;
    while (cut < keep && logits[idx[cut]] >= thr) ++cut;
    keep = cut;
  }
  std::vector<double> w(keep);
  double total = 0;
  for (int i = 0; i < keep; ++i) {
    w[i] = std::exp(double(logits[idx[i]] / p.temperature) - double(logits[idx[0]] / p.temperature));
    total += w[i];
  }
  const double u = UniformFromCounter(p.seed, step) * total;
  double cum = 0;
  for (int i = 0; i < keep; ++i) {
    cum += w[i];
    if (u < cum) return idx[i];
  }
  return idx[keep - 1];
}

std::vector<float> VocabLogits(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 2.5f);
  std::vector<float> l(n);
  for (auto& x : l) x = d(rng);
  // A handful of strong candidates, as real lm-head logits have.
  for (int i = 0; i < 30; ++i) l[(i * 7919 + seed) % n] = 14.0f + 0.4f * i * ((i % 3) - 1);
  return l;
}

TEST_CASE("greedy: argmax, ties to the lowest id") {
  auto l = VocabLogits(152064, 1);
  l[90000] = 50.0f;
  l[1234] = 50.0f;
  l[151999] = 50.0f;
  Dev d(l, 0);
  SamplingParams p;
  p.temperature = 0.0f;
  CHECK(d.Sample(p) == 1234);
  l[1234] = 49.0f;
  Dev d2(l, 0);
  CHECK(d2.Sample(p) == 90000);
}

TEST_CASE("top_k = 1 equals greedy") {
  for (uint32_t seed : {2u, 3u, 4u}) {
    auto l = VocabLogits(152064, seed);
    Dev d(l, 0);
    SamplingParams p;
    p.temperature = 1.5f;
    p.top_k = 1;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    const int want = CpuSample(l, SamplingParams{0.0f, 0, 1.0f, 0.0f, 1.0f, 0, 0}, 0);
    for (int i = 0; i < 5; ++i) CHECK(d.Sample(p) == want);
  }
}

TEST_CASE("full chain on 152064 logits equals the float64 chain, step after step") {
  struct P {
    float temp;
    int top_k;
    float top_p, min_p;
  };
  for (P c : {P{0.8f, 40, 0.95f, 0.05f}, P{1.0f, 0, 0.9f, 0.0f}, P{1.2f, 200, 1.0f, 0.0f},
              P{0.7f, 0, 1.0f, 0.02f}, P{1.0f, 1000, 0.99f, 0.0f}}) {
    CAPTURE(c.temp);
    CAPTURE(c.top_k);
    CAPTURE(c.top_p);
    CAPTURE(c.min_p);
    auto l = VocabLogits(152064, 9);
    Dev d(l, 0);
    SamplingParams p{c.temp, c.top_k, c.top_p, c.min_p, 1.0f, 0, 1234};
    int agree = 0;
    const int steps = 60;
    for (int s = 0; s < steps; ++s) agree += d.Sample(p) == CpuSample(l, p, s);
    CHECK(agree == steps);
    CHECK(d.State().step == uint64_t(steps));
    CHECK(d.State().truncations == 0u);
  }
}

TEST_CASE("temperature sampling: deterministic per seed, distribution matches softmax") {
  const std::vector<float> l = {1.0f, 2.0f, 0.5f, -1.0f, 3.0f, 2.5f, 0.0f, 1.5f};
  const int draws = 20000;
  SamplingParams p{0.9f, 0, 1.0f, 0.0f, 1.0f, 0, 77};
  // Capture one sampling step in a graph, replay it; the ring records the tokens.
  auto run = [&](uint64_t seed) {
    Dev d(l, draws);
    p.seed = seed;
    p.repeat_last_n = draws;
    cudaStream_t st;
    REQUIRE(cudaStreamCreate(&st) == cudaSuccess);
    cudaGraph_t g;
    cudaGraphExec_t ge;
    REQUIRE(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal) == cudaSuccess);
    REQUIRE(SampleToken(p, d.logits, 8, d.ring, d.state, d.ws, d.token, st).ok());
    REQUIRE(cudaStreamEndCapture(st, &g) == cudaSuccess);
    REQUIRE(cudaGraphInstantiate(&ge, g, 0) == cudaSuccess);
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < draws; ++i) REQUIRE(cudaGraphLaunch(ge, st) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(st) == cudaSuccess);
    const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    MESSAGE("sampling graph replay (vocab 8): " << us / draws << " us per token");
    cudaGraphExecDestroy(ge), cudaGraphDestroy(g), cudaStreamDestroy(st);
    CHECK(d.State().step == uint64_t(draws));
    auto r = d.Ring();
    for (int i = 0; i < draws; ++i) REQUIRE(r[i] == CpuSample(l, p, i));
    return r;
  };
  auto a = run(77), b = run(77), c = run(78);
  CHECK(a == b);
  CHECK(a != c);
  std::vector<double> prob(8);
  double z = 0;
  for (int i = 0; i < 8; ++i) z += (prob[i] = std::exp(double(l[i]) / 0.9));
  std::vector<int> hist(8, 0);
  for (int t : a) hist[t]++;
  for (int i = 0; i < 8; ++i) {
    const double pi = prob[i] / z, f = double(hist[i]) / draws;
    const double sd = std::sqrt(pi * (1 - pi) / draws);
    MESSAGE("token " << i << ": p " << pi << " freq " << f);
    CHECK(std::abs(f - pi) < 5 * sd + 1e-4);
  }
}

TEST_CASE("top-p, min-p and top-k exclude what they should") {
  // probabilities 0.5, 0.3, 0.1, 0.05, 0.05 (temperature 1)
  const std::vector<float> l = {std::log(0.05f), std::log(0.5f), std::log(0.1f), std::log(0.3f),
                                std::log(0.05f)};
  struct Case {
    SamplingParams p;
    std::vector<int> allowed;
  };
  const Case cases[] = {
      {{1.0f, 0, 0.75f, 0.0f, 1.0f, 0, 5}, {1, 3}},      // 0.5 + 0.3 >= 0.75
      {{1.0f, 0, 0.85f, 0.0f, 1.0f, 0, 5}, {1, 3, 2}},   // needs 0.9
      {{1.0f, 0, 1.0f, 0.15f, 1.0f, 0, 5}, {1, 3, 2}},   // p >= 0.075
      {{1.0f, 2, 1.0f, 0.0f, 1.0f, 0, 5}, {1, 3}},
      {{1.0f, 4, 0.5f, 0.0f, 1.0f, 0, 5}, {1}},          // top-p inside top-k
  };
  for (const Case& c : cases) {
    Dev d(l, 0);
    std::vector<int> hist(5, 0);
    for (int i = 0; i < 2000; ++i) hist[d.Sample(c.p)]++;
    for (int t = 0; t < 5; ++t) {
      const bool ok = std::find(c.allowed.begin(), c.allowed.end(), t) != c.allowed.end();
      CAPTURE(t);
      if (ok) CHECK(hist[t] > 0);
      else CHECK(hist[t] == 0);
    }
  }
}

TEST_CASE("repetition penalty: distinct ring tokens once, llama.cpp rule, ring push") {
  std::vector<float> l = VocabLogits(1000, 5);
  l[10] = 40.0f;   // positive: divided
  l[11] = 39.0f;
  l[12] = -3.0f;   // negative: multiplied
  Dev d(l, 4);
  const RecentRing ring = MakeRecentRing(std::vector<int32_t>{10, 12, 10}, 4);
  REQUIRE(cudaMemcpy(d.ring, ring.tokens.data(), 16, cudaMemcpyHostToDevice) == cudaSuccess);
  SamplerState s{};
  s.ring_head = ring.head;
  s.ring_count = ring.count;
  REQUIRE(cudaMemcpy(d.state, &s, sizeof(s), cudaMemcpyHostToDevice) == cudaSuccess);
  SamplingParams p{0.0f, 0, 1.0f, 0.0f, 1.25f, 4, 0};
  CHECK(d.Sample(p) == 11);  // 40 / 1.25 = 32 < 39
  std::vector<float> after(l.size());
  REQUIRE(cudaMemcpy(after.data(), d.logits, l.size() * 4, cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(after[10] == 40.0f / 1.25f);  // once, though 10 appears twice
  CHECK(after[12] == -3.0f * 1.25f);
  for (int i = 0; i < 1000; ++i) {
    if (i != 10 && i != 12) REQUIRE(after[i] == l[i]);
  }
  const SamplerState s2 = d.State();
  CHECK(s2.ring_count == 4);
  CHECK(s2.ring_head == 0);
  CHECK(d.Ring()[3] == 11);
}

TEST_CASE("sampling time on 152064 logits") {
  auto l = VocabLogits(152064, 11);
  Dev d(l, 64);
  SamplingParams p;  // defaults: 0.8, 40, 0.95, 0.05
  p.repeat_penalty = 1.1f;
  d.Sample(p);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 100; ++i) d.Sample(p);
  const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  MESSAGE("full chain, 152064 logits, eager launches + sync: " << us / 100 << " us per token");
  p.temperature = 0.0f;
  const auto t1 = std::chrono::steady_clock::now();
  for (int i = 0; i < 100; ++i) d.Sample(p);
  const double us2 = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t1).count();
  MESSAGE("greedy, 152064 logits, eager launches + sync: " << us2 / 100 << " us per token");
}

}  // namespace
}  // namespace dpl::kernels
