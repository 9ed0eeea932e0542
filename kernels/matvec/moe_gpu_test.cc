// GPU tests of the mixture-of-experts kernels (tags gpu, manual):
//   - RouteTopK against a float64 CPU softmax / top-k / renormalization (the
//     reference model's rule), with exact ties, near-ties and k = 1, 2, 8 of
//     8 and 128 experts;
//   - ExpertMatVec for every expert kernel (q4_K, q5_K, q6_K raw and dpl,
//     q8_0 raw and dpl) at 256x512, 512x256, 768x2048, 2048x768 (one-block
//     rows: 256 columns), for 1, 3 and 16 token rows whose routes share
//     experts, against float64 products of the CPU-dequantized expert
//     weights with the same int8-rounded activations; a grouped launch (gate
//     and up) gives the bits of one launch per tensor;
//   - RouteGroups against a stable CPU sort (skewed and out-of-range ids,
//     1 to 1024 experts, up to 3000 routes, tiles of 8 / 16 / 64), and
//     ExpertMatVecGrouped against float64 and ExpertMatVec (every type; runs
//     of several tiles; the same bits at every tile size);
//   - MoeCombine against float64;
//   - PlanExperts refuses a type without an expert kernel.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "formats/dequant.h"
#include "kernels/cuda_handles.h"
#include "kernels/device_tuning.h"
#include "kernels/gpu_test.h"
#include "kernels/matvec/matvec_test_util.h"
#include "kernels/matvec/matvec_plan.h"
#include "kernels/matvec/moe.h"

namespace dpl::kernels {
namespace {

using formats::GgmlType;
using formats::TensorLayout;
using testing::GuardedArray;
using testing::NormErr;
using testutil::HostMatrix;

DecodeTuning Tuning() {
  const absl::StatusOr<DecodeTuning> t = DecodeTuningForDevice();
  REQUIRE_MESSAGE(t.ok(), t.status().ToString());
  return *t;
}

std::vector<float> RandomNormal(int64_t n, uint64_t seed, float sd = 1.f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.f, sd);
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& v : x) v = normal(rng);
  return x;
}

// The reference model's routing of one row (runtime/reference: softmax in
// float64, partial sort by probability descending then id ascending, the
// picked probabilities renormalized with the sum clamped at 2^-14).
void RefRoute(const float* l, int n_expert, int k, std::vector<int>* ids, std::vector<double>* w) {
  std::vector<double> p(l, l + n_expert);
  const double top = *std::max_element(p.begin(), p.end());
  double z = 0;
  for (double& r : p) z += (r = std::exp(r - top));
  for (double& r : p) r /= z;
  std::vector<int> order(static_cast<size_t>(n_expert));
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + k, order.end(),
                    [&](int a, int b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
  double sum = 0;
  for (int j = 0; j < k; ++j) sum += p[order[j]];
  sum = std::max(sum, 6.103515625e-5);
  ids->assign(order.begin(), order.begin() + k);
  w->resize(static_cast<size_t>(k));
  for (int j = 0; j < k; ++j) (*w)[j] = p[order[j]] / sum;
}

TEST_CASE("RouteTopK follows the float64 softmax / top-k / renormalization") {
  for (int n_expert : {8, 128}) {
    for (int k : {1, 2, 8}) {
      for (int n_rows : {1, 3, 16, 37}) {
        CAPTURE(n_expert);
        CAPTURE(k);
        CAPTURE(n_rows);
        std::vector<float> logits = RandomNormal(int64_t{n_rows} * n_expert, 1000 + n_expert * 31 + k * 7 + n_rows);
        // Row 1: exact ties everywhere (every expert the same logit): the
        // lowest ids win, weights 1/k.
        if (n_rows > 1) std::fill(logits.begin() + n_expert, logits.begin() + 2 * n_expert, 0.75f);
        // Row 2: near-ties at the k-th place: pairs one ulp apart, and an
        // exact tie between a high and a low id.
        if (n_rows > 2) {
          float* r = logits.data() + 2 * n_expert;
          for (int e = 0; e < n_expert; ++e) r[e] = -1.0f - 0.01f * e;
          r[n_expert - 1] = 2.0f;
          r[3] = 2.0f;  // exact tie with the last expert: 3 first
          r[5] = std::nextafter(1.5f, 2.0f);
          r[n_expert - 2] = 1.5f;  // one ulp below expert 5
        }
        GuardedArray<float> d_logits(logits);
        GuardedArray<int> d_ids(static_cast<size_t>(n_rows) * k);
        GuardedArray<float> d_w(static_cast<size_t>(n_rows) * k);
        GuardedArray<int> d_copy(static_cast<size_t>(n_rows) * k);
        // The ids copy (the decoder's route log for tests) on every other shape.
        const bool copy = n_rows % 2 == 1;
        STATUS_OK(RouteTopK(d_logits.get(), n_rows, n_expert, k, d_ids.get(), d_w.get(), nullptr, false,
                            copy ? d_copy.get() : nullptr));
        const std::vector<int> ids = d_ids.Download();
        const std::vector<float> w = d_w.Download();
        if (copy) CHECK(d_copy.Download() == ids);
        for (int t = 0; t < n_rows; ++t) {
          CAPTURE(t);
          std::vector<int> want_ids;
          std::vector<double> want_w;
          RefRoute(logits.data() + int64_t{t} * n_expert, n_expert, k, &want_ids, &want_w);
          double wsum = 0;
          for (int j = 0; j < k; ++j) {
            CAPTURE(j);
            CHECK(ids[t * k + j] == want_ids[j]);
            CHECK(std::fabs(w[t * k + j] - want_w[j]) < 2e-6);
            wsum += w[t * k + j];
          }
          CHECK(std::fabs(wsum - 1.0) < 1e-5);
        }
        if (n_rows > 2) {  // the planted ties, spelled out
          CHECK(ids[2 * k] == 3);
          if (k >= 2) CHECK(ids[2 * k + 1] == n_expert - 1);
          if (k >= 8) {
            CHECK(ids[2 * k + 2] == 5);
            CHECK(ids[2 * k + 3] == n_expert - 2);
          }
        }
        if (n_rows > 1) {
          for (int j = 0; j < k; ++j) {
            CHECK(ids[k + j] == j);
            CHECK(std::fabs(w[k + j] - 1.0 / k) < 1e-6);
          }
        }
      }
    }
  }
}

TEST_CASE("RouteTopK refuses bad shapes") {
  GuardedArray<float> l(16);
  GuardedArray<int> ids(16);
  GuardedArray<float> w(16);
  CHECK(!RouteTopK(l.get(), 1, 8, 9, ids.get(), w.get(), nullptr, false).ok());
  CHECK(!RouteTopK(l.get(), 1, 8, 0, ids.get(), w.get(), nullptr, false).ok());
  CHECK(!RouteTopK(l.get(), 1, kMoeMaxExperts + 1, 1, ids.get(), w.get(), nullptr, false).ok());
}

// Every expert kernel: type and layout.
struct ExpertType {
  GgmlType type;
  TensorLayout layout;
};
constexpr ExpertType kExpertTypes[] = {
    {GgmlType::kQ4_K, TensorLayout::kRaw}, {GgmlType::kQ5_K, TensorLayout::kRaw},
    {GgmlType::kQ6_K, TensorLayout::kRaw}, {GgmlType::kQ6_K, TensorLayout::kDpl},
    {GgmlType::kQ8_0, TensorLayout::kRaw}, {GgmlType::kQ8_0, TensorLayout::kDpl},
};

// A host expert tensor (n_expert experts of (rows, cols) back to back) on
// the device, with its plan.
struct DevExperts {
  HostMatrix host;  // (n_expert * rows, cols)
  std::vector<float> deq;  // (n_expert * rows, cols) dequantized
  void* dev = nullptr;
  ExpertWeights w;
  ExpertPlan plan;
  ~DevExperts() { cudaFree(dev); }
};

void MakeExperts(ExpertType t, int n_expert, int64_t rows, int64_t cols, uint64_t seed, DevExperts* e) {
  e->host = testutil::RandomMatrix(t.type, t.layout, n_expert * rows, cols, 0, seed);
  e->deq.resize(static_cast<size_t>(n_expert * rows * cols));
  for (int64_t r = 0; r < n_expert * rows; ++r) {
    const absl::Status st = formats::DequantizeRow(t.type, t.layout, e->host.bytes.data() + r * e->host.row_stride,
                                                   static_cast<uint64_t>(cols), e->deq.data() + r * cols);
    REQUIRE_MESSAGE(st.ok(), st.ToString());
  }
  CUDA_OK(cudaMalloc(&e->dev, e->host.bytes.size()));
  CUDA_OK(cudaMemcpy(e->dev, e->host.bytes.data(), e->host.bytes.size(), cudaMemcpyHostToDevice));
  e->w.w.data = e->dev;
  e->w.w.type = t.type;
  e->w.w.layout = t.layout;
  e->w.w.n_rows = rows;
  e->w.w.n_cols = cols;
  e->w.w.row_stride = e->host.row_stride;
  e->w.expert_stride = rows * e->host.row_stride;
  e->w.n_expert = n_expert;
  const absl::StatusOr<ExpertPlan> p = PlanExperts(e->w, Tuning());
  REQUIRE_MESSAGE(p.ok(), p.status().ToString());
  e->plan = *p;
}

// y = W_e x for expert e of `ex`, x in float64.
std::vector<double> RefExpert(const DevExperts& ex, int e, const double* x) {
  const int64_t rows = ex.w.w.n_rows, cols = ex.w.w.n_cols;
  std::vector<double> y(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    const float* wr = ex.deq.data() + (e * rows + r) * cols;
    double acc = 0;
    for (int64_t i = 0; i < cols; ++i) acc += static_cast<double>(wr[i]) * x[i];
    y[static_cast<size_t>(r)] = acc;
  }
  return y;
}

// x_rows random rows of cols values as the decoder prepares them: RMSNorm
// (weights 1) and int8 blocks in one launch (MoeNormQuantize); h, the
// normed floats, back on the host for the references.
struct NormedActs {
  void* mem = nullptr;
  MoeActs acts;
  std::vector<float> h;
  NormedActs(int x_rows, int64_t cols, uint64_t seed) {
    const std::vector<float> x = RandomNormal(int64_t{x_rows} * cols, seed);
    GuardedArray<float> d_x(x), d_h(x.size()), d_ones(std::vector<float>(static_cast<size_t>(cols), 1.f));
    CUDA_OK(cudaMalloc(&mem, MoeActsBytes(int64_t{x_rows} * cols)));
    acts = MoeActsIn(mem, int64_t{x_rows} * cols);
    STATUS_OK(MoeNormQuantize(d_x.get(), d_ones.get(), 1e-6f, static_cast<int>(cols), x_rows, d_h.get(), acts,
                              nullptr, false));
    h = d_h.Download();
  }
  ~NormedActs() { cudaFree(mem); }
  NormedActs(const NormedActs&) = delete;
  NormedActs& operator=(const NormedActs&) = delete;
};

TEST_CASE("ExpertMatVec follows float64 for every expert type, shape and row count") {
  constexpr int kExperts = 8, kUsed = 2;
  const int64_t shapes[][2] = {{256, 512}, {512, 256}, {768, 2048}, {2048, 768}};  // rows x cols
  int seed = 0;
  for (const ExpertType& t : kExpertTypes) {
    for (const auto& s : shapes) {
      const int64_t rows = s[0], cols = s[1];
      CAPTURE(formats::TraitsOf(t.type).name);
      CAPTURE(static_cast<int>(t.layout));
      CAPTURE(rows);
      CAPTURE(cols);
      // Two tensors of one shape (gate and up) for the grouped launch.
      DevExperts a, b;
      MakeExperts(t, kExperts, rows, cols, 500 + ++seed, &a);
      MakeExperts(t, kExperts, rows, cols, 900 + seed, &b);
      for (int n : {1, 3, 16}) {
        CAPTURE(n);
        const int n_routes = n * kUsed;
        // Rows 2i and 2i + 1 take the same experts; the last expert (7) and
        // expert 0 are among them.
        std::vector<int> ids(static_cast<size_t>(n_routes));
        for (int r = 0; r < n_routes; ++r) ids[r] = ((r / kUsed) / 2 * 3 + (r % kUsed) * 7) % kExperts;
        GuardedArray<int> d_ids(ids);
        for (int x_div : {kUsed, 1}) {  // gate/up: a token row per k routes; down: a row per route
          CAPTURE(x_div);
          const int x_rows = n_routes / x_div;
          // The activations as the decoder makes them: RMSNorm (weights 1)
          // and int8 blocks in one launch; h comes back for the reference.
          const NormedActs na(x_rows, cols, 77 + n + x_div + seed);
          const MoeActs& acts = na.acts;
          const std::vector<float>& h = na.h;
          GuardedArray<float> ya(static_cast<size_t>(n_routes * rows)), yb(ya.size()), ya1(ya.size()),
              yb1(ya.size());
          const ExpertOut both[2] = {{&a.w, &a.plan, ya.get()}, {&b.w, &b.plan, yb.get()}};
          STATUS_OK(ExpertMatVec(both, acts, static_cast<int>(cols), n_routes, x_div, d_ids.get(), nullptr, false));
          const ExpertOut one_a[1] = {{&a.w, &a.plan, ya1.get()}};
          const ExpertOut one_b[1] = {{&b.w, &b.plan, yb1.get()}};
          STATUS_OK(ExpertMatVec(one_a, acts, static_cast<int>(cols), n_routes, x_div, d_ids.get(), nullptr, false));
          STATUS_OK(ExpertMatVec(one_b, acts, static_cast<int>(cols), n_routes, x_div, d_ids.get(), nullptr, false));
          const std::vector<float> ga = ya.Download(), gb = yb.Download(), ga1 = ya1.Download(),
                                   gb1 = yb1.Download();
          CHECK(std::memcmp(ga.data(), ga1.data(), ga.size() * 4) == 0);
          CHECK(std::memcmp(gb.data(), gb1.data(), gb.size() * 4) == 0);
          double worst_q = 0, worst_exact = 0;
          for (int r = 0; r < n_routes; ++r) {
            const int xr = r / x_div;
            const std::vector<double> xq = testutil::QuantizedX(h.data() + int64_t{xr} * cols, cols);
            const std::vector<double> xe(h.begin() + int64_t{xr} * cols, h.begin() + int64_t{xr + 1} * cols);
            for (const auto& [ex, got] : {std::pair{&a, &ga}, std::pair{&b, &gb}}) {
              const float* y = got->data() + int64_t{r} * rows;
              worst_q = std::max(worst_q, NormErr(y, RefExpert(*ex, ids[r], xq.data())));
              worst_exact = std::max(worst_exact, NormErr(y, RefExpert(*ex, ids[r], xe.data())));
            }
          }
          // Against the same int8-rounded activations: float accumulation
          // only. Against exact activations: the int8 rounding (~0.5%).
          CHECK_MESSAGE(worst_q < 1e-5, "err vs the quantized-x reference " << worst_q);
          CHECK_MESSAGE(worst_exact < 0.02, "err vs the exact-x reference " << worst_exact);
        }
      }
    }
  }
}

// The routes grouped by expert, on a device buffer of MoeGroupsBytes.
struct DevGroups {
  void* mem = nullptr;
  MoeGroups g;
  DevGroups(int max_routes, int n_expert) {
    CUDA_OK(cudaMalloc(&mem, MoeGroupsBytes(max_routes, n_expert)));
    g = MoeGroupsIn(mem, max_routes, n_expert);
  }
  ~DevGroups() { cudaFree(mem); }
};

TEST_CASE("RouteGroups sorts the routes by expert, stably, in tiles") {
  struct Case {
    int n_expert, n_routes;
  };
  const Case cases[] = {{8, 5}, {8, 100}, {1, 17}, {128, 512}, {128, 2048}, {1024, 3000}, {3, 64}};
  int seed = 0;
  for (const Case& c : cases) {
    for (int tile_routes : {8, 16, 64}) {
      CAPTURE(c.n_expert);
      CAPTURE(c.n_routes);
      CAPTURE(tile_routes);
      std::mt19937 rng(1000 + ++seed);
      std::vector<int> ids(static_cast<size_t>(c.n_routes));
      // Skewed: half the routes on a few experts (runs longer than a tile),
      // the rest anywhere; a few out of range (clamped, as ExpertMatVec does).
      for (int r = 0; r < c.n_routes; ++r) {
        const int u = static_cast<int>(rng() % 100);
        ids[r] = u < 50 ? static_cast<int>(rng() % std::min(c.n_expert, 3)) : static_cast<int>(rng() % c.n_expert);
        if (u == 99) ids[r] = -5;
        if (u == 98) ids[r] = c.n_expert + 7;
      }
      GuardedArray<int> d_ids(ids);
      DevGroups dg(c.n_routes, c.n_expert);
      STATUS_OK(RouteGroups(d_ids.get(), c.n_routes, tile_routes, dg.g, nullptr, false));
      CUDA_OK(cudaDeviceSynchronize());
      const int64_t max_tiles = MoeMaxTiles(c.n_routes, c.n_expert, tile_routes);
      int n_tiles = 0;
      std::vector<int> order(static_cast<size_t>(c.n_routes)), tiles(static_cast<size_t>(3 * max_tiles));
      CUDA_OK(cudaMemcpy(&n_tiles, dg.g.n_tiles, 4, cudaMemcpyDeviceToHost));
      CUDA_OK(cudaMemcpy(order.data(), dg.g.order, order.size() * 4, cudaMemcpyDeviceToHost));
      CUDA_OK(cudaMemcpy(tiles.data(), dg.g.tiles, tiles.size() * 4, cudaMemcpyDeviceToHost));
      // The expected grouping: a stable sort by clamped expert, then runs.
      std::vector<int> want(static_cast<size_t>(c.n_routes));
      std::iota(want.begin(), want.end(), 0);
      auto expert = [&](int r) { return std::min(std::max(ids[r], 0), c.n_expert - 1); };
      std::stable_sort(want.begin(), want.end(), [&](int a, int b) { return expert(a) < expert(b); });
      CHECK(order == want);
      std::vector<int> want_tiles;
      for (int at = 0; at < c.n_routes;) {
        const int e = expert(want[at]);
        int end = at;
        while (end < c.n_routes && expert(want[end]) == e) ++end;
        for (int j = at; j < end; j += tile_routes) {
          want_tiles.insert(want_tiles.end(), {e, j, std::min(tile_routes, end - j)});
        }
        at = end;
      }
      REQUIRE(static_cast<int64_t>(want_tiles.size()) <= 3 * max_tiles);
      CHECK(n_tiles * 3 == static_cast<int>(want_tiles.size()));
      CHECK(std::equal(want_tiles.begin(), want_tiles.end(), tiles.begin()));
    }
  }
  DevGroups small(4, 8);
  GuardedArray<int> d_ids(std::vector<int>{0, 1, 2, 3, 4});
  CHECK(!RouteGroups(d_ids.get(), 5, 8, small.g, nullptr, false).ok());  // more routes than the buffers hold
  CHECK(!RouteGroups(d_ids.get(), 0, 8, small.g, nullptr, false).ok());
  CHECK(!RouteGroups(d_ids.get(), 4, 12, small.g, nullptr, false).ok());  // not a multiple of 8
}

// Every expert type, gate/up-like and down-like shapes (and a q8_0 width that
// is not whole 256-column blocks: the skeleton's tile), 2 to 64 rows with
// one expert taking most routes (runs of several tiles): the grouped form
// against float64 with the same int8 activations, against ExpertMatVec, and
// the same bits at every tile size (the tensor-core form) or ExpertMatVec's
// bits (the skeleton's tile).
TEST_CASE("ExpertMatVecGrouped follows ExpertMatVec for every expert type") {
  constexpr int kExperts = 8, kUsed = 2;
  struct Shape {
    int64_t rows, cols;
  };
  int seed = 0;
  for (const ExpertType& t : kExpertTypes) {
    std::vector<Shape> shapes = {{256, 512}, {768, 2048}, {2048, 768}};
    if (t.type == GgmlType::kQ8_0) shapes.push_back({256, 288});
    for (const Shape& sh : shapes) {
      const int64_t rows = sh.rows, cols = sh.cols;
      CAPTURE(formats::TraitsOf(t.type).name);
      CAPTURE(static_cast<int>(t.layout));
      CAPTURE(rows);
      CAPTURE(cols);
      DevExperts a, b;
      MakeExperts(t, kExperts, rows, cols, 3100 + ++seed, &a);
      MakeExperts(t, kExperts, rows, cols, 3500 + seed, &b);
      const bool mma = MatVecMmaSupports(a.plan.kernel, cols);
      for (int n : {2, 9, 64}) {
        CAPTURE(n);
        const int n_routes = n * kUsed;
        std::mt19937 rng(40 + n + seed);
        std::vector<int> ids(static_cast<size_t>(n_routes));
        for (int r = 0; r < n_routes; ++r) {
          ids[r] = r % kUsed == 0 && rng() % 4 != 0 ? 5 : static_cast<int>(rng() % kExperts);
        }
        GuardedArray<int> d_ids(ids);
        for (int x_div : {kUsed, 1}) {
          CAPTURE(x_div);
          const int x_rows = n_routes / x_div;
          const NormedActs na(x_rows, cols, 11 + n + x_div + seed);
          const MoeActs& acts = na.acts;
          const std::vector<float>& h = na.h;
          const size_t out = static_cast<size_t>(n_routes * rows);
          GuardedArray<float> ya(out), yb(out);
          const ExpertOut per_route[2] = {{&a.w, &a.plan, ya.get()}, {&b.w, &b.plan, yb.get()}};
          STATUS_OK(ExpertMatVec(per_route, acts, static_cast<int>(cols), n_routes, x_div, d_ids.get(), nullptr, false));
          const std::vector<float> want_a = ya.Download(), want_b = yb.Download();
          std::vector<float> first_a;  // the first tile size's, for the same-bits check
          std::vector<int> tile_sizes = {MoeTileRoutes(n_routes, kExperts, a.plan.kernel, static_cast<int>(cols))};
          if (mma) tile_sizes = {8, 16, 64};
          for (int tile : tile_sizes) {
            CAPTURE(tile);
            DevGroups dg(n_routes, kExperts);
            STATUS_OK(RouteGroups(d_ids.get(), n_routes, tile, dg.g, nullptr, false));
            GuardedArray<float> ga(out), gb(out), g1(out);
            const ExpertOut grouped[2] = {{&a.w, &a.plan, ga.get()}, {&b.w, &b.plan, gb.get()}};
            const ExpertOut alone[1] = {{&a.w, &a.plan, g1.get()}};
            STATUS_OK(ExpertMatVecGrouped(grouped, acts, static_cast<int>(cols), n_routes, x_div, dg.g, tile, nullptr,
                                          false));
            STATUS_OK(ExpertMatVecGrouped(alone, acts, static_cast<int>(cols), n_routes, x_div, dg.g, tile, nullptr,
                                          false));
            const std::vector<float> got_a = ga.Download(), got_b = gb.Download(), got_1 = g1.Download();
            CHECK(std::memcmp(got_1.data(), got_a.data(), out * 4) == 0);  // grouped launch == alone
            if (!mma) {
              CHECK(std::memcmp(got_a.data(), want_a.data(), out * 4) == 0);
              CHECK(std::memcmp(got_b.data(), want_b.data(), out * 4) == 0);
            }
            if (first_a.empty()) {
              first_a = got_a;
            } else {
              CHECK(std::memcmp(got_a.data(), first_a.data(), out * 4) == 0);
            }
            double worst_q = 0, worst_per_route = 0;
            for (int r = 0; r < n_routes; ++r) {
              const std::vector<double> xq = testutil::QuantizedX(h.data() + int64_t{r / x_div} * cols, cols);
              for (const auto& [ex, got, want] : {std::tuple{&a, &got_a, &want_a}, std::tuple{&b, &got_b, &want_b}}) {
                const float* y = got->data() + int64_t{r} * rows;
                worst_q = std::max(worst_q, NormErr(y, RefExpert(*ex, ids[r], xq.data())));
                const std::vector<double> w(want->begin() + int64_t{r} * rows, want->begin() + int64_t{r + 1} * rows);
                worst_per_route = std::max(worst_per_route, NormErr(y, w));
              }
            }
            CHECK_MESSAGE(worst_q < 1e-5, "err vs the quantized-x reference " << worst_q);
            CHECK_MESSAGE(worst_per_route < 1e-5, "err vs ExpertMatVec " << worst_per_route);
          }
        }
      }
    }
  }
  // Groups made for other experts, or too few routes, or the wrong tiles, are refused.
  DevExperts e;
  MakeExperts({GgmlType::kQ4_K, TensorLayout::kRaw}, 4, 64, 256, 7, &e);
  DevGroups wrong(8, 16), few(2, 4), right(8, 4);
  void* mem = nullptr;
  CUDA_OK(cudaMalloc(&mem, MoeActsBytes(8 * 256)));
  const MoeActs acts = MoeActsIn(mem, 8 * 256);
  GuardedArray<float> y(8 * 64);
  const ExpertOut o[1] = {{&e.w, &e.plan, y.get()}};
  CHECK(!ExpertMatVecGrouped(o, acts, 256, 8, 1, wrong.g, 8, nullptr, false).ok());
  CHECK(!ExpertMatVecGrouped(o, acts, 256, 8, 1, few.g, 8, nullptr, false).ok());
  CHECK(!ExpertMatVecGrouped(o, acts, 256, 8, 1, right.g, 12, nullptr, false).ok());
  CUDA_OK(cudaFree(mem));
}

TEST_CASE("ExpertMatVec reads each route's own expert (a wrong offset shows)") {
  // Experts that differ: each route's output must match its expert and not
  // a neighbour's (a stride bug would read expert e +- 1 and still give
  // plausible numbers).
  DevExperts ex;
  MakeExperts({GgmlType::kQ4_K, TensorLayout::kRaw}, 4, 64, 256, 4242, &ex);
  const std::vector<int> ids = {3, 0, 2, 1};
  GuardedArray<int> d_ids(ids);
  const std::vector<float> x = RandomNormal(256, 5);
  GuardedArray<float> d_x(x), d_h(x.size()), d_ones(std::vector<float>(256, 1.f));
  void* mem = nullptr;
  CUDA_OK(cudaMalloc(&mem, MoeActsBytes(256)));
  const MoeActs acts = MoeActsIn(mem, 256);
  STATUS_OK(MoeNormQuantize(d_x.get(), d_ones.get(), 1e-6f, 256, 1, d_h.get(), acts, nullptr, false));
  const std::vector<float> h = d_h.Download();
  const std::vector<double> xq = testutil::QuantizedX(h.data(), 256);
  GuardedArray<float> y(4 * 64);
  const ExpertOut o[1] = {{&ex.w, &ex.plan, y.get()}};
  STATUS_OK(ExpertMatVec(o, acts, 256, 4, 4, d_ids.get(), nullptr, false));
  const std::vector<float> got = y.Download();
  for (int r = 0; r < 4; ++r) {
    for (int e = 0; e < 4; ++e) {
      const double err = NormErr(got.data() + r * 64, RefExpert(ex, e, xq.data()));
      if (e == ids[r]) {
        CHECK(err < 1e-5);
      } else {
        CHECK(err > 0.5);
      }
    }
  }
  CUDA_OK(cudaFree(mem));
}

TEST_CASE("MoeCombine adds the weighted routes into the residual") {
  for (int k : {1, 2, 8}) {
    const int n = 5, cols = 1000;
    const std::vector<float> y = RandomNormal(int64_t{n} * k * cols, 3 + k);
    const std::vector<float> w = RandomNormal(int64_t{n} * k, 4 + k, 0.3f);
    const std::vector<float> x0 = RandomNormal(int64_t{n} * cols, 5 + k);
    GuardedArray<float> d_y(y), d_w(w), d_x(x0);
    STATUS_OK(MoeCombine(d_y.get(), d_w.get(), n, k, cols, d_x.get(), nullptr, false));
    const std::vector<float> got = d_x.Download();
    std::vector<double> want(x0.begin(), x0.end());
    for (int t = 0; t < n; ++t) {
      for (int c = 0; c < cols; ++c) {
        for (int j = 0; j < k; ++j) {
          want[t * cols + c] += double(w[t * k + j]) * y[(int64_t{t} * k + j) * cols + c];
        }
      }
    }
    CHECK(NormErr(got, want) < 1e-6);
  }
}

TEST_CASE("PlanExperts refuses a type without an expert kernel") {
  for (GgmlType type : {GgmlType::kIQ4_XS, GgmlType::kQ4_0, GgmlType::kF16}) {
    CAPTURE(formats::TraitsOf(type).name);
    ExpertWeights e;
    e.w.data = reinterpret_cast<const void*>(uintptr_t{1} << 20);
    e.w.type = type;
    e.w.n_rows = 64;
    e.w.n_cols = 512;
    e.w.row_stride = MinRowStride(type, TensorLayout::kRaw, 512);
    e.expert_stride = 64 * e.w.row_stride;
    e.n_expert = 8;
    const absl::StatusOr<ExpertPlan> p = PlanExperts(e, Tuning());
    REQUIRE(!p.ok());
    CHECK(p.status().code() == absl::StatusCode::kUnimplemented);
  }
}

}  // namespace
}  // namespace dpl::kernels
