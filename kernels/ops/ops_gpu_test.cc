// GPU tests of kernels/ops against float64 CPU references (tags gpu, manual).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "formats/dequant.h"
#include "kernels/gpu_test.h"
#include "kernels/kv_pages.h"
#include "kernels/matvec/matvec_test_util.h"
#include "kernels/ops/kv_cache.h"
#include "kernels/ops/ops.h"

namespace dpl::kernels {
namespace {

using testing::NormErr;

using formats::F16ToF32;
using formats::F32ToF16;
using formats::GgmlType;
using formats::TensorLayout;

constexpr int kGuard = 64;  // sentinel bytes after every output

// Device copy of `bytes` plus kGuard sentinel bytes (0xA5) behind it.
template <typename T>
T* Upload(const std::vector<T>& host) {
  void* p = nullptr;
  const size_t bytes = host.size() * sizeof(T);
  REQUIRE(cudaMalloc(&p, bytes + kGuard) == cudaSuccess);
  REQUIRE(cudaMemcpy(p, host.data(), bytes, cudaMemcpyHostToDevice) == cudaSuccess);
  REQUIRE(cudaMemset(static_cast<char*>(p) + bytes, 0xA5, kGuard) == cudaSuccess);
  return static_cast<T*>(p);
}
template <typename T>
std::vector<T> Download(const T* d, size_t n) {
  std::vector<T> h(n);
  REQUIRE(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess);
  return h;
}
template <typename T>
void CheckSentinel(const T* d, size_t n) {
  std::vector<unsigned char> g(kGuard);
  REQUIRE(cudaMemcpy(g.data(), reinterpret_cast<const char*>(d) + n * sizeof(T), kGuard,
                     cudaMemcpyDeviceToHost) == cudaSuccess);
  for (unsigned char c : g) REQUIRE(c == 0xA5);
}

std::vector<float> RandomFloats(size_t n, uint32_t seed, float mean = 0.0f, float sd = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(mean, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

TEST_CASE("RmsNorm matches float64") {
  for (int n : {896, 3584, 5120, 8192}) {
    const int rows = 3;
    const float eps = 1e-6f;
    auto x = RandomFloats(size_t(rows) * n, n, 0.3f, 2.0f);
    auto w = RandomFloats(n, n + 2, 1.0f, 0.2f);
    float* dx = Upload(x);
    float* dw = Upload(w);
    float* dy = Upload(std::vector<float>(size_t(rows) * n, 0.0f));
    STATUS_OK(RmsNorm(dx, dw, dy, rows, n, eps, 0));
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<double> ref(size_t(rows) * n);
    auto ref_norm = [&](const std::vector<float>& xs) {
      for (int r = 0; r < rows; ++r) {
        double ss = 0;
        for (int i = 0; i < n; ++i) ss += double(xs[r * n + i]) * xs[r * n + i];
        const double sc = 1.0 / std::sqrt(ss / n + eps);
        for (int i = 0; i < n; ++i) ref[r * n + i] = xs[r * n + i] * sc * w[i];
      }
    };
    ref_norm(x);
    const double e1 = NormErr(Download(dy, ref.size()), ref);
    MESSAGE("rmsnorm n=" << n << " normalized error " << e1);
    CHECK(e1 < 2e-6);
    CheckSentinel(dy, ref.size());

    cudaFree(dx), cudaFree(dw), cudaFree(dy);
  }
}

TEST_CASE("SwiGlu matches float64") {
  const int n = 18944;
  auto g = RandomFloats(n, 1, 0.0f, 4.0f);
  auto u = RandomFloats(n, 2);
  float* dg = Upload(g);
  float* du = Upload(u);
  float* dout = Upload(std::vector<float>(n, 0.0f));
  STATUS_OK(SwiGlu(dg, du, dout, n, 0));
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<double> ref(n);
  for (int i = 0; i < n; ++i) ref[i] = g[i] / (1.0 + std::exp(-double(g[i]))) * u[i];
  const double e = NormErr(Download(dout, n), ref);
  MESSAGE("swiglu normalized error " << e);
  CHECK(e < 2e-6);
  CheckSentinel(dout, n);

  cudaFree(dg), cudaFree(du), cudaFree(dout);
}

// The f16 forms for the tensor-core products: RmsNorm's and SwiGlu's float32
// results rounded to nearest even, bit for bit (what ConvertToF16 of them
// gives), and nothing written past the output.
TEST_CASE("RmsNormF16 and SwiGluF16 are the float32 kernels rounded to f16") {
  const int rows = 5, n = 3584;
  const float eps = 1e-6f;
  auto x = RandomFloats(size_t(rows) * n, 11, 0.3f, 2.0f);
  auto w = RandomFloats(n, 12, 1.0f, 0.2f);
  float* dx = Upload(x);
  float* dw = Upload(w);
  float* dy = Upload(std::vector<float>(size_t(rows) * n, 0.0f));
  uint16_t* dh = Upload(std::vector<uint16_t>(size_t(rows) * n, 0));
  STATUS_OK(RmsNorm(dx, dw, dy, rows, n, eps, 0));
  STATUS_OK(RmsNormF16(dx, dw, dh, rows, n, eps, 0));
  CUDA_OK(cudaDeviceSynchronize());
  const std::vector<float> y = Download(dy, size_t(rows) * n);
  const std::vector<uint16_t> h = Download(dh, size_t(rows) * n);
  size_t differ = 0;
  for (size_t i = 0; i < y.size(); ++i) differ += h[i] != F32ToF16(y[i]);
  CHECK(differ == 0);
  CheckSentinel(dh, h.size());

  const int m = 18944 * 3 + 5;  // not a multiple of the grid's stride
  auto g = RandomFloats(m, 13, 0.0f, 4.0f);
  auto u = RandomFloats(m, 14);
  float* dg = Upload(g);
  float* du = Upload(u);
  float* dout = Upload(std::vector<float>(m, 0.0f));
  uint16_t* dout16 = Upload(std::vector<uint16_t>(m, 0));
  STATUS_OK(SwiGlu(dg, du, dout, m, 0));
  STATUS_OK(SwiGluF16(dg, du, dout16, m, 0));
  CUDA_OK(cudaDeviceSynchronize());
  const std::vector<float> o = Download(dout, m);
  const std::vector<uint16_t> o16 = Download(dout16, m);
  differ = 0;
  for (int i = 0; i < m; ++i) differ += o16[i] != F32ToF16(o[i]);
  CHECK(differ == 0);
  CheckSentinel(dout16, o16.size());
  CHECK(RmsNormF16(dx, dw, nullptr, rows, n, eps, 0).code() == absl::StatusCode::kInvalidArgument);
  CHECK(SwiGluF16(dg, du, dout16, 0, 0).code() == absl::StatusCode::kInvalidArgument);

  cudaFree(dx), cudaFree(dw), cudaFree(dy), cudaFree(dh);
  cudaFree(dg), cudaFree(du), cudaFree(dout), cudaFree(dout16);
}

// RoPE + KV write for tokens at `positions` (one launch), against float64;
// with `head_norm`, qwen3's per-head q/k RMSNorm first.
// With `seqs` (a batched decode step), token t goes to region seqs[t] of a
// cache of max(seqs) + 1 sequence regions; a token at position -1 (padding)
// writes nothing.
void RunRope(RopeStyle style, int n_head, int n_head_kv, int hd, int n_rot,
             const std::vector<int>& positions, int n_ctx, bool head_norm = false,
             const std::vector<int>& seqs = {}) {
  const int n = static_cast<int>(positions.size());
  int n_seq = 1;
  for (int sq : seqs) n_seq = std::max(n_seq, sq + 1);
  auto seq_of = [&](int tok) { return seqs.empty() ? 0 : std::max(seqs[tok], 0); };
  CAPTURE(positions[0]);
  CAPTURE(n);
  CAPTURE(n_rot);
  const size_t qw = size_t(n_head) * hd, kw = size_t(n_head_kv) * hd;
  auto q = RandomFloats(n * qw, 11 + positions[0]);
  auto k = RandomFloats(n * kw, 12 + positions[0]);
  auto v = RandomFloats(n * kw, 13 + positions[0]);
  auto inv = RopeInvFreq(1000000.0, n_rot);
  REQUIRE(inv.ok());
  const size_t cache_elems = size_t(n_seq) * n_head_kv * n_ctx * hd;
  std::vector<uint16_t> cache_init(cache_elems, 0x3C00);  // 1.0
  float* dq = Upload(q);
  float* dk = Upload(k);
  float* dv = Upload(v);
  double* dinv = Upload(*inv);
  uint16_t* dkc = Upload(cache_init);
  uint16_t* dvc = Upload(cache_init);
  int* dpos = Upload(positions);
  int* dseq = seqs.empty() ? nullptr : Upload(seqs);
  const float eps = 1e-6f;
  const std::vector<float> qn = RandomFloats(hd, 21, 1.0f, 0.3f), kn = RandomFloats(hd, 22, 1.0f, 0.3f);
  float* dqn = Upload(qn);
  float* dkn = Upload(kn);
  const HeadNorms norms = head_norm ? HeadNorms{dqn, dkn, eps} : HeadNorms{};
  RopeKvShape sh{n_head, n_head_kv, hd, n_rot, n_ctx};
  STATUS_OK(RopeWriteKv(sh, style, dpos, dinv, norms, dq, dk, dv, dkc, dvc, n, 0, false, dseq));
  CUDA_OK(cudaDeviceSynchronize());
  // x: (n, heads, hd), token t's heads RMS-normed by w (head_norm), then
  // rotated by positions[t].
  auto rope_ref = [&](const std::vector<float>& x, int heads, const std::vector<float>& w) {
    std::vector<double> r(x.begin(), x.end());
    for (int tok = 0; tok < n; ++tok) {
      for (int h = 0; h < heads; ++h) {
        const size_t row = (size_t(tok) * heads + h) * hd;
        if (head_norm) {
          double ss = 0;
          for (int e = 0; e < hd; ++e) ss += r[row + e] * r[row + e];
          const double sc = 1.0 / std::sqrt(ss / hd + eps);
          for (int e = 0; e < hd; ++e) r[row + e] = r[row + e] * sc * w[e];
        }
        for (int i = 0; i < n_rot / 2; ++i) {
          const int i0 = style == RopeStyle::kNeox ? i : 2 * i;
          const int i1 = style == RopeStyle::kNeox ? i + n_rot / 2 : 2 * i + 1;
          const double t = double(positions[tok]) * (*inv)[i];
          const double x0 = r[row + i0], x1 = r[row + i1];
          r[row + i0] = x0 * std::cos(t) - x1 * std::sin(t);
          r[row + i1] = x0 * std::sin(t) + x1 * std::cos(t);
        }
      }
    }
    return r;
  };
  const double eq = NormErr(Download(dq, q.size()), rope_ref(q, n_head, qn));
  auto kref = rope_ref(k, n_head_kv, kn);
  auto kc = Download(dkc, cache_elems);
  auto vc = Download(dvc, cache_elems);
  std::vector<float> kgot;
  std::vector<double> kref_written;
  std::vector<bool> written(size_t(n_seq) * n_ctx, false);
  for (int tok = 0; tok < n; ++tok) {
    if (positions[tok] >= 0) written[size_t(seq_of(tok)) * n_ctx + positions[tok]] = true;
  }
  size_t rows_written = 0;
  for (int tok = 0; tok < n; ++tok) {
    const int pos = positions[tok];
    if (pos < 0) continue;  // padding: checked below (no row but the written ones changed)
    const size_t region = size_t(seq_of(tok)) * n_ctx;
    for (int h = 0; h < n_head_kv; ++h) {
      const size_t row = (size_t(seq_of(tok)) * n_head_kv + h) * n_ctx + pos;
      for (int e = 0; e < hd; ++e) {
        const size_t src = (size_t(tok) * n_head_kv + h) * hd + e;
        kgot.push_back(F16ToF32(kc[row * hd + e]));
        kref_written.push_back(kref[src]);
        REQUIRE(vc[row * hd + e] == F32ToF16(v[src]));
        // Rows no token was at stay untouched.
        if (pos > 0 && !written[region + pos - 1]) REQUIRE(kc[(row - 1) * hd + e] == 0x3C00);
        if (pos + 1 < n_ctx && !written[region + pos + 1]) REQUIRE(vc[(row + 1) * hd + e] == 0x3C00);
      }
    }
    ++rows_written;
  }
  // Nothing else changed: count the rows that differ from the initial 1.0.
  size_t changed = 0;
  for (size_t r = 0; r < cache_elems / hd; ++r) {
    bool differs = false;
    for (int e = 0; e < hd; ++e) differs |= vc[r * hd + e] != 0x3C00 || kc[r * hd + e] != 0x3C00;
    changed += differs;
  }
  CHECK(changed <= rows_written * n_head_kv);
  const double ek = NormErr(kgot, kref_written);
  MESSAGE("rope " << std::string(style == RopeStyle::kNeox ? "neox" : "adjacent")
                  << (head_norm ? " +head norm" : "") << " pos=" << positions[0]
                  << " tokens=" << n << " n_rot=" << n_rot << ": q error " << eq
                  << ", k (f16 cache) error " << ek);
  CHECK(eq < 1e-6);
  CHECK(ek < 5e-4);
  CheckSentinel(dq, q.size());
  CheckSentinel(dkc, cache_elems);
  CheckSentinel(dvc, cache_elems);
  cudaFree(dq), cudaFree(dk), cudaFree(dv), cudaFree(dinv), cudaFree(dkc), cudaFree(dvc),
      cudaFree(dpos), cudaFree(dqn), cudaFree(dkn), cudaFree(dseq);
}

TEST_CASE("RopeWriteKv: both styles, precise angles at long positions, cache rows") {
  for (RopeStyle st : {RopeStyle::kNeox, RopeStyle::kAdjacent}) {
    for (int pos : {0, 7, 3253, 32767}) RunRope(st, 28, 4, 128, 128, {pos}, 32768);
    RunRope(st, 14, 2, 64, 64, {100}, 4096);
    RunRope(st, 8, 2, 128, 64, {5000}, 8192);  // partial rotation: tail passes through
  }
}

TEST_CASE("RopeWriteKv with qwen3's per-head q/k norms") {
  for (int pos : {0, 3253}) RunRope(RopeStyle::kNeox, 32, 8, 128, 128, {pos}, 4096, true);
  RunRope(RopeStyle::kNeox, 8, 2, 128, 64, {5, 6, 7}, 64, true);  // partial rotation: tail normed too
  RunRope(RopeStyle::kAdjacent, 14, 2, 64, 64, {100}, 4096, true);
}

TEST_CASE("RopeWriteKv: a prompt chunk in one launch") {
  std::vector<int> chunk(300);
  for (int t = 0; t < 300; ++t) chunk[t] = 3254 + t;
  for (RopeStyle st : {RopeStyle::kNeox, RopeStyle::kAdjacent}) {
    RunRope(st, 28, 4, 128, 128, chunk, 4096);
    RunRope(st, 8, 2, 128, 64, {9, 3, 40, 41}, 64);  // any order, partial rotation
  }
}

TEST_CASE("RopeWriteKv: a batched step, one token per sequence region, padding writes nothing") {
  for (RopeStyle st : {RopeStyle::kNeox, RopeStyle::kAdjacent}) {
    // Regions out of order, one skipped (3), a padding row (position -1).
    RunRope(st, 28, 4, 128, 128, {17, 0, -1, 4000, 5}, 4096, false, {2, 0, -1, 4, 1});
    RunRope(st, 32, 8, 128, 128, {9, 3}, 64, true, {1, 0});  // qwen3 head norms
  }
}

// RopeWriteKv for the same tokens once into regions and once into a paged
// pool of blocks of 16 positions (kernels/kv_pages.h): every written
// (seq, kv head, pos) row must hold the same bits at its two addresses, found
// here by KvCacheLayout (regions SeqOffset + RowOffset; pages BlockOffset of
// the table's block + RowOffset), and every pool row no token wrote must
// still hold its sentinel. The pool has 5 blocks more than the n_seq tables
// use, handed out in a shuffled order, each f16 prefilled with an
// index-dependent NaN (never a RoPE output of finite data).
// With `seqs`, token t belongs to sequence max(seqs[t], 0) (d_seq); empty: a
// prompt chunk (d_seq null) of sequence chunk_seq, reached by offsetting the
// cache pointers (regions) or pages.tables by chunk_seq * max_blocks (pages).
// (seq, pos) pairs must be distinct; a position outside [0, n_ctx) writes
// nothing.
void RunRopePaged(RopeStyle style, int n_head, int n_head_kv, int hd, int n_rot,
                  const std::vector<int>& positions, const std::vector<int>& seqs, int n_seq,
                  int n_ctx, int chunk_seq = 0, bool head_norm = false) {
  constexpr int kBlock = 16, kShift = 4;
  REQUIRE(n_ctx % kBlock == 0);
  const int n = static_cast<int>(positions.size());
  REQUIRE((seqs.empty() || seqs.size() == positions.size()));
  auto seq_of = [&](int tok) { return seqs.empty() ? chunk_seq : std::max(seqs[tok], 0); };
  CAPTURE(n);
  CAPTURE(n_ctx);
  CAPTURE(chunk_seq);
  CAPTURE(seqs.empty());
  const int max_blocks = n_ctx / kBlock;
  const int n_blocks = n_seq * max_blocks + 5;
  const auto regions = MakeKvCacheLayout(1, n_head_kv, n_ctx, hd, n_seq);
  const auto paged = MakePagedKvCacheLayout(1, n_head_kv, hd, n_seq, kBlock, n_blocks, n_ctx);
  REQUIRE(regions.ok());
  REQUIRE_MESSAGE(paged.ok(), paged.status().ToString());
  REQUIRE(paged->n_ctx == n_ctx);
  REQUIRE(paged->max_blocks() == max_blocks);
  REQUIRE(paged->block_shift == kShift);
  // The tables: a shuffled pool, the first n_seq * max_blocks blocks used.
  std::vector<int> ids(n_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937(7 + n));
  const std::vector<int> tables(ids.begin(), ids.begin() + size_t(n_seq) * max_blocks);

  const size_t qw = size_t(n_head) * hd, kw = size_t(n_head_kv) * hd;
  const auto q = RandomFloats(n * qw, 31 + n);
  const auto k = RandomFloats(n * kw, 32 + n);
  const auto v = RandomFloats(n * kw, 33 + n);
  auto inv = RopeInvFreq(1000000.0, n_rot);
  REQUIRE(inv.ok());
  const size_t region_elems = regions->ElemsPerArray(), pool_elems = paged->ElemsPerArray();
  auto k_sentinel = [](size_t i) { return uint16_t(0x7E00 | (i % 509)); };
  auto v_sentinel = [](size_t i) { return uint16_t(0xFE00 | (i % 511)); };
  std::vector<uint16_t> kpool(pool_elems), vpool(pool_elems);
  for (size_t i = 0; i < pool_elems; ++i) kpool[i] = k_sentinel(i), vpool[i] = v_sentinel(i);
  const std::vector<uint16_t> region_init(region_elems, 0x7E00);

  float* dq_regions = Upload(q);
  float* dq_paged = Upload(q);
  float* dk = Upload(k);
  float* dv = Upload(v);
  double* dinv = Upload(*inv);
  uint16_t* dkr = Upload(region_init);
  uint16_t* dvr = Upload(region_init);
  uint16_t* dkp = Upload(kpool);
  uint16_t* dvp = Upload(vpool);
  int* dpos = Upload(positions);
  int* dseq = seqs.empty() ? nullptr : Upload(seqs);
  int* dtables = Upload(tables);
  const float eps = 1e-6f;
  float* dqn = Upload(RandomFloats(hd, 41, 1.0f, 0.3f));
  float* dkn = Upload(RandomFloats(hd, 42, 1.0f, 0.3f));
  const HeadNorms norms = head_norm ? HeadNorms{dqn, dkn, eps} : HeadNorms{};
  const RopeKvShape sh{n_head, n_head_kv, hd, n_rot, n_ctx};

  const uint64_t region = seqs.empty() ? regions->SeqOffset(chunk_seq) : 0;
  STATUS_OK(RopeWriteKv(sh, style, dpos, dinv, norms, dq_regions, dk, dv, dkr + region, dvr + region,
                        n, 0, false, dseq));
  const KvPages pages{dtables + (seqs.empty() ? size_t(chunk_seq) * max_blocks : 0), max_blocks,
                      kShift};
  STATUS_OK(RopeWriteKv(sh, style, dpos, dinv, norms, dq_paged, dk, dv, dkp, dvp, n, 0, false, dseq,
                        pages));
  CUDA_OK(cudaDeviceSynchronize());

  // q does not depend on the cache layout.
  const auto qr = Download(dq_regions, q.size()), qp = Download(dq_paged, q.size());
  CHECK(std::memcmp(qr.data(), qp.data(), q.size() * sizeof(float)) == 0);
  const auto kr = Download(dkr, region_elems), vr = Download(dvr, region_elems);
  const auto kp = Download(dkp, pool_elems), vp = Download(dvp, pool_elems);
  std::vector<bool> written(pool_elems / hd, false);  // per pool row
  size_t rows = 0, expected_rows = 0, differ = 0, unwritten = 0;
  for (int tok = 0; tok < n; ++tok) {
    const int pos = positions[tok], sq = seq_of(tok);
    if (pos < 0 || pos >= n_ctx) continue;
    expected_rows += n_head_kv;
    const int blk = tables[size_t(sq) * max_blocks + pos / kBlock];
    for (int h = 0; h < n_head_kv; ++h) {
      const uint64_t at_region = regions->SeqOffset(sq) + regions->RowOffset(h, pos);
      const uint64_t at_page = paged->BlockOffset(blk) + paged->RowOffset(h, pos);
      REQUIRE(at_page + hd <= pool_elems);
      REQUIRE(!written[at_page / hd]);  // distinct (seq, pos): distinct rows
      written[at_page / hd] = true;
      ++rows;
      differ += std::memcmp(&kr[at_region], &kp[at_page], size_t(hd) * 2) != 0;
      differ += std::memcmp(&vr[at_region], &vp[at_page], size_t(hd) * 2) != 0;
      // The regions run wrote the row (no f16 NaN or infinity left).
      for (int e = 0; e < hd; ++e) {
        unwritten += (kr[at_region + e] & 0x7C00) == 0x7C00 || (vr[at_region + e] & 0x7C00) == 0x7C00;
      }
    }
  }
  size_t touched = 0;  // pool rows that lost their sentinel though no token was there
  for (size_t r = 0; r < pool_elems / hd; ++r) {
    if (written[r]) continue;
    bool same = true;
    for (int e = 0; e < hd; ++e) {
      const size_t i = r * hd + e;
      same &= kp[i] == k_sentinel(i) && vp[i] == v_sentinel(i);
    }
    touched += !same;
  }
  MESSAGE("paged rope " << std::string(style == RopeStyle::kNeox ? "neox" : "adjacent")
                        << " tokens=" << n << " rows=" << rows << " pool blocks=" << n_blocks);
  CHECK(rows == expected_rows);
  CHECK(rows > 0);
  CHECK(differ == 0);
  CHECK(unwritten == 0);
  CHECK(touched == 0);
  CheckSentinel(dkp, pool_elems);
  CheckSentinel(dvp, pool_elems);
  CheckSentinel(dkr, region_elems);
  CheckSentinel(dvr, region_elems);
  cudaFree(dq_regions), cudaFree(dq_paged), cudaFree(dk), cudaFree(dv), cudaFree(dinv), cudaFree(dkr),
      cudaFree(dvr), cudaFree(dkp), cudaFree(dvp), cudaFree(dpos), cudaFree(dseq), cudaFree(dtables),
      cudaFree(dqn), cudaFree(dkn);
}

TEST_CASE("RopeWriteKv into a paged cache writes the rows regions would") {
  // A packed batch (d_seq) over 5 sequences of 64 positions (sequence 4
  // unused): runs across block boundaries (15|16, 31|32, 47|48), the last
  // position 63, a padding row (position -1, sequence -1) and a position past
  // n_ctx (64), in no particular order.
  const std::vector<int> pos = {14, 15, 16, 17, 0, 31, 32, 63, -1, 64, 47, 48, 5};
  const std::vector<int> seq = {0, 0, 0, 0, 2, 2, 2, 2, -1, 1, 3, 3, 1};
  for (RopeStyle st : {RopeStyle::kNeox, RopeStyle::kAdjacent}) {
    RunRopePaged(st, 8, 4, 128, 128, pos, seq, 5, 64);
    RunRopePaged(st, 8, 2, 128, 64, pos, seq, 5, 64, 0, true);  // partial rotation, qwen3 head norms
    // One token per sequence, as a decode step.
    RunRopePaged(st, 28, 4, 128, 128, {17, 0, -1, 4000, 4095}, {2, 0, -1, 4, 1}, 5, 4096);
  }
}

TEST_CASE("RopeWriteKv into a paged cache: a prompt chunk (no d_seq) through one sequence's table") {
  std::vector<int> chunk(300);
  for (int t = 0; t < 300; ++t) chunk[t] = 3254 + t;  // blocks 203..222
  std::vector<int> short_chunk;
  for (int p = 5; p <= 64; ++p) short_chunk.push_back(p);  // blocks 0..3, then past n_ctx
  for (RopeStyle st : {RopeStyle::kNeox, RopeStyle::kAdjacent}) {
    for (int chunk_seq : {0, 2}) {  // sequence 0's table, and a table reached by offset
      RunRopePaged(st, 8, 2, 64, 64, short_chunk, {}, 3, 64, chunk_seq);
      RunRopePaged(st, 28, 4, 128, 128, chunk, {}, 3, 4096, chunk_seq);
    }
  }
}

TEST_CASE("RopeWriteKv rejects bad block tables, naming the field") {
  const RopeKvShape sh{8, 2, 64, 64, 64};
  int* fi = reinterpret_cast<int*>(256);
  float* ff = reinterpret_cast<float*>(256);
  uint16_t* fh = reinterpret_cast<uint16_t*>(256);
  const double* fd = reinterpret_cast<const double*>(256);
  auto call = [&](const KvPages& pages) {
    return RopeWriteKv(sh, RopeStyle::kNeox, fi, fd, HeadNorms{}, ff, ff, ff, fh, fh, 1, 0, false,
                       nullptr, pages);
  };
  struct Bad {
    KvPages pages;
    const char* names;
  };
  for (const Bad& b : {Bad{{fi, 4, 3}, "block_shift"}, Bad{{fi, 4, 11}, "block_shift"},
                       Bad{{fi, 0, 4}, "max_blocks"}, Bad{{fi, -1, 4}, "max_blocks"},
                       Bad{{fi, 3, 4}, "n_ctx 64 is more than a block table reaches"}}) {
    const absl::Status st = call(b.pages);
    CAPTURE(st.ToString());
    CHECK(absl::IsInvalidArgument(st));
    CHECK(st.message().find(b.names) != std::string::npos);
  }
}

TEST_CASE("EmbedRows is bit-identical to formats::DequantizeRow, every type and layout") {
  struct Case {
    GgmlType type;
    TensorLayout layout;
    int n_cols;
  };
  std::vector<Case> cases = {{GgmlType::kF32, TensorLayout::kRaw, 896},
                             {GgmlType::kF16, TensorLayout::kRaw, 896},
                             {GgmlType::kBF16, TensorLayout::kRaw, 896},
                             {GgmlType::kF16, TensorLayout::kRaw, 100}};  // not a multiple of 8
  for (GgmlType t : {GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0,
                     GgmlType::kQ5_1, GgmlType::kIQ4_NL, GgmlType::kQ2_K, GgmlType::kQ3_K,
                     GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K, GgmlType::kIQ4_XS}) {
    const int n_cols = formats::TraitsOf(t).block_elems == 256 ? 3584 : 896;
    cases.push_back({t, TensorLayout::kRaw, n_cols});
    if (formats::DplPlanesOf(t).n > 0) cases.push_back({t, TensorLayout::kDpl, n_cols});
  }
  const int n_rows = 6, token = 4;
  for (const Case& c : cases) {
    CAPTURE(std::string(formats::TraitsOf(c.type).name));
    CAPTURE(int(c.layout));
    const testutil::HostMatrix m = testutil::RandomMatrix(c.type, c.layout, n_rows, c.n_cols, 0, 5);
    // Rows for tokens 4, 0 and 5 in one launch, then an out-of-range id.
    const std::vector<int> tokens = {token, 0, n_rows - 1, n_rows};
    const int n_tok = static_cast<int>(tokens.size());
    const size_t n_out = size_t(n_tok) * c.n_cols;
    uint8_t* dtable = Upload(m.bytes);
    int* dtok = Upload(tokens);
    float* dout = Upload(std::vector<float>(n_out, 0.0f));
    const WeightMatrix t{dtable, c.type, c.layout, n_rows, c.n_cols, m.row_stride};
    STATUS_OK(EmbedRows(t, dtok, n_tok, dout, 0));
    CUDA_OK(cudaDeviceSynchronize());
    const auto got = Download(dout, n_out);
    std::vector<float> ref(c.n_cols);
    int mismatches = 0;
    for (int i = 0; i + 1 < n_tok; ++i) {
      REQUIRE(formats::DequantizeRow(c.type, c.layout, &m.bytes[tokens[i] * m.row_stride], c.n_cols,
                                     ref.data())
                  .ok());
      for (int j = 0; j < c.n_cols; ++j) mismatches += std::memcmp(&got[i * c.n_cols + j], &ref[j], 4) != 0;
    }
    CHECK(mismatches == 0);
    // Out-of-range token: a NaN row.
    CHECK(std::isnan(got[(n_tok - 1) * size_t(c.n_cols)]));
    CHECK(std::isnan(got[n_out - 1]));
    CheckSentinel(dout, n_out);
    cudaFree(dtable), cudaFree(dtok), cudaFree(dout);
  }
  const WeightMatrix bad{reinterpret_cast<uint8_t*>(256), GgmlType::kQ4_K, TensorLayout::kDpl, 4,
                         3584, 144 * 14};
  const absl::Status st = EmbedRows(bad, reinterpret_cast<int*>(256), 1, reinterpret_cast<float*>(256), 0);
  CHECK(!st.ok());
  CHECK(st.message().find("q4_K has no dpl layout") != std::string::npos);
}

}  // namespace
}  // namespace dpl::kernels
