// Decode attention vs a float64 CPU reference over the same f16 K/V values
// (tags gpu, manual).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "formats/dequant.h"
#include "kernels/attention/attention.h"
#include "kernels/device_tuning.h"
#include "kernels/gpu_test.h"
#include "kernels/matvec/matvec.h"

namespace dpl::kernels {
namespace {

using testing::NormErr;

// The device's tuning: SM count and the measured attention policy.
DecodeTuning Tuning() {
  const absl::StatusOr<DecodeTuning> t = DecodeTuningForDevice();
  REQUIRE_MESSAGE(t.ok(), t.status().ToString());
  return *t;
}

constexpr float kSentinel = -12345.5f;

struct Setup {
  int n_head, n_head_kv, hd, n_ctx;
  std::vector<uint16_t> k, v;  // (n_head_kv, n_ctx, hd)
  uint16_t* dk = nullptr;
  uint16_t* dv = nullptr;
};

// Rows [lo, len) random; the others hold huge values: reading them would show.
void MakeCache(Setup& s, int len, int lo = 0) {
  std::mt19937 rng(len * 31 + s.hd);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const size_t n = size_t(s.n_head_kv) * s.n_ctx * s.hd;
  s.k.resize(n);
  s.v.resize(n);
  for (int h = 0; h < s.n_head_kv; ++h) {
    for (int p = 0; p < s.n_ctx; ++p) {
      for (int e = 0; e < s.hd; ++e) {
        const size_t i = (size_t(h) * s.n_ctx + p) * s.hd + e;
        const bool live = p < len && p >= lo;
        s.k[i] = formats::F32ToF16(live ? u(rng) : 60000.0f);
        s.v[i] = formats::F32ToF16(live ? u(rng) : 60000.0f);
      }
    }
  }
  CUDA_OK(cudaMalloc(&s.dk, n * 2));
  CUDA_OK(cudaMalloc(&s.dv, n * 2));
  CUDA_OK(cudaMemcpy(s.dk, s.k.data(), n * 2, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(s.dv, s.v.data(), n * 2, cudaMemcpyHostToDevice));
}

// softmax(q K[lo..len)^T / sqrt(hd)) V[lo..len) in float64.
std::vector<double> Reference(const Setup& s, const std::vector<float>& q, int len, int lo = 0) {
  const int g = s.n_head / s.n_head_kv;
  std::vector<double> out(size_t(s.n_head) * s.hd, 0.0);
  std::vector<double> sc(len);
  for (int h = 0; h < s.n_head; ++h) {
    const int kvh = h / g;
    double mx = -1e300;
    for (int p = lo; p < len; ++p) {
      double d = 0;
      const uint16_t* kr = &s.k[(size_t(kvh) * s.n_ctx + p) * s.hd];
      for (int e = 0; e < s.hd; ++e) d += double(q[h * s.hd + e]) * formats::F16ToF32(kr[e]);
      sc[p] = d / std::sqrt(double(s.hd));
      mx = std::max(mx, sc[p]);
    }
    double l = 0;
    for (int p = lo; p < len; ++p) l += (sc[p] = std::exp(sc[p] - mx));
    for (int p = lo; p < len; ++p) {
      const uint16_t* vr = &s.v[(size_t(kvh) * s.n_ctx + p) * s.hd];
      for (int e = 0; e < s.hd; ++e) out[h * s.hd + e] += sc[p] / l * formats::F16ToF32(vr[e]);
    }
  }
  return out;
}

// window > 0: a sliding window, the query at position len - 1 sees keys
// max(0, len - window) .. len - 1 only.
std::vector<uint8_t> DownloadBytes(const void* d, size_t n) {
  std::vector<uint8_t> h(n);
  CUDA_OK(cudaMemcpy(h.data(), d, n, cudaMemcpyDeviceToHost));
  return h;
}

// The same call with `quant`: out unchanged bit for bit (`want`), and the
// int8 blocks equal to QuantizeActivations of out.
void CheckQuantizedOutput(const DecodeAttentionPlan& plan, const float* dq, const Setup& s,
                          const int* dpos, float* dws, const std::vector<float>& want) {
  const int64_t n_out = static_cast<int64_t>(want.size());
  auto bytes = MatVecScratchBytes(n_out, 1);
  REQUIRE(bytes.ok());
  void *ma, *mb;
  float* dout;
  CUDA_OK(cudaMalloc(&ma, *bytes));
  CUDA_OK(cudaMalloc(&mb, *bytes));
  CUDA_OK(cudaMalloc(&dout, n_out * 4));
  MatVecScratch fused = MatVecScratchIn(ma, n_out, 1), plain = MatVecScratchIn(mb, n_out, 1);
  auto target = QuantizeInto(n_out, 1, &fused);
  REQUIRE(target.ok());
  STATUS_OK(DecodeAttention(plan, dq, s.dk, s.dv, dpos, dws, dout, 0, &*target));
  STATUS_OK(QuantizeActivations(dout, n_out, 1, &plain, 0));
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<float> got(n_out);
  CUDA_OK(cudaMemcpy(got.data(), dout, n_out * 4, cudaMemcpyDeviceToHost));
  CHECK(std::memcmp(got.data(), want.data(), n_out * 4) == 0);
  const size_t nb = n_out / 32;
  CHECK(DownloadBytes(fused.q, n_out) == DownloadBytes(plain.q, n_out));
  CHECK(DownloadBytes(fused.d, nb * 4) == DownloadBytes(plain.d, nb * 4));
  CHECK(DownloadBytes(fused.s, nb * 4) == DownloadBytes(plain.s, nb * 4));
  cudaFree(ma), cudaFree(mb), cudaFree(dout);
}

void RunCase(int n_head, int n_head_kv, int hd, int n_ctx, int len, float q_scale, int window = 0,
             int combine_parts = 0) {  // 0: the device tuning's
  CAPTURE(n_head);
  CAPTURE(n_head_kv);
  CAPTURE(hd);
  CAPTURE(len);
  CAPTURE(window);
  CAPTURE(combine_parts);
  DecodeTuning t = Tuning();
  if (combine_parts > 0) t.attn_combine_parts = combine_parts;
  auto plan = PlanDecodeAttention(n_head, n_head_kv, hd, n_ctx, window, t);
  REQUIRE(plan.ok());
  const int lo = window > 0 && len > window ? len - window : 0;
  Setup s{n_head, n_head_kv, hd, n_ctx, {}, {}};
  MakeCache(s, len, lo);
  std::mt19937 rng(len + 7);
  std::normal_distribution<float> nd(0.0f, q_scale);
  std::vector<float> q(size_t(n_head) * hd);
  for (auto& x : q) x = nd(rng);
  float *dq, *dws, *dout;
  int* dpos;
  const size_t n_out = q.size();
  CUDA_OK(cudaMalloc(&dq, n_out * 4));
  CUDA_OK(cudaMalloc(&dout, (n_out + 16) * 4));
  CUDA_OK(cudaMalloc(&dws, plan->workspace_floats * 4));
  CUDA_OK(cudaMalloc(&dpos, 4));
  CUDA_OK(cudaMemcpy(dq, q.data(), n_out * 4, cudaMemcpyHostToDevice));
  std::vector<float> init(n_out + 16, kSentinel);
  CUDA_OK(cudaMemcpy(dout, init.data(), init.size() * 4, cudaMemcpyHostToDevice));
  const int pos = len - 1;
  CUDA_OK(cudaMemcpy(dpos, &pos, 4, cudaMemcpyHostToDevice));
  STATUS_OK(DecodeAttention(*plan, dq, s.dk, s.dv, dpos, dws, dout, 0));
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<float> got(n_out + 16);
  CUDA_OK(cudaMemcpy(got.data(), dout, got.size() * 4, cudaMemcpyDeviceToHost));
  for (int i = 0; i < 16; ++i) REQUIRE(got[n_out + i] == kSentinel);
  got.resize(n_out);
  const double err = NormErr(got, Reference(s, q, len, lo));
  MESSAGE("attention heads " << n_head << "/" << n_head_kv << " hd " << hd << " len " << len
                             << " window " << window << " q_scale " << q_scale << " (max_splits "
                             << plan->max_splits << ", combine parts " << plan->combine_parts
                             << "): normalized error " << err);
  CHECK(err < 2e-4);
  CheckQuantizedOutput(*plan, dq, s, dpos, dws, got);
  cudaFree(dq), cudaFree(dout), cudaFree(dws), cudaFree(dpos), cudaFree(s.dk), cudaFree(s.dv);
}

TEST_CASE("decode attention, GQA 7:1 (Qwen2.5-7B)") {
  for (int len : {1, 7, 33, 129, 3254, 32768}) RunCase(28, 4, 128, 32768, len, 1.0f);
  RunCase(28, 4, 128, 32768, 3254, 6.0f);  // peaky softmax
}

TEST_CASE("decode attention, GQA 5:1 (Qwen2.5-14B)") {
  for (int len : {1, 7, 3254, 32768}) RunCase(40, 8, 128, 32768, len, 1.0f);
}

TEST_CASE("decode attention with a sliding window (Mistral: 4096)") {
  for (int len : {1, 100, 4096, 4097, 5000, 9000}) RunCase(32, 8, 128, 16384, len, 1.0f, 4096);
  RunCase(14, 2, 64, 1024, 1000, 2.0f, 1);  // each query sees itself only
  RunCase(28, 4, 128, 4096, 3254, 1.0f, 33);
}

TEST_CASE("decode attention, both combine widths") {
  for (int parts : {4, 8}) {
    for (int len : {1, 40, 200, 3254, 32768}) RunCase(28, 4, 128, 32768, len, 2.0f, 0, parts);
    RunCase(14, 2, 64, 4096, 1000, 2.0f, 0, parts);
  }
}

TEST_CASE("decode attention, head_dim 64 and other groups") {
  RunCase(14, 2, 64, 4096, 1000, 2.0f);  // Qwen2.5-0.5B shape
  RunCase(32, 8, 128, 8192, 5000, 2.0f);  // group 4
  RunCase(8, 8, 64, 2048, 2048, 2.0f);    // no grouping, full cache
}

TEST_CASE("decode attention in a CUDA graph follows d_pos across replays") {
  const int n_ctx = 4096;
  auto plan = PlanDecodeAttention(28, 4, 128, n_ctx, /*window=*/0, Tuning());
  REQUIRE(plan.ok());
  Setup s{28, 4, 128, n_ctx, {}, {}};
  MakeCache(s, n_ctx);
  std::vector<float> q(28 * 128);
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  for (auto& x : q) x = nd(rng);
  float *dq, *dws, *dout;
  int* dpos;
  CUDA_OK(cudaMalloc(&dq, q.size() * 4));
  CUDA_OK(cudaMalloc(&dout, q.size() * 4));
  CUDA_OK(cudaMalloc(&dws, plan->workspace_floats * 4));
  CUDA_OK(cudaMalloc(&dpos, 4));
  CUDA_OK(cudaMemcpy(dq, q.data(), q.size() * 4, cudaMemcpyHostToDevice));
  cudaStream_t st;
  CUDA_OK(cudaStreamCreate(&st));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA_OK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
  STATUS_OK(DecodeAttention(*plan, dq, s.dk, s.dv, dpos, dws, dout, st));
  CUDA_OK(cudaStreamEndCapture(st, &graph));
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  for (int len : {5, 300, 4096, 17}) {
    const int pos = len - 1;
    CUDA_OK(cudaMemcpy(dpos, &pos, 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaGraphLaunch(exec, st));
    CUDA_OK(cudaStreamSynchronize(st));
    std::vector<float> got(q.size());
    CUDA_OK(cudaMemcpy(got.data(), dout, got.size() * 4, cudaMemcpyDeviceToHost));
    const double err = NormErr(got, Reference(s, q, len));
    MESSAGE("graph replay len " << len << ": normalized error " << err);
    CHECK(err < 2e-4);
  }
  cudaGraphExecDestroy(exec), cudaGraphDestroy(graph), cudaStreamDestroy(st);
  cudaFree(dq), cudaFree(dout), cudaFree(dws), cudaFree(dpos), cudaFree(s.dk), cudaFree(s.dv);
}

// A batched call: rows of different sequences (regions of one cache) and
// lengths, and a padding row (position -1). Each row against the float64
// reference of its region, and bit for bit the batch-1 call on that region
// with the same number of splits (a row depends on its own inputs only).
TEST_CASE("batched decode attention: one row per sequence region") {
  const int n_head = 28, n_kv = 4, hd = 128, n_ctx = 4096, n_seq = 3;
  const int lens[n_seq] = {1, 700, 3254};  // region r holds lens[r] live rows
  std::vector<Setup> regions;
  for (int r = 0; r < n_seq; ++r) {
    regions.push_back(Setup{n_head, n_kv, hd, n_ctx, {}, {}});
    MakeCache(regions.back(), lens[r]);
  }
  // The cache as the runtime lays it: (n_seq, n_kv, n_ctx, hd).
  const size_t region = size_t(n_kv) * n_ctx * hd;
  uint16_t *dk, *dv;
  CUDA_OK(cudaMalloc(&dk, n_seq * region * 2));
  CUDA_OK(cudaMalloc(&dv, n_seq * region * 2));
  for (int r = 0; r < n_seq; ++r) {
    CUDA_OK(cudaMemcpy(dk + r * region, regions[r].dk, region * 2, cudaMemcpyDeviceToDevice));
    CUDA_OK(cudaMemcpy(dv + r * region, regions[r].dv, region * 2, cudaMemcpyDeviceToDevice));
  }
  // Rows: region 2 at its end, padding, region 0, region 1.
  const std::vector<int> seqs = {2, -1, 0, 1};
  const int batch = static_cast<int>(seqs.size());
  std::vector<int> pos(batch);
  for (int b = 0; b < batch; ++b) pos[b] = seqs[b] < 0 ? -1 : lens[seqs[b]] - 1;
  auto plan = PlanDecodeAttention(n_head, n_kv, hd, n_ctx, /*window=*/0, Tuning(), batch);
  REQUIRE(plan.ok());
  auto single = PlanDecodeAttention(n_head, n_kv, hd, n_ctx, 0, Tuning());
  REQUIRE(single.ok());
  CHECK(plan->max_splits <= single->max_splits);  // the rows share one wave
  CHECK(plan->workspace_floats == uint64_t(batch) * n_head * plan->max_splits * (hd + 2));
  DecodeTuning same = Tuning();
  same.attn_splits = plan->max_splits;
  auto one = PlanDecodeAttention(n_head, n_kv, hd, n_ctx, 0, same);
  REQUIRE(one.ok());
  REQUIRE(one->max_splits == plan->max_splits);

  const size_t row = size_t(n_head) * hd;
  std::vector<float> q(batch * row);
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  for (auto& x : q) x = nd(rng);
  float *dq, *dws, *dout, *dout1;
  int *dpos, *dseq;
  CUDA_OK(cudaMalloc(&dq, q.size() * 4));
  CUDA_OK(cudaMalloc(&dout, q.size() * 4));
  CUDA_OK(cudaMalloc(&dout1, row * 4));
  CUDA_OK(cudaMalloc(&dws, plan->workspace_floats * 4));
  CUDA_OK(cudaMalloc(&dpos, batch * 4));
  CUDA_OK(cudaMalloc(&dseq, batch * 4));
  CUDA_OK(cudaMemcpy(dq, q.data(), q.size() * 4, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dpos, pos.data(), batch * 4, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dseq, seqs.data(), batch * 4, cudaMemcpyHostToDevice));
  STATUS_OK(DecodeAttention(*plan, dq, dk, dv, dpos, dws, dout, 0, nullptr, dseq));
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<float> got(q.size());
  CUDA_OK(cudaMemcpy(got.data(), dout, got.size() * 4, cudaMemcpyDeviceToHost));
  for (int b = 0; b < batch; ++b) {
    CAPTURE(b);
    const std::vector<float> out_b(got.begin() + b * row, got.begin() + (b + 1) * row);
    if (seqs[b] < 0) {  // padding: finite, nothing else asked of it
      for (float x : out_b) REQUIRE(std::isfinite(x));
      continue;
    }
    const int r = seqs[b];
    const std::vector<float> q_b(q.begin() + b * row, q.begin() + (b + 1) * row);
    const double err = NormErr(out_b, Reference(regions[r], q_b, lens[r]));
    MESSAGE("batched row " << b << " (region " << r << ", len " << lens[r] << ", max_splits "
                           << plan->max_splits << "): normalized error " << err);
    CHECK(err < 2e-4);
    // The batch-1 call on region r alone (its pointers offset, d_seq null).
    STATUS_OK(DecodeAttention(*one, dq + b * row, dk + r * region, dv + r * region, dpos + b, dws,
                              dout1, 0));
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<float> alone(row);
    CUDA_OK(cudaMemcpy(alone.data(), dout1, row * 4, cudaMemcpyDeviceToHost));
    CHECK(std::memcmp(alone.data(), out_b.data(), row * 4) == 0);
  }
  for (Setup& s : regions) cudaFree(s.dk), cudaFree(s.dv);
  cudaFree(dk), cudaFree(dv), cudaFree(dq), cudaFree(dout), cudaFree(dout1), cudaFree(dws);
  cudaFree(dpos), cudaFree(dseq);
}

TEST_CASE("PlanDecodeAttention rejects unsupported shapes") {
  const DecodeTuning t = Tuning();
  const int sms = t.num_sms;
  CHECK(!PlanDecodeAttention(28, 4, 96, 4096, /*window=*/0, t).ok());
  CHECK(!PlanDecodeAttention(28, 3, 128, 4096, /*window=*/0, t).ok());
  CHECK(!PlanDecodeAttention(64, 4, 128, 4096, /*window=*/0, t).ok());  // group 16
  auto p = PlanDecodeAttention(28, 4, 128, 32768, /*window=*/0, t);
  REQUIRE(p.ok());
  // One wave of split blocks: at least one per SM, never past n_ctx / min_chunk.
  CHECK(p->n_head_kv * p->max_splits >= sms);
  CHECK(p->max_splits <= 32768 / t.attn_min_chunk);
  CHECK(p->min_chunk == t.attn_min_chunk);
  DecodeTuning chunk32 = t;
  chunk32.attn_min_chunk = 32;
  auto small = PlanDecodeAttention(28, 4, 128, 100, /*window=*/0, chunk32);
  REQUIRE(small.ok());
  CHECK(small->max_splits == 4);  // ceil(100 / 32)
  CHECK(small->workspace_floats == 28ull * 4 * 130);
  chunk32.attn_min_chunk = 64;
  auto small64 = PlanDecodeAttention(28, 4, 128, 100, /*window=*/0, chunk32);
  REQUIRE(small64.ok());
  CHECK(small64->max_splits == 2);  // ceil(100 / 64)
  chunk32.attn_min_chunk = 0;
  CHECK(!PlanDecodeAttention(28, 4, 128, 100, /*window=*/0, chunk32).ok());
  DecodeTuning parts = t;
  parts.attn_combine_parts = 5;
  CHECK(!PlanDecodeAttention(28, 4, 128, 100, /*window=*/0, parts).ok());
  // The tuning's policy fields reach the plan.
  DecodeTuning forced = t;
  forced.attn_splits = 7;
  forced.attn_pdl = false;
  auto f = PlanDecodeAttention(28, 4, 128, 32768, /*window=*/0, forced);
  REQUIRE(f.ok());
  CHECK(f->max_splits == 7);
  CHECK(!f->pdl);
  CHECK(!PlanDecodeAttention(28, 4, 128, 4096, 0, t, 0).ok());
  CHECK(!PlanDecodeAttention(28, 4, 128, 4096, 0, t, 65536).ok());
}

}  // namespace
}  // namespace dpl::kernels
