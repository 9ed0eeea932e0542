// Dequantization of weight rows to f16 (one thread per 8 consecutive
// weights, one 16-byte store each), the activation and output-init kernels,
// and the cuBLAS GEMM of PromptGemm. See prompt_gemm.h.
#include "kernels/gemm/prompt_gemm.h"

#include <cuda_fp16.h>

#include <climits>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "formats/ggml_types.h"
#include "formats/tensor_layout.h"
#include "kernels/cuda_check.h"
#include "kernels/dequant.cuh"
#include "kernels/gemm/cublas_api.h"

namespace dpl::kernels {
namespace {

using formats::GgmlType;
using formats::TensorLayout;

absl::Status CublasStatus(cublasStatus_t st, const char* what, const char* file, int line) {
  if (st == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  const absl::StatusOr<const CublasApi*> api = Cublas();  // opened: it made the call
  return absl::InternalError(absl::StrCat(
      what, " failed at ", file, ":", line, ": ",
      api.ok() ? absl::StrCat((*api)->status_name(st), " (", (*api)->status_string(st), ")")
               : absl::StrCat("cublasStatus_t ", static_cast<int>(st))));
}

}  // namespace
}  // namespace dpl::kernels

// Returns from the enclosing function (absl::Status or StatusOr) when the
// cuBLAS call fails, naming the call and its cublasStatus_t.
#define DPL_CUBLAS_CHECK(call)                                                           \
  do {                                                                                   \
    const cublasStatus_t dpl_cublas_st_ = (call);                                        \
    if (dpl_cublas_st_ != CUBLAS_STATUS_SUCCESS) {                                       \
      return ::dpl::kernels::CublasStatus(dpl_cublas_st_, #call, __FILE__, __LINE__);    \
    }                                                                                    \
  } while (0)

namespace dpl::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kGroup = 8;  // weights per thread: 8 f16 = one 16-byte store

// 8 floats -> 8 f16 (round to nearest even each, as __float2half_rn), packed
// low element first, as they lie in memory.
__device__ __forceinline__ uint4 PackHalf8(const float (&v)[8]) {
  uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const __half2 h = __floats2half2_rn(v[2 * i], v[2 * i + 1]);
    w[i] = *reinterpret_cast<const uint32_t*>(&h);
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// out[r][j] = f16(dequant(w row r)[j]), r < n_rows, j < n_cols
// Thread g writes group g of the (n_rows, n_cols) output: row g / gpr,
// columns 8 (g % gpr) ... + 7 (gpr = n_cols / 8 groups per row), so a warp's
// stores are 512 contiguous bytes and, for the k-quants, a warp reads the
// 1 (q4_K, q6_K) or 8 (q8_0, q5_0) blocks they come from; the header and
// scale bytes the threads share come from L1. 32-bit indices: the host
// launches at most 2^30 groups at a time.
// Measured (H200, gemm_bench, 2026-12-01): q4_K 18944x3584 in 54 us, 3.2 TB/s
// of bytes read + written = 77% of a D2D cudaMemcpy (4.15 TB/s); f16 4.0 TB/s,
// q8_0 3.7, q6_K dpl 2.9. Tried and no faster (same bits): 2 or 4 groups per
// thread, 16 adjacent weights per thread (q6_K dpl +6%, q8_0/f16 -10..20%),
// streaming stores, one 16-byte q4_K header load with the scales picked from
// registers, integer-to-float by exponent bits instead of I2F.
template <GgmlType kType, bool kDpl>
__global__ void __launch_bounds__(kThreads)
    DequantF16Kernel(const uint8_t* __restrict__ w,  // (n_rows, row_stride) bytes
                     int64_t row_stride, int64_t n_cols, uint32_t groups_per_row,
                     uint32_t n_groups,
                     uint4* __restrict__ out) {  // (n_rows, n_cols) f16, 8 per uint4
  // One pass for a full grid; a capped grid (max_ctas) strides.
  for (uint32_t g = blockIdx.x * kThreads + threadIdx.x; g < n_groups; g += gridDim.x * kThreads) {
    const uint32_t r = g / groups_per_row;
    const int64_t j0 = static_cast<int64_t>(g - r * groups_per_row) * kGroup;
    float v[8];
    DeviceFormat<kType, kDpl>::Load8(w + r * row_stride, j0, n_cols, v);
    out[g] = PackHalf8(v);
  }
}

// The same values one element per thread, for what the 8-wide loads cannot
// read: rows or an output not aligned for them, n_cols % 8 != 0 (f32, f16,
// bf16 only; block types are whole blocks of 32 or 256).
template <GgmlType kType>
__global__ void DequantF16ScalarKernel(const uint8_t* __restrict__ w,  // (n_rows, row_stride)
                                       int64_t row_stride, int64_t n_rows, int64_t n_cols,
                                       __half* __restrict__ out) {  // (n_rows, n_cols)
  const int64_t n = n_rows * n_cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / n_cols, j = i - r * n_cols;
    out[i] = __float2half_rn(FloatElem<kType>(w + r * row_stride, j));
  }
}

// Grid of a grid-stride loop over n items: enough CTAs to fill any GPU
// several times over, and within gridDim.x's limit.
int StrideBlocks(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<int>(b < (1 << 16) ? (b > 0 ? b : 1) : (1 << 16));
}

bool Aligned(const void* p, int64_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; }

template <GgmlType kType, bool kDpl>
absl::Status LaunchDequant(const WeightMatrix& w, int64_t row_begin, int64_t n_rows,
                           uint16_t* out, cudaStream_t stream, int max_ctas) {
  const uint8_t* base = static_cast<const uint8_t*>(w.data) + row_begin * w.row_stride;
  constexpr int kAlign = DeviceFormat<kType, kDpl>::kRowAlign;
  const int64_t gpr = w.n_cols / kGroup;
  const bool vector_ok = w.n_cols % kGroup == 0 && Aligned(base, kAlign) &&
                         w.row_stride % kAlign == 0 && Aligned(out, 16) && gpr < (1 << 30);
  if constexpr (!IsFloatFormat(kType)) {
    if (!vector_ok) {
      // Never for a tensor of a .dpl file: its rows start 256-byte aligned
      // plus whole blocks.
      return absl::InvalidArgumentError(absl::StrCat(
          "DequantizeRowsF16: ", formats::TraitsOf(kType).name, " rows must be ", kAlign,
          "-byte aligned (data and row_stride) and the output 16-byte aligned"));
    }
  } else if (!vector_ok) {
    DequantF16ScalarKernel<kType><<<StrideBlocks(n_rows * w.n_cols), kThreads, 0, stream>>>(
        base, w.row_stride, n_rows, w.n_cols, reinterpret_cast<__half*>(out));
    DPL_CUDA_CHECK_LAUNCH();
    return absl::OkStatus();
  }
  // Chunks of at most 2^30 groups keep the kernel's indices 32-bit.
  const int64_t chunk_rows = (int64_t{1} << 30) / gpr;
  for (int64_t r0 = 0; r0 < n_rows; r0 += chunk_rows) {
    const int64_t rows = n_rows - r0 < chunk_rows ? n_rows - r0 : chunk_rows;
    const int64_t groups = rows * gpr;
    int blocks = static_cast<int>((groups + kThreads - 1) / kThreads);
    if (max_ctas > 0 && blocks > max_ctas) blocks = max_ctas;
    DequantF16Kernel<kType, kDpl><<<blocks, kThreads, 0, stream>>>(
        base + r0 * w.row_stride, w.row_stride, w.n_cols, static_cast<uint32_t>(gpr),
        static_cast<uint32_t>(groups), reinterpret_cast<uint4*>(out + r0 * w.n_cols));
    DPL_CUDA_CHECK_LAUNCH();
  }
  return absl::OkStatus();
}

// Checks what every entry point needs of w: a device pointer, a format with
// a device dequantizer (VisitDeviceFormat), whole blocks per row and a
// stride that holds them.
absl::Status CheckMatrix(const WeightMatrix& w, const char* who) {
  const formats::GgmlTypeTraits tr = formats::TraitsOf(w.type);
  DPL_RETURN_IF_ERROR(
      VisitDeviceFormat(w.type, w.layout, who, [](auto, auto) { return absl::OkStatus(); }));
  if (w.data == nullptr || w.n_rows <= 0 || w.n_cols <= 0 || w.n_cols % tr.block_elems != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, ": bad ", tr.name, " matrix (n_rows=", w.n_rows, ", n_cols=", w.n_cols,
        ", a multiple of ", tr.block_elems, ") or null data"));
  }
  const int64_t blocks = w.n_cols / tr.block_elems;
  const int64_t min_stride = static_cast<int64_t>(
      formats::LayoutRowStride(w.layout, static_cast<uint64_t>(blocks), tr.block_bytes));
  if (w.row_stride < min_stride) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, ": row_stride ", w.row_stride, " < ", min_stride, " bytes of a ", tr.name, " (",
        formats::TensorLayoutName(w.layout), ") row of ", w.n_cols));
  }
  return absl::OkStatus();
}

// Rows of an already checked w.
absl::Status DispatchDequant(const WeightMatrix& w, int64_t row_begin, int64_t n_rows,
                             uint16_t* out, cudaStream_t s, int max_ctas = 0) {
  return VisitDeviceFormat(w.type, w.layout, "DequantizeRowsF16", [&](auto type, auto dpl) {
    return LaunchDequant<decltype(type)::value, decltype(dpl)::value>(w, row_begin, n_rows, out, s,
                                                                       max_ctas);
  });
}

// out[i] = f16(x[i]); four per thread when x, out and n allow 16-byte loads.
__global__ void ConvertF16Kernel(const float* __restrict__ x, int64_t n, __half* __restrict__ out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = __float2half_rn(x[i]);
  }
}
__global__ void ConvertF16x4Kernel(const float4* __restrict__ x, int64_t n4,
                                   uint2* __restrict__ out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n4;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float4 v = __ldg(x + i);
    const __half2 a = __floats2half2_rn(v.x, v.y), b = __floats2half2_rn(v.z, v.w);
    out[i] = make_uint2(*reinterpret_cast<const uint32_t*>(&a),
                        *reinterpret_cast<const uint32_t*>(&b));
  }
}

// y[t][r] = residual[t][r] + bias[r]  (either term may be absent, not both)
// What the GEMM then adds W x to (beta = 1). residual may equal y: each
// element is read, then written, by one thread. blockIdx.y strides tokens.
__global__ void InitOutputKernel(const float* __restrict__ bias,  // (n_rows) or null
                                 const float* residual,           // (n_tokens, n_rows) or null
                                 float* y,                        // (n_tokens, n_rows)
                                 int64_t n_rows, int64_t n_tokens) {
  const int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (r >= n_rows) return;
  const float b = bias ? bias[r] : 0.0f;
  for (int64_t t = blockIdx.y; t < n_tokens; t += gridDim.y) {
    const int64_t i = t * n_rows + r;
    y[i] = residual ? (bias ? residual[i] + b : residual[i]) : b;
  }
}

}  // namespace

absl::Status DequantizeRowsF16(const WeightMatrix& w, int64_t row_begin, int64_t n_rows,
                               uint16_t* out, cudaStream_t stream, int max_ctas) {
  DPL_RETURN_IF_ERROR(CheckMatrix(w, "DequantizeRowsF16"));
  if (out == nullptr || n_rows <= 0 || row_begin < 0 || row_begin > w.n_rows - n_rows) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DequantizeRowsF16: rows [", row_begin, ", ", row_begin, " + ", n_rows,
        ") outside the matrix's ", w.n_rows, " rows, or null output"));
  }
  if (max_ctas < 0) return absl::InvalidArgumentError("DequantizeRowsF16: max_ctas < 0");
  return DispatchDequant(w, row_begin, n_rows, out, stream, max_ctas);
}

absl::Status ConvertToF16(const float* x, int64_t n, uint16_t* out, cudaStream_t stream) {
  if (x == nullptr || out == nullptr || n <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("ConvertToF16: bad size ", n, " or null pointer"));
  }
  if (n % 4 == 0 && Aligned(x, 16) && Aligned(out, 8)) {
    ConvertF16x4Kernel<<<StrideBlocks(n / 4), kThreads, 0, stream>>>(
        reinterpret_cast<const float4*>(x), n / 4, reinterpret_cast<uint2*>(out));
  } else {
    ConvertF16Kernel<<<StrideBlocks(n), kThreads, 0, stream>>>(x, n,
                                                               reinterpret_cast<__half*>(out));
  }
  DPL_CUDA_CHECK_LAUNCH();
  return absl::OkStatus();
}

absl::StatusOr<float> PromptGemm::InitOutput(const WeightMatrix& w, int64_t n_tokens, float* y,
                                             const float* bias, const float* residual) {
  if (bias == nullptr && residual == nullptr) return 0.0f;
  if (bias != nullptr || residual != y) {
    const dim3 grid(static_cast<unsigned>((w.n_rows + kThreads - 1) / kThreads),
                    static_cast<unsigned>(n_tokens < 65535 ? n_tokens : 65535));
    InitOutputKernel<<<grid, kThreads, 0, stream_>>>(bias, residual, y, w.n_rows, n_tokens);
    DPL_CUDA_CHECK_LAUNCH();
  }
  return 1.0f;
}

absl::Status PromptGemm::RunDequantized(const WeightMatrix& w, const uint16_t* w_f16, const uint16_t* x_f16,
                                        int64_t n_tokens, float* y, const float* bias, const float* residual) {
  if (!handle_) return absl::FailedPreconditionError("PromptGemm: no cuBLAS handle (moved from)");
  DPL_RETURN_IF_ERROR(CheckMatrix(w, "PromptGemm::RunDequantized"));
  DPL_ASSIGN_OR_RETURN(const float beta, InitOutput(w, n_tokens, y, bias, residual));
  return GemmF16(w_f16, w.n_rows, w.n_cols, x_f16, n_tokens, y, w.n_rows, beta);
}

void PromptGemm::HandleDeleter::operator()(cublasContext* h) const {
  if (const absl::StatusOr<const CublasApi*> api = Cublas(); api.ok()) (*api)->destroy(h);
}

absl::StatusOr<PromptGemm> PromptGemm::Create(cudaStream_t stream) {
  PromptGemm g;
  g.stream_ = stream;
  DPL_ASSIGN_OR_RETURN(const CublasApi* cublas, Cublas());
  DPL_ASSIGN_OR_RETURN(g.workspace_, DeviceBuffer<uint8_t>::Allocate(kWorkspaceBytes));
  cublasHandle_t h = nullptr;
  DPL_CUBLAS_CHECK(cublas->create(&h));
  g.handle_.reset(h);
  DPL_CUBLAS_CHECK(cublas->set_stream(h, stream));
  // After cublasSetStream, which resets the workspace to cuBLAS's own pool
  // (allocated on demand: what this workspace exists to avoid).
  DPL_CUBLAS_CHECK(cublas->set_workspace(h, g.workspace_.get(), kWorkspaceBytes));
  // f16 inputs, float32 sums: the math mode only forbids reductions in a
  // type narrower than the compute type (a split-K sum in f16, say).
  DPL_CUBLAS_CHECK(cublas->set_math_mode(
      h, static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH |
                                   CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
  return g;
}

absl::Status PromptGemm::SetSmCountTarget(int n) {
  if (!handle_) return absl::FailedPreconditionError("PromptGemm: no cuBLAS handle (moved from)");
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat("PromptGemm::SetSmCountTarget: ", n, " SMs"));
  DPL_ASSIGN_OR_RETURN(const CublasApi* cublas, Cublas());
  DPL_CUBLAS_CHECK(cublas->set_sm_count_target(handle_.get(), n));
  return absl::OkStatus();
}

absl::Status PromptGemm::GemmF16(const uint16_t* w_f16, int64_t n_rows, int64_t n_cols,
                                 const uint16_t* x_f16, int64_t n_tokens, float* y, int64_t ldy,
                                 float beta) {
  if (!handle_) return absl::FailedPreconditionError("PromptGemm: no cuBLAS handle (moved from)");
  if (w_f16 == nullptr || x_f16 == nullptr || y == nullptr || n_rows <= 0 || n_cols <= 0 ||
      n_tokens <= 0 || ldy < n_rows || ldy > INT_MAX || n_cols > INT_MAX ||
      n_tokens > INT_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PromptGemm::GemmF16: bad shape (n_rows=", n_rows, ", n_cols=", n_cols,
        ", n_tokens=", n_tokens, ", ldy=", ldy, ", cuBLAS takes int) or null pointer"));
  }
  // Row-major y (T, N) = x (T, K) . W (N, K)^T is, read column-major,
  // C (N, T) = A^T B with A = W as a (K, N) column-major matrix (lda = K)
  // and B = x as (K, T) (ldb = K); C's leading dimension is y's row, ldy.
  const float alpha = 1.0f;
  DPL_ASSIGN_OR_RETURN(const CublasApi* cublas, Cublas());  // opened: Create succeeded
  DPL_CUBLAS_CHECK(cublas->gemm_ex(handle_.get(), CUBLAS_OP_T, CUBLAS_OP_N,
                                   static_cast<int>(n_rows), static_cast<int>(n_tokens),
                                   static_cast<int>(n_cols), &alpha, w_f16, CUDA_R_16F,
                                   static_cast<int>(n_cols), x_f16, CUDA_R_16F,
                                   static_cast<int>(n_cols), &beta, y, CUDA_R_32F,
                                   static_cast<int>(ldy), CUBLAS_COMPUTE_32F,
                                   CUBLAS_GEMM_DEFAULT));
  return absl::OkStatus();
}

absl::Status PromptGemm::Run(const WeightMatrix& w, const uint16_t* x_f16, int64_t n_tokens,
                             float* y, const float* bias, const float* residual,
                             uint16_t* w_scratch, int64_t scratch_elems) {
  if (!handle_) return absl::FailedPreconditionError("PromptGemm: no cuBLAS handle (moved from)");
  DPL_RETURN_IF_ERROR(CheckMatrix(w, "PromptGemm::Run"));
  if (x_f16 == nullptr || y == nullptr || w_scratch == nullptr || n_tokens <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PromptGemm::Run: n_tokens ", n_tokens, " or a null x_f16 / y / w_scratch"));
  }
  if (w.n_rows > INT_MAX || w.n_cols > INT_MAX || n_tokens > INT_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PromptGemm::Run: shape (", n_tokens, ", ", w.n_rows, ", ", w.n_cols,
        ") past cuBLAS's int dimensions"));
  }
  if (scratch_elems < w.n_cols) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PromptGemm::Run: scratch of ", scratch_elems, " f16 holds no row of ", w.n_cols));
  }
  int64_t block_rows = scratch_elems / w.n_cols;
  if (block_rows >= w.n_rows) {
    block_rows = w.n_rows;
  } else if (block_rows >= kRowAlign) {
    block_rows -= block_rows % kRowAlign;
  }
  DPL_ASSIGN_OR_RETURN(const float beta, InitOutput(w, n_tokens, y, bias, residual));
  for (int64_t r0 = 0; r0 < w.n_rows; r0 += block_rows) {
    const int64_t rows = w.n_rows - r0 < block_rows ? w.n_rows - r0 : block_rows;
    DPL_RETURN_IF_ERROR(DispatchDequant(w, r0, rows, w_scratch, stream_));
    DPL_RETURN_IF_ERROR(GemmF16(w_scratch, rows, w.n_cols, x_f16, n_tokens, y + r0, w.n_rows, beta));
  }
  return absl::OkStatus();
}

}  // namespace dpl::kernels

namespace dpl::kernels {

absl::StatusOr<F16WeightsAhead> F16WeightsAhead::Create(bool side_first, int dequant_ctas) {
  if (dequant_ctas < 0) {
    return absl::InvalidArgumentError(absl::StrCat("F16WeightsAhead: dequant_ctas ", dequant_ctas));
  }
  F16WeightsAhead a;
  a.dequant_ctas_ = dequant_ctas;
  if (side_first) {
    DPL_ASSIGN_OR_RETURN(a.side_, CreateHighPriorityStream());
  } else {
    DPL_ASSIGN_OR_RETURN(a.side_, CreateStream());
  }
  for (int i = 0; i < 2; ++i) {
    DPL_ASSIGN_OR_RETURN(a.dequantized_[i], CreateEvent());
    DPL_ASSIGN_OR_RETURN(a.read_[i], CreateEvent());
  }
  DPL_ASSIGN_OR_RETURN(a.start_, CreateEvent());
  return a;
}

absl::Status F16WeightsAhead::Issue(size_t i) {
  const WeightMatrix& w = *order_[i];
  uint16_t* buf = scratch_[i % 2];
  if (i >= 2) DPL_CUDA_CHECK(cudaStreamWaitEvent(side_.get(), read_[i % 2].get(), 0));
  DPL_RETURN_IF_ERROR(DequantizeRowsF16(w, 0, w.n_rows, buf, side_.get(), dequant_ctas_));
  DPL_CUDA_CHECK(cudaEventRecord(dequantized_[i % 2].get(), side_.get()));
  issued_ = i + 1;
  return absl::OkStatus();
}

absl::Status F16WeightsAhead::Begin(absl::Span<const WeightMatrix* const> order, uint16_t* scratch0,
                                    uint16_t* scratch1, int64_t scratch_elems, cudaStream_t stream) {
  if (scratch0 == nullptr || scratch1 == nullptr || scratch0 == scratch1) {
    return absl::InvalidArgumentError("F16WeightsAhead::Begin: two distinct scratch buffers needed");
  }
  for (size_t i = 0; i < order.size(); ++i) {
    if (order[i] == nullptr || order[i]->n_rows * order[i]->n_cols > scratch_elems) {
      return absl::InvalidArgumentError(absl::StrCat("F16WeightsAhead::Begin: matrix ", i,
                                                     " null or larger than the scratch of ", scratch_elems,
                                                     " f16"));
    }
  }
  DPL_RETURN_IF_ERROR(End());
  order_.assign(order.begin(), order.end());
  scratch_[0] = scratch0;
  scratch_[1] = scratch1;
  stream_ = stream;
  next_ = issued_ = 0;
  // The buffers' earlier readers (the stream's work so far) go first.
  DPL_CUDA_CHECK(cudaEventRecord(start_.get(), stream));
  DPL_CUDA_CHECK(cudaStreamWaitEvent(side_.get(), start_.get(), 0));
  for (size_t i = 0; i < order_.size() && i < 2; ++i) DPL_RETURN_IF_ERROR(Issue(i));
  return absl::OkStatus();
}

absl::Status F16WeightsAhead::Run(PromptGemm& gemm, const WeightMatrix& w, const uint16_t* x_f16,
                                  int64_t n_tokens, float* y, const float* bias, const float* residual) {
  if (!Next(w)) {
    return absl::FailedPreconditionError(absl::StrCat("F16WeightsAhead::Run: matrix ", next_,
                                                      " of the pass is not the one asked for"));
  }
  const size_t i = next_++;
  DPL_CUDA_CHECK(cudaStreamWaitEvent(stream_, dequantized_[i % 2].get(), 0));
  DPL_RETURN_IF_ERROR(gemm.RunDequantized(w, scratch_[i % 2], x_f16, n_tokens, y, bias, residual));
  DPL_CUDA_CHECK(cudaEventRecord(read_[i % 2].get(), stream_));
  if (i + 2 < order_.size()) DPL_RETURN_IF_ERROR(Issue(i + 2));
  return absl::OkStatus();
}

absl::Status F16WeightsAhead::End() {
  // Dequants issued but never multiplied: the stream waits for them, so
  // nothing on the side stream outlives the pass unordered (and a capture
  // would join).
  if (stream_ != nullptr && issued_ > next_) {
    for (size_t i = next_; i < issued_; ++i) {
      DPL_CUDA_CHECK(cudaStreamWaitEvent(stream_, dequantized_[i % 2].get(), 0));
    }
  }
  order_.clear();
  next_ = issued_ = 0;
  return absl::OkStatus();
}

}  // namespace dpl::kernels
