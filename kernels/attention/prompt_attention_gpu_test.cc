// Prompt attention (causal flash attention over a chunk of tokens) vs a
// float64 CPU reference over the same f16 K/V values and the f32 q
// (tags gpu, manual).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "formats/dequant.h"
#include "kernels/attention/prompt_attention.h"
#include "kernels/gpu_test.h"

namespace dpl::kernels {
namespace {

using testing::GuardedArray;
using testing::NormErr;

// Quiet-NaN f16 bits: the cache rows past p0 + n_tokens hold these, so any
// read of them that reached the output would turn it into NaN.
constexpr uint16_t kF16NaN = 0x7E00;

// Error bound, per (token, head) row and over the whole output. Why 2e-3:
// the kernel feeds the tensor cores f16 operands -- q rounded to f16
// (relative 2^-11 per element, so the scores move by ~1e-4 at these
// magnitudes) and the probabilities P rounded to f16 before P V (relative
// 2^-11 per weight) -- while the reference keeps q in f32 and every product
// in float64; K and V are f16 in both. Measured on an H200 (2026-12-01):
// 1.7e-4 to 2.9e-4 over the whole output, at most 6.3e-4 for one row, over
// every case below (0 exactly for a single key, where P = 1). 2e-3 leaves
// ~3x headroom for other seeds and peakier rows without letting a wrong mask
// (a missing or extra key moves a row by ~1e-2 and more) or a wrong fragment
// (error ~1) through.
constexpr double kMaxErr = 2e-3;

struct Case {
  int n_head, n_head_kv, hd;
  int p0, n_tokens;
  int slack;       // NaN cache rows past p0 + n_tokens (n_ctx = p0 + n_tokens + slack)
  int window = 0;  // > 0: sliding window; rows below every query's window hold huge values
};

struct Result {
  double err_all = 0;      // NormErr over the whole output
  double err_row_max = 0;  // largest NormErr of one (token, head) row
};

// out[t][h] = softmax(q[t][h] . K[kvh][lo..p0+t] / sqrt(hd)) V[kvh][lo..p0+t], in float64
// (lo = 0, or max(0, p0 + t - window + 1)).
std::vector<double> Reference(const Case& c, int n_ctx, const std::vector<float>& q,
                              const std::vector<float>& kf,   // (n_head_kv, n_ctx, hd) f16 values
                              const std::vector<float>& vf) {
  const int hd = c.hd, group = c.n_head / c.n_head_kv;
  std::vector<double> out(size_t(c.n_tokens) * c.n_head * hd, 0.0);
  std::vector<double> sc(c.p0 + c.n_tokens), qd(hd), acc(hd);
  const double scale = 1.0 / std::sqrt(double(hd));
  for (int t = 0; t < c.n_tokens; ++t) {
    const int n_keys = c.p0 + t + 1;
    const int lo = c.window > 0 ? std::max(0, n_keys - c.window) : 0;
    for (int h = 0; h < c.n_head; ++h) {
      const int kvh = h / group;
      for (int e = 0; e < hd; ++e) qd[e] = q[(size_t(t) * c.n_head + h) * hd + e];
      double mx = -1e300;
      for (int p = lo; p < n_keys; ++p) {
        const float* kr = &kf[(size_t(kvh) * n_ctx + p) * hd];
        double d0 = 0, d1 = 0, d2 = 0, d3 = 0;  // four chains: the reference is the slow part
        for (int e = 0; e < hd; e += 4) {
          d0 += qd[e] * kr[e];
          d1 += qd[e + 1] * kr[e + 1];
          d2 += qd[e + 2] * kr[e + 2];
          d3 += qd[e + 3] * kr[e + 3];
        }
        sc[p] = ((d0 + d1) + (d2 + d3)) * scale;
        mx = std::max(mx, sc[p]);
      }
      double l = 0;
      for (int p = lo; p < n_keys; ++p) l += (sc[p] = std::exp(sc[p] - mx));
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int p = lo; p < n_keys; ++p) {
        const float* vr = &vf[(size_t(kvh) * n_ctx + p) * hd];
        const double w = sc[p];
        for (int e = 0; e < hd; ++e) acc[e] += w * vr[e];
      }
      double* o = &out[(size_t(t) * c.n_head + h) * hd];
      for (int e = 0; e < hd; ++e) o[e] = acc[e] / l;
    }
  }
  return out;
}

Result RunCase(const Case& c) {
  CAPTURE(c.n_head);
  CAPTURE(c.n_head_kv);
  CAPTURE(c.hd);
  CAPTURE(c.p0);
  CAPTURE(c.n_tokens);
  CAPTURE(c.slack);
  const int hd = c.hd;
  const int n_ctx = c.p0 + c.n_tokens + c.slack;
  const int n_valid = c.p0 + c.n_tokens;
  // Below every query's window: finite but huge (a key read there that was
  // not masked would dominate its row; NaN would also poison masked P V).
  const int first_seen = c.window > 0 ? std::max(0, c.p0 - c.window + 1) : 0;
  std::mt19937 rng(uint32_t(c.p0 * 131 + c.n_tokens * 7 + c.n_head * 3 + hd));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);

  const size_t n_cache = size_t(c.n_head_kv) * n_ctx * hd;
  std::vector<uint16_t> k(n_cache), v(n_cache);
  std::vector<float> kf(n_cache), vf(n_cache);
  for (int kvh = 0; kvh < c.n_head_kv; ++kvh) {
    for (int p = 0; p < n_ctx; ++p) {
      for (int e = 0; e < hd; ++e) {
        const size_t i = (size_t(kvh) * n_ctx + p) * hd + e;
        const uint16_t fill = p < first_seen ? formats::F32ToF16(60000.0f) : kF16NaN;
        const bool live = p < n_valid && p >= first_seen;
        k[i] = live ? formats::F32ToF16(u(rng)) : fill;
        v[i] = live ? formats::F32ToF16(u(rng)) : fill;
        kf[i] = formats::F16ToF32(k[i]);
        vf[i] = formats::F16ToF32(v[i]);
      }
    }
  }
  // q ~ 3 * U(-1, 1): scores of standard deviation ~1 after the 1/sqrt(hd)
  // scale, so the softmax is far from flat.
  std::vector<float> q(size_t(c.n_tokens) * c.n_head * hd);
  for (auto& x : q) x = 3.0f * u(rng);

  GuardedArray<float> dq(q);
  GuardedArray<uint16_t> dk(k), dv(v);
  GuardedArray<float> dout(size_t(c.n_tokens) * c.n_head * hd);
  const PromptAttentionShape shape{c.n_head, c.n_head_kv, hd, n_ctx, c.window};
  STATUS_OK(PromptAttention(shape, dq.get(), dk.get(), dv.get(), c.p0, c.n_tokens, dout.get(), 0));
  const std::vector<float> got = dout.Download();  // syncs, checks the sentinels
  const std::vector<double> ref = Reference(c, n_ctx, q, kf, vf);

  Result r;
  size_t non_finite = 0;
  for (float x : got) non_finite += std::isfinite(x) ? 0 : 1;
  CHECK_MESSAGE(non_finite == 0, non_finite << " outputs are NaN or inf");
  r.err_all = NormErr(got, ref);
  std::vector<double> ref_row(hd);
  for (size_t row = 0; row < size_t(c.n_tokens) * c.n_head; ++row) {
    std::copy(ref.begin() + row * hd, ref.begin() + (row + 1) * hd, ref_row.begin());
    const double e = NormErr(got.data() + row * hd, ref_row);
    r.err_row_max = std::max(r.err_row_max, std::isfinite(e) ? e : 1e30);
  }
  MESSAGE("prompt attention heads " << c.n_head << "/" << c.n_head_kv << " hd " << hd << " p0 "
                                    << c.p0 << " n_tokens " << c.n_tokens << " slack " << c.slack
                                    << " window " << c.window << ": normalized error " << r.err_all << " (worst row "
                                    << r.err_row_max << ")");
  CHECK(r.err_all <= kMaxErr);
  CHECK(r.err_row_max <= kMaxErr);
  return r;
}

TEST_CASE("prompt attention, head_dim 128, GQA 7:1 (Qwen2.5-7B), first chunk") {
  for (int n : {1, 17, 64, 100, 512}) RunCase({28, 4, 128, 0, n, 64});
}

TEST_CASE("prompt attention, head_dim 128, GQA 7:1, later chunks") {
  RunCase({28, 4, 128, 3254, 512, 64});  // p0 not a multiple of 64: diagonal crosses two key tiles
  RunCase({28, 4, 128, 1000, 37, 64});   // one partial query tile
  RunCase({28, 4, 128, 1000, 37, 0});    // the chunk ends at the last cache row (n_ctx = p0 + n)
}

TEST_CASE("prompt attention with a sliding window") {
  RunCase({32, 8, 128, 0, 512, 64, 100});      // the window ends inside the chunk
  RunCase({32, 8, 128, 4000, 300, 64, 4096});  // Mistral's 4096, a chunk past it
  RunCase({32, 8, 128, 3254, 512, 64, 64});    // one key tile wide, p0 not tile-aligned
  RunCase({14, 2, 64, 1000, 37, 0, 1});        // each token sees itself only
  RunCase({28, 4, 128, 100, 200, 64, 5000});   // wider than everything: plain causal
}

TEST_CASE("prompt attention, other GQA groups") {
  RunCase({8, 8, 128, 0, 100, 64});     // group 1
  RunCase({32, 8, 128, 1000, 37, 64});  // group 4
  RunCase({32, 8, 128, 0, 512, 3});     // group 4, a few NaN rows only
  RunCase({40, 8, 128, 200, 300, 64});  // group 5 (Qwen2.5-14B)
}

TEST_CASE("prompt attention, head_dim 64") {
  for (int n : {1, 17, 64, 100, 512}) RunCase({14, 2, 64, 0, n, 64});  // Qwen2.5-0.5B shape
  RunCase({14, 2, 64, 1000, 37, 64});
  RunCase({14, 2, 64, 1000, 37, 0});
  RunCase({8, 8, 64, 777, 129, 64});  // group 1
}

TEST_CASE("prompt attention is deterministic") {
  const int n_ctx = 700, p0 = 100, n = 300;
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<uint16_t> k(size_t(4) * n_ctx * 128), v(k.size());
  for (auto& x : k) x = formats::F32ToF16(u(rng));
  for (auto& x : v) x = formats::F32ToF16(u(rng));
  std::vector<float> q(size_t(n) * 28 * 128);
  for (auto& x : q) x = 3.0f * u(rng);
  GuardedArray<float> dq(q);
  GuardedArray<uint16_t> dk(k), dv(v);
  GuardedArray<float> a(q.size()), b(q.size());
  const PromptAttentionShape shape{28, 4, 128, n_ctx};
  STATUS_OK(PromptAttention(shape, dq.get(), dk.get(), dv.get(), p0, n, a.get(), 0));
  STATUS_OK(PromptAttention(shape, dq.get(), dk.get(), dv.get(), p0, n, b.get(), 0));
  CHECK(a.Download() == b.Download());
}

// A paged chunk against the same chunk over regions: bit for bit equal.
// Regions: n_seq sequences of n_ctx positions, (n_seq, n_kv, n_ctx, hd),
// rows 0..p0+n-1 of each random and the rest NaN; the chunk runs on
// sequence `seq` (the caller offsets the pointers to its region). Pages: the
// same rows in a pool of blocks handed out in a shuffled order, the pool's
// other blocks NaN, and the table entries past a sequence's rows naming NaN
// blocks, so a read through a wrong entry, of a wrong row or past the rows
// shows.
struct PagedCase {
  int n_head, n_head_kv, hd;
  int p0, n_tokens;
  int block;
  int window = 0;
};

// The same KV rows as regions and as pages: n_seq sequences of n_ctx
// positions, rows 0..n_valid-1 of each random, the rest NaN; the pool of
// blocks handed out in a shuffled order, its other blocks NaN, the table
// entries past a sequence's rows naming NaN blocks.
struct Caches {
  std::vector<uint16_t> k, v;    // regions: (n_seq, n_kv, n_ctx, hd)
  std::vector<uint16_t> pk, pv;  // pages: (n_blocks, n_kv, block, hd)
  std::vector<int> tables;       // (n_seq, n_ctx / block)
  size_t region = 0;             // elements a sequence's region
  int block_shift = 0;
};

Caches MakeCaches(int n_seq, int n_kv, int hd, int n_ctx, int n_valid, int block, std::mt19937& rng) {
  Caches c;
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  c.region = size_t(n_kv) * n_ctx * hd;
  c.k.assign(n_seq * c.region, kF16NaN);
  c.v.assign(n_seq * c.region, kF16NaN);
  for (int s = 0; s < n_seq; ++s) {
    for (int h = 0; h < n_kv; ++h) {
      for (int p = 0; p < n_valid; ++p) {
        for (int e = 0; e < hd; ++e) {
          const size_t i = ((size_t(s) * n_kv + h) * n_ctx + p) * hd + e;
          c.k[i] = formats::F32ToF16(u(rng));
          c.v[i] = formats::F32ToF16(u(rng));
        }
      }
    }
  }
  // The pool: ceil(n_valid / block) blocks a sequence, plus spare NaN ones.
  const int max_blocks = n_ctx / block;
  const int need = (n_valid + block - 1) / block, used = n_seq * need;
  const int n_blocks = used + 5;
  std::vector<int> ids(n_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  const size_t per_block = size_t(n_kv) * block * hd;
  c.pk.assign(per_block * n_blocks, kF16NaN);
  c.pv.assign(per_block * n_blocks, kF16NaN);
  c.tables.resize(size_t(n_seq) * max_blocks);
  int next = 0;
  for (int s = 0; s < n_seq; ++s) {
    for (int i = 0; i < max_blocks; ++i) {
      const int blk = i < need ? ids[next++] : ids[used + (s + i) % (n_blocks - used)];
      c.tables[size_t(s) * max_blocks + i] = blk;
      if (i >= need) continue;
      for (int h = 0; h < n_kv; ++h) {
        for (int r = 0; r < block && i * block + r < n_valid; ++r) {
          const size_t from = ((size_t(s) * n_kv + h) * n_ctx + i * block + r) * hd;
          const size_t to = ((size_t(blk) * n_kv + h) * block + r) * hd;
          std::copy_n(c.k.begin() + from, hd, c.pk.begin() + to);
          std::copy_n(c.v.begin() + from, hd, c.pv.begin() + to);
        }
      }
    }
  }
  c.block_shift = __builtin_ctz(static_cast<unsigned>(block));
  REQUIRE((1 << c.block_shift) == block);
  return c;
}

size_t CountNonFinite(const std::vector<float>& x) {
  size_t n = 0;
  for (float e : x) n += std::isfinite(e) ? 0 : 1;
  return n;
}

void RunPagedCase(const PagedCase& c) {
  CAPTURE(c.n_head);
  CAPTURE(c.n_head_kv);
  CAPTURE(c.hd);
  CAPTURE(c.p0);
  CAPTURE(c.n_tokens);
  CAPTURE(c.block);
  CAPTURE(c.window);
  const int n_ctx = 512, n_seq = 3, seq = 1, hd = c.hd, n_kv = c.n_head_kv;
  const int n_valid = c.p0 + c.n_tokens;
  REQUIRE(n_valid <= n_ctx);
  std::mt19937 rng(uint32_t(c.p0 * 131 + c.n_tokens * 7 + c.n_head * 3 + hd + c.block));
  const Caches m = MakeCaches(n_seq, n_kv, hd, n_ctx, n_valid, c.block, rng);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> q(size_t(c.n_tokens) * c.n_head * hd);
  for (auto& x : q) x = 3.0f * u(rng);

  GuardedArray<float> dq(q);
  GuardedArray<uint16_t> dk(m.k), dv(m.v), dpk(m.pk), dpv(m.pv);
  GuardedArray<int> dtab(m.tables);
  GuardedArray<float> out_r(q.size()), out_p(q.size());
  const PromptAttentionShape shape{c.n_head, n_kv, hd, n_ctx, c.window};
  const KvPages pages{dtab.get(), n_ctx / c.block, m.block_shift};
  STATUS_OK(PromptAttention(shape, dq.get(), dk.get() + seq * m.region, dv.get() + seq * m.region, c.p0,
                            c.n_tokens, out_r.get(), 0));
  STATUS_OK(PromptAttention(shape, dq.get(), dpk.get(), dpv.get(), c.p0, c.n_tokens, out_p.get(), 0,
                            pages, seq));
  const std::vector<float> got_r = out_r.Download(), got_p = out_p.Download();
  REQUIRE_MESSAGE(CountNonFinite(got_r) == 0, "regions outputs are NaN or inf");
  CHECK(std::memcmp(got_r.data(), got_p.data(), got_r.size() * 4) == 0);
}

TEST_CASE("paged prompt attention gives the same bits as regions") {
  for (int hd : {128, 64}) {
    for (const auto& heads : {std::pair{28, 4}, std::pair{16, 4}}) {  // groups 7 and 4
      // A chunk off the block boundaries, blocks of 16 (4 a key tile).
      RunPagedCase({heads.first, heads.second, hd, 37, 100, 16});
      RunPagedCase({heads.first, heads.second, hd, 37, 100, 16, 50});  // window: tiles from 0 < lo
      // The first chunk, blocks of 64 (one a key tile), a partial last query tile.
      RunPagedCase({heads.first, heads.second, hd, 0, 130, 64});
      RunPagedCase({heads.first, heads.second, hd, 0, 130, 64, 40});
      // A later chunk with a window, blocks of 32 (2 a key tile).
      RunPagedCase({heads.first, heads.second, hd, 300, 150, 32, 100});
    }
  }
}

// A packed pass in one launch (PromptAttentionBatch) against each chunk
// launched alone, regions and pages: bit for bit equal. The chunks differ in
// sequence, start, length (a one-token chunk, a partial tile, several
// tiles) and sit in the pass's rows in an order other than their sequences'.
void RunBatchCase(int n_head, int n_kv, int hd, int block, int window) {
  CAPTURE(n_head);
  CAPTURE(n_kv);
  CAPTURE(hd);
  CAPTURE(block);
  CAPTURE(window);
  const int n_ctx = 512, n_seq = 5;
  struct Chunk {
    int seq, p0, n;
  };
  const Chunk chunks[] = {{3, 37, 100}, {0, 0, 130}, {4, 300, 1}, {1, 2, 64}, {2, 400, 50}};
  int n_valid = 0;
  for (const Chunk& c : chunks) n_valid = std::max(n_valid, c.p0 + c.n);
  std::mt19937 rng(uint32_t(n_head * 11 + hd + block + window));
  const Caches m = MakeCaches(n_seq, n_kv, hd, n_ctx, n_valid, block, rng);
  std::vector<PromptChunk> pass;
  int rows = 0;
  for (const Chunk& c : chunks) {
    pass.push_back({c.seq, c.p0, rows, c.n});
    rows += c.n;
  }
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> q(size_t(rows) * n_head * hd);
  for (auto& x : q) x = 3.0f * u(rng);
  const std::vector<PromptTile> tiles = PlanPromptTiles(pass);

  GuardedArray<float> dq(q);
  GuardedArray<uint16_t> dk(m.k), dv(m.v), dpk(m.pk), dpv(m.pv);
  GuardedArray<int> dtab(m.tables);
  GuardedArray<PromptTile> dtiles(tiles);
  const PromptAttentionShape shape{n_head, n_kv, hd, n_ctx, window};
  const KvPages pages{dtab.get(), n_ctx / block, m.block_shift};
  const size_t row_elems = size_t(n_head) * hd;
  for (const bool paged : {false, true}) {
    CAPTURE(paged);
    GuardedArray<float> alone(q.size()), batch(q.size());
    for (const PromptChunk& c : pass) {
      const float* qc = dq.get() + c.row * row_elems;
      float* oc = alone.get() + c.row * row_elems;
      if (paged) {
        STATUS_OK(PromptAttention(shape, qc, dpk.get(), dpv.get(), c.p0, c.n_tokens, oc, 0, pages, c.seq));
      } else {
        STATUS_OK(PromptAttention(shape, qc, dk.get() + c.seq * m.region, dv.get() + c.seq * m.region, c.p0,
                                  c.n_tokens, oc, 0));
      }
    }
    if (paged) {
      STATUS_OK(PromptAttentionBatch(shape, dq.get(), dpk.get(), dpv.get(), tiles, dtiles.get(), batch.get(), 0,
                                     pages));
    } else {
      STATUS_OK(PromptAttentionBatch(shape, dq.get(), dk.get(), dv.get(), tiles, dtiles.get(), batch.get(), 0));
    }
    const std::vector<float> a = alone.Download(), b = batch.Download();
    REQUIRE_MESSAGE(CountNonFinite(a) == 0, "the chunks' outputs are NaN or inf");
    CHECK(std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
  }
}

TEST_CASE("a packed pass in one launch gives each chunk's bits") {
  for (int hd : {128, 64}) {
    RunBatchCase(28, 4, hd, 16, 0);
    RunBatchCase(28, 4, hd, 16, 60);
    RunBatchCase(16, 4, hd, 64, 0);
    RunBatchCase(16, 4, hd, 32, 100);
  }
}

TEST_CASE("a packed pass's bad tiles are refused, naming the problem") {
  GuardedArray<float> q(size_t(128) * 28 * 128), out(size_t(128) * 28 * 128);
  GuardedArray<uint16_t> k(size_t(2) * 4 * 256 * 128), v(size_t(2) * 4 * 256 * 128);
  const PromptAttentionShape shape{28, 4, 128, 256};
  GuardedArray<PromptTile> dev(std::vector<PromptTile>(4));
  auto error = [&](std::vector<PromptTile> tiles, const PromptTile* dev_tiles, const char* field) {
    const absl::Status st =
        PromptAttentionBatch(shape, q.get(), k.get(), v.get(), tiles, dev_tiles, out.get(), 0);
    CAPTURE(field);
    CHECK(st.code() == absl::StatusCode::kInvalidArgument);
    CHECK_MESSAGE(st.message().find(field) != std::string::npos, st.ToString());
  };
  error({}, dev.get(), "0 tiles");
  error({{0, 0, 0, 64, 0}}, nullptr, "dev_tiles");
  error({{0, 250, 0, 64, 0}}, dev.get(), "n_ctx");      // 250 + 64 > 256
  error({{0, 0, 0, 64, 64}}, dev.get(), "m0");          // m0 past the chunk
  error({{0, 0, 0, 100, 32}}, dev.get(), "m0");         // not a tile start
  error({{-1, 0, 0, 64, 0}}, dev.get(), "seq");
  error({{0, 0, -5, 64, 0}}, dev.get(), "row");
  error({{0, 0, 0, 0, 0}}, dev.get(), "n_tokens");
  CUDA_OK(cudaDeviceSynchronize());
}

TEST_CASE("prompt attention rejects bad arguments, naming the field") {
  GuardedArray<float> q(size_t(4) * 28 * 128), out(size_t(4) * 28 * 128);
  GuardedArray<uint16_t> k(size_t(4) * 64 * 128), v(size_t(4) * 64 * 128);
  const PromptAttentionShape good{28, 4, 128, 64};
  auto expect_error = [&](const PromptAttentionShape& s, const float* qp, const uint16_t* kp,
                          const uint16_t* vp, int p0, int n, float* op, const char* field) {
    const absl::Status st = PromptAttention(s, qp, kp, vp, p0, n, op, 0);
    CAPTURE(field);
    CHECK(st.code() == absl::StatusCode::kInvalidArgument);
    CHECK_MESSAGE(st.message().find(field) != std::string::npos, st.ToString());
  };
  expect_error({28, 4, 96, 64}, q.get(), k.get(), v.get(), 0, 4, out.get(), "head_dim");
  expect_error({28, 3, 128, 64}, q.get(), k.get(), v.get(), 0, 4, out.get(), "n_head_kv");
  expect_error({0, 4, 128, 64}, q.get(), k.get(), v.get(), 0, 4, out.get(), "n_head");
  expect_error({28, 4, 128, 0}, q.get(), k.get(), v.get(), 0, 4, out.get(), "n_ctx");
  expect_error(good, q.get(), k.get(), v.get(), 0, 0, out.get(), "n_tokens");
  expect_error(good, q.get(), k.get(), v.get(), -1, 4, out.get(), "p0");
  expect_error(good, q.get(), k.get(), v.get(), 61, 4, out.get(), "n_ctx");  // 61 + 4 > 64
  expect_error(good, nullptr, k.get(), v.get(), 0, 4, out.get(), "q=null");
  expect_error(good, q.get(), k.get(), nullptr, 0, 4, out.get(), "v_cache=null");
  expect_error(good, q.get(), k.get() + 1, v.get(), 0, 4, out.get(), "k_cache");  // misaligned
  // The boundary itself is fine: p0 + n_tokens == n_ctx.
  STATUS_OK(PromptAttention(good, q.get(), k.get(), v.get(), 60, 4, out.get(), 0));
  CUDA_OK(cudaDeviceSynchronize());
  // Pages (the field named in each message).
  GuardedArray<int> tab(std::vector<int>(4, 0));
  auto paged_error = [&](const KvPages& pages, int seq, int p0, int n, const char* field) {
    const absl::Status st =
        PromptAttention(good, q.get(), k.get(), v.get(), p0, n, out.get(), 0, pages, seq);
    CAPTURE(field);
    CHECK(st.code() == absl::StatusCode::kInvalidArgument);
    CHECK_MESSAGE(st.message().find(field) != std::string::npos, st.ToString());
  };
  paged_error({tab.get(), 4, 3}, 0, 0, 4, "block_shift");
  paged_error({tab.get(), 1, 11}, 0, 0, 4, "block_shift");
  paged_error({tab.get(), 0, 4}, 0, 0, 4, "max_blocks");
  paged_error({tab.get(), 4, 4}, -1, 0, 4, "seq");
  paged_error({tab.get(), 4, 4}, 0, 61, 4, "n_ctx");  // 61 + 4 > 64
  paged_error({tab.get(), 3, 4}, 0, 0, 4, "n_ctx");   // 3 blocks of 16 reach 48 < 64
  // 4 blocks of 16 reach n_ctx 64: the boundary is fine (every entry names block 0,
  // k's first 4 x 16 rows).
  STATUS_OK(
      PromptAttention(good, q.get(), k.get(), v.get(), 60, 4, out.get(), 0, {tab.get(), 4, 4}, 0));
  CUDA_OK(cudaDeviceSynchronize());
}

}  // namespace
}  // namespace dpl::kernels
