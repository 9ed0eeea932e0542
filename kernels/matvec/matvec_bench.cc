// Times the matvec kernels on Qwen2.5-7B/14B decode shapes (tags manual, needs
// a GPU). Each shape's weights are replicated into copies totalling > 3x the
// L2 size and the launches rotate over them, so the timing is of HBM, not L2.
// Prints per shape: microseconds per call, GB/s of weight bytes, and the
// fraction of 4.4 TB/s (the H200's measured read bandwidth).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <cstdlib>
#include <deque>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kernels/cuda_handles.h"
#include "kernels/device_tuning.h"
#include "kernels/matvec/matvec.h"
#include "kernels/matvec/matvec_kernels.h"
#include "kernels/matvec/matvec_test_util.h"

namespace dpl::kernels {
namespace {

using formats::GgmlType;
using formats::TensorLayout;

constexpr double kPeakGBs = 4400.0;

std::string GeometryLabel(const MatVecGeometry& g) {
  return absl::StrCat(g.token_tile > 1 ? absl::StrCat("t", g.token_tile) : "", "ks", g.ksplit, "d",
                      g.depth, g.pipe ? "p" : "");
}

#define BENCH_CUDA(call)                                                              \
  do {                                                                                \
    const cudaError_t e_ = (call);                                                    \
    if (e_ != cudaSuccess) {                                                          \
      std::fprintf(stderr, "%s failed: %s\n", #call, cudaGetErrorString(e_));         \
      return 1;                                                                       \
    }                                                                                 \
  } while (0)
#define BENCH_OK(expr)                                                                \
  do {                                                                                \
    const absl::Status st_ = (expr);                                                  \
    if (!st_.ok()) {                                                                  \
      std::fprintf(stderr, "%s\n", st_.ToString().c_str());                           \
      return 1;                                                                       \
    }                                                                                 \
  } while (0)

struct Shape {
  const char* name;
  GgmlType type;
  TensorLayout layout;
  int64_t n_rows, n_cols;
  int64_t n_tokens;  // 1: decode; > 1: token-tiled prompt kernel
};

// Times every compiled single-token geometry of one shape and prints the
// planned one against the best.
template <typename TimeLoop>
absl::Status SweepGeometries(const Shape& s, MatVecPlan plan, double bytes, double planned_us,
                             TimeLoop& time_loop, int iters) {
  const MatVecGeometry planned = plan.decode;
  double best_us = 1e30;
  std::string best;
  std::printf("    geometries:");
  for (int ks : {1, 2, 4, 8}) {
    for (int depth : {1, 2, 4}) {
      for (bool pipe : {false, true}) {
        plan.decode = {1, ks, depth, pipe};
        if (!IsCompiledGeometry(plan.decode)) continue;
        float ms = 0;
        DPL_RETURN_IF_ERROR(time_loop(plan, false, &ms));
        const double u = ms * 1e3 / iters;
        const std::string label = GeometryLabel(plan.decode);
        std::printf(" %s %.2f", label.c_str(), u);
        if (u < best_us) {
          best_us = u;
          best = label;
        }
      }
    }
  }
  auto pct = [&](double us) { return 100.0 * bytes / (us * 1e-6) / 1e9 / kPeakGBs; };
  std::printf("\n    AB %-26s planned %s %.2f us (%.1f%%) | best %s %.2f us (%.1f%%)\n", s.name,
              GeometryLabel(planned).c_str(), planned_us, pct(planned_us), best.c_str(), best_us,
              pct(best_us));
  return absl::OkStatus();
}

// One shape's whole benchmark: weights replicated past L2, x, the timing
// loop (with and without quantizing x), then the geometry sweep. (~100
// lines: the timing loop closes over the buffers made here.)
int BenchShape(const Shape& s, const DecodeTuning& tuning, MatVecScratch* scratch,
               int64_t l2_bytes) {
  // A few distinct random rows, tiled over the matrix (values don't change
  // the timing; sane f16 scales keep the math finite).
  const int64_t distinct = std::min<int64_t>(s.n_rows, 64);
  const testutil::HostMatrix proto =
      testutil::RandomMatrix(s.type, s.layout, distinct, s.n_cols, 0, 7);
  const int64_t stride = proto.row_stride;
  const int64_t bytes = s.n_rows * stride;
  const int64_t slot = (bytes + 255) / 256 * 256;
  int64_t copies = std::max<int64_t>(1, (3 * l2_bytes + bytes - 1) / bytes);
  copies = std::min<int64_t>(copies, 64);
  std::vector<uint8_t> host(static_cast<size_t>(bytes));
  for (int64_t r = 0; r < s.n_rows; ++r) {
    std::memcpy(host.data() + r * stride, proto.bytes.data() + (r % distinct) * stride,
                static_cast<size_t>(stride));
  }
  uint8_t* dw = nullptr;
  BENCH_CUDA(cudaMalloc(&dw, static_cast<size_t>(slot * copies)));
  BENCH_CUDA(cudaMemcpy(dw, host.data(), host.size(), cudaMemcpyHostToDevice));
  for (int64_t c = 1; c < copies; ++c) {
    BENCH_CUDA(cudaMemcpy(dw + c * slot, dw, static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice));
  }
  std::mt19937_64 rng(3);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> x(static_cast<size_t>(s.n_cols * s.n_tokens));
  for (auto& v : x) v = normal(rng);
  float *dx = nullptr, *dy = nullptr;
  BENCH_CUDA(cudaMalloc(&dx, x.size() * 4));
  BENCH_CUDA(cudaMalloc(&dy, static_cast<size_t>(s.n_rows * s.n_tokens) * 4));
  BENCH_CUDA(cudaMemcpy(dx, x.data(), x.size() * 4, cudaMemcpyHostToDevice));

  WeightMatrix w;
  w.type = s.type;
  w.layout = s.layout;
  w.n_rows = s.n_rows;
  w.n_cols = s.n_cols;
  w.row_stride = stride;
  w.data = dw;
  absl::StatusOr<MatVecPlan> planned = PlanMatVec(w, tuning);
  BENCH_OK(planned.status());
  const MatVecPlan plan = *planned;
  const MatVecKernel kernel = plan.kernel;
  const bool quant = UsesQuantizedActivations(kernel);
  if (quant) BENCH_OK(QuantizeActivations(dx, s.n_cols, s.n_tokens, scratch, nullptr));
  MatVecIo io;
  io.x = dx;
  io.qx = quant ? scratch : nullptr;
  io.n_tokens = s.n_tokens;
  io.y = dy;

  cudaEvent_t e0, e1;
  BENCH_CUDA(cudaEventCreate(&e0));
  BENCH_CUDA(cudaEventCreate(&e1));
  const int iters = s.n_tokens > kMmaMaxTokens ? 20 : 100;  // prompt passes are long
  auto time_loop = [&](const MatVecPlan& p, bool with_quantize, float* ms) -> absl::Status {
    for (int warm = 0; warm < 2; ++warm) {
      const int n = warm == 0 ? std::max(2, iters / 8) : iters;
      if (cudaEventRecord(e0) != cudaSuccess) return absl::InternalError("event");
      for (int i = 0; i < n; ++i) {
        w.data = dw + (i % copies) * slot;
        if (with_quantize && quant) {
          absl::Status st = QuantizeActivations(dx, s.n_cols, s.n_tokens, scratch, nullptr);
          if (!st.ok()) return st;
        }
        absl::Status st = RunMatVec(w, p, io, nullptr);
        if (!st.ok()) return st;
      }
      if (cudaEventRecord(e1) != cudaSuccess || cudaEventSynchronize(e1) != cudaSuccess) {
        return absl::InternalError(absl::StrCat("timing loop: ", cudaGetErrorString(cudaGetLastError())));
      }
      if (cudaEventElapsedTime(ms, e0, e1) != cudaSuccess) return absl::InternalError("elapsed");
    }
    return absl::OkStatus();
  };
  float ms_mv = 0, ms_all = 0;
  BENCH_OK(time_loop(plan, false, &ms_mv));
  BENCH_OK(time_loop(plan, true, &ms_all));
  const double us = ms_mv * 1e3 / iters;
  const double us_all = ms_all * 1e3 / iters;
  const double gbs = bytes / (us * 1e-6) / 1e9;
  std::printf("%-26s %-9s %7ldx%-6ld tok %3ld %7.1f MB x%-2ld %s | %8.2f us %7.1f GB/s %5.1f%% | "
              "+quantize %8.2f us %5.1f%% |",
              s.name, MatVecKernelName(kernel), static_cast<long>(s.n_rows),
              static_cast<long>(s.n_cols), static_cast<long>(s.n_tokens), bytes / 1e6,
              static_cast<long>(copies), GeometryLabel(s.n_tokens == 1 ? plan.decode : plan.prompt).c_str(), us, gbs, 100.0 * gbs / kPeakGBs,
              us_all, 100.0 * bytes / (us_all * 1e-6) / 1e9 / kPeakGBs);
  std::printf("\n");
  // q4_K's two tensor-core forms on the same binary: int8 (int8 activations,
  // per-32 scaling of integer dots) and f16 (weights dequantized into f16
  // fragments), with their normalized difference.
  if (s.n_tokens >= 2 && s.n_tokens <= kMmaMaxTokens && MatVecMmaF16Supports(kernel, s.n_cols)) {
    MatVecPlan p8 = plan, p16 = plan;
    p8.mma_f16_min_tokens = 0;
    p16.mma_f16_min_tokens = 2;
    float ms8 = 0, ms16 = 0;
    std::vector<float> y8(static_cast<size_t>(s.n_rows * s.n_tokens)), y16(y8.size());
    BENCH_OK(time_loop(p8, false, &ms8));
    BENCH_CUDA(cudaMemcpy(y8.data(), dy, y8.size() * 4, cudaMemcpyDeviceToHost));
    BENCH_OK(time_loop(p16, false, &ms16));
    BENCH_CUDA(cudaMemcpy(y16.data(), dy, y16.size() * 4, cudaMemcpyDeviceToHost));
    double num = 0, den = 0;
    for (size_t i = 0; i < y8.size(); ++i) {
      num += (double(y16[i]) - y8[i]) * (double(y16[i]) - y8[i]);
      den += double(y8[i]) * y8[i];
    }
    const double us8 = ms8 * 1e3 / iters, us16 = ms16 * 1e3 / iters;
    std::printf("%-26s   int8 form %8.2f us %7.1f GB/s | f16 form %8.2f us %7.1f GB/s %6.1f TFLOP/s"
                " | %.2fx | rel. diff %.1e\n",
                s.name, us8, bytes / (us8 * 1e-6) / 1e9, us16, bytes / (us16 * 1e-6) / 1e9,
                2.0 * s.n_rows * s.n_cols * s.n_tokens / (us16 * 1e-6) / 1e12, us8 / us16,
                std::sqrt(num / std::max(den, 1e-30)));
  }
  // Single-token shapes: every compiled geometry on the same binary, for
  // tuning the planner's choices (matvec_plan.h).
  if (s.n_tokens == 1) BENCH_OK(SweepGeometries(s, plan, bytes, us, time_loop, iters));
  std::fflush(stdout);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaFree(dx);
  cudaFree(dy);
  cudaFree(dw);
  return 0;
}
// Q/K/V (or gate/up) of one 7B layer: one grouped launch per kernel
// (PlanMatVecGroups) against one launch per matrix, weights rotated past L2
// as above. Prints microseconds per layer's worth of launches.
int BenchGroup(const char* name, const std::vector<std::tuple<GgmlType, TensorLayout, int64_t>>& ms,
               int64_t n_cols, const DecodeTuning& tuning, MatVecScratch* scratch, int64_t l2_bytes) {
  std::vector<WeightMatrix> ws;
  std::vector<uint8_t*> bufs;
  int64_t bytes = 0;
  for (const auto& [type, layout, rows] : ms) {
    const testutil::HostMatrix m = testutil::RandomMatrix(type, layout, rows, n_cols, 0, 7);
    bytes += static_cast<int64_t>(m.bytes.size());
    uint8_t* d = nullptr;
    const int64_t copies = 16;
    BENCH_CUDA(cudaMalloc(&d, m.bytes.size() * copies));
    for (int64_t c = 0; c < copies; ++c) {
      BENCH_CUDA(cudaMemcpy(d + c * m.bytes.size(), m.bytes.data(), m.bytes.size(), cudaMemcpyHostToDevice));
    }
    bufs.push_back(d);
    ws.push_back(WeightMatrix{d, type, layout, rows, n_cols, m.row_stride});
  }
  const int64_t copies = std::max<int64_t>(1, std::min<int64_t>(16, 3 * l2_bytes / bytes + 1));
  float *dx = nullptr, *dy = nullptr;
  BENCH_CUDA(cudaMalloc(&dx, n_cols * 4));
  BENCH_CUDA(cudaMemset(dx, 0, n_cols * 4));
  BENCH_CUDA(cudaMalloc(&dy, 3 * 32768 * 4));
  BENCH_OK(QuantizeActivations(dx, n_cols, 1, scratch, nullptr));
  for (bool grouped : {true, false}) {
    DecodeTuning t = tuning;
    t.group_matvecs = grouped;
    const absl::StatusOr<std::vector<MatVecGroupPlan>> plans = PlanMatVecGroups(ws, t);
    BENCH_OK(plans.status());
    MatVecIo io;
    io.x = dx;
    io.qx = scratch;
    io.n_tokens = 1;
    cudaEvent_t e0, e1;
    BENCH_CUDA(cudaEventCreate(&e0));
    BENCH_CUDA(cudaEventCreate(&e1));
    const int iters = 200;
    float ms_total = 0;
    for (int warm = 0; warm < 2; ++warm) {
      BENCH_CUDA(cudaEventRecord(e0));
      for (int i = 0; i < iters; ++i) {
        for (const MatVecGroupPlan& g : *plans) {
          std::vector<const WeightMatrix*> members;
          std::vector<WeightMatrix> copy(ws);
          std::vector<MatVecOut> outs;
          for (int k : g.members) {
            copy[k].data = bufs[k] + (i % copies) * copy[k].n_rows * copy[k].row_stride;
            outs.push_back({dy + 32768 * outs.size(), nullptr, nullptr});
          }
          for (int k : g.members) members.push_back(&copy[k]);
          BENCH_OK(RunMatVecGroup(members, g.plan, outs, io, nullptr));
        }
      }
      BENCH_CUDA(cudaEventRecord(e1));
      BENCH_CUDA(cudaEventSynchronize(e1));
      BENCH_CUDA(cudaEventElapsedTime(&ms_total, e0, e1));
    }
    const double us = ms_total * 1e3 / iters;
    std::printf("group %-28s %s: %zu launches, %7.2f us, %7.1f GB/s (%.1f%%)\n", name,
                grouped ? "grouped" : "separate", plans->size(), us, bytes / (us * 1e-6) / 1e9,
                100.0 * bytes / (us * 1e-6) / 1e9 / kPeakGBs);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
  }
  for (uint8_t* d : bufs) cudaFree(d);
  cudaFree(dx);
  cudaFree(dy);
  return 0;
}

int Main() {
  cudaDeviceProp prop;
  BENCH_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("device %s, %d SMs, L2 %d MB; peak used for %%: %.0f GB/s\n", prop.name,
              prop.multiProcessorCount, prop.l2CacheSize >> 20, kPeakGBs);
  absl::StatusOr<DecodeTuning> tuning = DecodeTuningForDevice();
  BENCH_OK(tuning.status());
  // The f16 form's k-split sum in clusters and its CTAs a SM up to 16
  // tokens, as dpl-bench takes them.
  if (const char* e = std::getenv("DPL_F16_CLUSTER"); e != nullptr) {
    tuning->mma_f16_cluster_sum = std::atoi(e);
  }
  if (const char* e = std::getenv("DPL_F16_CTAS"); e != nullptr) {
    tuning->mma_f16_small_ctas_per_sm = std::atoi(e);
  }
  if (const char* e = std::getenv("DPL_F16_TARGET"); e != nullptr) {
    tuning->mma_f16_target_ctas = std::atoi(e);
  }
  if (const char* e = std::getenv("DPL_F16_TARGET_WIDE"); e != nullptr) {
    tuning->mma_f16_target_ctas_wide = std::atoi(e);
  }
  std::printf("tuning: q6_K decode CTAs per SM %d\n", tuning->q6k_ctas_per_sm);
  const absl::StatusOr<uint64_t> scratch_bytes = MatVecScratchBytes(18944, 512);
  BENCH_OK(scratch_bytes.status());
  absl::StatusOr<DeviceBuffer<uint8_t>> scratch_mem = DeviceBuffer<uint8_t>::Allocate(*scratch_bytes);
  BENCH_OK(scratch_mem.status());
  MatVecScratch scratch = MatVecScratchIn(scratch_mem->get(), 18944, 512);
  std::vector<Shape> shapes = {
      // Qwen2.5-7B (hidden 3584, ffn 18944, kv 512, vocab 152064)
      {"7B ffn_gate/up q4_K", GgmlType::kQ4_K, TensorLayout::kRaw, 18944, 3584, 1},
      {"7B ffn_down q4_K", GgmlType::kQ4_K, TensorLayout::kRaw, 3584, 18944, 1},
      {"7B ffn_down q6_K dpl", GgmlType::kQ6_K, TensorLayout::kDpl, 3584, 18944, 1},
      {"7B ffn_down q6_K raw", GgmlType::kQ6_K, TensorLayout::kRaw, 3584, 18944, 1},
      {"7B lm_head q6_K dpl", GgmlType::kQ6_K, TensorLayout::kDpl, 152064, 3584, 1},
      {"7B attn_q/o q4_K", GgmlType::kQ4_K, TensorLayout::kRaw, 3584, 3584, 1},
      {"7B attn_k q4_K", GgmlType::kQ4_K, TensorLayout::kRaw, 512, 3584, 1},
      {"7B attn_v q6_K dpl", GgmlType::kQ6_K, TensorLayout::kDpl, 512, 3584, 1},
      // Qwen2.5-14B (hidden 5120, ffn 13824, kv 1024)
      {"14B ffn_gate/up q4_K", GgmlType::kQ4_K, TensorLayout::kRaw, 13824, 5120, 1},
      {"14B ffn_down q4_K", GgmlType::kQ4_K, TensorLayout::kRaw, 5120, 13824, 1},
      {"14B ffn_down q6_K dpl", GgmlType::kQ6_K, TensorLayout::kDpl, 5120, 13824, 1},
      {"14B lm_head q6_K dpl", GgmlType::kQ6_K, TensorLayout::kDpl, 152064, 5120, 1},
      {"14B attn_q/o q4_K", GgmlType::kQ4_K, TensorLayout::kRaw, 5120, 5120, 1},
      {"f16 18944x3584", GgmlType::kF16, TensorLayout::kRaw, 18944, 3584, 1},
      {"bf16 18944x3584", GgmlType::kBF16, TensorLayout::kRaw, 18944, 3584, 1},
      {"f32 3584x3584", GgmlType::kF32, TensorLayout::kRaw, 3584, 3584, 1},
      // Prompt processing: 512 tokens through the tiled kernel.
      {"7B ffn_gate q4_K x512tok", GgmlType::kQ4_K, TensorLayout::kRaw, 18944, 3584, 512},
      {"7B ffn_down q6_K x512tok", GgmlType::kQ6_K, TensorLayout::kDpl, 3584, 18944, 512},
  };
  // Every other block type on the 7B layer shapes, raw and (where it has
  // planes) dpl: what the converter's choice of layout per type rests on
  // (kAutoLayout in converter/convert.cc).
  for (GgmlType t : {GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0,
                     GgmlType::kQ5_1, GgmlType::kIQ4_NL, GgmlType::kQ2_K, GgmlType::kQ3_K,
                     GgmlType::kQ5_K, GgmlType::kIQ4_XS}) {
    for (TensorLayout l : {TensorLayout::kRaw, TensorLayout::kDpl}) {
      if (l == TensorLayout::kDpl && formats::DplPlanesOf(t).n == 0) continue;
      static std::deque<std::string> names;  // Shape holds a char*: a deque never moves them
      for (const auto& [what, rows, cols] : {std::tuple{"ffn_gate/up", 18944, 3584},
                                             std::tuple{"ffn_down", 3584, 18944},
                                             std::tuple{"attn_q/o", 3584, 3584}}) {
        names.push_back(absl::StrCat("7B ", what, " ", formats::TraitsOf(t).name,
                                     l == TensorLayout::kDpl ? " dpl" : " raw"));
        shapes.push_back({names.back().c_str(), t, l, rows, cols, 1});
      }
    }
  }
  // Batched decode steps (issues 12, 29): 4-64 tokens through the int8 mma form
  // (RunMatVec picks it for 2..kMmaMaxTokens tokens); "mma" selects them.
  for (int64_t tokens : {4, 8, 16, 32, 64}) {
    static std::deque<std::string> names;
    for (const auto& [what, type, layout, rows, cols] :
         {std::tuple{"attn_q/o q4_K", GgmlType::kQ4_K, TensorLayout::kRaw, 3584, 3584},
          std::tuple{"attn_k/v q4_K", GgmlType::kQ4_K, TensorLayout::kRaw, 512, 3584},
          std::tuple{"ffn_gate/up q4_K", GgmlType::kQ4_K, TensorLayout::kRaw, 18944, 3584},
          std::tuple{"ffn_down q4_K", GgmlType::kQ4_K, TensorLayout::kRaw, 3584, 18944},
          std::tuple{"ffn_down q6_K dpl", GgmlType::kQ6_K, TensorLayout::kDpl, 3584, 18944},
          std::tuple{"lm_head q6_K dpl", GgmlType::kQ6_K, TensorLayout::kDpl, 152064, 3584},
          std::tuple{"ffn_gate/up q5_K", GgmlType::kQ5_K, TensorLayout::kRaw, 18944, 3584},
          std::tuple{"ffn_gate/up q8_0 dpl", GgmlType::kQ8_0, TensorLayout::kDpl, 18944, 3584},
          std::tuple{"14B attn_q/o q4_K", GgmlType::kQ4_K, TensorLayout::kRaw, 5120, 5120},
          std::tuple{"14B ffn_gate/up q4_K", GgmlType::kQ4_K, TensorLayout::kRaw, 13824, 5120},
          std::tuple{"14B ffn_down q4_K", GgmlType::kQ4_K, TensorLayout::kRaw, 5120, 13824}}) {
      const bool b14 = std::strncmp(what, "14B ", 4) == 0;
      names.push_back(absl::StrCat(b14 ? "mma " : "mma 7B ", what, " ", tokens, "tok"));
      shapes.push_back({names.back().c_str(), type, layout, rows, cols, tokens});
    }
  }
  // Wave fit of the f16 form (issue 29): q4_K matrices of 3584 columns whose
  // row counts make whole or fractional waves of CTAs (two a SM at 64 tokens
  // on a 132-SM H100: 8448, 16896, 33792 rows are one wave; 17152 is one wave
  // and 4 CTAs, 18944 (7B gate/up) 1.12, 25344 1.5). If a product's time
  // follows its waves rather than its bytes, a CTA's own chain bounds it.
  for (int64_t tokens : {16, 64}) {
    static std::deque<std::string> names;
    for (int64_t rows : {8448, 16896, 17152, 18944, 25344, 33792}) {
      names.push_back(absl::StrCat("waves q4_K ", rows, "x3584 ", tokens, "tok"));
      shapes.push_back({names.back().c_str(), GgmlType::kQ4_K, TensorLayout::kRaw, rows, 3584, tokens});
    }
  }
  const char* only = std::getenv("DPL_MATVEC_BENCH_ONLY");  // substring filter on shape names
  if (only == nullptr || std::strstr("group", only) != nullptr) {
    using T = GgmlType;
    using L = TensorLayout;
    if (BenchGroup("7B q/k/v q4_K", {{T::kQ4_K, L::kRaw, 3584}, {T::kQ4_K, L::kRaw, 512}, {T::kQ4_K, L::kRaw, 512}},
                   3584, *tuning, &scratch, prop.l2CacheSize) != 0 ||
        BenchGroup("7B q/k q4_K + v q6_K", {{T::kQ4_K, L::kRaw, 3584}, {T::kQ4_K, L::kRaw, 512}, {T::kQ6_K, L::kDpl, 512}},
                   3584, *tuning, &scratch, prop.l2CacheSize) != 0 ||
        BenchGroup("7B gate/up q4_K", {{T::kQ4_K, L::kRaw, 18944}, {T::kQ4_K, L::kRaw, 18944}}, 3584, *tuning,
                   &scratch, prop.l2CacheSize) != 0 ||
        BenchGroup("7B q/k/v q8_0 dpl", {{T::kQ8_0, L::kDpl, 3584}, {T::kQ8_0, L::kDpl, 512}, {T::kQ8_0, L::kDpl, 512}},
                   3584, *tuning, &scratch, prop.l2CacheSize) != 0 ||
        BenchGroup("8B q/k/v q4_K (qwen3)", {{T::kQ4_K, L::kRaw, 4096}, {T::kQ4_K, L::kRaw, 1024}, {T::kQ4_K, L::kRaw, 1024}},
                   4096, *tuning, &scratch, prop.l2CacheSize) != 0) {
      return 1;
    }
  }
  for (const Shape& s : shapes) {
    if (only != nullptr && std::strstr(s.name, only) == nullptr) continue;
    if (BenchShape(s, *tuning, &scratch, prop.l2CacheSize) != 0) return 1;
  }
  return 0;
}

}  // namespace
}  // namespace dpl::kernels

int main() { return dpl::kernels::Main(); }
