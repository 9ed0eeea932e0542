// GPU tests of the prompt GEMM (tags gpu, manual): the f16 dequant bit for
// bit against f16(formats::DequantizeRow) for every type and layout (both the
// 8-wide and the per-element kernels), ConvertToF16 against the host
// rounding, PromptGemm::Run against a float64 reference built from the same
// f16-rounded inputs (bias, residual, in place, row blocks), a captured CUDA
// graph, and the error paths. Every output sits in a GuardedArray.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "formats/dequant.h"
#include "base/status_macros.h"
#include "kernels/cuda_handles.h"
#include "kernels/gemm/prompt_gemm.h"
#include "kernels/gpu_test.h"
#include "kernels/matvec/dev_matrix.h"
#include "kernels/matvec/matvec_test_util.h"

namespace dpl::kernels {
namespace {

using formats::F16ToF32;
using formats::F32ToF16;
using formats::GgmlType;
using formats::TensorLayout;
using testing::GuardedArray;
using testing::NormErr;
using testutil::HostMatrix;

std::string TypeName(GgmlType t, TensorLayout l) {
  return absl::StrCat(formats::TraitsOf(t).name, l == TensorLayout::kDpl ? " dpl" : "");
}

// A random matrix (matvec_test_util: dpl-synth's blocks). Bytes past a
// row's weights (extra_stride) hold 0xA5 garbage.
HostMatrix MakeMatrix(GgmlType type, TensorLayout layout, int64_t n_rows, int64_t n_cols,
                      int64_t extra_stride, uint64_t seed) {
  return testutil::RandomMatrix(type, layout, n_rows, n_cols, extra_stride, seed);
}

using testutil::DevMatrix;

// Rows [row_begin, row_begin + n_rows) of m through the CPU dequantizer:
// (n_rows, n_cols) floats.
std::vector<float> CpuDequant(const HostMatrix& m, int64_t row_begin, int64_t n_rows) {
  std::vector<float> out(static_cast<size_t>(n_rows * m.n_cols));
  for (int64_t r = 0; r < n_rows; ++r) {
    const absl::Status st = formats::DequantizeRow(
        m.type, m.layout, m.bytes.data() + (row_begin + r) * m.row_stride,
        static_cast<uint64_t>(m.n_cols), out.data() + r * m.n_cols);
    REQUIRE_MESSAGE(st.ok(), st.ToString());
  }
  return out;
}

// Compares the device's f16 bits with F32ToF16 (round to nearest even, the
// host twin of __float2half_rn) of the CPU dequant; returns the mismatches
// and prints the first.
int64_t CountF16Mismatches(const std::vector<uint16_t>& got, const std::vector<float>& ref,
                           const std::string& name) {
  int64_t bad = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const uint16_t want = F32ToF16(ref[i]);
    if (got[i] != want) {
      if (bad == 0) {
        std::printf("[dequant] %s: first mismatch at %zu: got 0x%04x want 0x%04x (%.9g)\n",
                    name.c_str(), i, got[i], want, ref[i]);
      }
      ++bad;
    }
  }
  return bad;
}

// Dequantizes rows [row_begin, +n_rows) of m on the device into a guarded
// array (at element offset out_offset, to misalign it on purpose) and checks
// every bit.
void CheckDequant(const HostMatrix& m, const DevMatrix& dm, int64_t row_begin, int64_t n_rows,
                  int64_t out_offset) {
  const std::string name =
      absl::StrCat(TypeName(m.type, m.layout), " ", m.n_rows, "x", m.n_cols, " stride ",
                   m.row_stride, " rows [", row_begin, ", +", n_rows, ") out+", out_offset);
  GuardedArray<uint16_t> out(static_cast<size_t>(out_offset + n_rows * m.n_cols));
  STATUS_OK(DequantizeRowsF16(dm.w, row_begin, n_rows, out.get() + out_offset, nullptr));
  std::vector<uint16_t> got = out.Download();
  for (int64_t i = 0; i < out_offset; ++i) REQUIRE(got[static_cast<size_t>(i)] == 0);
  got.erase(got.begin(), got.begin() + out_offset);
  const int64_t bad = CountF16Mismatches(got, CpuDequant(m, row_begin, n_rows), name);
  std::printf("[dequant] %-62s %s\n", name.c_str(), bad == 0 ? "bit-identical" : "MISMATCH");
  CHECK_MESSAGE(bad == 0, name << ": " << bad << " of " << got.size() << " values differ");
}

struct TypeCase {
  GgmlType type;
  TensorLayout layout;
};
const TypeCase kAllTypes[] = {
    {GgmlType::kF32, TensorLayout::kRaw},    {GgmlType::kF16, TensorLayout::kRaw},
    {GgmlType::kBF16, TensorLayout::kRaw},   {GgmlType::kQ8_0, TensorLayout::kRaw},
    {GgmlType::kQ8_0, TensorLayout::kDpl},   {GgmlType::kQ4_0, TensorLayout::kRaw},
    {GgmlType::kQ4_0, TensorLayout::kDpl},   {GgmlType::kQ4_1, TensorLayout::kRaw},
    {GgmlType::kQ4_1, TensorLayout::kDpl},   {GgmlType::kQ5_0, TensorLayout::kRaw},
    {GgmlType::kQ5_0, TensorLayout::kDpl},   {GgmlType::kQ5_1, TensorLayout::kRaw},
    {GgmlType::kQ5_1, TensorLayout::kDpl},   {GgmlType::kIQ4_NL, TensorLayout::kRaw},
    {GgmlType::kIQ4_NL, TensorLayout::kDpl}, {GgmlType::kQ2_K, TensorLayout::kRaw},
    {GgmlType::kQ2_K, TensorLayout::kDpl},   {GgmlType::kQ3_K, TensorLayout::kRaw},
    {GgmlType::kQ3_K, TensorLayout::kDpl},   {GgmlType::kQ4_K, TensorLayout::kRaw},
    {GgmlType::kQ5_K, TensorLayout::kRaw},   {GgmlType::kQ6_K, TensorLayout::kRaw},
    {GgmlType::kQ6_K, TensorLayout::kDpl},   {GgmlType::kIQ4_XS, TensorLayout::kRaw},
    {GgmlType::kIQ4_XS, TensorLayout::kDpl},
};

TEST_CASE("DequantizeRowsF16: bit-identical to f16(DequantizeRow), every type and layout") {
  const int64_t kRows = 320;
  // (row_begin, n_rows): one row, an odd count from an odd start, 300 rows.
  const int64_t ranges[][2] = {{0, 1}, {3, 37}, {17, 300}, {0, kRows}};
  for (const TypeCase& tc : kAllTypes) {
    for (int64_t n_cols : {256, 512, 4096}) {
      const HostMatrix m = MakeMatrix(tc.type, tc.layout, kRows, n_cols, 0, 11 + n_cols);
      DevMatrix dm(m);
      for (const auto& rg : ranges) CheckDequant(m, dm, rg[0], rg[1], 0);
    }
  }
}

// Float weights: rows or outputs the 8-wide loads cannot read go through the
// per-element kernel, same bits. Block weights: every tensor of a .dpl file
// is aligned (256-byte offsets, whole-block or 16-byte strides), so a
// misaligned one is refused, naming the alignment, rather than read slowly.
TEST_CASE("DequantizeRowsF16: the per-element fallback gives the same bits") {
  struct Case {
    GgmlType type;
    TensorLayout layout;
    int64_t n_cols, extra_stride, out_offset;
    const char* why;
  };
  const Case cases[] = {
      {GgmlType::kF32, TensorLayout::kRaw, 100, 0, 0, "n_cols % 8 != 0"},
      {GgmlType::kF16, TensorLayout::kRaw, 100, 0, 0, "n_cols % 8 != 0"},
      {GgmlType::kBF16, TensorLayout::kRaw, 100, 0, 0, "n_cols % 8 != 0"},
      {GgmlType::kF32, TensorLayout::kRaw, 512, 4, 0, "stride % 16 != 0"},
      {GgmlType::kF16, TensorLayout::kRaw, 512, 2, 0, "stride % 16 != 0"},
      {GgmlType::kF16, TensorLayout::kRaw, 512, 0, 1, "output not 16-byte aligned"},
      // Vector path with padded strides (the loads must skip the garbage).
      {GgmlType::kQ8_0, TensorLayout::kRaw, 96, 2, 0, "padded stride"},
      {GgmlType::kQ4_K, TensorLayout::kRaw, 512, 16, 0, "padded stride"},
      {GgmlType::kQ6_K, TensorLayout::kDpl, 1280, 16, 0, "padded stride"},
      {GgmlType::kQ3_K, TensorLayout::kDpl, 1280, 16, 0, "padded stride"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.why);
    const HostMatrix m = MakeMatrix(c.type, c.layout, 67, c.n_cols, c.extra_stride, 5);
    DevMatrix dm(m);
    CheckDequant(m, dm, 0, 67, c.out_offset);
    CheckDequant(m, dm, 5, 31, c.out_offset);
  }
  const Case refused[] = {
      {GgmlType::kQ8_0, TensorLayout::kRaw, 96, 1, 0, "odd stride"},
      {GgmlType::kQ4_K, TensorLayout::kRaw, 512, 4, 0, "stride % 16 != 0"},
      {GgmlType::kQ6_K, TensorLayout::kDpl, 512, 4, 0, "stride % 16 != 0"},
      {GgmlType::kQ5_1, TensorLayout::kRaw, 512, 4, 0, "stride % 8 != 0"},
      {GgmlType::kQ4_K, TensorLayout::kRaw, 512, 0, 1, "output not 16-byte aligned"},
  };
  for (const Case& c : refused) {
    CAPTURE(c.why);
    const HostMatrix m = MakeMatrix(c.type, c.layout, 67, c.n_cols, c.extra_stride, 5);
    DevMatrix dm(m);
    GuardedArray<uint16_t> out(static_cast<size_t>(c.out_offset + 67 * c.n_cols));
    const absl::Status st = DequantizeRowsF16(dm.w, 0, 67, out.get() + c.out_offset, nullptr);
    CHECK(!st.ok());
    CHECK_MESSAGE(st.message().find("-byte aligned") != absl::string_view::npos, st.ToString());
  }
}

TEST_CASE("ConvertToF16 rounds like __float2half_rn (both kernels)") {
  std::mt19937_64 rng(8);
  std::normal_distribution<float> normal(0.f, 30.f);
  for (int64_t n : {int64_t{4096}, int64_t{4099}}) {  // 4-wide kernel, then the scalar one
    std::vector<float> x(static_cast<size_t>(n));
    for (float& v : x) v = normal(rng);
    // Edges: ties, the largest finite, overflow, subnormals, signed zero.
    const float edges[] = {65504.f, 65519.f, 65520.f, -70000.f, 1e-8f, -3e-7f, 6.1e-5f, -0.0f,
                           1.0009765625f + 0.00048828125f, 2049.f};
    for (size_t i = 0; i < std::size(edges); ++i) x[i * 7] = edges[i];
    GuardedArray<float> dx(x);
    GuardedArray<uint16_t> out(static_cast<size_t>(n));
    STATUS_OK(ConvertToF16(dx.get(), n, out.get(), nullptr));
    const std::vector<uint16_t> got = out.Download();
    int64_t bad = 0;
    for (int64_t i = 0; i < n; ++i) bad += got[static_cast<size_t>(i)] != F32ToF16(x[static_cast<size_t>(i)]);
    CHECK_MESSAGE(bad == 0, n << " values: " << bad << " differ");
  }
}

// ---- PromptGemm::Run against float64 ----

std::vector<float> RandomFloats(int64_t n, float sigma, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.f, sigma);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& f : v) f = normal(rng);
  return v;
}

// f16-rounded copies: what the GEMM multiplies.
std::vector<double> RoundF16(const std::vector<float>& v) {
  std::vector<double> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = F16ToF32(F32ToF16(v[i]));
  return out;
}

// ref[t][r] = sum_k w[r][k] x[t][k] in float64, rows split over threads.
std::vector<double> RefGemm(const std::vector<double>& w, const std::vector<double>& x,
                            int64_t n_rows, int64_t n_cols, int64_t n_tokens) {
  std::vector<double> y(static_cast<size_t>(n_tokens * n_rows));
  const int64_t n_threads = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::thread> pool;
  for (int64_t th = 0; th < n_threads; ++th) {
    pool.emplace_back([&, th] {
      for (int64_t r = th; r < n_rows; r += n_threads) {
        const double* wr = w.data() + r * n_cols;
        for (int64_t t = 0; t < n_tokens; ++t) {
          const double* xt = x.data() + t * n_cols;
          double acc = 0;
          for (int64_t k = 0; k < n_cols; ++k) acc += wr[k] * xt[k];
          y[static_cast<size_t>(t * n_rows + r)] = acc;
        }
      }
    });
  }
  for (std::thread& t : pool) t.join();
  return y;
}

struct GemmCase {
  GgmlType type;
  TensorLayout layout;
  int64_t n_rows, n_cols;
  int64_t scratch_rows;  // 0: the whole matrix; else scratch of this many rows + 5 elements
  std::vector<int64_t> tokens;
};

// The float32 sums of f16 products differ from float64 by ~1e-7 relative;
// 1e-4 leaves room for any cuBLAS algorithm (split-K included).
constexpr double kGemmTol = 1e-4;

void CheckGemmCase(PromptGemm& gemm, const GemmCase& c) {
  const HostMatrix m = MakeMatrix(c.type, c.layout, c.n_rows, c.n_cols, 0, 100 + c.n_rows);
  DevMatrix dm(m);
  const std::vector<double> wh = RoundF16(CpuDequant(m, 0, c.n_rows));
  const int64_t scratch_elems =
      c.scratch_rows == 0 ? c.n_rows * c.n_cols : c.scratch_rows * c.n_cols + 5;
  GuardedArray<uint16_t> scratch(static_cast<size_t>(scratch_elems));
  const std::vector<float> bias = RandomFloats(c.n_rows, 1.f, 7);
  GuardedArray<float> dbias(bias);
  for (int64_t T : c.tokens) {
    const std::vector<float> x = RandomFloats(T * c.n_cols, 1.f, 9 + T);
    const std::vector<float> res = RandomFloats(T * c.n_rows, 2.f, 13 + T);
    GuardedArray<float> dx(x), dres(res);
    GuardedArray<uint16_t> xh(static_cast<size_t>(T * c.n_cols));
    STATUS_OK(ConvertToF16(dx.get(), T * c.n_cols, xh.get(), nullptr));
    const std::vector<double> base = RefGemm(wh, RoundF16(x), c.n_rows, c.n_cols, T);
    // Variants: plain; + bias; + residual (separate); y += W x in place;
    // in place + bias.
    for (int variant = 0; variant < 5; ++variant) {
      const bool with_bias = variant == 1 || variant == 4;
      const bool with_res = variant >= 2;
      const bool in_place = variant >= 3;
      GuardedArray<float> y(static_cast<size_t>(T * c.n_rows));
      if (in_place) y.Upload(res);
      const float* residual = with_res ? (in_place ? y.get() : dres.get()) : nullptr;
      STATUS_OK(gemm.Run(dm.w, xh.get(), T, y.get(), with_bias ? dbias.get() : nullptr, residual,
                         scratch.get(), scratch_elems));
      const std::vector<float> got = y.Download();
      std::vector<double> ref = base;
      for (int64_t t = 0; t < T; ++t) {
        for (int64_t r = 0; r < c.n_rows; ++r) {
          const size_t i = static_cast<size_t>(t * c.n_rows + r);
          if (with_bias) ref[i] += bias[static_cast<size_t>(r)];
          if (with_res) ref[i] += res[i];
        }
      }
      const double err = NormErr(got.data(), ref);
      const std::string name = absl::StrCat(
          TypeName(c.type, c.layout), " ", c.n_rows, "x", c.n_cols, " T ", T, " scratch ",
          c.scratch_rows == 0 ? std::string("whole") : absl::StrCat(c.scratch_rows, " rows"),
          with_bias ? " +bias" : "", with_res ? (in_place ? " +y (in place)" : " +residual") : "");
      std::printf("[gemm] %-66s err %.3e\n", name.c_str(), err);
      CHECK_MESSAGE(err <= kGemmTol, name << " err " << err);
    }
  }
  (void)scratch.Download();  // sentinels after the scratch intact
}

TEST_CASE("PromptGemm::Run vs float64 reference: types, token counts, bias/residual, row blocks") {
  absl::StatusOr<PromptGemm> gemm = PromptGemm::Create(nullptr);
  REQUIRE_MESSAGE(gemm.ok(), gemm.status().ToString());
  const GemmCase cases[] = {
      {GgmlType::kQ4_K, TensorLayout::kRaw, 512, 3584, 0, {1, 7, 64, 512}},
      {GgmlType::kQ4_K, TensorLayout::kRaw, 3584, 3584, 700, {7, 64}},  // 640-row blocks
      {GgmlType::kQ6_K, TensorLayout::kDpl, 4096, 512, 700, {1, 7, 64, 512}},
      {GgmlType::kQ6_K, TensorLayout::kRaw, 1024, 4096, 37, {7, 64}},  // 37-row blocks
      {GgmlType::kQ8_0, TensorLayout::kRaw, 512, 3584, 0, {1, 64}},
      {GgmlType::kQ5_0, TensorLayout::kRaw, 1000, 512, 129, {7, 64}},  // 128-row blocks
      {GgmlType::kF16, TensorLayout::kRaw, 512, 4096, 0, {7}},
      {GgmlType::kBF16, TensorLayout::kRaw, 300, 512, 0, {7}},
      {GgmlType::kF32, TensorLayout::kRaw, 300, 512, 1, {7}},  // one row per block
  };
  for (const GemmCase& c : cases) CheckGemmCase(*gemm, c);
}

TEST_CASE("PromptGemm::Run is deterministic and replays from a captured CUDA graph") {
  absl::StatusOr<Stream> stream = CreateStream();
  REQUIRE(stream.ok());
  absl::StatusOr<PromptGemm> made = PromptGemm::Create(stream->get());
  REQUIRE_MESSAGE(made.ok(), made.status().ToString());
  PromptGemm gemm = std::move(*made);  // moved: the handle must survive it
  const int64_t n_rows = 2048, n_cols = 3584, T = 64;
  const HostMatrix m = MakeMatrix(GgmlType::kQ4_K, TensorLayout::kRaw, n_rows, n_cols, 0, 3);
  DevMatrix dm(m);
  const int64_t scratch_elems = 1000 * n_cols;  // 896-row blocks: 3 GEMMs
  GuardedArray<uint16_t> scratch(static_cast<size_t>(scratch_elems));
  GuardedArray<float> dx(RandomFloats(T * n_cols, 1.f, 4)), bias(RandomFloats(n_rows, 1.f, 5));
  GuardedArray<uint16_t> xh(static_cast<size_t>(T * n_cols));
  GuardedArray<float> y0(static_cast<size_t>(T * n_rows)), y1(static_cast<size_t>(T * n_rows)),
      y2(static_cast<size_t>(T * n_rows));
  // The uploads above ran on the legacy stream, which a non-blocking stream
  // does not wait for.
  CUDA_OK(cudaDeviceSynchronize());
  STATUS_OK(ConvertToF16(dx.get(), T * n_cols, xh.get(), stream->get()));
  STATUS_OK(gemm.Run(dm.w, xh.get(), T, y0.get(), bias.get(), nullptr, scratch.get(),
                     scratch_elems));
  STATUS_OK(gemm.Run(dm.w, xh.get(), T, y1.get(), bias.get(), nullptr, scratch.get(),
                     scratch_elems));
  absl::StatusOr<GraphExec> graph = CaptureGraph(stream->get(), [&] {
    return gemm.Run(dm.w, xh.get(), T, y2.get(), bias.get(), nullptr, scratch.get(),
                    scratch_elems);
  });
  REQUIRE_MESSAGE(graph.ok(), graph.status().ToString());
  CUDA_OK(cudaGraphLaunch(graph->get(), stream->get()));
  CUDA_OK(cudaStreamSynchronize(stream->get()));
  const std::vector<float> a = y0.Download(), b = y1.Download(), c = y2.Download();
  const bool same = std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
  const bool same_graph = std::memcmp(a.data(), c.data(), a.size() * 4) == 0;
  std::printf("[gemm] rerun %s, graph replay %s\n", same ? "bit-identical" : "DIFFERS",
              same_graph ? "bit-identical" : "DIFFERS");
  CHECK(same);
  CHECK(same_graph);
}

// A pass of products through F16WeightsAhead (the next matrix dequantized
// on a second stream while this one multiplies) against Run: the same bits.
// Every product has its own output, so a GEMM that read its buffer before
// the dequant into it finished (it would see matrix i - 2's rows), or a
// dequant that overwrote a buffer a GEMM still read, shows in that output.
TEST_CASE("F16WeightsAhead gives Run's bits") {
  absl::StatusOr<Stream> stream = CreateStream();
  REQUIRE(stream.ok());
  absl::StatusOr<PromptGemm> made = PromptGemm::Create(stream->get());
  REQUIRE_MESSAGE(made.ok(), made.status().ToString());
  PromptGemm gemm = std::move(*made);
  absl::StatusOr<F16WeightsAhead> ahead = F16WeightsAhead::Create();
  REQUIRE_MESSAGE(ahead.ok(), ahead.status().ToString());
  const int64_t n_rows = 2048, n_cols = 1024, T = 96;
  std::vector<std::unique_ptr<DevMatrix>> ms;
  std::vector<const WeightMatrix*> order;
  for (int i = 0; i < 7; ++i) {  // alternating types and layouts
    const GgmlType type = i % 2 == 0 ? GgmlType::kQ4_K : GgmlType::kQ6_K;
    const TensorLayout layout = i % 2 == 0 ? TensorLayout::kRaw : TensorLayout::kDpl;
    ms.push_back(std::make_unique<DevMatrix>(MakeMatrix(type, layout, n_rows - 128 * (i % 3), n_cols, 0, 40 + i)));
    order.push_back(&ms.back()->w);
  }
  const int64_t scratch_elems = n_rows * n_cols;
  GuardedArray<uint16_t> s0(static_cast<size_t>(scratch_elems)), s1(static_cast<size_t>(scratch_elems));
  GuardedArray<float> x(RandomFloats(T * n_cols, 1.f, 7)), bias(RandomFloats(n_rows, 1.f, 8));
  GuardedArray<uint16_t> xh(static_cast<size_t>(T * n_cols));
  const size_t out = static_cast<size_t>(T * n_rows);
  GuardedArray<float> ya(out * order.size()), yb(out * order.size());
  CUDA_OK(cudaDeviceSynchronize());
  STATUS_OK(ConvertToF16(x.get(), T * n_cols, xh.get(), stream->get()));
  auto pass = [&](float* y, bool use_ahead) -> absl::Status {
    if (use_ahead) DPL_RETURN_IF_ERROR(ahead->Begin(order, s0.get(), s1.get(), scratch_elems, stream->get()));
    for (size_t i = 0; i < order.size(); ++i) {
      const float* b = i % 2 == 1 ? bias.get() : nullptr;
      if (use_ahead) {
        DPL_RETURN_IF_ERROR(ahead->Run(gemm, *order[i], xh.get(), T, y + i * out, b, nullptr));
      } else {
        DPL_RETURN_IF_ERROR(gemm.Run(*order[i], xh.get(), T, y + i * out, b, nullptr, s0.get(), scratch_elems));
      }
    }
    return use_ahead ? ahead->End() : absl::OkStatus();
  };
  STATUS_OK(pass(ya.get(), false));
  STATUS_OK(pass(yb.get(), true));
  STATUS_OK(pass(yb.get(), true));  // a second pass: Begin after End, buffers reused
  CUDA_OK(cudaStreamSynchronize(stream->get()));
  const std::vector<float> a = ya.Download(), b = yb.Download();
  CHECK(std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
  {
    // The SM-sharing variant: the side stream at low priority, its dequants
    // capped at 5 striding CTAs, the GEMMs planned for fewer SMs (in both
    // passes: the handle's target is what Run uses too).
    absl::StatusOr<F16WeightsAhead> capped = F16WeightsAhead::Create(/*side_first=*/false, /*dequant_ctas=*/5);
    REQUIRE_MESSAGE(capped.ok(), capped.status().ToString());
    STATUS_OK(gemm.SetSmCountTarget(24));
    std::swap(*ahead, *capped);
    STATUS_OK(pass(ya.get(), false));
    STATUS_OK(pass(yb.get(), true));
    CUDA_OK(cudaStreamSynchronize(stream->get()));
    const std::vector<float> a2 = ya.Download(), b2 = yb.Download();
    CHECK(std::memcmp(a2.data(), b2.data(), a2.size() * 4) == 0);
    std::swap(*ahead, *capped);
    STATUS_OK(gemm.SetSmCountTarget(0));
    CHECK(gemm.SetSmCountTarget(-1).code() == absl::StatusCode::kInvalidArgument);
    CHECK(F16WeightsAhead::Create(true, -1).status().code() == absl::StatusCode::kInvalidArgument);
  }
  // Asked for a matrix out of order: refused, nothing run.
  STATUS_OK(ahead->Begin(order, s0.get(), s1.get(), scratch_elems, stream->get()));
  const absl::Status st = ahead->Run(gemm, *order[1], xh.get(), T, yb.get(), nullptr, nullptr);
  CHECK(st.code() == absl::StatusCode::kFailedPrecondition);
  STATUS_OK(ahead->End());
  // A matrix larger than the scratch: refused at Begin.
  CHECK(ahead->Begin(order, s0.get(), s1.get(), scratch_elems - 1, stream->get()).code() ==
        absl::StatusCode::kInvalidArgument);
  CUDA_OK(cudaStreamSynchronize(stream->get()));
}

TEST_CASE("PromptGemm / DequantizeRowsF16 / ConvertToF16: errors name the problem") {
  absl::StatusOr<PromptGemm> made = PromptGemm::Create(nullptr);
  REQUIRE(made.ok());
  PromptGemm& gemm = *made;
  // One zeroed buffer, cut into disjoint pieces: a 4x256 q4_K matrix (576
  // bytes), x (256 f16), y (4 floats), scratch (256 f16).
  GuardedArray<uint8_t> buf(1 << 16);
  uint8_t* base = buf.get();
  uint16_t* x = reinterpret_cast<uint16_t*>(base + 4096);
  float* y = reinterpret_cast<float*>(base + 8192);
  uint16_t* scratch = reinterpret_cast<uint16_t*>(base + 16384);
  const WeightMatrix w{base, GgmlType::kQ4_K, TensorLayout::kRaw, 4, 256, 144};
  auto expect = [](const absl::Status& st, const char* needle) {
    CHECK_MESSAGE(!st.ok(), "expected an error mentioning '" << needle << "'");
    CHECK_MESSAGE(st.ToString().find(needle) != std::string::npos, st.ToString());
  };
  STATUS_OK(gemm.Run(w, x, 1, y, nullptr, nullptr, scratch, 256));  // the valid twin
  expect(gemm.Run(w, x, 0, y, nullptr, nullptr, scratch, 256), "n_tokens 0");
  expect(gemm.Run(w, nullptr, 1, y, nullptr, nullptr, scratch, 256), "null");
  expect(gemm.Run(w, x, 1, nullptr, nullptr, nullptr, scratch, 256), "null");
  expect(gemm.Run(w, x, 1, y, nullptr, nullptr, nullptr, 256), "null");
  expect(gemm.Run(w, x, 1, y, nullptr, nullptr, scratch, 255), "scratch of 255");
  WeightMatrix bad = w;
  bad.type = GgmlType::kIQ2_XXS;
  bad.row_stride = 66;
  expect(gemm.Run(bad, x, 1, y, nullptr, nullptr, scratch, 256), "iq2_xxs");
  expect(DequantizeRowsF16(bad, 0, 1, scratch, nullptr), "iq2_xxs");
  bad = w;
  bad.layout = TensorLayout::kDpl;
  expect(gemm.Run(bad, x, 1, y, nullptr, nullptr, scratch, 256), "q4_K has no dpl layout");
  bad = w;
  bad.row_stride = 143;
  expect(gemm.Run(bad, x, 1, y, nullptr, nullptr, scratch, 256), "row_stride 143");
  bad = w;
  bad.n_cols = 300;
  expect(DequantizeRowsF16(bad, 0, 1, scratch, nullptr), "n_cols=300");
  bad = w;
  bad.data = nullptr;
  expect(DequantizeRowsF16(bad, 0, 1, scratch, nullptr), "null data");
  bad = w;
  bad.n_rows = 0;
  expect(DequantizeRowsF16(bad, 0, 1, scratch, nullptr), "n_rows=0");
  expect(DequantizeRowsF16(w, 3, 2, scratch, nullptr), "outside");
  expect(DequantizeRowsF16(w, -1, 1, scratch, nullptr), "outside");
  expect(DequantizeRowsF16(w, 0, 0, scratch, nullptr), "outside");
  expect(DequantizeRowsF16(w, 0, 1, nullptr, nullptr), "null output");
  STATUS_OK(DequantizeRowsF16(w, 3, 1, scratch, nullptr));  // the valid twin
  expect(ConvertToF16(nullptr, 4, x, nullptr), "null");
  expect(ConvertToF16(y, 0, x, nullptr), "bad size 0");
  PromptGemm moved = std::move(gemm);
  expect(gemm.Run(w, x, 1, y, nullptr, nullptr, scratch, 256), "moved from");
  STATUS_OK(moved.Run(w, x, 1, y, nullptr, nullptr, scratch, 256));
  (void)buf.Download();  // synchronizes; sentinels intact
}

}  // namespace
}  // namespace dpl::kernels
