// Prompt matmuls on tensor cores: the weight rows are dequantized to f16 into
// a scratch buffer, then cuBLAS multiplies them with the f16 activations,
// accumulating in float32:
//   y[t] = W x[t] (+ bias) (+ residual[t])      for t < n_tokens
// the same contract as RunMatVec (kernels/matvec/matvec.h), for the prompt
// sizes where streaming the weights once through tensor cores beats the dp4a
// kernels. gemm_bench on the H200 (2026-12-01, q4_K and q6_K dpl 7B/14B
// layer shapes, whole-matrix scratch): faster than QuantizeActivations +
// RunMatVec from T = 2..8 tokens depending on the shape and at every larger
// T (7B ffn_gate q4_K: T 8 97 vs 118 us, T 512 156 us vs 7.4 ms); at T = 1
// the dp4a decode kernel wins (19 vs 97 us).
//
// Precision: W (from its exact float32 dequant) and x are rounded to f16,
// relative error <= 2^-11 per value, far below a 4- or 6-bit quantization
// step; values past 65504 would become inf (LLM weights and normed
// activations are orders of magnitude smaller). The f16 products are exact
// and summed in float32 (CUBLAS_COMPUTE_32F): no f16 accumulation.
//
// Nothing here allocates per call: PromptGemm's handle and workspace are made
// once (Create), the scratch is the caller's. Every launch is on the one
// stream, so the calls can be captured into a CUDA graph.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/cuda_handles.h"
#include "kernels/weight_matrix.h"

struct cublasContext;  // cublasHandle_t; cublas_v2.h stays out of this header

namespace dpl::kernels {

// Rows [row_begin, row_begin + n_rows) of w, dequantized and rounded to f16:
//   out: (n_rows, w.n_cols) f16 bits, row-major;
//   out[i][j] = __float2half_rn(formats::DequantizeRow(w row row_begin + i)[j]), bit for bit.
// Types: f32, f16, bf16, q8_0, q5_0, q4_K, q6_K (raw or dpl layout). Errors:
// shapes, null pointers, rows outside w, an unsupported type or layout (named).
// max_ctas > 0 caps the launch at that many CTAs, each striding over the
// rows (F16WeightsAhead's side stream: a dequant that leaves SMs to a GEMM);
// 0 launches a CTA per 256 groups of 8 weights. The same bits either way.
absl::Status DequantizeRowsF16(const WeightMatrix& w, int64_t row_begin, int64_t n_rows,
                               uint16_t* out, cudaStream_t stream, int max_ctas = 0);

// out (n) f16 bits = __float2half_rn(x (n) f32).
absl::Status ConvertToF16(const float* x, int64_t n, uint16_t* out, cudaStream_t stream);

// A cuBLAS handle bound to one stream, with its workspace. Movable, not
// copyable; destruction destroys the handle, then frees the workspace.
class PromptGemm {
 public:
  // Creates the handle on `stream` and gives it a workspace allocated here,
  // once (kWorkspaceBytes), so that no Run allocates.
  static absl::StatusOr<PromptGemm> Create(cudaStream_t stream);
  PromptGemm(PromptGemm&&) = default;
  // The old handle goes before the workspace it was given.
  PromptGemm& operator=(PromptGemm&& o) noexcept {
    handle_ = std::move(o.handle_);
    workspace_ = std::move(o.workspace_);
    stream_ = o.stream_;
    return *this;
  }

  // y (n_tokens, w.n_rows) f32 = x (n_tokens, w.n_cols) . W^T (+ bias) (+ residual)
  //   x_f16:     (n_tokens, w.n_cols) f16 bits (ConvertToF16 of the activations,
  //              done once and shared by the matrices that read them: Q, K, V).
  //   y:         (n_tokens, w.n_rows) f32.
  //   bias:      (w.n_rows) or null, added for every token.
  //   residual:  (n_tokens, w.n_rows) or null; may equal y (y += W x), must
  //              not otherwise overlap it.
  //   w_scratch: (scratch_elems) f16, the caller's: W is dequantized into it
  //              floor(scratch_elems / n_cols) rows at a time (rounded down to
  //              a multiple of kRowAlign when larger), each block followed by
  //              its GEMM, so a matrix larger than the scratch (a 152064-row
  //              lm head) still works. Reused in stream order: no other stream
  //              may touch it meanwhile. Size it for the largest matrix that
  //              runs here (7B ffn: 136 MB): blocks cost more than the write
  //              and re-read of W in f16 they would save in L2 (7B ffn_gate
  //              q4_K, T 8: whole 97 us, 32 MiB 111 us, 16 MiB 148 us; the
  //              block GEMMs fill the GPU less and wait for each dequant).
  // The sums are added as y = (residual + bias) + W x (one float32 rounding
  // more than a fused epilogue: within the float32 accumulation error).
  // Errors: shapes <= 0, scratch smaller than one row, null pointers, an
  // unsupported type (named), cuBLAS failures (call and status named).
  absl::Status Run(const WeightMatrix& w, const uint16_t* x_f16, int64_t n_tokens, float* y,
                   const float* bias, const float* residual, uint16_t* w_scratch,
                   int64_t scratch_elems);

  // Run for a whole matrix already dequantized (w_f16: (w.n_rows, w.n_cols)
  // f16 bits, DequantizeRowsF16 of all of w): the same arithmetic, so the
  // same bits as Run with a scratch that holds w. F16WeightsAhead's GEMM.
  absl::Status RunDequantized(const WeightMatrix& w, const uint16_t* w_f16, const uint16_t* x_f16,
                              int64_t n_tokens, float* y, const float* bias, const float* residual);

  // Run's GEMM step alone, for rows already in f16 (Run calls it per block):
  //   y[t][r] = sum_k w_f16[r][k] x_f16[t][k] + beta * y[t][r]    r < n_rows, t < n_tokens
  //   w_f16: (n_rows, n_cols) f16 bits; x_f16: (n_tokens, n_cols) f16 bits;
  //   y: (n_tokens, ldy) f32 with ldy >= n_rows (the block's first column).
  absl::Status GemmF16(const uint16_t* w_f16, int64_t n_rows, int64_t n_cols,
                       const uint16_t* x_f16, int64_t n_tokens, float* y, int64_t ldy,
                       float beta);

  // cuBLAS's recommended workspace for Hopper (cublasSetWorkspace docs:
  // 32 MiB; 4 MiB before Hopper): split-K and stream-K kernels take their
  // partial sums from it, and without enough of it cuBLAS falls back to
  // other kernels.
  static constexpr size_t kWorkspaceBytes = size_t{32} << 20;

  // cublasSetSmCountTarget: the GEMMs from now on plan for n SMs (0: all),
  // leaving the rest to work on other streams (F16WeightsAhead's dequant).
  absl::Status SetSmCountTarget(int n);
  // Row blocks of a scratch smaller than W start at multiples of this many
  // rows (when a block holds at least that many): whole GEMM tiles per block,
  // and 16-byte aligned y + r0 for the f32 output.
  static constexpr int64_t kRowAlign = 128;

 private:
  struct HandleDeleter {
    void operator()(cublasContext* h) const;
  };
  PromptGemm() = default;
  // y = residual + bias where either is given (InitOutputKernel); returns
  // the beta the GEMM then adds W x with (1, or 0 when neither is given).
  absl::StatusOr<float> InitOutput(const WeightMatrix& w, int64_t n_tokens, float* y, const float* bias,
                                   const float* residual);

  cudaStream_t stream_ = nullptr;
  DeviceBuffer<uint8_t> workspace_;                     // (kWorkspaceBytes)
  std::unique_ptr<cublasContext, HandleDeleter> handle_;  // destroyed before workspace_
};

// The next matrix's f16 dequantization beside this one's GEMM (a probe,
// DecodeTuning::gemm_dequant_ahead). PromptGemm::Run dequantizes a matrix,
// then multiplies it, on one stream: the dequant pass (memory-bound, ~4 ms
// of a 7B's 20 ms 512-token chunk on the H200) and the GEMMs (tensor-core
// bound) take turns. Here a second stream dequantizes matrix i + 1 into the
// other of two scratch buffers while matrix i's GEMM runs, ordered by
// events: the GEMM of i waits for its dequant, the dequant of i + 2 for the
// GEMM of i (the buffer's last reader). Same kernels, same inputs: the same
// bits as Run.
class F16WeightsAhead {
 public:
  // The side stream and the events. side_first: the side stream at the
  // device's highest priority, so its blocks take SMs as GEMM blocks retire
  // (else at the lowest: the GEMMs' stream should then be a high-priority
  // one, and the dequant fills what SMs the GEMM leaves, see
  // PromptGemm::SetSmCountTarget). dequant_ctas: DequantizeRowsF16's
  // max_ctas for the side stream's launches.
  static absl::StatusOr<F16WeightsAhead> Create(bool side_first = true, int dequant_ctas = 0);

  // Starts a pass on `stream` (the GEMMs' stream, PromptGemm's): the
  // matrices that Run will be asked for, in that order, each at most
  // scratch_elems f16 (checked), and the two buffers (scratch_elems f16
  // each). Their first two dequants go out now, after the stream's work so
  // far (an earlier pass may still read the buffers).
  absl::Status Begin(absl::Span<const WeightMatrix* const> order, uint16_t* scratch0, uint16_t* scratch1,
                     int64_t scratch_elems, cudaStream_t stream);
  // Whether the pass's next matrix is w (pointer identity): Run's condition.
  bool Next(const WeightMatrix& w) const { return next_ < order_.size() && order_[next_] == &w; }
  // PromptGemm::Run's contract for the pass's next matrix (Next(w) true,
  // else FailedPrecondition), with its rows from the dequant started ahead.
  absl::Status Run(PromptGemm& gemm, const WeightMatrix& w, const uint16_t* x_f16, int64_t n_tokens, float* y,
                   const float* bias, const float* residual);
  // Ends the pass: the side stream has nothing the stream did not wait for
  // (every dequant issued was consumed, or is waited for here).
  absl::Status End();

 private:
  F16WeightsAhead() = default;
  absl::Status Issue(size_t i);  // order_[i]'s dequant into buffer i % 2, on the side stream

  Stream side_;
  Event dequantized_[2], read_[2], start_;
  std::vector<const WeightMatrix*> order_;
  uint16_t* scratch_[2] = {nullptr, nullptr};
  size_t next_ = 0, issued_ = 0;
  cudaStream_t stream_ = nullptr;
  int dequant_ctas_ = 0;
};

}  // namespace dpl::kernels
