// Decode attention vs a float64 CPU reference over the same f16 K/V values
// (tags gpu, manual).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
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

// Quiet-NaN f16 bits: cache rows nobody may read hold these.
constexpr uint16_t kF16NaN = 0x7E00;

// A regions cache (n_seq, n_kv, n_ctx, hd) copied into a paged pool (n_blocks,
// n_kv, block, hd), as the server's scheduler would lay it out: sequence s's
// positions 0..lens[s]-1 go to blocks handed out in a shuffled order
// (tables[s * max_blocks + p / block]); every other block of the pool holds
// NaN bits, and the table entries past a sequence's rows name one of those,
// so a read through a wrong entry, of a wrong row or past the rows shows.
struct PagedPool {
  int block = 0, max_blocks = 0, n_blocks = 0;
  std::vector<uint16_t> k, v;  // (n_blocks, n_kv, block, hd)
  std::vector<int> tables;     // (n_seq, max_blocks)
};

PagedPool PageCache(const std::vector<uint16_t>& k, const std::vector<uint16_t>& v, int n_kv,
                    int n_ctx, int hd, const std::vector<int>& lens, int block, uint32_t seed) {
  const int n_seq = static_cast<int>(lens.size());
  PagedPool pool;
  pool.block = block;
  pool.max_blocks = n_ctx / block;
  int used = 0;
  for (int len : lens) used += (len + block - 1) / block;
  pool.n_blocks = used + 7;  // spare NaN blocks
  std::vector<int> ids(pool.n_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::mt19937 rng(seed);
  std::shuffle(ids.begin(), ids.end(), rng);
  const size_t per_block = size_t(n_kv) * block * hd;
  pool.k.assign(per_block * pool.n_blocks, kF16NaN);
  pool.v.assign(per_block * pool.n_blocks, kF16NaN);
  pool.tables.assign(size_t(n_seq) * pool.max_blocks, 0);
  int next = 0;
  for (int s = 0; s < n_seq; ++s) {
    for (int i = 0; i < pool.max_blocks; ++i) {
      const bool holds_rows = i * block < lens[s];
      // Past the rows: one of the spare (NaN) blocks, never read.
      const int blk = holds_rows ? ids[next++] : ids[used + (s + i) % (pool.n_blocks - used)];
      pool.tables[size_t(s) * pool.max_blocks + i] = blk;
      if (!holds_rows) continue;
      for (int h = 0; h < n_kv; ++h) {
        for (int r = 0; r < block && i * block + r < lens[s]; ++r) {
          const size_t from = ((size_t(s) * n_kv + h) * n_ctx + i * block + r) * hd;
          const size_t to = ((size_t(blk) * n_kv + h) * block + r) * hd;
          std::copy_n(k.begin() + from, hd, pool.k.begin() + to);
          std::copy_n(v.begin() + from, hd, pool.v.begin() + to);
        }
      }
    }
  }
  return pool;
}

template <typename T>
T* Upload(const std::vector<T>& h) {
  T* d = nullptr;
  CUDA_OK(cudaMalloc(&d, h.size() * sizeof(T)));
  CUDA_OK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

// One batched call over regions and the same call over their paged copy
// (same plan, so the same splits): out, and the int8 blocks of `quant`,
// bit for bit equal. Rows: sequence 0 at its last position (every block of
// its table), sequence 1 at position 0, sequence 2 at 137 (not
// block-aligned), a padding row (position -1, sequence -1: key 0 of
// sequence 0); then a d_seq-less call (sequence 0's table) at position 300.
void RunPagedCase(int n_head, int n_kv, int hd, int block, int window, const DecodeTuning& t) {
  CAPTURE(n_head);
  CAPTURE(n_kv);
  CAPTURE(hd);
  CAPTURE(block);
  CAPTURE(window);
  CAPTURE(t.attn_splits);
  const int n_ctx = 512;
  const std::vector<int> lens = {512, 1, 138};  // live rows per sequence
  const int n_seq = static_cast<int>(lens.size());
  // Regions: live rows random, the rest NaN (read by neither layout).
  const size_t region = size_t(n_kv) * n_ctx * hd;
  std::vector<uint16_t> k(n_seq * region), v(n_seq * region);
  std::mt19937 rng(uint32_t(hd * 7 + n_head + block));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (int s = 0; s < n_seq; ++s) {
    for (int h = 0; h < n_kv; ++h) {
      for (int p = 0; p < n_ctx; ++p) {
        for (int e = 0; e < hd; ++e) {
          const size_t i = ((size_t(s) * n_kv + h) * n_ctx + p) * hd + e;
          k[i] = p < lens[s] ? formats::F32ToF16(u(rng)) : kF16NaN;
          v[i] = p < lens[s] ? formats::F32ToF16(u(rng)) : kF16NaN;
        }
      }
    }
  }
  const PagedPool pool = PageCache(k, v, n_kv, n_ctx, hd, lens, block, uint32_t(block + window));
  const int block_shift = __builtin_ctz(static_cast<unsigned>(block));
  REQUIRE((1 << block_shift) == block);

  const std::vector<int> seqs = {0, 1, 2, -1};
  const std::vector<int> pos = {511, 0, 137, -1};
  const int batch = static_cast<int>(seqs.size());
  auto plan = PlanDecodeAttention(n_head, n_kv, hd, n_ctx, window, t, batch);
  REQUIRE(plan.ok());
  const int64_t row = int64_t(n_head) * hd;
  std::vector<float> q(batch * row);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  for (auto& x : q) x = nd(rng);

  uint16_t *dk = Upload(k), *dv = Upload(v), *pk = Upload(pool.k), *pv = Upload(pool.v);
  int *dtab = Upload(pool.tables), *dpos = Upload(pos), *dseq = Upload(seqs);
  float* dq = Upload(q);
  float *dws, *out_r, *out_p;
  CUDA_OK(cudaMalloc(&dws, plan->workspace_floats * 4));
  CUDA_OK(cudaMalloc(&out_r, batch * row * 4));
  CUDA_OK(cudaMalloc(&out_p, batch * row * 4));
  auto bytes = MatVecScratchBytes(row, batch);
  REQUIRE(bytes.ok());
  void *ma, *mb;
  CUDA_OK(cudaMalloc(&ma, *bytes));
  CUDA_OK(cudaMalloc(&mb, *bytes));
  MatVecScratch sr = MatVecScratchIn(ma, row, batch), sp = MatVecScratchIn(mb, row, batch);
  auto qr = QuantizeInto(row, batch, &sr);
  auto qp = QuantizeInto(row, batch, &sp);
  REQUIRE(qr.ok());
  REQUIRE(qp.ok());
  const KvPages pages{dtab, pool.max_blocks, block_shift};

  STATUS_OK(DecodeAttention(*plan, dq, dk, dv, dpos, dws, out_r, 0, &*qr, dseq));
  STATUS_OK(DecodeAttention(*plan, dq, pk, pv, dpos, dws, out_p, 0, &*qp, dseq, pages));
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<float> got_r(batch * row), got_p(batch * row);
  CUDA_OK(cudaMemcpy(got_r.data(), out_r, got_r.size() * 4, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(got_p.data(), out_p, got_p.size() * 4, cudaMemcpyDeviceToHost));
  size_t non_finite = 0;
  for (float x : got_r) non_finite += std::isfinite(x) ? 0 : 1;
  REQUIRE_MESSAGE(non_finite == 0, non_finite << " regions outputs are NaN or inf");
  for (int b = 0; b < batch; ++b) {
    CAPTURE(b);
    CHECK(std::memcmp(got_r.data() + b * row, got_p.data() + b * row, row * 4) == 0);
  }
  const size_t nb = size_t(batch) * row / 32;
  CHECK(DownloadBytes(qr->q, batch * row) == DownloadBytes(qp->q, batch * row));
  CHECK(DownloadBytes(qr->d, nb * 4) == DownloadBytes(qp->d, nb * 4));
  CHECK(DownloadBytes(qr->s, nb * 4) == DownloadBytes(qp->s, nb * 4));

  // Without d_seq every row is sequence 0: regions at the array's start, pages
  // through table 0.
  DecodeTuning same = t;
  same.attn_splits = plan->max_splits;
  auto one = PlanDecodeAttention(n_head, n_kv, hd, n_ctx, window, same);
  REQUIRE(one.ok());
  const int pos300 = 300;
  CUDA_OK(cudaMemcpy(dpos, &pos300, 4, cudaMemcpyHostToDevice));
  STATUS_OK(DecodeAttention(*one, dq, dk, dv, dpos, dws, out_r, 0));
  STATUS_OK(DecodeAttention(*one, dq, pk, pv, dpos, dws, out_p, 0, nullptr, nullptr, pages));
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<float> one_r(row), one_p(row);
  CUDA_OK(cudaMemcpy(one_r.data(), out_r, row * 4, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(one_p.data(), out_p, row * 4, cudaMemcpyDeviceToHost));
  for (float x : one_r) REQUIRE(std::isfinite(x));
  CHECK(std::memcmp(one_r.data(), one_p.data(), row * 4) == 0);

  cudaFree(dk), cudaFree(dv), cudaFree(pk), cudaFree(pv), cudaFree(dtab), cudaFree(dpos);
  cudaFree(dseq), cudaFree(dq), cudaFree(dws), cudaFree(out_r), cudaFree(out_p), cudaFree(ma);
  cudaFree(mb);
}

TEST_CASE("paged cache gives the same bits as regions") {
  DecodeTuning forced = Tuning();
  forced.attn_splits = 7;     // chunks of 74 (len 512), 20 (len 138) or 15 (window
  forced.attn_min_chunk = 1;  // 100): tiles start off the block boundaries and cross them
  for (const DecodeTuning& t : {Tuning(), forced}) {
    for (int hd : {128, 64}) {
      for (int block : {16, 64}) {
        for (int window : {0, 100}) {
          RunPagedCase(28, 4, hd, block, window, t);  // group 7
          RunPagedCase(16, 4, hd, block, window, t);  // group 4
        }
      }
    }
  }
}

TEST_CASE("DecodeAttention rejects bad pages, naming the field") {
  auto plan = PlanDecodeAttention(28, 4, 128, 512, /*window=*/0, Tuning());
  REQUIRE(plan.ok());
  float *dq, *dws, *dout;
  uint16_t* dkv;
  int* dint;
  CUDA_OK(cudaMalloc(&dq, 28 * 128 * 4));
  CUDA_OK(cudaMalloc(&dws, plan->workspace_floats * 4));
  CUDA_OK(cudaMalloc(&dout, 28 * 128 * 4));
  CUDA_OK(cudaMalloc(&dkv, 64));
  CUDA_OK(cudaMalloc(&dint, 64));
  auto expect_error = [&](const KvPages& pages, const char* field) {
    const absl::Status st =
        DecodeAttention(*plan, dq, dkv, dkv, dint, dws, dout, 0, nullptr, nullptr, pages);
    CAPTURE(field);
    CHECK(st.code() == absl::StatusCode::kInvalidArgument);
    CHECK_MESSAGE(st.message().find(field) != std::string::npos, st.ToString());
  };
  expect_error({dint, 32, 3}, "block_shift");
  expect_error({dint, 1, 11}, "block_shift");
  expect_error({dint, 0, 4}, "max_blocks");
  expect_error({dint, 31, 4}, "n_ctx");  // 31 blocks of 16 reach 496 < 512
  cudaFree(dq), cudaFree(dws), cudaFree(dout), cudaFree(dkv), cudaFree(dint);
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
