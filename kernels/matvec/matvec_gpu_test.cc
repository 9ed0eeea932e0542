// GPU tests of the matvec kernels (tags gpu, manual): every type and layout
// against a float64 CPU reference built from formats::DequantizeRow, the
// dpl-vs-raw bitwise gate of every type with planes, grouped launches vs one
// launch per matrix (bitwise), the fused norm/SwiGLU quantization, fused
// bias/residual, the token-tiled variant vs the single-token kernel, and
// sentinels after every output.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <array>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "formats/dequant.h"
#include "kernels/cuda_handles.h"
#include "kernels/device_tuning.h"
#include "kernels/matvec/matvec.h"
#include "kernels/matvec/matvec_kernels.h"
#include "kernels/gpu_test.h"
#include "kernels/matvec/dev_matrix.h"
#include "kernels/matvec/matvec_test_util.h"

namespace dpl::kernels {
namespace {

using testing::NormErr;

using formats::GgmlType;
using formats::TensorLayout;
using testutil::HostMatrix;
using DevFloats = testing::GuardedArray<float>;

using testutil::DevMatrix;

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

bool IsQuantized(GgmlType t) {
  return t != GgmlType::kF32 && t != GgmlType::kF16 && t != GgmlType::kBF16;
}

// Every block type the GPU runs, and whether it has a dpl layout.
struct TypeInfo {
  GgmlType type;
  bool dpl;
};
constexpr TypeInfo kBlockTypes[] = {
    {GgmlType::kQ8_0, true},   {GgmlType::kQ4_0, true},  {GgmlType::kQ4_1, true},
    {GgmlType::kQ5_0, true},   {GgmlType::kQ5_1, true},  {GgmlType::kIQ4_NL, true},
    {GgmlType::kQ2_K, true},   {GgmlType::kQ3_K, true},  {GgmlType::kQ4_K, false},
    {GgmlType::kQ5_K, false},  {GgmlType::kQ6_K, true},  {GgmlType::kIQ4_XS, true},
};

// The plan of `w` on this GPU.
MatVecPlan PlanFor(const WeightMatrix& w) {
  const absl::StatusOr<DecodeTuning> tuning = DecodeTuningForDevice();
  REQUIRE_MESSAGE(tuning.ok(), tuning.status().ToString());
  const absl::StatusOr<MatVecPlan> plan = PlanMatVec(w, *tuning);
  REQUIRE_MESSAGE(plan.ok(), plan.status().ToString());
  return *plan;
}

// y = W x for n_tokens tokens as the decoder runs it: quantize x when the
// kernel needs it, then RunMatVec.
absl::Status Run(const WeightMatrix& w, const MatVecPlan& plan, const float* x, int64_t n_tokens,
                 float* y, const float* bias, const float* residual, MatVecScratch* scratch) {
  MatVecIo io;
  io.x = x;
  io.n_tokens = n_tokens;
  io.y = y;
  io.bias = bias;
  io.residual = residual;
  if (UsesQuantizedActivations(plan.kernel)) {
    if (scratch == nullptr) return absl::InvalidArgumentError("quantized kernel without a scratch");
    DPL_RETURN_IF_ERROR(QuantizeActivations(x, w.n_cols, n_tokens, scratch, nullptr));
    io.qx = scratch;
  }
  return RunMatVec(w, plan, io, nullptr);
}

std::string GeometryName(const MatVecGeometry& g) {
  return absl::StrCat("tile", g.token_tile, " ks", g.ksplit, " d", g.depth, g.pipe ? " pipe" : "");
}

// The planned decode geometry first, then every compiled single-token one.
std::vector<MatVecGeometry> AllDecodeGeometries(const MatVecPlan& plan) {
  std::vector<MatVecGeometry> all = {plan.decode};
  for (int ks : {1, 2, 4, 8}) {
    for (int depth : {1, 2, 4}) {
      for (bool pipe : {false, true}) {
        const MatVecGeometry g{1, ks, depth, pipe};
        if (IsCompiledGeometry(g)) all.push_back(g);
      }
    }
  }
  return all;
}

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
  MatVecPlan plan = PlanFor(dm.w);
  // The planned geometry, then every compiled single-token geometry.
  for (const MatVecGeometry& g : AllDecodeGeometries(plan)) {
    plan.decode = g;
    STATUS_OK(Run(dm.w, plan, dx.get(), 1, dy.get(), nullptr, nullptr, scratch));
    const std::vector<float> y = dy.Download();
    for (float v : y) REQUIRE(std::isfinite(v));
    const double err = NormErr(y.data(), ref);
    const std::string name =
        absl::StrCat(MatVecKernelName(plan.kernel), " ", c.n_rows, "x", c.n_cols, " stride ",
                     m.row_stride, " ", GeometryName(g));
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
  DeviceBuffer<uint8_t> mem;
  MatVecScratch s;
  // f16_max: the most tokens its f16 copy holds (the f16 form's wide launch past 64).
  explicit ScratchHolder(int64_t f16_max = kMmaMaxTokens) {
    const absl::StatusOr<uint64_t> bytes = MatVecScratchBytes(32768, 512, f16_max);
    REQUIRE_MESSAGE(bytes.ok(), bytes.status().ToString());
    absl::StatusOr<DeviceBuffer<uint8_t>> m = DeviceBuffer<uint8_t>::Allocate(*bytes);
    REQUIRE_MESSAGE(m.ok(), m.status().ToString());
    mem = std::move(*m);
    s = MatVecScratchIn(mem.get(), 32768, 512, f16_max);
  }
};

TEST_CASE("matvec: every type vs float64 reference, sentinels intact") {
  ScratchHolder sh;
  std::vector<Case> cases = {
      {GgmlType::kF32, TensorLayout::kRaw, 67, 99, 0},       // scalar path (n_cols % 4 != 0)
      {GgmlType::kF32, TensorLayout::kRaw, 301, 512, 0},
      {GgmlType::kF32, TensorLayout::kRaw, 1000, 4096, 16},
      {GgmlType::kF16, TensorLayout::kRaw, 67, 100, 0},      // scalar path
      {GgmlType::kF16, TensorLayout::kRaw, 301, 896, 0},
      {GgmlType::kF16, TensorLayout::kRaw, 513, 3584, 0},
      {GgmlType::kBF16, TensorLayout::kRaw, 67, 100, 0},     // scalar path
      {GgmlType::kBF16, TensorLayout::kRaw, 513, 3584, 0},
      // Large row counts (every k-split/depth variant runs on each case).
      {GgmlType::kF32, TensorLayout::kRaw, 8451, 64, 0},
      {GgmlType::kF16, TensorLayout::kRaw, 8453, 128, 0},
  };
  // Every block type and layout: one block per row, odd block counts,
  // realistic widths, a padded stride, and many rows.
  for (const TypeInfo& t : kBlockTypes) {
    const bool k256 = formats::TraitsOf(t.type).block_elems == 256;
    for (TensorLayout l : {TensorLayout::kRaw, TensorLayout::kDpl}) {
      if (l == TensorLayout::kDpl && !t.dpl) continue;
      if (k256) {
        for (const Case& c : {Case{t.type, l, 67, 256, 0}, Case{t.type, l, 203, 1280, 0},
                              Case{t.type, l, 301, 3584, 16}, Case{t.type, l, 61, 18944, 0},
                              Case{t.type, l, 8459, 512, 0}}) {
          cases.push_back(c);
        }
      } else {
        for (const Case& c : {Case{t.type, l, 129, 32, 0}, Case{t.type, l, 67, 96, 0},
                              Case{t.type, l, 301, 896, 16}, Case{t.type, l, 1003, 4864, 0},
                              Case{t.type, l, 8455, 96, 0}}) {
          cases.push_back(c);
        }
      }
    }
  }
  for (const Case& c : cases) {
    CAPTURE(formats::TraitsOf(c.type).name);
    CAPTURE(static_cast<int>(c.layout));
    CAPTURE(c.n_rows);
    CAPTURE(c.n_cols);
    CheckCase(c, &sh.s);
  }
}

TEST_CASE("matvec: dpl and raw layouts give bit-identical outputs, for every type with planes") {
  ScratchHolder sh;
  for (const TypeInfo& t : kBlockTypes) {
    if (!t.dpl) continue;
    const bool k256 = formats::TraitsOf(t.type).block_elems == 256;
    const std::vector<std::array<int64_t, 2>> shapes =
        k256 ? std::vector<std::array<int64_t, 2>>{{67, 256}, {301, 3584}, {203, 1280}, {64, 18944}, {1000, 5120}, {8461, 768}}
             : std::vector<std::array<int64_t, 2>>{{129, 32}, {67, 96}, {301, 3584}, {64, 18944}, {8461, 800}};
    for (const auto& s : shapes) {
      const HostMatrix dpl = testutil::RandomMatrix(t.type, TensorLayout::kDpl, s[0], s[1], 0, 777 + s[0]);
      const HostMatrix raw = testutil::RawTwin(dpl);
      DevMatrix ddpl(dpl), draw(raw);
      MatVecPlan pdpl = PlanFor(ddpl.w), praw = PlanFor(draw.w);
      REQUIRE(pdpl.decode == praw.decode);  // the layouts must take the same geometry
      // Both on the int8 forms: the f16 mma form reads q6_K in the dpl layout
      // only (a raw twin keeps the int8 form), so from its threshold on the
      // two layouts multiply different activations (f16 vs int8 blocks).
      pdpl.mma_f16_min_tokens = praw.mma_f16_min_tokens = 0;
      for (int64_t n_tokens : {int64_t{1}, int64_t{5}, int64_t{40}}) {
        // Tokens > 1 run the prompt geometry (or the mma form, 5 and 40 tokens
        // in one and five n8 tiles): the decode loop runs once for them.
        std::vector<MatVecGeometry> geometries = AllDecodeGeometries(pdpl);
        if (n_tokens > 1) geometries.resize(1);
        for (const MatVecGeometry& g : geometries) {
          pdpl.decode = praw.decode = g;
          const std::vector<float> x = RandomX(s[1] * n_tokens, 5 + s[1]);
          DevFloats dx(s[1] * n_tokens), ya(s[0] * n_tokens), yb(s[0] * n_tokens);
          dx.Upload(x);
          STATUS_OK(Run(ddpl.w, pdpl, dx.get(), n_tokens, ya.get(), nullptr, nullptr, &sh.s));
          STATUS_OK(Run(draw.w, praw, dx.get(), n_tokens, yb.get(), nullptr, nullptr, &sh.s));
          const std::vector<float> a = ya.Download(), b = yb.Download();
          for (float v : a) REQUIRE(std::isfinite(v));
          const bool same = std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
          std::printf("[bitwise] %s dpl vs raw %ldx%ld tokens %ld %s: %s\n",
                      std::string(formats::TraitsOf(t.type).name).c_str(), static_cast<long>(s[0]),
                      static_cast<long>(s[1]), static_cast<long>(n_tokens), GeometryName(g).c_str(),
                      same ? "identical" : "DIFFERENT");
          CHECK_MESSAGE(same, formats::TraitsOf(t.type).name << " dpl vs raw differ at " << s[0]
                                                             << "x" << s[1] << " tokens " << n_tokens
                                                             << " " << GeometryName(g));
        }
      }
    }
  }
}

// Q, K, V of one launch (and gate/up) against a launch per matrix with the
// group's plan: the grid only moves the row blocks, so the bits are equal.
TEST_CASE("matvec: a grouped launch equals one launch per matrix, bit for bit") {
  ScratchHolder sh;
  const absl::StatusOr<DecodeTuning> tuning = DecodeTuningForDevice();
  REQUIRE(tuning.ok());
  struct Group {
    std::vector<std::pair<GgmlType, TensorLayout>> types;
    std::vector<int64_t> rows;
    int64_t n_cols;
    size_t launches;  // what PlanMatVecGroups plans on the H200
  };
  const Group groups[] = {
      {{{GgmlType::kQ4_K, TensorLayout::kRaw}, {GgmlType::kQ4_K, TensorLayout::kRaw}, {GgmlType::kQ6_K, TensorLayout::kDpl}},
       {3584, 512, 512}, 3584, 2},  // a 7B Q4_K_M layer's Q, K, V: two launches
      {{{GgmlType::kQ4_K, TensorLayout::kRaw}, {GgmlType::kQ4_K, TensorLayout::kRaw}, {GgmlType::kQ6_K, TensorLayout::kDpl}},
       {5120, 1024, 1024}, 5120, 1},  // a 14B layer's: one mixed launch, k-split 2
      {{{GgmlType::kQ6_K, TensorLayout::kRaw}, {GgmlType::kQ4_K, TensorLayout::kRaw}, {GgmlType::kQ4_K, TensorLayout::kRaw}},
       {1029, 5120, 1024}, 5120, 1},  // raw q6_K last, a partial row block, k-split 2
      {{{GgmlType::kQ4_K, TensorLayout::kRaw}, {GgmlType::kQ6_K, TensorLayout::kDpl}}, {2048, 1001}, 512, 1},  // k-split 4
      {{{GgmlType::kQ8_0, TensorLayout::kDpl}, {GgmlType::kQ8_0, TensorLayout::kDpl}, {GgmlType::kQ8_0, TensorLayout::kDpl}},
       {1024, 256, 256}, 512, 1},
      {{{GgmlType::kQ5_K, TensorLayout::kRaw}, {GgmlType::kQ5_K, TensorLayout::kRaw}}, {1536, 1536}, 512, 1},  // gate, up
      {{{GgmlType::kF16, TensorLayout::kRaw}, {GgmlType::kF16, TensorLayout::kRaw}, {GgmlType::kF16, TensorLayout::kRaw}},
       {67, 13, 301}, 896, 1},
  };
  for (const Group& gr : groups) {
    const int64_t n_cols = gr.n_cols;
    std::vector<HostMatrix> hm;
    std::vector<std::unique_ptr<DevMatrix>> dm;
    std::vector<WeightMatrix> ws;
    for (size_t i = 0; i < gr.types.size(); ++i) {
      hm.push_back(testutil::RandomMatrix(gr.types[i].first, gr.types[i].second, gr.rows[i], n_cols, 0, 90 + i));
      dm.push_back(std::make_unique<DevMatrix>(hm.back()));
      ws.push_back(dm.back()->w);
    }
    const absl::StatusOr<std::vector<MatVecGroupPlan>> plans = PlanMatVecGroups(ws, *tuning);
    REQUIRE(plans.ok());
    for (int64_t n_tokens : {int64_t{1}, int64_t{3}}) {
      const std::vector<float> x = RandomX(n_cols * n_tokens, 91);
      DevFloats dx(n_cols * n_tokens);
      dx.Upload(x);
      std::vector<std::unique_ptr<DevFloats>> grouped, alone, bias;
      for (size_t i = 0; i < ws.size(); ++i) {
        grouped.push_back(std::make_unique<DevFloats>(gr.rows[i] * n_tokens));
        alone.push_back(std::make_unique<DevFloats>(gr.rows[i] * n_tokens));
        bias.push_back(std::make_unique<DevFloats>(gr.rows[i]));
        bias.back()->Upload(RandomX(gr.rows[i], 92 + i));
      }
      for (const MatVecGroupPlan& g : *plans) {
        MatVecIo io;
        io.x = dx.get();
        io.n_tokens = n_tokens;
        if (UsesQuantizedActivations(g.plan.kernel)) {
          STATUS_OK(QuantizeActivations(dx.get(), n_cols, n_tokens, &sh.s, nullptr));
          io.qx = &sh.s;
        }
        std::vector<const WeightMatrix*> members;
        std::vector<MatVecOut> outs;
        for (int i : g.members) {
          members.push_back(&ws[i]);
          outs.push_back({grouped[i]->get(), bias[i]->get(), nullptr});
        }
        STATUS_OK(RunMatVecGroup(members, g.plan, outs, io, nullptr));
        for (size_t k = 0; k < g.members.size(); ++k) {
          // A mixed launch's last member alone: its own kernel, the group's geometry.
          MatVecPlan own = g.plan;
          own.mixed = false;
          if (g.plan.mixed && k + 1 == g.members.size()) own.kernel = g.plan.last_kernel;
          const int i = g.members[k];
          STATUS_OK(Run(ws[i], own, dx.get(), n_tokens, alone[i]->get(), bias[i]->get(), nullptr, &sh.s));
        }
      }
      for (size_t i = 0; i < ws.size(); ++i) {
        const std::vector<float> a = grouped[i]->Download(), b = alone[i]->Download();
        for (float v : a) REQUIRE(std::isfinite(v));
        CHECK_MESSAGE(std::memcmp(a.data(), b.data(), a.size() * 4) == 0,
                      "matrix " << i << " of a " << ws.size() << "-matrix group, tokens " << n_tokens);
      }
    }
    std::printf("[group] %zu matrices in %zu launches%s: grouped == separate\n", ws.size(),
                plans->size(), (*plans)[0].plan.mixed ? " (mixed)" : "");
    CHECK(plans->size() == gr.launches);
  }
}

// NormQuantizeActivations and SwiGluQuantizeActivations against float64
// norms/SwiGLU, and their int8 blocks against QuantizeActivations of their
// own float output (the same quantizer: bit for bit).
TEST_CASE("fused RMSNorm / SwiGLU + quantization") {
  ScratchHolder a, b;
  for (int n : {512, 3584, 5120}) {
    for (int rows : {1, 3}) {
      const float eps = 1e-6f;
      const std::vector<float> x = RandomX(int64_t{n} * rows, n + rows), w = RandomX(n, n + 7);
      DevFloats dx(int64_t{n} * rows), dw(n), dh(int64_t{n} * rows);
      dx.Upload(x);
      dw.Upload(w);
      STATUS_OK(NormQuantizeActivations(dx.get(), dw.get(), eps, n, rows, dh.get(), &a.s, nullptr));
      const std::vector<float> h = dh.Download();
      std::vector<double> ref(h.size());
      for (int r = 0; r < rows; ++r) {
        double ss = 0;
        for (int i = 0; i < n; ++i) ss += double(x[r * n + i]) * x[r * n + i];
        const double sc = 1.0 / std::sqrt(ss / n + eps);
        for (int i = 0; i < n; ++i) ref[r * n + i] = x[r * n + i] * sc * w[i];
      }
      const double err = NormErr(h.data(), ref);
      CHECK(err < 2e-6);
      STATUS_OK(QuantizeActivations(dh.get(), n, rows, &b.s, nullptr));
      const size_t nq = size_t(n) * rows, nb = nq / 32;
      std::vector<int8_t> qa(nq), qb(nq);
      std::vector<float> da(nb), db(nb), sa(nb), sb(nb);
      CUDA_OK(cudaMemcpy(qa.data(), a.s.q, nq, cudaMemcpyDeviceToHost));
      CUDA_OK(cudaMemcpy(qb.data(), b.s.q, nq, cudaMemcpyDeviceToHost));
      CUDA_OK(cudaMemcpy(da.data(), a.s.d, nb * 4, cudaMemcpyDeviceToHost));
      CUDA_OK(cudaMemcpy(db.data(), b.s.d, nb * 4, cudaMemcpyDeviceToHost));
      CUDA_OK(cudaMemcpy(sa.data(), a.s.s, nb * 4, cudaMemcpyDeviceToHost));
      CUDA_OK(cudaMemcpy(sb.data(), b.s.s, nb * 4, cudaMemcpyDeviceToHost));
      CHECK(qa == qb);
      CHECK(da == db);
      CHECK(sa == sb);
      std::printf("[fused] rmsnorm+quantize n=%d rows=%d: norm err %.2e, int8 blocks identical\n", n, rows, err);
    }
  }
  for (int n : {1536, 18944}) {
    const std::vector<float> g = RandomX(n, 3), u = RandomX(n, 4);
    DevFloats dg(n), du(n), dout(n);
    dg.Upload(g);
    du.Upload(u);
    STATUS_OK(SwiGluQuantizeActivations(dg.get(), du.get(), n, 1, dout.get(), &a.s, nullptr));
    const std::vector<float> got = dout.Download();
    std::vector<double> ref(n);
    for (int i = 0; i < n; ++i) ref[i] = g[i] / (1.0 + std::exp(-double(g[i]))) * u[i];
    const double err = NormErr(got.data(), ref);
    CHECK(err < 2e-6);
    STATUS_OK(QuantizeActivations(dout.get(), n, 1, &b.s, nullptr));
    std::vector<int8_t> qa(n), qb(n);
    CUDA_OK(cudaMemcpy(qa.data(), a.s.q, n, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(qb.data(), b.s.q, n, cudaMemcpyDeviceToHost));
    CHECK(qa == qb);
    // In place (g == gate), as the decoder runs it.
    STATUS_OK(SwiGluQuantizeActivations(dg.get(), du.get(), n, 1, dg.get(), &a.s, nullptr));
    CHECK(dg.Download() == got);
    std::printf("[fused] swiglu+quantize n=%d: err %.2e, int8 blocks identical, in place identical\n", n, err);
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
    const MatVecPlan plan = PlanFor(dm.w);
    STATUS_OK(Run(dm.w, plan, dx.get(), 1, y0.get(), nullptr, nullptr, &sh.s));
    STATUS_OK(Run(dm.w, plan, dx.get(), 1, y1.get(), db.get(), nullptr, &sh.s));
    STATUS_OK(Run(dm.w, plan, dx.get(), 1, y2.get(), db.get(), dr.get(), &sh.s));
    y3.Upload(res);  // in place: y = W x + y
    STATUS_OK(Run(dm.w, plan, dx.get(), 1, y3.get(), nullptr, y3.get(), &sh.s));
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

// Several tokens (the token tile, or for q4_K, q5_K, q6_K and q8_0 rows of
// whole 256-column blocks from 2 to kMmaMaxTokens tokens the int8 mma form)
// against the single-token kernel token by token: the same integer dots,
// float sums in another order. f32 matrices also on the deeper token tile
// (kF32WideTile, a MoE router's), a router's shape among them.
TEST_CASE("matvec: token-tiled variant equals the single-token kernel per token") {
  ScratchHolder sh;
  const Case cases[] = {
      {GgmlType::kQ4_K, TensorLayout::kRaw, 301, 3584, 0},
      {GgmlType::kQ4_K, TensorLayout::kRaw, 8459, 512, 0},
      {GgmlType::kQ5_K, TensorLayout::kRaw, 301, 3584, 0},
      {GgmlType::kQ5_K, TensorLayout::kRaw, 67, 256, 0},
      {GgmlType::kQ6_K, TensorLayout::kDpl, 203, 1280, 0},
      {GgmlType::kQ6_K, TensorLayout::kDpl, 8461, 768, 0},
      {GgmlType::kQ6_K, TensorLayout::kRaw, 67, 256, 0},
      {GgmlType::kQ8_0, TensorLayout::kRaw, 301, 896, 0},  // 3.5 blocks of 256: the token tile
      {GgmlType::kQ8_0, TensorLayout::kRaw, 301, 1280, 0},
      {GgmlType::kQ8_0, TensorLayout::kDpl, 8459, 512, 0},
      {GgmlType::kQ5_0, TensorLayout::kRaw, 67, 96, 0},
      {GgmlType::kF16, TensorLayout::kRaw, 301, 896, 0},
      {GgmlType::kF32, TensorLayout::kRaw, 67, 99, 0},
      {GgmlType::kF32, TensorLayout::kRaw, 128, 2048, 0},
  };
  for (const Case& c : cases) {
    for (int64_t n_tokens : {int64_t{2}, int64_t{13}, int64_t{33}, int64_t{64}, int64_t{512}}) {
      if (n_tokens == 512 && c.type != GgmlType::kQ4_K) continue;
      const bool mma = (c.type == GgmlType::kQ4_K || c.type == GgmlType::kQ5_K ||
                        c.type == GgmlType::kQ6_K || c.type == GgmlType::kQ8_0) &&
                       c.n_cols % 256 == 0;
      if ((n_tokens == 33 || n_tokens == 64) && !mma) continue;
      const HostMatrix m = testutil::RandomMatrix(c.type, c.layout, c.n_rows, c.n_cols, 0, 31);
      DevMatrix dm(m);
      const std::vector<float> x = RandomX(c.n_cols * n_tokens, 17);
      const std::vector<float> bias = RandomX(c.n_rows, 18), res = RandomX(c.n_rows * n_tokens, 19);
      DevFloats dx(c.n_cols * n_tokens), db(c.n_rows), dr(c.n_rows * n_tokens),
          ym(c.n_rows * n_tokens), ys(c.n_rows * n_tokens);
      dx.Upload(x);
      db.Upload(bias);
      dr.Upload(res);
      // The int8 forms, which share the single-token kernel's int8 activations
      // (the f16 form, on by default from some token count, multiplies f16
      // activations: its own test below checks it against float64).
      MatVecPlan plan = PlanFor(dm.w);
      plan.mma_f16_min_tokens = 0;
      std::vector<MatVecPlan> plans = {plan};
      if (plan.kernel == MatVecKernel::kF32) {
        plans.push_back(plan);
        plans.back().prompt = kF32WideTile;
      }
      for (int64_t t = 0; t < n_tokens; ++t) {
        STATUS_OK(Run(dm.w, plan, dx.get() + t * c.n_cols, 1, ys.get() + t * c.n_rows, db.get(),
                      dr.get() + t * c.n_rows, &sh.s));
      }
      const std::vector<float> b = ys.Download();
      const std::vector<double> bd(b.begin(), b.end());
      for (const MatVecPlan& pl : plans) {
        STATUS_OK(Run(dm.w, pl, dx.get(), n_tokens, ym.get(), db.get(), dr.get(), &sh.s));
        const std::vector<float> a = ym.Download();
        const double err = NormErr(a.data(), bd);
        const bool same = std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
        const bool wide = pl.prompt == kF32WideTile;
        std::printf("[multi] %-10s %ldx%ld tokens %3ld%s: err vs single-token %.3e (%s)\n",
                    std::string(formats::TraitsOf(c.type).name).c_str(), static_cast<long>(c.n_rows),
                    static_cast<long>(c.n_cols), static_cast<long>(n_tokens), wide ? " (wide tile)" : "",
                    err, same ? "bit-identical" : "differs");
        CHECK_MESSAGE(err < 1e-6, formats::TraitsOf(c.type).name << " tokens " << n_tokens << " wide " << wide);
      }
    }
  }
}

// The f16 forms' reference: the float64 product of the dequantized weights
// w (n_rows, n_cols) with each token's x rounded to f16 (what those forms
// read), plus bias and residual: (n_tokens, n_rows).
std::vector<double> RefF16X(const std::vector<float>& w, int64_t n_rows, int64_t n_cols, int64_t n_tokens,
                            const std::vector<float>& x, const std::vector<float>& bias,
                            const std::vector<float>& res) {
  std::vector<double> ref(static_cast<size_t>(n_rows * n_tokens));
  std::vector<double> xh(static_cast<size_t>(n_cols));
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int64_t i = 0; i < n_cols; ++i) {
      xh[i] = static_cast<double>(__half2float(__float2half_rn(x[t * n_cols + i])));
    }
    const std::vector<double> y = RefMatVec(w, n_rows, n_cols, xh.data());
    for (int64_t r = 0; r < n_rows; ++r) ref[t * n_rows + r] = y[r] + bias[r] + res[t * n_rows + r];
  }
  return ref;
}

// The f16 mma form (matvec_mma_f16.cu; q4_K, q5_K, q6_K dpl, q8_0 dpl) against the float64 product of
// the dequantized weights with x rounded to f16 (the activations it reads):
// what is left is the f16 rounding of each weight (one rounding of q s - m)
// and of d sc, d dmin, ~2-4e-4; the int8 form's int8 activations give ~4e-3
// against the same reference, so the gate also tells which form ran. Odd
// row and token counts, k-splits 1-8, bias and residual (in place), a
// grouped launch of two matrices equal to one launch each, bit for bit, the
// 3- and 4-CTA-a-SM variants up to 16 tokens, and the k splits summed in
// clusters equal to the sum kernel's, bit for bit.
TEST_CASE("matvec: the f16 mma form vs float64 reference, grouped == separate") {
  ScratchHolder sh;
  const Case cases[] = {
      {GgmlType::kQ4_K, TensorLayout::kRaw, 301, 3584, 0},    // 3 row blocks, 8 splits
      {GgmlType::kQ4_K, TensorLayout::kRaw, 8459, 512, 16},   // 67 row blocks, 4 splits, padded stride
      {GgmlType::kQ4_K, TensorLayout::kRaw, 67, 256, 0},      // one block a row, 2 splits
      {GgmlType::kQ4_K, TensorLayout::kRaw, 40000, 1280, 0},  // 313 row blocks, no split
      {GgmlType::kQ6_K, TensorLayout::kDpl, 203, 18944, 0},   // 74 blocks: d in 10 chunks of 8
      {GgmlType::kQ6_K, TensorLayout::kDpl, 8459, 768, 16},   // 3 blocks, padded stride
      {GgmlType::kQ6_K, TensorLayout::kDpl, 67, 256, 0},
      {GgmlType::kQ8_0, TensorLayout::kDpl, 301, 3584, 0},   // d plane chunks of 8 scales
      {GgmlType::kQ8_0, TensorLayout::kDpl, 8459, 768, 16},  // padded stride
      {GgmlType::kQ8_0, TensorLayout::kDpl, 67, 256, 0},
      {GgmlType::kQ5_K, TensorLayout::kRaw, 301, 3584, 0},   // 14 blocks: every sub-block's fifth bit
      {GgmlType::kQ5_K, TensorLayout::kRaw, 8459, 512, 16},  // padded stride
      {GgmlType::kQ5_K, TensorLayout::kRaw, 67, 256, 0},
  };
  for (const Case& c : cases) {
    const HostMatrix m = testutil::RandomMatrix(c.type, c.layout, c.n_rows, c.n_cols,
                                                c.extra_stride, 77 + c.n_rows);
    DevMatrix dm(m);
    const std::vector<float> w = Dequant(m);
    MatVecPlan p16 = PlanFor(dm.w), p8 = p16;
    REQUIRE(p16.mma_f16_min_tokens > 0);  // the form exists
    p16.mma_f16_min_tokens = 2;
    p8.mma_f16_min_tokens = 0;
    for (int64_t n_tokens : {int64_t{2}, int64_t{8}, int64_t{13}, int64_t{33}, int64_t{64}}) {
      const std::vector<float> x = RandomX(c.n_cols * n_tokens, 5 + n_tokens);
      const std::vector<float> bias = RandomX(c.n_rows, 6), res = RandomX(c.n_rows * n_tokens, 7);
      const std::vector<double> ref = RefF16X(w, c.n_rows, c.n_cols, n_tokens, x, bias, res);
      DevFloats dx(c.n_cols * n_tokens), db(c.n_rows), y16(c.n_rows * n_tokens),
          y8(c.n_rows * n_tokens), ya(c.n_rows * n_tokens), yb(c.n_rows * n_tokens);
      dx.Upload(x);
      db.Upload(bias);
      y16.Upload(res);  // residual in place: y = W x + bias + y
      y8.Upload(res);
      STATUS_OK(Run(dm.w, p16, dx.get(), n_tokens, y16.get(), db.get(), y16.get(), &sh.s));
      STATUS_OK(Run(dm.w, p8, dx.get(), n_tokens, y8.get(), db.get(), y8.get(), &sh.s));
      const std::vector<float> a = y16.Download(), b = y8.Download();
      for (float v : a) REQUIRE(std::isfinite(v));
      const double e16 = NormErr(a.data(), ref), e8 = NormErr(b.data(), ref);
      // The same matrix twice in one launch (two parts) against one launch.
      const WeightMatrix* ws[2] = {&dm.w, &dm.w};
      const MatVecOut outs[2] = {{ya.get(), nullptr, nullptr}, {yb.get(), nullptr, nullptr}};
      MatVecIo io;
      io.x = dx.get();
      io.qx = &sh.s;
      io.n_tokens = n_tokens;
      STATUS_OK(QuantizeActivations(dx.get(), c.n_cols, n_tokens, &sh.s, nullptr));
      STATUS_OK(RunMatVecGroup(ws, p16, outs, io, nullptr));
      DevFloats ys(c.n_rows * n_tokens);
      STATUS_OK(Run(dm.w, p16, dx.get(), n_tokens, ys.get(), nullptr, nullptr, &sh.s));
      const std::vector<float> ga = ya.Download(), gb = yb.Download(), one = ys.Download();
      const bool same = std::memcmp(ga.data(), one.data(), one.size() * 4) == 0 &&
                        std::memcmp(gb.data(), one.data(), one.size() * 4) == 0;
      std::printf("[f16 mma] %s %ldx%ld stride %ld tokens %2ld splits %d: err vs f16-x reference "
                  "%.2e (int8 form %.2e), grouped %s\n",
                  std::string(formats::TraitsOf(c.type).name).c_str(), static_cast<long>(c.n_rows), static_cast<long>(c.n_cols),
                  static_cast<long>(m.row_stride), static_cast<long>(n_tokens),
                  MmaF16Splits(c.n_rows, c.n_cols), e16, e8, same ? "== separate" : "DIFFERS");
      CHECK_MESSAGE(e16 < 1e-3, "f16 form err " << e16);
      CHECK_MESSAGE(e8 > 2 * e16, "the int8 form should carry the int8 activation error");
      CHECK(same);
      // The k splits added inside clusters of a row tile's CTAs
      // (MatVecPlan::mma_f16_cluster_sum): MmaSumSplits' additions in its
      // order, so its bits, alone (bias, residual in place) and grouped.
      {
        MatVecPlan pc = p16;
        pc.mma_f16_cluster_sum = 2;
        DevFloats yc(c.n_rows * n_tokens), yca(c.n_rows * n_tokens), ycb(c.n_rows * n_tokens);
        yc.Upload(res);
        STATUS_OK(Run(dm.w, pc, dx.get(), n_tokens, yc.get(), db.get(), yc.get(), &sh.s));
        const MatVecOut couts[2] = {{yca.get(), nullptr, nullptr}, {ycb.get(), nullptr, nullptr}};
        STATUS_OK(RunMatVecGroup(ws, pc, couts, io, nullptr));
        CHECK(std::memcmp(yc.Download().data(), a.data(), a.size() * 4) == 0);
        CHECK(std::memcmp(yca.Download().data(), one.data(), one.size() * 4) == 0);
        CHECK(std::memcmp(ycb.Download().data(), one.data(), one.size() * 4) == 0);
      }
      // More CTAs a SM up to 16 tokens (DecodeTuning::mma_f16_small_ctas_per_sm):
      // three with whole-block stages walk k as two do (the same bits); four
      // with half-block stages may split k elsewhere (the reference's error).
      if (n_tokens <= 16) {
        for (int ctas : {3, 4}) {
          MatVecPlan pc = p16;
          pc.mma_f16_small_ctas = ctas;
          pc.num_sms = 0;  // every launch a big grid, however few its CTAs
          DevFloats yc(c.n_rows * n_tokens);
          yc.Upload(res);
          STATUS_OK(Run(dm.w, pc, dx.get(), n_tokens, yc.get(), db.get(), yc.get(), &sh.s));
          const std::vector<float> got = yc.Download();
          const double ec = NormErr(got.data(), ref);
          CAPTURE(ctas);
          CHECK_MESSAGE(ec < 1e-3, "f16 form, " << ctas << " CTAs a SM, err " << ec);
          if (ctas == 3) CHECK(std::memcmp(got.data(), a.data(), a.size() * 4) == 0);
          pc.mma_f16_cluster_sum = 2;  // and its splits in clusters: the same bits
          yc.Upload(res);
          STATUS_OK(Run(dm.w, pc, dx.get(), n_tokens, yc.get(), db.get(), yc.get(), &sh.s));
          CHECK(std::memcmp(yc.Download().data(), got.data(), got.size() * 4) == 0);
        }
      }
      // A scratch whose owner wants no f16 copy for this many tokens gets
      // none written, and the plan falls back to the int8 form: its bits.
      sh.s.f16_min_tokens = n_tokens + 1;
      DevFloats yoff(c.n_rows * n_tokens);
      yoff.Upload(res);
      STATUS_OK(Run(dm.w, p16, dx.get(), n_tokens, yoff.get(), db.get(), yoff.get(), &sh.s));
      sh.s.f16_min_tokens = 2;
      CHECK(std::memcmp(yoff.Download().data(), b.data(), b.size() * 4) == 0);
    }
  }
}

// The f16 form's wide launch (MatVecPlan::mma_f16_max_tokens: more than
// 64 tokens, one CTA a 64-token tile of a row tile, k split alike for the
// group and summed in clusters): against the float64 reference as above,
// and each 64-token tile bit for bit equal to a 64-token launch of those
// tokens alone with as many splits (the same kernel, the same sums in the
// same order: the tile's offset is all that differs), k unsplit and split,
// bias and residual (in place) included; unsplit, a grouped launch equal
// to one launch a matrix; and with mma_f16_max_tokens below the count, the
// token tile (the dp4a kernel's int8 error) instead.
TEST_CASE("matvec: the f16 form's wide launch == its 64-token tiles, vs float64 reference") {
  ScratchHolder sh(512);
  const Case cases[] = {
      {GgmlType::kQ4_K, TensorLayout::kRaw, 301, 3584, 0},   // 3 row blocks
      {GgmlType::kQ4_K, TensorLayout::kRaw, 1000, 512, 16},  // 8 row blocks, padded stride
      {GgmlType::kQ6_K, TensorLayout::kDpl, 203, 2304, 0},   // d in 2 chunks of 8
      {GgmlType::kQ8_0, TensorLayout::kDpl, 301, 1024, 0},
      {GgmlType::kQ5_K, TensorLayout::kRaw, 130, 768, 16},
  };
  for (const Case& c : cases) {
    const HostMatrix m = testutil::RandomMatrix(c.type, c.layout, c.n_rows, c.n_cols,
                                                c.extra_stride, 91 + c.n_rows);
    DevMatrix dm(m);
    const std::vector<float> w = Dequant(m);
    MatVecPlan wide = PlanFor(dm.w);
    REQUIRE(wide.mma_f16_min_tokens > 0);  // the form exists
    wide.mma_f16_max_tokens = 512;
    wide.mma_f16_cluster_sum = 2;
    wide.mma_f16_wide_split = true;
    MatVecPlan wide1 = wide;  // k unsplit
    wide1.mma_f16_wide_split = false;
    for (int64_t n_tokens : {int64_t{65}, int64_t{130}, int64_t{200}, int64_t{512}}) {
      if (n_tokens == 512 && c.type != GgmlType::kQ4_K) continue;  // the reference's time
      CAPTURE(n_tokens);
      const std::vector<float> x = RandomX(c.n_cols * n_tokens, 15 + n_tokens);
      const std::vector<float> bias = RandomX(c.n_rows, 16), res = RandomX(c.n_rows * n_tokens, 17);
      const std::vector<double> ref = RefF16X(w, c.n_rows, c.n_cols, n_tokens, x, bias, res);
      DevFloats dx(c.n_cols * n_tokens), db(c.n_rows), yw(c.n_rows * n_tokens), yt(c.n_rows * n_tokens);
      dx.Upload(x);
      db.Upload(bias);
      yw.Upload(res);  // residual in place: y = W x + bias + y
      yt.Upload(res);
      STATUS_OK(Run(dm.w, wide, dx.get(), n_tokens, yw.get(), db.get(), yw.get(), &sh.s));
      const std::vector<float> got = yw.Download();
      for (float v : got) REQUIRE(std::isfinite(v));
      const double err = NormErr(got.data(), ref);
      // Tile by tile: 64 tokens each (the last padded with more random
      // tokens, whose outputs are not compared), on 64-token launches that
      // split k as the wide launch did: its target over its token tiles.
      const int64_t tiles = (n_tokens + 63) / 64;
      auto tiles_equal = [&](const MatVecPlan& pw, const std::vector<float>& yw_got) {
        MatVecPlan tile = pw;
        tile.mma_f16_min_tokens = 2;
        tile.mma_f16_target_ctas_wide =
            pw.mma_f16_wide_split ? static_cast<int>((pw.mma_f16_target_ctas_wide + tiles - 1) / tiles) : 1;
        bool eq = true;
        for (int64_t t0 = 0; t0 < n_tokens; t0 += 64) {
          const int64_t n = std::min<int64_t>(64, n_tokens - t0);
          std::vector<float> xt = RandomX(c.n_cols * 64, 18);
          std::vector<float> rt = RandomX(c.n_rows * 64, 19);
          std::copy(x.begin() + t0 * c.n_cols, x.begin() + (t0 + n) * c.n_cols, xt.begin());
          std::copy(res.begin() + t0 * c.n_rows, res.begin() + (t0 + n) * c.n_rows, rt.begin());
          DevFloats dxt(c.n_cols * 64), dyt(c.n_rows * 64);
          dxt.Upload(xt);
          dyt.Upload(rt);
          STATUS_OK(Run(dm.w, tile, dxt.get(), 64, dyt.get(), db.get(), dyt.get(), &sh.s));
          const std::vector<float> yt64 = dyt.Download();
          eq = eq && std::memcmp(yt64.data(), yw_got.data() + t0 * c.n_rows, n * c.n_rows * 4) == 0;
        }
        return eq;
      };
      const int splits = MmaF16Splits(c.n_rows, c.n_cols,
                                      static_cast<int>((wide.mma_f16_target_ctas_wide + tiles - 1) / tiles));
      const bool same = tiles_equal(wide, got);
      DevFloats yu(c.n_rows * n_tokens);
      yu.Upload(res);
      STATUS_OK(Run(dm.w, wide1, dx.get(), n_tokens, yu.get(), db.get(), yu.get(), &sh.s));
      const std::vector<float> got1 = yu.Download();
      const double err1 = NormErr(got1.data(), ref);
      const bool same1 = tiles_equal(wide1, got1);
      // The same matrix twice in one wide launch (two parts) against one
      // launch, k unsplit (a group's splits follow its rows, so split ones differ).
      const WeightMatrix* ws[2] = {&dm.w, &dm.w};
      DevFloats ya(c.n_rows * n_tokens), yb(c.n_rows * n_tokens), ys(c.n_rows * n_tokens);
      const MatVecOut outs[2] = {{ya.get(), nullptr, nullptr}, {yb.get(), nullptr, nullptr}};
      MatVecIo io;
      io.x = dx.get();
      io.qx = &sh.s;
      io.n_tokens = n_tokens;
      STATUS_OK(QuantizeActivations(dx.get(), c.n_cols, n_tokens, &sh.s, nullptr));
      STATUS_OK(RunMatVecGroup(ws, wide1, outs, io, nullptr));
      STATUS_OK(Run(dm.w, wide1, dx.get(), n_tokens, ys.get(), nullptr, nullptr, &sh.s));
      const std::vector<float> one = ys.Download();
      const bool grouped = std::memcmp(ya.Download().data(), one.data(), one.size() * 4) == 0 &&
                           std::memcmp(yb.Download().data(), one.data(), one.size() * 4) == 0;
      // Below the count: the token tile on int8 activations.
      MatVecPlan narrow = wide;
      narrow.mma_f16_max_tokens = static_cast<int>(n_tokens) - 1;
      STATUS_OK(Run(dm.w, narrow, dx.get(), n_tokens, yt.get(), db.get(), yt.get(), &sh.s));
      const std::vector<float> tt = yt.Download();
      const double e8 = NormErr(tt.data(), ref);
      std::printf("[f16 wide] %s %ldx%ld stride %ld tokens %3ld: err vs f16-x reference %.2e with k split %d "
                  "ways, %.2e unsplit (token tile %.2e), tiles %s / %s, grouped %s\n",
                  std::string(formats::TraitsOf(c.type).name).c_str(), static_cast<long>(c.n_rows),
                  static_cast<long>(c.n_cols), static_cast<long>(m.row_stride), static_cast<long>(n_tokens), err,
                  splits, err1, e8, same ? "== 64-token launches" : "DIFFER", same1 ? "==" : "DIFFER",
                  grouped ? "== separate" : "DIFFERS");
      CHECK_MESSAGE(err < 1e-3, "wide f16 form err " << err);
      CHECK_MESSAGE(err1 < 1e-3, "wide f16 form, k unsplit, err " << err1);
      CHECK_MESSAGE(e8 > 2 * err, "the token tile should carry the int8 activation error");
      CHECK(same);
      CHECK(same1);
      CHECK(grouped);
    }
  }
}

TEST_CASE("matvec: every k-split agrees on the same matrix") {
  ScratchHolder sh;
  const Case cases[] = {
      {GgmlType::kQ4_K, TensorLayout::kRaw, 301, 3584, 0},
      {GgmlType::kQ6_K, TensorLayout::kDpl, 67, 18944, 0},
      {GgmlType::kQ8_0, TensorLayout::kRaw, 67, 96, 0},
      {GgmlType::kF16, TensorLayout::kRaw, 301, 896, 0},
  };
  for (const Case& c : cases) {
    const HostMatrix m = testutil::RandomMatrix(c.type, c.layout, c.n_rows, c.n_cols, 0, 55);
    DevMatrix dm(m);
    const std::vector<float> x = RandomX(c.n_cols, 56);
    DevFloats dx(c.n_cols), ya(c.n_rows), yb(c.n_rows);
    dx.Upload(x);
    MatVecPlan plan = PlanFor(dm.w);
    plan.decode = {1, 1, 2, false};
    STATUS_OK(Run(dm.w, plan, dx.get(), 1, ya.get(), nullptr, nullptr, &sh.s));
    const std::vector<float> a = ya.Download();
    for (int ks : {2, 4, 8}) {
      plan.decode = ks != 4 ? MatVecGeometry{1, ks, 1, true} : MatVecGeometry{1, ks, 2, false};
      STATUS_OK(Run(dm.w, plan, dx.get(), 1, yb.get(), nullptr, nullptr, &sh.s));
      const std::vector<float> b = yb.Download();
      std::vector<double> bd(b.begin(), b.end());
      const double e = NormErr(a.data(), bd);
      std::printf("[ksplit] %-10s %ldx%ld: k-split 1 vs %d normalized diff %.3e\n",
                  std::string(formats::TraitsOf(c.type).name).c_str(),
                  static_cast<long>(c.n_rows), static_cast<long>(c.n_cols), ks, e);
      CHECK(e < 1e-6);
    }
  }
}

TEST_CASE("matvec: errors name the problem") {
  ScratchHolder sh;
  DevFloats buf(1024);
  WeightMatrix w;
  w.data = buf.get();
  w.type = GgmlType::kIQ2_XXS;
  w.n_rows = 4;
  w.n_cols = 256;
  w.row_stride = 66;
  const absl::StatusOr<DecodeTuning> tuning = DecodeTuningForDevice();
  REQUIRE(tuning.ok());
  absl::Status st = PlanMatVec(w, *tuning).status();
  CHECK(!st.ok());
  CHECK(st.ToString().find("iq2_xxs") != std::string::npos);
  w.type = GgmlType::kQ4_K;
  w.n_cols = 256;
  w.row_stride = 144;
  const MatVecPlan plan = PlanFor(w);
  MatVecIo io;
  io.x = buf.get();
  io.y = buf.get();
  st = RunMatVec(w, plan, io, nullptr);  // no quantized activations given
  CHECK(!st.ok());
  CHECK(st.ToString().find("quantized activations") != std::string::npos);
  MatVecPlan bad = plan;
  bad.decode = {1, 3, 2, false};
  io.qx = &sh.s;
  STATUS_OK(QuantizeActivations(buf.get(), 256, 1, &sh.s, nullptr));
  st = RunMatVec(w, bad, io, nullptr);
  CHECK(!st.ok());
  CHECK(st.ToString().find("not compiled") != std::string::npos);
  // A 64-row matrix splits k on the mma form (MmaSplits: 8 ways at 3584
  // columns): a scratch without room for the partials is refused before
  // anything launches (its weights are never read).
  DevFloats x4(3584 * 4), y4(64 * 4);
  WeightMatrix short_w = w;
  short_w.data = x4.get();
  short_w.n_rows = 64;
  short_w.n_cols = 3584;
  short_w.row_stride = 14 * 144;
  REQUIRE(MmaSplits(short_w.n_rows, short_w.n_cols) > 1);
  STATUS_OK(QuantizeActivations(x4.get(), 3584, 4, &sh.s, nullptr));
  MatVecScratch bare = sh.s;
  bare.partial = nullptr;
  bare.partial_floats = 0;
  MatVecIo io4;
  io4.x = x4.get();
  io4.qx = &bare;
  io4.n_tokens = 4;
  io4.y = y4.get();
  st = RunMatVec(short_w, PlanFor(short_w), io4, nullptr);
  CHECK(!st.ok());
  CHECK(st.ToString().find("k-split partials") != std::string::npos);
}

}  // namespace
}  // namespace dpl::kernels
