// Prompt matmul benchmark (tags manual, needs a GPU). For Qwen2.5-7B/14B layer
// shapes and T = 1 .. 2048 tokens, microseconds of:
//   GEMM:   cuBLAS alone on f16 weights (PromptGemm::GemmF16), and its TFLOP/s;
//   Run:    PromptGemm::Run (dequant + GEMM) through one scratch of the whole
//           matrix or of kScratchMiB, launched eagerly and replayed from a
//           captured CUDA graph (which shows how much of an eager Run is host
//           time: cuBLAS's per-call overhead, paid once per row block);
//   int8:   the int8 matvec path, QuantizeActivations + RunMatVec: the dp4a
//           kernel at 1 token, the mma forms (matvec_mma.cu, or the f16 one
//           from DecodeTuning's thresholds) at 2 to kMmaMaxTokens for q4_K /
//           q6_K, and with DPL_MMA_F16_MAX=N the f16 form's wide launch from
//           65 to N tokens (DPL_F16_WIDE_SPLIT=0|1: k split in clusters;
//           else and beyond, the dp4a token tile), with its
//           GB/s of quantized weights and TFLOP/s;
// then the f16 dequant alone (GB/s of quantized bytes read + f16 bytes
// written, against the device's memset and D2D copy ceilings), and per shape
// the smallest T from which dequant + GEMM beats the int8 path (what
// DecodeTuning's mma_max_tokens and gemm_min_tokens follow). Markdown tables.
// DPL_GEMM_BENCH_TOKENS=1,2,4 limits the token counts, DPL_GEMM_BENCH_ONLY a
// substring of the shape names.
//
// Timing: CUDA events around loops of `inner` calls (>= ~0.3 ms per loop),
// the median of 7 loops after a warm-up, everything on one stream. The
// quantized weights (and, for GEMM alone, their f16 copies) are replicated
// to > 3x the L2 size and rotated, so every call reads weights from HBM as a
// prompt pass does (each layer's weights once); x, y and Run's scratch are
// not rotated (the runtime keeps one of each).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "base/status_macros.h"
#include "kernels/cuda_handles.h"
#include "kernels/device_tuning.h"
#include "kernels/gemm/prompt_gemm.h"
#include "kernels/matvec/matvec.h"
#include "kernels/matvec/matvec_test_util.h"

namespace dpl::kernels {
namespace {

using formats::GgmlType;
using formats::TensorLayout;

constexpr int64_t kTokens[] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048};
constexpr int64_t kMaxTokens = 2048;
constexpr int kReps = 7;
// Run's scratch sizes besides the whole matrix. Why smaller ones: a block
// that fits in L2 lets the GEMM read the f16 rows the dequant just wrote from
// L2, and the next block overwrites them there before they reach HBM.
constexpr int64_t kScratchMiB[] = {16, 32};
constexpr int kNumScratch = 1 + static_cast<int>(std::size(kScratchMiB));

struct Shape {
  const char* name;
  GgmlType type;
  TensorLayout layout;
  int64_t n_rows, n_cols;
};

// Events on `stream` around loops of calls; fn(i) enqueues call i (i rotates
// the buffers).
class Timer {
 public:
  static absl::StatusOr<Timer> Create(cudaStream_t stream) {
    Timer t;
    t.stream_ = stream;
    DPL_ASSIGN_OR_RETURN(t.e0_, CreateEvent(cudaEventDefault));
    DPL_ASSIGN_OR_RETURN(t.e1_, CreateEvent(cudaEventDefault));
    return t;
  }
  // Median microseconds per call.
  absl::StatusOr<double> MedianUs(const std::function<absl::Status(int64_t)>& fn) {
    DPL_ASSIGN_OR_RETURN(const double first, LoopUs(fn, 1));  // warm-up and estimate
    const int64_t inner = std::clamp<int64_t>(static_cast<int64_t>(300.0 / first) + 1, 1, 64);
    std::vector<double> us;
    for (int r = 0; r < kReps; ++r) {
      DPL_ASSIGN_OR_RETURN(const double u, LoopUs(fn, inner));
      us.push_back(u);
    }
    std::sort(us.begin(), us.end());
    return us[us.size() / 2];
  }

 private:
  absl::StatusOr<double> LoopUs(const std::function<absl::Status(int64_t)>& fn, int64_t n) {
    DPL_CUDA_CHECK(cudaEventRecord(e0_.get(), stream_));
    for (int64_t i = 0; i < n; ++i) DPL_RETURN_IF_ERROR(fn(counter_++));
    DPL_CUDA_CHECK(cudaEventRecord(e1_.get(), stream_));
    DPL_CUDA_CHECK(cudaEventSynchronize(e1_.get()));
    float ms = 0;
    DPL_CUDA_CHECK(cudaEventElapsedTime(&ms, e0_.get(), e1_.get()));
    return ms * 1e3 / static_cast<double>(n);
  }
  cudaStream_t stream_ = nullptr;
  Event e0_, e1_;
  int64_t counter_ = 0;
};

// `copies` slots of `bytes` each (256-aligned), the first filled from host
// and copied to the rest.
struct Replicated {
  DeviceBuffer<uint8_t> mem;
  int64_t slot = 0, copies = 0;
  uint8_t* at(int64_t i) const { return mem.get() + (i % copies) * slot; }
};
absl::StatusOr<Replicated> Replicate(const void* host, int64_t bytes, int64_t copies) {
  Replicated r;
  r.slot = (bytes + 255) / 256 * 256;
  r.copies = copies;
  DPL_ASSIGN_OR_RETURN(r.mem, DeviceBuffer<uint8_t>::Allocate(static_cast<size_t>(r.slot * copies)));
  if (host != nullptr) {
    DPL_CUDA_CHECK(cudaMemcpy(r.mem.get(), host, static_cast<size_t>(bytes), cudaMemcpyHostToDevice));
    for (int64_t c = 1; c < copies; ++c) {
      DPL_CUDA_CHECK(cudaMemcpy(r.at(c), r.mem.get(), static_cast<size_t>(bytes),
                                cudaMemcpyDeviceToDevice));
    }
  }
  return r;
}

// Copies of `bytes` that together exceed 3x the L2 (at least 1, at most 64).
int64_t CopiesPastL2(int64_t bytes, int64_t l2_bytes) {
  return std::clamp<int64_t>((3 * l2_bytes + bytes - 1) / bytes, 1, 64);
}

struct Row {
  int64_t tokens;
  double gemm_us;
  double run_us[kNumScratch];    // eager; whole matrix, then kScratchMiB
  double graph_us[kNumScratch];  // the same Run replayed from a graph
  double int8_us;  // RunMatVec: dp4a, or the mma form at 2..kMmaMaxTokens
};

// The smallest T from which `us(row)` beats the int8 path at every larger T.
std::string Crossover(const std::vector<Row>& rows, const std::function<double(const Row&)>& us) {
  int64_t crossover = -1;
  for (size_t i = rows.size(); i-- > 0;) {
    if (us(rows[i]) >= rows[i].int8_us) break;
    crossover = rows[i].tokens;
  }
  return crossover < 0 ? std::string("never") : absl::StrCat("T >= ", crossover);
}

struct Tables {
  std::string dequant, summary;
};

absl::Status BenchShape(const Shape& s, const std::vector<int64_t>& tokens,
                        const DecodeTuning& tuning, MatVecScratch* mv_scratch, int64_t l2_bytes,
                        double copy_gbs, cudaStream_t stream, Timer& timer, Tables* tables) {
  // A few distinct random rows tiled over the matrix (values don't change the
  // timing; sane f16 scales keep the math finite).
  const int64_t distinct = std::min<int64_t>(s.n_rows, 64);
  const testutil::HostMatrix proto =
      testutil::RandomMatrix(s.type, s.layout, distinct, s.n_cols, 0, 7);
  const int64_t stride = proto.row_stride;
  const int64_t q_bytes = s.n_rows * stride;
  std::vector<uint8_t> host(static_cast<size_t>(q_bytes));
  for (int64_t r = 0; r < s.n_rows; ++r) {
    std::memcpy(host.data() + r * stride, proto.bytes.data() + (r % distinct) * stride,
                static_cast<size_t>(stride));
  }
  DPL_ASSIGN_OR_RETURN(const Replicated wq,
                       Replicate(host.data(), q_bytes, CopiesPastL2(q_bytes, l2_bytes)));
  const int64_t h_elems = s.n_rows * s.n_cols, h_bytes = 2 * h_elems;
  DPL_ASSIGN_OR_RETURN(const Replicated wh,
                       Replicate(nullptr, h_bytes, CopiesPastL2(h_bytes, l2_bytes)));
  const WeightMatrix w{wq.at(0), s.type, s.layout, s.n_rows, s.n_cols, stride};
  auto w_at = [&](int64_t i) {
    WeightMatrix wi = w;
    wi.data = wq.at(i);
    return wi;
  };
  auto h_at = [&](int64_t i) { return reinterpret_cast<uint16_t*>(wh.at(i)); };
  for (int64_t c = 0; c < wh.copies; ++c) {  // f16 weights for the GEMM-alone timing
    DPL_RETURN_IF_ERROR(DequantizeRowsF16(w, 0, s.n_rows, h_at(c), stream));
  }
  DPL_ASSIGN_OR_RETURN(DeviceBuffer<uint16_t> scratch,
                       DeviceBuffer<uint16_t>::Allocate(static_cast<size_t>(h_elems)));
  int64_t scratch_elems[kNumScratch] = {h_elems};
  for (int k = 1; k < kNumScratch; ++k) {
    scratch_elems[k] = std::min(h_elems, (kScratchMiB[k - 1] << 20) / 2);
  }

  std::mt19937_64 rng(3);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> x(static_cast<size_t>(kMaxTokens * s.n_cols));
  for (float& v : x) v = normal(rng);
  DPL_ASSIGN_OR_RETURN(DeviceBuffer<float> dx, DeviceBuffer<float>::Allocate(x.size()));
  DPL_ASSIGN_OR_RETURN(DeviceBuffer<uint16_t> dxh, DeviceBuffer<uint16_t>::Allocate(x.size()));
  DPL_ASSIGN_OR_RETURN(DeviceBuffer<float> dy,
                       DeviceBuffer<float>::Allocate(static_cast<size_t>(kMaxTokens * s.n_rows)));
  DPL_CUDA_CHECK(cudaMemcpy(dx.get(), x.data(), x.size() * 4, cudaMemcpyHostToDevice));
  DPL_RETURN_IF_ERROR(ConvertToF16(dx.get(), static_cast<int64_t>(x.size()), dxh.get(), stream));
  DPL_ASSIGN_OR_RETURN(PromptGemm gemm, PromptGemm::Create(stream));
  DPL_ASSIGN_OR_RETURN(const MatVecPlan plan, PlanMatVec(w, tuning));

  // Dequant alone (T-independent), weights and outputs rotated past L2.
  DPL_ASSIGN_OR_RETURN(const double dq_us, timer.MedianUs([&](int64_t i) {
    return DequantizeRowsF16(w_at(i), 0, s.n_rows, h_at(i), stream);
  }));
  const double dq_gbs = static_cast<double>(q_bytes + h_bytes) / (dq_us * 1e-6) / 1e9;
  absl::StrAppendFormat(&tables->dequant, "| %s | %dx%d | %.1f | %.1f | %.1f | %.0f | %.0f%% |\n",
                        s.name, s.n_rows, s.n_cols, q_bytes / 1e6, h_bytes / 1e6, dq_us, dq_gbs,
                        100.0 * dq_gbs / copy_gbs);

  std::vector<Row> rows;
  for (const int64_t T : tokens) {
    Row row{T, 0, {}, {}, 0};
    DPL_ASSIGN_OR_RETURN(row.gemm_us, timer.MedianUs([&](int64_t i) {
      return gemm.GemmF16(h_at(i), s.n_rows, s.n_cols, dxh.get(), T, dy.get(), s.n_rows, 0.0f);
    }));
    for (int k = 0; k < kNumScratch; ++k) {
      auto run = [&](int64_t i) {
        return gemm.Run(w_at(i), dxh.get(), T, dy.get(), nullptr, nullptr, scratch.get(),
                        scratch_elems[k]);
      };
      DPL_ASSIGN_OR_RETURN(row.run_us[k], timer.MedianUs(run));
      // One graph per weight copy, so the replays rotate like the eager runs.
      std::vector<GraphExec> graphs;
      for (int64_t c = 0; c < wq.copies; ++c) {
        DPL_ASSIGN_OR_RETURN(GraphExec g, CaptureGraph(stream, [&] { return run(c); }));
        graphs.push_back(std::move(g));
      }
      DPL_ASSIGN_OR_RETURN(row.graph_us[k], timer.MedianUs([&](int64_t i) -> absl::Status {
        DPL_CUDA_CHECK(cudaGraphLaunch(graphs[static_cast<size_t>(i % wq.copies)].get(), stream));
        return absl::OkStatus();
      }));
    }
    DPL_ASSIGN_OR_RETURN(row.int8_us, timer.MedianUs([&](int64_t i) {
      DPL_RETURN_IF_ERROR(QuantizeActivations(dx.get(), s.n_cols, T, mv_scratch, stream));
      MatVecIo io;
      io.x = dx.get();
      io.qx = mv_scratch;
      io.n_tokens = T;
      io.y = dy.get();
      return RunMatVec(w_at(i), plan, io, stream);
    }));
    rows.push_back(row);
  }

  for (const Row& r : rows) {
    const double flops = 2.0 * static_cast<double>(r.tokens * s.n_rows * s.n_cols);
    std::printf("| %s | %ld | %.1f | %.1f |", s.name, static_cast<long>(r.tokens), r.gemm_us,
                flops / (r.gemm_us * 1e-6) / 1e12);
    for (int k = 0; k < kNumScratch; ++k) std::printf(" %.1f / %.1f |", r.run_us[k], r.graph_us[k]);
    std::printf(" %.1f | %.0f | %.1f | %s |\n", r.int8_us, q_bytes / (r.int8_us * 1e-6) / 1e9,
                flops / (r.int8_us * 1e-6) / 1e12,
                r.run_us[0] < r.int8_us ? "dequant+GEMM"
                : r.tokens > kMmaMaxTokens && r.tokens <= plan.mma_f16_max_tokens ? "f16 wide"
                : r.tokens == 1 || r.tokens > kMmaMaxTokens || !MatVecMmaSupports(plan.kernel, s.n_cols)
                    ? "dp4a"
                    : "mma");
  }
  std::fflush(stdout);
  absl::StrAppend(&tables->summary, "| ", s.name, " |");
  for (int k = 0; k < kNumScratch; ++k) {
    absl::StrAppend(&tables->summary, " ", Crossover(rows, [k](const Row& r) { return r.run_us[k]; }),
                    " / ", Crossover(rows, [k](const Row& r) { return r.graph_us[k]; }), " |");
  }
  absl::StrAppend(&tables->summary, "\n");
  return absl::OkStatus();
}

// HBM ceilings on this device: cudaMemsetAsync (write only) and a
// device-to-device cudaMemcpyAsync (GB/s of bytes read + written), 512 MiB.
absl::Status Ceilings(cudaStream_t stream, Timer& timer, double* write_gbs, double* copy_gbs) {
  const size_t bytes = size_t{512} << 20;
  DPL_ASSIGN_OR_RETURN(DeviceBuffer<uint8_t> a, DeviceBuffer<uint8_t>::Allocate(bytes));
  DPL_ASSIGN_OR_RETURN(DeviceBuffer<uint8_t> b, DeviceBuffer<uint8_t>::Allocate(bytes));
  DPL_ASSIGN_OR_RETURN(const double set_us, timer.MedianUs([&](int64_t) -> absl::Status {
    DPL_CUDA_CHECK(cudaMemsetAsync(a.get(), 1, bytes, stream));
    return absl::OkStatus();
  }));
  DPL_ASSIGN_OR_RETURN(const double copy_us, timer.MedianUs([&](int64_t) -> absl::Status {
    DPL_CUDA_CHECK(cudaMemcpyAsync(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice, stream));
    return absl::OkStatus();
  }));
  *write_gbs = bytes / (set_us * 1e-6) / 1e9;
  *copy_gbs = 2.0 * bytes / (copy_us * 1e-6) / 1e9;
  return absl::OkStatus();
}

absl::Status Bench() {
  cudaDeviceProp prop;
  DPL_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device %s, %d SMs, L2 %d MB\n\n", prop.name, prop.multiProcessorCount,
              prop.l2CacheSize >> 20);
  DPL_ASSIGN_OR_RETURN(DecodeTuning tuning, DecodeTuningForDevice());
  if (const char* e = std::getenv("DPL_MMA_F16_MAX"); e != nullptr && *e != '\0') {
    if (!absl::SimpleAtoi(e, &tuning.mma_f16_max_tokens) || tuning.mma_f16_max_tokens < 0) {
      return absl::InvalidArgumentError(absl::StrCat("DPL_MMA_F16_MAX: bad token count '", e, "'"));
    }
  }
  if (const char* e = std::getenv("DPL_F16_WIDE_SPLIT"); e != nullptr && *e != '\0') {
    tuning.mma_f16_wide_split = std::atoi(e) != 0;
  }
  const int64_t f16_max = std::max<int64_t>(kMmaMaxTokens, tuning.mma_f16_max_tokens);
  DPL_ASSIGN_OR_RETURN(const uint64_t mv_bytes, MatVecScratchBytes(18944, kMaxTokens, f16_max));
  DPL_ASSIGN_OR_RETURN(DeviceBuffer<uint8_t> mv_mem, DeviceBuffer<uint8_t>::Allocate(mv_bytes));
  MatVecScratch mv_scratch = MatVecScratchIn(mv_mem.get(), 18944, kMaxTokens, f16_max);
  DPL_ASSIGN_OR_RETURN(Stream stream, CreateStream());
  DPL_ASSIGN_OR_RETURN(Timer timer, Timer::Create(stream.get()));
  const Shape shapes[] = {
      // Qwen2.5-7B (hidden 3584, ffn 18944, kv 512)
      {"7B attn_q/o q4_K", GgmlType::kQ4_K, TensorLayout::kRaw, 3584, 3584},
      {"7B attn_k/v q4_K", GgmlType::kQ4_K, TensorLayout::kRaw, 512, 3584},
      {"7B ffn_gate/up q4_K", GgmlType::kQ4_K, TensorLayout::kRaw, 18944, 3584},
      {"7B ffn_down q4_K", GgmlType::kQ4_K, TensorLayout::kRaw, 3584, 18944},
      {"7B ffn_down q6_K dpl", GgmlType::kQ6_K, TensorLayout::kDpl, 3584, 18944},
      // Qwen2.5-14B (hidden 5120, ffn 13824, kv 1024)
      {"14B attn_q/o q4_K", GgmlType::kQ4_K, TensorLayout::kRaw, 5120, 5120},
      {"14B attn_k/v q4_K", GgmlType::kQ4_K, TensorLayout::kRaw, 1024, 5120},
      {"14B ffn_gate/up q4_K", GgmlType::kQ4_K, TensorLayout::kRaw, 13824, 5120},
      {"14B ffn_down q4_K", GgmlType::kQ4_K, TensorLayout::kRaw, 5120, 13824},
      {"14B ffn_down q6_K dpl", GgmlType::kQ6_K, TensorLayout::kDpl, 5120, 13824},
  };
  std::vector<int64_t> tokens(std::begin(kTokens), std::end(kTokens));
  if (const char* e = std::getenv("DPL_GEMM_BENCH_TOKENS"); e != nullptr) {
    tokens.clear();
    for (const absl::string_view item : absl::StrSplit(e, ',', absl::SkipEmpty())) {
      int64_t t = 0;
      if (!absl::SimpleAtoi(item, &t) || t < 1 || t > kMaxTokens) {
        return absl::InvalidArgumentError(absl::StrCat("DPL_GEMM_BENCH_TOKENS: bad token count '",
                                                       item, "' (1..", kMaxTokens, ")"));
      }
      tokens.push_back(t);
    }
  }
  const char* only = std::getenv("DPL_GEMM_BENCH_ONLY");
  double write_gbs = 0, copy_gbs = 0;
  DPL_RETURN_IF_ERROR(Ceilings(stream.get(), timer, &write_gbs, &copy_gbs));
  std::printf("HBM ceilings: cudaMemset %.0f GB/s (write), D2D cudaMemcpy %.0f GB/s (read + "
              "write).\n\n",
              write_gbs, copy_gbs);
  std::printf("Microseconds, medians of %d loops. Run: eager / graph replay.\n\n", kReps);
  std::printf("| shape | T | GEMM | GEMM TFLOP/s | Run whole |");
  for (int64_t mib : kScratchMiB) std::printf(" Run %ld MiB |", static_cast<long>(mib));
  std::printf(" int8 | int8 GB/s | int8 TFLOP/s | faster (eager, whole) |\n|---|---|---|---|---|");
  for (size_t k = 0; k < std::size(kScratchMiB); ++k) std::printf("---|");
  std::printf("---|---|---|---|\n");
  Tables tables;
  tables.dequant =
      "| shape | N x K | q MB | f16 MB | dequant us | GB/s (read + write) | of D2D copy |\n"
      "|---|---|---|---|---|---|---|\n";
  tables.summary = "| shape | Run whole (eager / graph) |";
  for (int64_t mib : kScratchMiB) absl::StrAppend(&tables.summary, " Run ", mib, " MiB |");
  absl::StrAppend(&tables.summary, "\n|---|---|");
  for (size_t k = 0; k < std::size(kScratchMiB); ++k) absl::StrAppend(&tables.summary, "---|");
  absl::StrAppend(&tables.summary, "\n");
  for (const Shape& s : shapes) {
    if (only != nullptr && std::strstr(s.name, only) == nullptr) continue;
    DPL_RETURN_IF_ERROR(BenchShape(s, tokens, tuning, &mv_scratch, prop.l2CacheSize, copy_gbs,
                                   stream.get(), timer, &tables));
  }
  std::printf("\nDequantizeRowsF16 of the whole matrix (weights and outputs rotated past L2):\n\n%s",
              tables.dequant.c_str());
  std::printf("\ndequant + GEMM faster than the int8 path from (and at every larger T):\n\n%s",
              tables.summary.c_str());
  return absl::OkStatus();
}

}  // namespace
}  // namespace dpl::kernels

int main() {
  const absl::Status st = dpl::kernels::Bench();
  if (!st.ok()) {
    std::fprintf(stderr, "%s\n", st.ToString().c_str());
    return 1;
  }
  return 0;
}
