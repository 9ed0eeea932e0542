// GPU tests of the matvec kernels (tags gpu, manual): every type and layout
// against a float64 CPU reference built from formats::DequantizeRow, the
// dpl-vs-raw q6_K bitwise gate, fused bias/residual, the token-tiled variant
// vs the single-token kernel, and sentinels after every output.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "formats/dequant.h"
#include "kernels/matvec/matvec.h"
#include "kernels/matvec/matvec_kernels.h"
#include "kernels/matvec/matvec_test_util.h"

namespace dpl::kernels {
namespace {

using formats::GgmlType;
using formats::TensorLayout;
using testutil::HostMatrix;

#define CUDA_OK(call) REQUIRE_MESSAGE((call) == cudaSuccess, #call)
#define STATUS_OK(expr)                                   \
  do {                                                    \
    const absl::Status st_ = (expr);                      \
    REQUIRE_MESSAGE(st_.ok(), st_.ToString());            \
  } while (0)

constexpr int kSentinels = 16;
constexpr uint32_t kSentinelBits = 0x7fc0dead;  // a NaN no kernel produces

// A device float buffer of n values followed by kSentinels sentinel words.
struct DevFloats {
  float* p = nullptr;
  int64_t n = 0;
  explicit DevFloats(int64_t n_) : n(n_) {
    CUDA_OK(cudaMalloc(&p, static_cast<size_t>(n + kSentinels) * sizeof(float)));
    std::vector<uint32_t> s(static_cast<size_t>(n + kSentinels), kSentinelBits);
    CUDA_OK(cudaMemcpy(p, s.data(), s.size() * 4, cudaMemcpyHostToDevice));
  }
  ~DevFloats() { cudaFree(p); }
  void Upload(const std::vector<float>& v) {
    REQUIRE(static_cast<int64_t>(v.size()) == n);
    CUDA_OK(cudaMemcpy(p, v.data(), v.size() * 4, cudaMemcpyHostToDevice));
  }
  std::vector<float> Download() const {
    std::vector<uint32_t> all(static_cast<size_t>(n + kSentinels));
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaMemcpy(all.data(), p, all.size() * 4, cudaMemcpyDeviceToHost));
    for (int i = 0; i < kSentinels; ++i) {
      REQUIRE_MESSAGE(all[static_cast<size_t>(n + i)] == kSentinelBits, "sentinel " << i
                                                                                    << " overwritten");
    }
    std::vector<float> v(static_cast<size_t>(n));
    std::memcpy(v.data(), all.data(), v.size() * 4);
    return v;
  }
};

struct DevMatrix {
  void* p = nullptr;
  WeightMatrix w;
  explicit DevMatrix(const HostMatrix& m) {
    // 256 extra bytes: tensors in the runtime's weight blob are 256-aligned
    // and followed by other tensors.
    CUDA_OK(cudaMalloc(&p, m.bytes.size() + 256));
    CUDA_OK(cudaMemcpy(p, m.bytes.data(), m.bytes.size(), cudaMemcpyHostToDevice));
    w.data = p;
    w.type = m.type;
    w.layout = m.layout;
    w.n_rows = m.n_rows;
    w.n_cols = m.n_cols;
    w.row_stride = m.row_stride;
  }
  ~DevMatrix() { cudaFree(p); }
};

std::vector<float> RandomX(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& v : x) {
    v = normal(rng);
    if (v == 0.f) v = 0.25f;  // never zeros
  }
  return x;
}

// Dequantized weights (n_rows, n_cols) via the project's CPU dequantizer.
std::vector<float> Dequant(const HostMatrix& m) {
  std::vector<float> w(static_cast<size_t>(m.n_rows * m.n_cols));
  for (int64_t r = 0; r < m.n_rows; ++r) {
    const absl::Status st = formats::DequantizeRow(m.type, m.layout, m.bytes.data() + r * m.row_stride,
                                                   static_cast<uint64_t>(m.n_cols),
                                                   w.data() + r * m.n_cols);
    REQUIRE_MESSAGE(st.ok(), st.ToString());
  }
  return w;
}

// ref[r] = sum_i w[r, i] * x[i] in float64.
std::vector<double> RefMatVec(const std::vector<float>& w, int64_t n_rows, int64_t n_cols,
                              const double* x) {
  std::vector<double> y(static_cast<size_t>(n_rows));
  for (int64_t r = 0; r < n_rows; ++r) {
    double acc = 0;
    const float* wr = w.data() + r * n_cols;
    for (int64_t i = 0; i < n_cols; ++i) acc += static_cast<double>(wr[i]) * x[i];
    y[static_cast<size_t>(r)] = acc;
  }
  return y;
}

double NormErr(const float* got, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = static_cast<double>(got[i]) - ref[i];
    num += d * d;
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / (den > 0 ? den : 1e-300));
}

bool IsQuantized(GgmlType t) { return t != GgmlType::kF32 && t != GgmlType::kF16; }

// One choice of single-token kernel: variant -1 default, 0 legacy, 1 v2;
// ks 0 = the default geometry (then depth/pipe are ignored).
struct DecodeConfig {
  int variant;
  int ks;
  int depth;
  int pipe;
  std::string Name() const {
    const char* v = variant < 0 ? "default" : (variant == 0 ? "legacy" : "v2");
    if (ks == 0) return absl::StrCat(v, " geometry");
    return absl::StrCat(v, " ks", ks, " d", depth, pipe > 0 ? " pipe" : "");
  }
};

std::vector<DecodeConfig> AllDecodeConfigs() {
  std::vector<DecodeConfig> c = {{-1, 0, 0, -1}, {0, 0, 0, -1}, {0, 1, 2, -1},
                                 {0, 1, 4, -1},  {0, 4, 2, -1}, {0, 4, 4, -1}};
  for (int ks : {1, 2, 4, 8}) {
    for (int depth : {1, 2, 4}) {
      for (int pipe : {0, 1}) c.push_back({1, ks, depth, pipe});
    }
  }
  return c;
}

// Sets DecodeOverrideForTesting for one scope.
struct ScopedDecode {
  explicit ScopedDecode(const DecodeConfig& c) {
    DecodeOverride& o = DecodeOverrideForTesting();
    o.variant = c.variant;
    o.ksplit = c.variant == 1 ? c.ks : 0;
    o.depth = c.variant == 1 ? c.depth : 0;
    o.pipe = c.pipe;
  }
  ~ScopedDecode() { DecodeOverrideForTesting() = DecodeOverride{}; }
};

struct Case {
  GgmlType type;
  TensorLayout layout;
  int64_t n_rows, n_cols, extra_stride;
};

// Runs one case single-token and reports normalized errors vs exact x and vs
// the CPU emulation of the quantized x.
void CheckCase(const Case& c, MatVecScratch* scratch) {
  const HostMatrix m = testutil::RandomMatrix(c.type, c.layout, c.n_rows, c.n_cols,
                                              c.extra_stride, 1234 + c.n_rows * 7 + c.n_cols);
  DevMatrix dm(m);
  const std::vector<float> x = RandomX(c.n_cols, 99 + c.n_cols);
  DevFloats dx(c.n_cols), dy(c.n_rows);
  dx.Upload(x);
  const std::vector<float> w = Dequant(m);
  std::vector<double> xd(x.begin(), x.end());
  const std::vector<double> ref = RefMatVec(w, c.n_rows, c.n_cols, xd.data());
  const std::vector<double> xq = testutil::QuantizedX(x.data(), c.n_cols);
  const std::vector<double> ref_q = RefMatVec(w, c.n_rows, c.n_cols, xq.data());
  MatVecKernel k;
  STATUS_OK(PlanMatVec(dm.w, &k));
  // The default path (MatVec: plan + quantize + run) with the default and the
  // legacy single-token kernel, then every k-split / load-depth variant of
  // both kernels on the same quantized x.
  const std::vector<DecodeConfig> configs = AllDecodeConfigs();
  for (const DecodeConfig& cfg : configs) {
    ScopedDecode scoped(cfg);
    if (cfg.ks == 0) {
      STATUS_OK(MatVec(dm.w, dx.p, dy.p, nullptr, nullptr, scratch, nullptr));
    } else {
      MatVecIo io;
      io.x = dx.p;
      io.qx = scratch;
      io.y = dy.p;
      io.force_ksplit = cfg.ks;
      io.force_depth = cfg.depth;
      STATUS_OK(RunMatVec(dm.w, k, io, nullptr));
    }
    const std::vector<float> y = dy.Download();
    for (float v : y) REQUIRE(std::isfinite(v));
    const double err = NormErr(y.data(), ref);
    const std::string name =
        absl::StrCat(MatVecKernelName(k), " ", c.n_rows, "x", c.n_cols, " stride ", m.row_stride,
                     " ", cfg.Name());
    if (!IsQuantized(c.type)) {
      std::printf("[matvec] %-40s err vs exact %.3e\n", name.c_str(), err);
      CHECK_MESSAGE(err < (c.type == GgmlType::kF32 ? 1e-5 : 1e-3), name << " err " << err);
      continue;
    }
    const double err_q = NormErr(y.data(), ref_q);
    std::printf("[matvec] %-40s err vs exact x %.3e, vs quantized x %.3e\n", name.c_str(), err,
                err_q);
    CHECK_MESSAGE(err_q < 1e-5, name << " err vs quantized-x reference " << err_q);
    CHECK_MESSAGE(err < 2e-2, name << " err vs exact reference " << err);
  }
}

struct ScratchHolder {
  MatVecScratch s;
  ScratchHolder() {
    const absl::Status st = AllocateMatVecScratch(32768, 512, &s);
    REQUIRE_MESSAGE(st.ok(), st.ToString());
  }
  ~ScratchHolder() { FreeMatVecScratch(&s); }
};

TEST_CASE("matvec: every type vs float64 reference, sentinels intact") {
  ScratchHolder sh;
  const Case cases[] = {
      {GgmlType::kF32, TensorLayout::kRaw, 67, 99, 0},       // scalar path (n_cols % 4 != 0)
      {GgmlType::kF32, TensorLayout::kRaw, 301, 512, 0},
      {GgmlType::kF32, TensorLayout::kRaw, 1000, 4096, 16},
      {GgmlType::kF16, TensorLayout::kRaw, 67, 100, 0},      // scalar path
      {GgmlType::kF16, TensorLayout::kRaw, 301, 896, 0},
      {GgmlType::kF16, TensorLayout::kRaw, 513, 3584, 0},
      {GgmlType::kQ8_0, TensorLayout::kRaw, 129, 32, 0},     // 1 block per row
      {GgmlType::kQ8_0, TensorLayout::kRaw, 67, 96, 0},      // 102-byte rows: 2-byte aligned
      {GgmlType::kQ8_0, TensorLayout::kRaw, 301, 896, 0},
      {GgmlType::kQ8_0, TensorLayout::kRaw, 1003, 4864, 2},
      {GgmlType::kQ5_0, TensorLayout::kRaw, 129, 32, 0},
      {GgmlType::kQ5_0, TensorLayout::kRaw, 67, 96, 0},      // 66-byte rows
      {GgmlType::kQ5_0, TensorLayout::kRaw, 301, 896, 0},
      {GgmlType::kQ5_0, TensorLayout::kRaw, 1003, 4864, 0},
      {GgmlType::kQ4_K, TensorLayout::kRaw, 67, 256, 0},
      {GgmlType::kQ4_K, TensorLayout::kRaw, 301, 3584, 0},
      {GgmlType::kQ4_K, TensorLayout::kRaw, 1003, 4608, 16},
      {GgmlType::kQ6_K, TensorLayout::kRaw, 67, 256, 0},     // nbe 1 (odd)
      {GgmlType::kQ6_K, TensorLayout::kRaw, 301, 3584, 0},
      {GgmlType::kQ6_K, TensorLayout::kRaw, 203, 1280, 0},   // nbe 5
      {GgmlType::kQ6_K, TensorLayout::kDplQ6K, 67, 256, 0},
      {GgmlType::kQ6_K, TensorLayout::kDplQ6K, 301, 3584, 0},
      {GgmlType::kQ6_K, TensorLayout::kDplQ6K, 203, 1280, 0},
      {GgmlType::kQ6_K, TensorLayout::kDplQ6K, 61, 18944, 0},
      // Large row counts (every k-split/depth variant runs on each case).
      {GgmlType::kF32, TensorLayout::kRaw, 8451, 64, 0},
      {GgmlType::kF16, TensorLayout::kRaw, 8453, 128, 0},
      {GgmlType::kQ8_0, TensorLayout::kRaw, 8455, 96, 0},
      {GgmlType::kQ5_0, TensorLayout::kRaw, 8457, 96, 0},
      {GgmlType::kQ4_K, TensorLayout::kRaw, 8459, 512, 0},
      {GgmlType::kQ6_K, TensorLayout::kRaw, 8461, 256, 0},
      {GgmlType::kQ6_K, TensorLayout::kDplQ6K, 8461, 768, 0},
  };
  for (const Case& c : cases) {
    CAPTURE(c.n_rows);
    CAPTURE(c.n_cols);
    CheckCase(c, &sh.s);
  }
}

TEST_CASE("matvec: q6_K dpl and raw layouts give bit-identical outputs") {
  ScratchHolder sh;
  const int64_t shapes[][2] = {{67, 256},   {301, 3584},  {203, 1280},
                               {64, 18944}, {1000, 5120}, {8461, 768}};
  for (const auto& s : shapes) {
    const HostMatrix dpl = testutil::RandomMatrix(GgmlType::kQ6_K, TensorLayout::kDplQ6K, s[0],
                                                  s[1], 0, 777 + s[0]);
    HostMatrix raw{GgmlType::kQ6_K, TensorLayout::kRaw, s[0], s[1], s[1] / 256 * 210, dpl.raw, {}};
    DevMatrix ddpl(dpl), draw(raw);
    for (int64_t n_tokens : {int64_t{1}, int64_t{13}}) {
     for (const DecodeConfig& cfg : AllDecodeConfigs()) {
      if (n_tokens > 1 && cfg.variant != -1) continue;
      ScopedDecode scoped(cfg);
      const std::vector<float> x = RandomX(s[1] * n_tokens, 5 + s[1]);
      DevFloats dx(s[1] * n_tokens), ya(s[0] * n_tokens), yb(s[0] * n_tokens);
      dx.Upload(x);
      STATUS_OK(MatMulTokens(ddpl.w, dx.p, n_tokens, ya.p, nullptr, nullptr, &sh.s, nullptr));
      STATUS_OK(MatMulTokens(draw.w, dx.p, n_tokens, yb.p, nullptr, nullptr, &sh.s, nullptr));
      const std::vector<float> a = ya.Download(), b = yb.Download();
      for (float v : a) REQUIRE(std::isfinite(v));
      const bool same = std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
      std::printf("[bitwise] q6_K dpl vs raw %ldx%ld tokens %ld %s: %s\n", static_cast<long>(s[0]),
                  static_cast<long>(s[1]), static_cast<long>(n_tokens), cfg.Name().c_str(),
                  same ? "identical" : "DIFFERENT");
      CHECK_MESSAGE(same, "dpl vs raw differ at " << s[0] << "x" << s[1] << " tokens "
                                                  << n_tokens << " " << cfg.Name());
     }
    }
  }
}

TEST_CASE("matvec: fused bias and residual (also in place)") {
  ScratchHolder sh;
  for (GgmlType type : {GgmlType::kQ4_K, GgmlType::kF32, GgmlType::kQ8_0}) {
    const int64_t n_rows = 301, n_cols = 3584;
    const HostMatrix m =
        testutil::RandomMatrix(type, TensorLayout::kRaw, n_rows, n_cols, 0, 4242);
    DevMatrix dm(m);
    const std::vector<float> x = RandomX(n_cols, 1), bias = RandomX(n_rows, 2),
                             res = RandomX(n_rows, 3);
    DevFloats dx(n_cols), db(n_rows), dr(n_rows), y0(n_rows), y1(n_rows), y2(n_rows),
        y3(n_rows);
    dx.Upload(x);
    db.Upload(bias);
    dr.Upload(res);
    STATUS_OK(MatVec(dm.w, dx.p, y0.p, nullptr, nullptr, &sh.s, nullptr));
    STATUS_OK(MatVec(dm.w, dx.p, y1.p, db.p, nullptr, &sh.s, nullptr));
    STATUS_OK(MatVec(dm.w, dx.p, y2.p, db.p, dr.p, &sh.s, nullptr));
    y3.Upload(res);  // in place: y = W x + y
    STATUS_OK(MatVec(dm.w, dx.p, y3.p, nullptr, y3.p, &sh.s, nullptr));
    const std::vector<float> a = y0.Download(), b = y1.Download(), c = y2.Download(),
                             d = y3.Download();
    double eb = 0, ec = 0, ed = 0, nn = 0;
    for (int64_t r = 0; r < n_rows; ++r) {
      // The kernel adds bias then residual to the same dot product.
      const float wb = a[r] + bias[r];
      const float wc = wb + res[r];
      const float wd = a[r] + res[r];
      eb += std::fabs(b[r] - wb);
      ec += std::fabs(c[r] - wc);
      ed += std::fabs(d[r] - wd);
      nn += std::fabs(wc);
    }
    std::printf("[fused] %s bias |diff| %.3e, bias+residual %.3e, in-place residual %.3e\n",
                std::string(formats::TraitsOf(type).name).c_str(), eb, ec, ed);
    CHECK(eb == 0);
    CHECK(ec == 0);
    CHECK(ed == 0);
    CHECK(nn > 0);
  }
}

TEST_CASE("matvec: token-tiled variant equals the single-token kernel per token") {
  ScratchHolder sh;
  const Case cases[] = {
      {GgmlType::kQ4_K, TensorLayout::kRaw, 301, 3584, 0},
      {GgmlType::kQ4_K, TensorLayout::kRaw, 8459, 512, 0},
      {GgmlType::kQ6_K, TensorLayout::kDplQ6K, 203, 1280, 0},
      {GgmlType::kQ6_K, TensorLayout::kDplQ6K, 8461, 768, 0},
      {GgmlType::kQ6_K, TensorLayout::kRaw, 67, 256, 0},
      {GgmlType::kQ8_0, TensorLayout::kRaw, 301, 896, 0},
      {GgmlType::kQ5_0, TensorLayout::kRaw, 67, 96, 0},
      {GgmlType::kF16, TensorLayout::kRaw, 301, 896, 0},
      {GgmlType::kF32, TensorLayout::kRaw, 67, 99, 0},
  };
  for (const Case& c : cases) {
    for (int64_t n_tokens : {int64_t{2}, int64_t{13}, int64_t{512}}) {
      if (n_tokens == 512 && c.type != GgmlType::kQ4_K) continue;
      const HostMatrix m = testutil::RandomMatrix(c.type, c.layout, c.n_rows, c.n_cols, 0, 31);
      DevMatrix dm(m);
      const std::vector<float> x = RandomX(c.n_cols * n_tokens, 17);
      const std::vector<float> bias = RandomX(c.n_rows, 18), res = RandomX(c.n_rows * n_tokens, 19);
      DevFloats dx(c.n_cols * n_tokens), db(c.n_rows), dr(c.n_rows * n_tokens),
          ym(c.n_rows * n_tokens), ys(c.n_rows * n_tokens);
      dx.Upload(x);
      db.Upload(bias);
      dr.Upload(res);
      STATUS_OK(MatMulTokens(dm.w, dx.p, n_tokens, ym.p, db.p, dr.p, &sh.s, nullptr));
      for (int64_t t = 0; t < n_tokens; ++t) {
        STATUS_OK(MatVec(dm.w, dx.p + t * c.n_cols, ys.p + t * c.n_rows, db.p,
                         dr.p + t * c.n_rows, &sh.s, nullptr));
      }
      const std::vector<float> a = ym.Download(), b = ys.Download();
      std::vector<double> bd(b.begin(), b.end());
      const double err = NormErr(a.data(), bd);
      const bool same = std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
      std::printf("[multi] %-10s %ldx%ld tokens %3ld: err vs single-token %.3e (%s)\n",
                  std::string(formats::TraitsOf(c.type).name).c_str(),
                  static_cast<long>(c.n_rows), static_cast<long>(c.n_cols),
                  static_cast<long>(n_tokens), err, same ? "bit-identical" : "differs");
      CHECK_MESSAGE(err < 1e-6, formats::TraitsOf(c.type).name << " tokens " << n_tokens);
    }
  }
}

TEST_CASE("matvec: both k-split settings agree on the same matrix") {
  ScratchHolder sh;
  const Case cases[] = {
      {GgmlType::kQ4_K, TensorLayout::kRaw, 301, 3584, 0},
      {GgmlType::kQ6_K, TensorLayout::kDplQ6K, 67, 18944, 0},
      {GgmlType::kQ8_0, TensorLayout::kRaw, 67, 96, 0},
      {GgmlType::kF16, TensorLayout::kRaw, 301, 896, 0},
  };
  for (const Case& c : cases) {
    const HostMatrix m = testutil::RandomMatrix(c.type, c.layout, c.n_rows, c.n_cols, 0, 55);
    DevMatrix dm(m);
    const std::vector<float> x = RandomX(c.n_cols, 56);
    DevFloats dx(c.n_cols), ya(c.n_rows), yb(c.n_rows);
    dx.Upload(x);
    MatVecKernel k;
    STATUS_OK(PlanMatVec(dm.w, &k));
    if (UsesQuantizedActivations(k)) STATUS_OK(QuantizeActivations(dx.p, c.n_cols, 1, &sh.s, nullptr));
    MatVecIo io;
    io.x = dx.p;
    io.qx = &sh.s;
    io.y = ya.p;
    io.force_ksplit = 1;
    {
      ScopedDecode legacy({0, 0, 0, -1});
      STATUS_OK(RunMatVec(dm.w, k, io, nullptr));
    }
    io.y = yb.p;
    io.force_ksplit = kKSplit;
    {
      ScopedDecode legacy({0, 0, 0, -1});
      STATUS_OK(RunMatVec(dm.w, k, io, nullptr));
    }
    for (int ks : {2, 8}) {
      DevFloats yc(c.n_rows);
      ScopedDecode scoped({1, ks, 2, 1});
      io.y = yc.p;
      io.force_ksplit = 0;
      STATUS_OK(RunMatVec(dm.w, k, io, nullptr));
      const std::vector<float> a = ya.Download(), cc = yc.Download();
      std::vector<double> cd(cc.begin(), cc.end());
      const double e = NormErr(a.data(), cd);
      std::printf("[ksplit] %-10s %ldx%ld: k-split 1 vs v2 %d normalized diff %.3e\n",
                  std::string(formats::TraitsOf(c.type).name).c_str(),
                  static_cast<long>(c.n_rows), static_cast<long>(c.n_cols), ks, e);
      CHECK(e < 1e-6);
    }
    const std::vector<float> a = ya.Download(), b = yb.Download();
    std::vector<double> bd(b.begin(), b.end());
    const double err = NormErr(a.data(), bd);
    std::printf("[ksplit] %-10s %ldx%ld: k-split 1 vs %d normalized diff %.3e\n",
                std::string(formats::TraitsOf(c.type).name).c_str(), static_cast<long>(c.n_rows),
                static_cast<long>(c.n_cols), kKSplit, err);
    CHECK(err < 1e-6);
  }
}

TEST_CASE("matvec: errors name the problem") {
  ScratchHolder sh;
  DevFloats buf(1024);
  WeightMatrix w;
  w.data = buf.p;
  w.type = GgmlType::kQ4_0;
  w.n_rows = 4;
  w.n_cols = 32;
  w.row_stride = 18;
  absl::Status st = MatVec(w, buf.p, buf.p, nullptr, nullptr, &sh.s, nullptr);
  CHECK(!st.ok());
  CHECK(st.ToString().find("q4_0") != std::string::npos);
  w.type = GgmlType::kQ4_K;
  w.n_cols = 256;
  w.row_stride = 144;
  st = MatVec(w, buf.p, buf.p, nullptr, nullptr, nullptr, nullptr);
  CHECK(!st.ok());
  CHECK(st.ToString().find("scratch") != std::string::npos);
}

}  // namespace
}  // namespace dpl::kernels
