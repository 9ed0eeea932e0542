// On-device sampling vs a float64 CPU implementation of the same chain, and
// the batched call vs SampleToken row by row (tags gpu, manual).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <iomanip>
#include <memory>
#include <sstream>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/gpu_test.h"
#include "kernels/cuda_handles.h"
#include "kernels/sampling/sampling.h"
#include "kernels/sampling/sampling_util.h"
#include "kernels/sampling/test_rows.h"
#include "runtime/generate/sampler.h"

namespace dpl::kernels {
namespace {

using sampling_rows::TopIds;
using sampling_rows::VocabLogits;


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

// The penalty window `tokens` (oldest first) into d's ring of `slots` slots.
void LoadRing(Dev& d, const std::vector<int32_t>& tokens, int slots) {
  const RecentRing ring = MakeRecentRing(tokens, slots);
  REQUIRE(cudaMemcpy(d.ring, ring.tokens.data(), ring.tokens.size() * sizeof(int32_t), cudaMemcpyHostToDevice) ==
          cudaSuccess);
  SamplerState s{};
  s.ring_head = ring.head;
  s.ring_count = ring.count;
  REQUIRE(cudaMemcpy(d.state, &s, sizeof(s), cudaMemcpyHostToDevice) == cudaSuccess);
}

TEST_CASE("repetition penalty: distinct ring tokens once, llama.cpp rule, ring push") {
  std::vector<float> l = VocabLogits(1000, 5);
  l[10] = 40.0f;   // positive: divided
  l[11] = 39.0f;
  l[12] = -3.0f;   // negative: multiplied
  Dev d(l, 4);
  LoadRing(d, {10, 12, 10}, 4);
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

// OpenAI's presence and frequency penalties after the repetition penalty,
// each distinct ring token once with its count (the host sampler's rule).
TEST_CASE("presence and frequency penalties: count a token's ring entries") {
  std::vector<float> l = VocabLogits(1000, 5);
  l[10] = 40.0f;
  l[11] = 31.5f;
  l[12] = -3.0f;
  Dev d(l, 4);
  LoadRing(d, {10, 12, 10}, 4);
  SamplingParams p{0.0f, 0, 1.0f, 0.0f, 1.25f, 4, 0, 0.5f, 0.25f};
  CHECK(d.Sample(p) == 11);  // 40 / 1.25 - (2 x 0.25 + 0.5) = 31 < 31.5
  std::vector<float> after(l.size());
  REQUIRE(cudaMemcpy(after.data(), d.logits, l.size() * 4, cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(after[10] == 31.0f);
  CHECK(after[12] == -4.5f);  // -3 x 1.25 - (0.25 + 0.5)
  for (int i = 0; i < 1000; ++i) {
    if (i != 10 && i != 12) REQUIRE(after[i] == l[i]);
  }
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

// ---- Batched sampling (SampleTokens) ----

// Device buffers of one batched call: n_seqs sequences (params, states,
// rings of ring_stride slots), `batch` rows (slots, logits, tokens). The
// workspace starts as garbage: the kernels must zero what they use.
struct BatchDev {
  int n_seqs, batch, n_vocab, ring_stride;
  testing::GuardedArray<SamplingParams> params;
  testing::GuardedArray<int> slots;
  testing::GuardedArray<float> logits;
  testing::GuardedArray<int> rings;
  testing::GuardedArray<SamplerState> states;
  testing::GuardedArray<char> ws;
  testing::GuardedArray<int> tokens;

  BatchDev(int seqs, int rows, int vocab, int stride)
      : n_seqs(seqs), batch(rows), n_vocab(vocab), ring_stride(stride), params(seqs),
        slots(rows), logits(static_cast<size_t>(rows) * vocab),
        rings(std::max(static_cast<size_t>(seqs) * stride, size_t{1})), states(seqs),
        ws(SamplingWorkspaceBytes(rows)), tokens(rows) {
    CUDA_OK(cudaMemset(ws.get(), 0x7f, ws.size()));
    CUDA_OK(cudaMemset(tokens.get(), 0x5a, tokens.size() * 4));
  }
  // Row r samples sequence r from VocabLogits(n_vocab, 300 + r); empty rings.
  void FillVocabRows() {
    std::vector<int> s(batch);
    std::iota(s.begin(), s.end(), 0);
    slots.Upload(s);
    std::vector<float> all;
    for (int r = 0; r < batch; ++r) {
      const auto l = VocabLogits(n_vocab, 300 + r);
      all.insert(all.end(), l.begin(), l.end());
    }
    logits.Upload(all);
    rings.Upload(std::vector<int>(rings.size(), -1));
  }
  SampleBatch Batch() const {
    SampleBatch b;
    b.params = params.get();
    b.n_seqs = n_seqs;
    b.slots = slots.get();
    b.batch = batch;
    b.logits = logits.get();
    b.n_vocab = n_vocab;
    b.rings = ring_stride > 0 ? rings.get() : nullptr;
    b.ring_stride = ring_stride;
    b.states = states.get();
    b.workspace = ws.get();
    b.tokens_out = tokens.get();
    return b;
  }
  void Sample(cudaStream_t st = 0) {
    STATUS_OK(SampleTokens(Batch(), st));
    CUDA_OK(cudaStreamSynchronize(st));
  }
};

bool SameState(const SamplerState& a, const SamplerState& b) {
  return a.step == b.step && a.ring_head == b.ring_head && a.ring_count == b.ring_count &&
         a.truncations == b.truncations;
}

// What SampleToken is given for params the device makes safe (see sampling.h).
SamplingParams Sanitized(SamplingParams p, int ring_stride) {
  p.repeat_last_n = std::clamp(p.repeat_last_n, 0, ring_stride);
  if (!(p.repeat_penalty > 0.0f)) p.repeat_penalty = 1.0f;
  return p;
}

TEST_CASE("batched: mixed rows equal SampleToken row by row (tokens, states, rings, logits)") {
  const int n_vocab = 152064, n_seqs = 12, stride = 64;
  const float nan = std::nanf("");
  // {temperature, top_k, top_p, min_p, repeat_penalty, repeat_last_n, seed}
  const std::vector<SamplingParams> seq_params = {
      {0.0f, 0, 1.0f, 0.0f, 1.0f, 0, 0},           // 0: greedy
      {0.0f, 40, 0.95f, 0.05f, 1.3f, 16, 0},       // 1: greedy with the penalty
      {0.9f, 40, 1.0f, 0.0f, 1.0f, 0, 11},         // 2: top-k
      {1.0f, 0, 0.9f, 0.0f, 1.0f, 0, 12},          // 3: top-p
      {0.7f, 0, 1.0f, 0.05f, 1.0f, 0, 13},         // 4: min-p
      {0.8f, 40, 0.95f, 0.05f, 1.1f, 64, 14},      // 5: the default chain, penalty
      {0.8f, 40, 0.95f, 0.05f, 1.2f, 32, 15},      // 6: another seed, ring of 32
      {1.5f, 1, 1.0f, 0.0f, 1.0f, 8, 16},          // 7: top_k 1, ring pushes, no penalty
      {0.8f, 0, 0.9f, 0.0f, -1.0f, 1000, 17},      // 8: bad: ring > stride, penalty <= 0
      {0.8f, 40, 0.95f, 0.05f, 1.1f, 64, 18},      // 9: no row samples it
      {1.0f, 200, 0.95f, 0.0f, 1.15f, 8, 19},      // 10: top-k then top-p, penalty
      {nan, 40, nan, nan, 1.05f, 64, 20},          // 11: NaN temperature: greedy
  };
  REQUIRE(static_cast<int>(seq_params.size()) == n_seqs);
  const std::vector<int> slots = {5, 0, -1, 2, 3, 11, 4, 1, 12, 6, 7, 8, 10};
  const int batch = static_cast<int>(slots.size());
  BatchDev bd(n_seqs, batch, n_vocab, stride);
  bd.params.Upload(seq_params);
  bd.slots.Upload(slots);
  std::vector<float> logits(static_cast<size_t>(batch) * n_vocab);
  for (int r = 0; r < batch; ++r) {
    const auto l = VocabLogits(n_vocab, 100 + r);
    std::copy(l.begin(), l.end(), logits.begin() + static_cast<size_t>(r) * n_vocab);
  }
  bd.logits.Upload(logits);
  // Each sequence's history: its row's top tokens (so the penalty matters),
  // one twice; ring slots past repeat_last_n hold -7 and must stay so.
  std::vector<int> rings(static_cast<size_t>(n_seqs) * stride, -7);
  std::vector<SamplerState> states(n_seqs);
  std::vector<int> row_of(n_seqs, -1);
  for (int r = 0; r < batch; ++r) {
    if (slots[r] >= 0 && slots[r] < n_seqs) row_of[slots[r]] = r;
  }
  for (int s = 0; s < n_seqs; ++s) {
    const int n = Sanitized(seq_params[s], stride).repeat_last_n;
    const int r = row_of[s] >= 0 ? row_of[s] : 0;
    std::vector<float> l(logits.begin() + static_cast<size_t>(r) * n_vocab,
                         logits.begin() + static_cast<size_t>(r + 1) * n_vocab);
    std::vector<int32_t> hist = TopIds(l, 6);
    hist.push_back(hist[1]);
    const RecentRing ring = MakeRecentRing(hist, n);
    std::copy(ring.tokens.begin(), ring.tokens.end(), rings.begin() + s * stride);
    states[s] = SamplerState{static_cast<unsigned long long>(3 * s), ring.head, ring.count, 0, 0};
  }
  bd.rings.Upload(rings);
  bd.states.Upload(states);

  // The reference: one Dev (SampleToken) per non-padding row, same start.
  std::vector<std::unique_ptr<Dev>> ref(batch);
  for (int r = 0; r < batch; ++r) {
    const int s = slots[r];
    if (s < 0 || s >= n_seqs) continue;
    const int n = Sanitized(seq_params[s], stride).repeat_last_n;
    std::vector<float> l(logits.begin() + static_cast<size_t>(r) * n_vocab,
                         logits.begin() + static_cast<size_t>(r + 1) * n_vocab);
    ref[r] = std::make_unique<Dev>(l, n);
    if (n > 0) CUDA_OK(cudaMemcpy(ref[r]->ring, rings.data() + s * stride, n * 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(ref[r]->state, &states[s], sizeof(SamplerState), cudaMemcpyHostToDevice));
  }
  const int steps = 4;
  for (int step = 0; step < steps; ++step) {
    CAPTURE(step);
    bd.Sample();
    const std::vector<int> got = bd.tokens.Download();
    for (int r = 0; r < batch; ++r) {
      CAPTURE(r);
      if (!ref[r]) {
        CHECK(got[r] == 0x5a5a5a5a);  // padding row: untouched
        continue;
      }
      CHECK(got[r] == ref[r]->Sample(Sanitized(seq_params[slots[r]], stride)));
    }
  }
  const std::vector<float> got_logits = bd.logits.Download();
  const std::vector<int> got_rings = bd.rings.Download();
  const std::vector<SamplerState> got_states = bd.states.Download();
  int sampled_rows = 0;
  for (int r = 0; r < batch; ++r) {
    CAPTURE(r);
    const float* gl = got_logits.data() + static_cast<size_t>(r) * n_vocab;
    if (!ref[r]) {
      CHECK(std::equal(gl, gl + n_vocab, logits.begin() + static_cast<size_t>(r) * n_vocab));
      continue;
    }
    const int s = slots[r];
    std::vector<float> want(n_vocab);
    CUDA_OK(cudaMemcpy(want.data(), ref[r]->logits, n_vocab * 4, cudaMemcpyDeviceToHost));
    CHECK(std::memcmp(gl, want.data(), n_vocab * 4) == 0);
    const SamplerState ws = ref[r]->State();
    CHECK(SameState(got_states[s], ws));
    CHECK(got_states[s].truncations == 0u);
    sampled_rows += got_states[s].step > states[s].step;
    const std::vector<int> want_ring = ref[r]->Ring();
    const int n = static_cast<int>(want_ring.size());
    CHECK(std::equal(want_ring.begin(), want_ring.end(), got_rings.begin() + s * stride));
    for (int j = n; j < stride; ++j) REQUIRE(got_rings[s * stride + j] == -7);
  }
  CHECK(sampled_rows == 8);  // 2, 3, 4, 5, 6, 7, 8, 10 draw; 0, 1, 11 are greedy
  // Sequence 9 has no row: state and ring as uploaded.
  CHECK(SameState(got_states[9], states[9]));
  CHECK(std::equal(got_rings.begin() + 9 * stride, got_rings.begin() + 10 * stride,
                   rings.begin() + 9 * stride));
}

// A mixed batch's start for the graph test: 6 sequences, 6 rows (one padding).
void FillMixed(BatchDev& bd) {
  const std::vector<SamplingParams> p = {
      {0.0f, 0, 1.0f, 0.0f, 1.2f, 16, 0},      // greedy with the penalty
      {0.8f, 40, 0.95f, 0.05f, 1.1f, 32, 1},   // the default chain
      {1.0f, 0, 0.9f, 0.0f, 1.0f, 8, 2},       // top-p
      {0.7f, 0, 1.0f, 0.05f, 1.3f, 32, 3},     // min-p
      {0.0f, 0, 1.0f, 0.0f, 1.0f, 0, 0},       // no row
      {1.2f, 100, 1.0f, 0.0f, 1.0f, 0, 5},     // top-k
  };
  bd.params.Upload(p);
  bd.slots.Upload({3, 0, -1, 5, 1, 2});
  std::vector<float> logits;
  for (int r = 0; r < bd.batch; ++r) {
    const auto l = VocabLogits(bd.n_vocab, 200 + r);
    logits.insert(logits.end(), l.begin(), l.end());
  }
  bd.logits.Upload(logits);
  std::vector<int> rings(static_cast<size_t>(bd.n_seqs) * bd.ring_stride, -1);
  bd.rings.Upload(rings);
}

TEST_CASE("batched: a captured graph replayed N steps equals N eager calls") {
  const int n_vocab = 152064, steps = 12;
  BatchDev g(6, 6, n_vocab, 32), e(6, 6, n_vocab, 32);
  FillMixed(g);
  FillMixed(e);
  cudaStream_t st;
  CUDA_OK(cudaStreamCreate(&st));
  absl::StatusOr<GraphExec> graph = CaptureGraph(st, [&] { return SampleTokens(g.Batch(), st); });
  REQUIRE(graph.ok());
  cudaGraphExec_t exec = graph->get();
  for (int s = 0; s < steps; ++s) {
    CAPTURE(s);
    CUDA_OK(cudaGraphLaunch(exec, st));
    CUDA_OK(cudaStreamSynchronize(st));
    e.Sample();
    CHECK(g.tokens.Download() == e.tokens.Download());
  }
  CHECK(g.logits.Download() == e.logits.Download());
  CHECK(g.rings.Download() == e.rings.Download());
  const auto gs = g.states.Download(), es = e.states.Download();
  for (int i = 0; i < 6; ++i) CHECK(SameState(gs[i], es[i]));
  CHECK(gs[1].step == uint64_t(steps));
  CHECK(gs[0].step == 0u);  // greedy: no draws
  CHECK(gs[0].ring_count == 12);
  cudaStreamDestroy(st);
}

TEST_CASE("batched: params changed in device memory between replays, no re-capture") {
  const int n_vocab = 152064;
  const auto l = VocabLogits(n_vocab, 31);
  BatchDev bd(2, 2, n_vocab, 0);  // no rings at all
  const SamplingParams greedy{0.0f, 0, 1.0f, 0.0f, 1.0f, 0, 0};
  const SamplingParams sampled{1.5f, 0, 1.0f, 0.05f, 1.0f, 0, 42};
  bd.params.Upload({greedy, greedy});
  bd.slots.Upload({1, 0});
  std::vector<float> two(l);
  two.insert(two.end(), l.begin(), l.end());
  bd.logits.Upload(two);
  cudaStream_t st;
  CUDA_OK(cudaStreamCreate(&st));
  absl::StatusOr<GraphExec> graph = CaptureGraph(st, [&] { return SampleTokens(bd.Batch(), st); });
  REQUIRE(graph.ok());
  cudaGraphExec_t exec = graph->get();
  auto replay = [&] {
    CUDA_OK(cudaGraphLaunch(exec, st));
    CUDA_OK(cudaStreamSynchronize(st));
    return bd.tokens.Download();
  };
  const int argmax = CpuSample(l, greedy, 0);
  for (int i = 0; i < 3; ++i) CHECK(replay() == std::vector<int>{argmax, argmax});
  // Sequence 1 (row 0) now samples: the draws follow the float64 chain.
  CUDA_OK(cudaMemcpyAsync(bd.params.get() + 1, &sampled, sizeof(sampled), cudaMemcpyHostToDevice, st));
  std::vector<int> drawn;
  for (int i = 0; i < 40; ++i) {
    const std::vector<int> t = replay();
    CHECK(t[0] == CpuSample(l, sampled, i));
    CHECK(t[1] == argmax);
    drawn.push_back(t[0]);
  }
  std::sort(drawn.begin(), drawn.end());
  CHECK(std::unique(drawn.begin(), drawn.end()) - drawn.begin() >= 2);
  // And back to greedy: the argmax again, the counter stays.
  CUDA_OK(cudaMemcpyAsync(bd.params.get() + 1, &greedy, sizeof(greedy), cudaMemcpyHostToDevice, st));
  CHECK(replay() == std::vector<int>{argmax, argmax});
  const auto s = bd.states.Download();
  CHECK(s[1].step == 40u);
  CHECK(s[0].step == 0u);
  cudaStreamDestroy(st);
}

TEST_CASE("batched: host checks of pointers and sizes") {
  BatchDev bd(2, 2, 1000, 4);
  bd.slots.Upload({0, 1});
  SampleBatch b = bd.Batch();
  CHECK(SampleTokens(b, 0).ok());
  CUDA_OK(cudaDeviceSynchronize());
  auto bad = [&](auto edit) {
    SampleBatch c = bd.Batch();
    edit(c);
    const absl::Status s = SampleTokens(c, 0);
    CHECK(absl::IsInvalidArgument(s));
    CHECK(std::string(s.message()).find("SampleTokens") != std::string::npos);
  };
  bad([](SampleBatch& c) { c.params = nullptr; });
  bad([](SampleBatch& c) { c.slots = nullptr; });
  bad([](SampleBatch& c) { c.n_vocab = 0; });
  bad([](SampleBatch& c) { c.batch = 0; });
  bad([](SampleBatch& c) { c.n_seqs = 0; });
  bad([](SampleBatch& c) { c.ring_stride = -1; });
  bad([](SampleBatch& c) { c.rings = nullptr; });
  bad([](SampleBatch& c) { c.workspace = static_cast<char*>(c.workspace) + 16; });
  bad([&](SampleBatch& c) { c.allowed_on = bd.slots.get(); });  // a flag array with no masks
  CHECK(SamplingWorkspaceBytes(1) % 256 == 0);
  CHECK(SamplingWorkspaceBytes(64) == 64 * SamplingWorkspaceBytes(1));
}

// Allowed-token masks (structured output): a masked row draws what the
// float64 chain draws from its logits with every disallowed one at -inf (the
// CPU sampler's SampleAllowed drops them, the same draw), greedy and sampled,
// a mask of a few tokens and of one; a row whose flag is off, and the same
// rows with no masks at all, draw as before; a captured graph reads masks
// rewritten between replays.
TEST_CASE("batched: allowed-token masks") {
  const int n_vocab = 152064, n_seqs = 5, batch = 5, words = AllowedWords(n_vocab);
  const std::vector<SamplingParams> params = {
      {0.0f, 0, 1.0f, 0.0f, 1.0f, 0, 0},       // greedy, 5% of the vocab allowed
      {0.8f, 40, 0.95f, 0.05f, 1.0f, 0, 31},   // the default chain, 5%
      {1.0f, 0, 1.0f, 0.0f, 1.0f, 0, 32},      // no truncation, three tokens allowed
      {0.8f, 40, 0.95f, 0.05f, 1.0f, 0, 33},   // one token allowed
      {0.8f, 40, 0.95f, 0.05f, 1.0f, 0, 34},   // flag off: unmasked
  };
  std::mt19937 rng(5);
  std::vector<uint32_t> masks(static_cast<size_t>(n_seqs) * words, 0);
  auto allow = [&](int seq, int tok) { masks[static_cast<size_t>(seq) * words + tok / 32] |= 1u << (tok % 32); };
  auto remask = [&](int step) {
    std::fill(masks.begin(), masks.end(), 0u);
    std::uniform_int_distribution<int> any(0, n_vocab - 1);
    for (int seq : {0, 1, 4}) {
      for (int i = 0; i < n_vocab / 20; ++i) allow(seq, any(rng));
    }
    for (int i = 0; i < 3; ++i) allow(2, (7 + 1000 * i + 37 * step) % n_vocab);
    allow(3, n_vocab - 1 - step);
  };
  const std::vector<int> on = {1, 1, 1, 1, 0};
  testing::GuardedArray<uint32_t> d_masks(masks.size());
  testing::GuardedArray<int> d_on(on.size());
  d_on.Upload(on);
  BatchDev bd(n_seqs, batch, n_vocab, 0);
  bd.params.Upload(params);
  bd.FillVocabRows();
  std::vector<float> logits;
  for (int r = 0; r < batch; ++r) {
    const auto l = VocabLogits(n_vocab, 300 + r);
    logits.insert(logits.end(), l.begin(), l.end());
  }
  BatchDev plain(n_seqs, batch, n_vocab, 0);  // the same rows with no masks
  plain.params.Upload(params);
  plain.FillVocabRows();
  cudaStream_t st = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  SampleBatch b = bd.Batch();
  b.allowed = d_masks.get();
  b.allowed_on = d_on.get();
  absl::StatusOr<GraphExec> graph = CaptureGraph(st, [&] { return SampleTokens(b, st); });
  REQUIRE(graph.ok());
  cudaGraphExec_t exec = graph->get();
  for (int step = 0; step < 4; ++step) {
    CAPTURE(step);
    remask(step);
    d_masks.Upload(masks);
    bd.logits.Upload(logits);  // the masked rows' logits were rewritten to -inf
    CUDA_OK(cudaGraphLaunch(exec, st));
    CUDA_OK(cudaStreamSynchronize(st));
    plain.logits.Upload(logits);
    plain.Sample();
    const std::vector<int> got = bd.tokens.Download(), free = plain.tokens.Download();
    for (int r = 0; r < batch; ++r) {
      CAPTURE(r);
      std::vector<float> l(logits.begin() + static_cast<size_t>(r) * n_vocab,
                           logits.begin() + static_cast<size_t>(r + 1) * n_vocab);
      if (on[r] != 0) {
        for (int i = 0; i < n_vocab; ++i) {
          if (((masks[static_cast<size_t>(r) * words + i / 32] >> (i % 32)) & 1u) == 0) l[i] = -INFINITY;
        }
        CHECK(((masks[static_cast<size_t>(r) * words + got[r] / 32] >> (got[r] % 32)) & 1u) == 1u);
      } else {
        CHECK(got[r] == free[r]);
      }
      CHECK(got[r] == CpuSample(l, params[r], static_cast<uint64_t>(step)));
    }
  }
  CUDA_OK(cudaStreamDestroy(st));
}

// OpenAI's logit_bias (issue 32): rows of mixed params (greedy, the default
// chain, top-k and top-p, min-p alone; penalties over rings that hold biased
// tokens) and bias lists (bans of the best tokens, -100, +bias, 1024
// entries, none), in a captured graph whose lists are rewritten between
// replays, draw what the CPU sampler (generate::Sampler, the same biases
// and history) draws, step after step; the logits the chain ran on are the
// CPU's Penalized ones bit for bit (the bias added first, then the
// penalties); a banned token never comes.
TEST_CASE("batched: logit biases draw as the CPU sampler; a ban is never drawn") {
  const int n_vocab = 152064, n_seqs = 5, batch = 5, stride = 64, steps = 4;
  const std::vector<SamplingParams> params = {
      {0.0f, 0, 1.0f, 0.0f, 1.0f, 0, 0},                    // greedy
      {0.8f, 40, 0.95f, 0.05f, 1.1f, stride, 31, 0.5f, 0},  // the default chain, penalties
      // top-k 50 and top-p (top-p alone over this row's flat bulk, its
      // best thirty pushed down, would hold more than kSamplingMaxCandidates:
      // the device truncates there, the CPU does not)
      {1.0f, 50, 0.9f, 0.0f, 1.0f, 0, 32},
      {1.3f, 0, 1.0f, 0.1f, 1.2f, stride, 33},              // min-p alone, repetition penalty
      {0.7f, 40, 0.95f, 0.05f, 1.0f, 0, 34},                // no biases
  };
  const std::vector<int> slots = {2, 0, 4, 1, 3};  // row r samples sequence slots[r]
  auto row_logits = [&](int r, int step) { return VocabLogits(n_vocab, 300 + r + 10 * step); };
  // Sequence s's list at `step`, given the logits its row sees.
  std::mt19937 rng(11);
  auto make_bias = [&](int seq, const std::vector<float>& l) {
    std::vector<LogitBias> b;
    const std::vector<int> top = TopIds(l, 60);
    std::uniform_int_distribution<int> any(0, n_vocab - 1);
    switch (seq) {
      case 0:  // greedy: the argmax banned, the third pushed up
        b = {{top[0], -INFINITY}, {top[2], 0.75f}};
        break;
      case 1:  // the ten best banned, a few others raised
        for (int i = 0; i < 10; ++i) b.push_back({top[i], -INFINITY});
        for (int i = 0; i < 5; ++i) b.push_back({top[20 + i], 3.0f});
        break;
      case 2:  // -100 on the best thirty, false on the next five
        for (int i = 0; i < 30; ++i) b.push_back({top[i], -100.0f});
        for (int i = 30; i < 35; ++i) b.push_back({top[i], -INFINITY});
        break;
      case 3: {  // a full list: random distinct tokens, small biases, some bans
        std::vector<int> ids;
        while (ids.size() < static_cast<size_t>(kMaxLogitBias)) {
          const int id = any(rng);
          if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
        }
        std::uniform_real_distribution<float> small(-3.0f, 3.0f);
        for (int id : ids) b.push_back({id, small(rng)});
        for (int i = 0; i < 3; ++i) {  // the best three banned (replacing entries of theirs)
          auto it = std::find_if(b.begin(), b.end(), [&](const LogitBias& e) { return e.token == top[i]; });
          if (it != b.end()) b.erase(it);
          b[static_cast<size_t>(i)] = {top[i], -INFINITY};
        }
        break;
      }
      default:
        break;
    }
    REQUIRE(CheckLogitBias(b, n_vocab).ok());
    return b;
  };
  // The rings start from a history that holds the biased tokens too.
  std::vector<std::vector<int32_t>> history(n_seqs);
  BatchDev bd(n_seqs, batch, n_vocab, stride);
  bd.params.Upload(params);
  bd.slots.Upload(slots);
  std::vector<int> rings(static_cast<size_t>(n_seqs) * stride, -1);
  std::vector<SamplerState> states(n_seqs, SamplerState{});
  std::vector<std::vector<float>> first(batch);
  for (int r = 0; r < batch; ++r) first[r] = row_logits(r, 0);
  for (int r = 0; r < batch; ++r) {
    const int seq = slots[r];
    const std::vector<int> top = TopIds(first[r], 40);
    history[seq] = {top[0], top[2], top[5], top[21], top[5], top[33], 17};
    const RecentRing ring = MakeRecentRing(history[seq], std::min(params[seq].repeat_last_n, stride));
    std::copy(ring.tokens.begin(), ring.tokens.end(), rings.begin() + static_cast<size_t>(seq) * stride);
    states[seq].ring_head = ring.head;
    states[seq].ring_count = ring.count;
  }
  bd.rings.Upload(rings);
  bd.states.Upload(states);
  std::vector<std::unique_ptr<generate::Sampler>> cpu(n_seqs);
  testing::GuardedArray<LogitBias> d_bias(static_cast<size_t>(n_seqs) * kMaxLogitBias);
  testing::GuardedArray<int> d_n_bias(n_seqs);
  cudaStream_t st = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  SampleBatch b = bd.Batch();
  b.bias = d_bias.get();
  b.n_bias = d_n_bias.get();
  absl::StatusOr<GraphExec> graph = CaptureGraph(st, [&] { return SampleTokens(b, st); });
  REQUIRE(graph.ok());
  cudaGraphExec_t exec = graph->get();
  for (int step = 0; step < steps; ++step) {
    CAPTURE(step);
    std::vector<float> all;
    std::vector<std::vector<float>> rows(batch);
    std::vector<std::vector<LogitBias>> lists(n_seqs);
    std::vector<LogitBias> packed(static_cast<size_t>(n_seqs) * kMaxLogitBias);
    std::vector<int> counts(n_seqs, 0);
    for (int r = 0; r < batch; ++r) {
      rows[r] = row_logits(r, step);
      all.insert(all.end(), rows[r].begin(), rows[r].end());
      const int seq = slots[r];
      lists[seq] = make_bias(seq, rows[r]);
      std::copy(lists[seq].begin(), lists[seq].end(), packed.begin() + static_cast<size_t>(seq) * kMaxLogitBias);
      counts[seq] = static_cast<int>(lists[seq].size());
      // The CPU sampler takes its list at construction: a new one each
      // step with this step's list, the window of the last (the history at
      // step 0) and its draw counter moved on by the `step` draws before
      // (a sampled draw takes one uniform; a greedy one none).
      SamplingParams p = params[seq];
      p.repeat_last_n = std::min(p.repeat_last_n, stride);
      auto next = std::make_unique<generate::Sampler>(p, lists[seq]);
      for (int32_t t : step == 0 ? history[seq] : cpu[seq]->recent()) next->Accept(t);
      for (int k = 0; k < step && p.temperature > 0; ++k) (void)next->Sample(rows[r]);
      cpu[seq] = std::move(next);
    }
    bd.logits.Upload(all);
    d_bias.Upload(packed);
    d_n_bias.Upload(counts);
    CUDA_OK(cudaGraphLaunch(exec, st));
    CUDA_OK(cudaStreamSynchronize(st));
    const std::vector<int> got = bd.tokens.Download();
    const std::vector<float> ran = bd.logits.Download();
    for (int r = 0; r < batch; ++r) {
      CAPTURE(r);
      const int seq = slots[r];
      const absl::Span<const float> want_logits = cpu[seq]->Penalized(rows[r]);
      const float* dev = ran.data() + static_cast<size_t>(r) * n_vocab;
      int differ = 0;
      for (int i = 0; i < n_vocab; ++i) differ += !(dev[i] == want_logits[i] || (std::isnan(dev[i]) && std::isnan(want_logits[i])));
      CHECK(differ == 0);
      const int32_t want = cpu[seq]->Sample(rows[r]);
      cpu[seq]->Accept(want);
      CHECK(got[r] == want);
      for (const LogitBias& e : lists[seq]) {
        if (e.bias == -INFINITY) CHECK(got[r] != e.token);
      }
      if (seq == 0) CHECK(got[r] != TopIds(rows[r], 1)[0]);
    }
  }
  CUDA_OK(cudaStreamDestroy(st));
}

// "T 0.8 top_k 40 top_p 0.95 min_p 0.05" for a failure's message.
std::string ChainName(const SamplingParams& p) {
  std::ostringstream o;
  o << "T " << p.temperature << " top_k " << p.top_k << " top_p " << p.top_p << " min_p " << p.min_p
    << " seed " << p.seed;
  return o.str();
}

// The `k` best tokens of `l` as "id:logit ..." (a failure's message).
std::string TopOf(const std::vector<float>& l, int k) {
  std::ostringstream o;
  for (int id : TopIds(l, k)) o << id << ":" << l[id] << " ";
  return o.str();
}

// Issue 30's cutoff (depth_bins.h) in every regime at once: 64 rows, a chain
// a row (top-k small and large, top-p alone, min-p alone, top-p with min-p,
// top-k 1800 near the candidate cap, greedy), each row against the float64
// chain draw after draw, no truncation. A mismatch names the row, its chain,
// both tokens and the row's best logits.
TEST_CASE("batched: 64 rows, every cutoff regime, equal the float64 chain step after step") {
  const int n_vocab = 152064, batch = 64, steps = 4;
  const std::vector<SamplingParams> chains = {
      {0.8f, 40, 0.95f, 0.05f, 1.0f, 0, 0},  // the default chain
      {1.0f, 0, 0.9f, 0.0f, 1.0f, 0, 0},     // top-p alone: the mass decides
      {1.2f, 200, 1.0f, 0.0f, 1.0f, 0, 0},   // top-k alone
      {0.7f, 0, 1.0f, 0.02f, 1.0f, 0, 0},    // min-p alone
      {1.0f, 1000, 0.99f, 0.0f, 1.0f, 0, 0}, // top-k 1000 then top-p
      {0.8f, 0, 0.95f, 0.05f, 1.0f, 0, 0},   // top-p and min-p, top-k off
      {1.0f, 1800, 1.0f, 0.0f, 1.0f, 0, 0},  // top-k near the cap (2048)
      {1.0f, 0, 0.5f, 0.0f, 1.0f, 0, 0},     // a narrow top-p
      {1.5f, 1, 1.0f, 0.0f, 1.0f, 0, 0},     // top-k 1
      {1.3f, 0, 1.0f, 0.1f, 1.0f, 0, 0},     // min-p 0.1
      {0.0f, 40, 0.95f, 0.05f, 1.0f, 0, 0},  // greedy
  };
  std::vector<SamplingParams> params(batch);
  for (int r = 0; r < batch; ++r) {
    params[r] = chains[r % chains.size()];
    params[r].seed = 1000 + r;
  }
  BatchDev bd(batch, batch, n_vocab, 0);
  bd.params.Upload(params);
  bd.FillVocabRows();  // row r: VocabLogits(n_vocab, 300 + r)
  std::vector<std::vector<float>> rows(batch);
  for (int r = 0; r < batch; ++r) rows[r] = VocabLogits(n_vocab, 300 + r);
  int mismatches = 0;
  for (int step = 0; step < steps; ++step) {
    bd.Sample();
    const std::vector<int> got = bd.tokens.Download();
    for (int r = 0; r < batch; ++r) {
      const int want = CpuSample(rows[r], params[r], static_cast<uint64_t>(step));
      if (got[r] == want) continue;
      ++mismatches;
      const bool in_vocab = got[r] >= 0 && got[r] < n_vocab;
      MESSAGE("step " << step << " row " << r << " (" << ChainName(params[r]) << "): device drew " << got[r]
                      << " (logit " << (in_vocab ? rows[r][got[r]] : NAN) << "), the float64 chain "
                      << want << " (logit " << rows[r][want] << "); best: " << TopOf(rows[r], 8));
    }
  }
  CHECK(mismatches == 0);
  const std::vector<SamplerState> states = bd.states.Download();
  for (int r = 0; r < batch; ++r) {
    CAPTURE(r);
    INFO(ChainName(params[r]));
    CHECK(states[r].truncations == 0u);
    CHECK(states[r].step == (params[r].temperature > 0.0f ? uint64_t(steps) : 0u));
  }
}

TEST_CASE("batched sampling time on 152064 logits, graph replay") {
  const int n_vocab = 152064, reps = 200;
  SamplingParams greedy{0.0f, 0, 1.0f, 0.0f, 1.0f, 0, 0};
  SamplingParams sampled;  // defaults: 0.8, 40, 0.95, 0.05
  sampled.repeat_penalty = 1.1f;
  sampled.repeat_last_n = 64;
  cudaStream_t st;
  CUDA_OK(cudaStreamCreate(&st));
  // Replays of one graph: microseconds per replay.
  auto time_graph = [&](auto&& capture) {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CUDA_OK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    capture();
    CUDA_OK(cudaStreamEndCapture(st, &graph));
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    for (int i = 0; i < 20; ++i) CUDA_OK(cudaGraphLaunch(exec, st));
    CUDA_OK(cudaStreamSynchronize(st));
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i) CUDA_OK(cudaGraphLaunch(exec, st));
    CUDA_OK(cudaStreamSynchronize(st));
    const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    cudaGraphExecDestroy(exec), cudaGraphDestroy(graph);
    return us / reps;
  };
  {
    cudaDeviceProp prop;
    CUDA_OK(cudaGetDeviceProperties(&prop, 0));
    MESSAGE("device: " << prop.name << ", " << prop.multiProcessorCount << " SMs");
    // The floor of a 64-row greedy batch: one max pass over 64 rows' bytes
    // (SampleToken greedy on one row of 64 * 152064 logits: Prepare, Max, Final).
    Dev big(std::vector<float>(static_cast<size_t>(64) * n_vocab, 0.5f), 0);
    const double us = time_graph([&] {
      STATUS_OK(SampleToken(greedy, big.logits, 64 * n_vocab, big.ring, big.state, big.ws,
                            big.token, st));
    });
    MESSAGE("one max pass over 64 x 152064 logits (SampleToken greedy, one row), graph replay: "
            << us << " us");
  }
  {
    Dev d(VocabLogits(n_vocab, 41), 64);
    for (const auto& [name, p] : {std::pair{std::string("greedy"), greedy},
                                  std::pair{std::string("sampled"), sampled}}) {
      SamplingParams q = p;
      q.repeat_last_n = 64;
      const double us = time_graph([&] {
        STATUS_OK(SampleToken(q, d.logits, n_vocab, d.ring, d.state, d.ws, d.token, st));
      });
      MESSAGE("SampleToken " << name << ", graph replay: " << us << " us");
    }
  }
  // Modes: greedy, sampled, mixed (every other row greedy: rows 0, 2, ...),
  // and two single-filter chains whose cutoff takes other paths: top-p alone
  // (the histogram's masses and Z_all) and min-p alone (the histogram
  // bounded at min-p's bin). No penalty on those two: 220 replays of a
  // penalty rewrite the same logits each time. Each mode starts from zeroed
  // states. The chains of a served request (greedy, sampled: top-k 40)
  // never truncate here; top-p 0.95 alone and min-p 0.05 alone on these
  // rows keep more than the 2048 candidates the sort holds (measured on an
  // H100, 2026-12-07: every draw), so they time the truncated path, which
  // sampling.h documents, and the table says how many draws it took.
  SamplingParams top_p_alone{1.0f, 0, 0.95f, 0.0f, 1.0f, 64, 0};
  SamplingParams min_p_alone{1.0f, 0, 1.0f, 0.05f, 1.0f, 64, 0};
  const std::vector<std::string> modes = {"greedy", "sampled", "mixed", "top-p alone", "min-p alone"};
  std::ostringstream table;
  table << "| call (us a graph replay) |";
  for (const std::string& m : modes) table << " " << m << " |";
  table << "\n| --- |";
  for (size_t i = 0; i < modes.size(); ++i) table << " ---: |";
  table << "\n";
  for (int batch : {1, 16, 64}) {
    BatchDev bd(batch, batch, n_vocab, 64);
    bd.FillVocabRows();
    table << "| SampleTokens batch " << batch << " |";
    for (const std::string& mode : modes) {
      const SamplingParams& base = mode == "greedy"        ? greedy
                                   : mode == "top-p alone" ? top_p_alone
                                   : mode == "min-p alone" ? min_p_alone
                                                           : sampled;
      std::vector<SamplingParams> p(batch, base);
      if (mode == "mixed") {
        for (int r = 0; r < batch; r += 2) p[r] = greedy;
      }
      for (int r = 0; r < batch; ++r) p[r].seed = r;
      bd.params.Upload(p);
      bd.states.Upload(std::vector<SamplerState>(static_cast<size_t>(batch), SamplerState{}));
      const double us = time_graph([&] { STATUS_OK(SampleTokens(bd.Batch(), st)); });
      const double gbs = static_cast<double>(batch) * n_vocab * 4 / (us * 1e3);
      MESSAGE("SampleTokens batch " << batch << " " << mode << ", graph replay: " << us
                                    << " us (" << us / batch << " us per row; one logits read = "
                                    << gbs << " GB/s)");
      const auto s = bd.states.Download();
      uint64_t truncated = 0;
      for (int r = 0; r < batch; ++r) truncated += s[r].truncations;
      table << " " << std::fixed << std::setprecision(1) << us;
      if (truncated > 0) table << " (" << truncated << " of " << batch * (20 + reps) << " draws truncated)";
      table << " |";
      if (mode == "greedy" || mode == "sampled" || mode == "mixed") {
        for (int r = 0; r < batch; ++r) {
          CAPTURE(r);
          INFO(mode);
          CHECK(s[r].truncations == 0u);
        }
      }
    }
    table << "\n";
  }
  MESSAGE("graph replay, " << reps << " replays after 20 warm-up, 152064 logits a row:\n" << table.str());
  cudaStreamDestroy(st);
}

// One eager call each, for a per-kernel breakdown under ncu:
//   ncu --clock-control none --metrics gpu__time_duration.sum sampling_gpu_test -tc='batched: kernel*'
// (launch order: SampleToken sampled, then batch 64 greedy, sampled, mixed,
// top-p alone; each call Prepare, Max, [Hist, Cutoff, Collect,] Final).
TEST_CASE("batched: kernel breakdown calls (for ncu)") {
  const int n_vocab = 152064, batch = 64;
  SamplingParams greedy{0.0f, 0, 1.0f, 0.0f, 1.0f, 0, 0};
  SamplingParams sampled;
  sampled.repeat_penalty = 1.1f;
  sampled.repeat_last_n = 64;
  SamplingParams top_p_alone{1.0f, 0, 0.95f, 0.0f, 1.0f, 64, 0};
  Dev d(VocabLogits(n_vocab, 41), 64);
  d.Sample(sampled);
  BatchDev bd(batch, batch, n_vocab, 64);
  bd.FillVocabRows();
  for (int mode = 0; mode < 4; ++mode) {
    std::vector<SamplingParams> p(batch, mode == 0 ? greedy : mode == 3 ? top_p_alone : sampled);
    for (int r = 0; r < batch; ++r) {
      if (mode == 2 && r % 2 == 0) p[r] = greedy;
      p[r].seed = r;
    }
    bd.params.Upload(p);
    bd.Sample();
  }
  CHECK(bd.states.Download()[1].step == 3u);
}

}  // namespace
}  // namespace dpl::kernels
