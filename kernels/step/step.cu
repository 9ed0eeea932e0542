#include "kernels/step/step.h"

#include "absl/strings/str_cat.h"
#include "kernels/cuda_check.h"

namespace dpl::kernels {
namespace {

constexpr int kThreads = 128;

// tokens[r], positions[r] = the token and position of row r's sequence.
__global__ void GatherStepRowsKernel(const int* __restrict__ row_seq,
                                     const int* __restrict__ seq_token,
                                     const int* __restrict__ seq_pos, int batch,
                                     int* __restrict__ tokens, int* __restrict__ positions) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= batch) return;
  const int s = row_seq[r];
  tokens[r] = s >= 0 ? seq_token[s] : 0;
  positions[r] = s >= 0 ? seq_pos[s] : -1;
}

// seq_pos[s] += 1, seq_token[s] = sampled[r] for the live rows.
__global__ void FinishStepRowsKernel(const int* __restrict__ row_seq, int batch,
                                     const int* __restrict__ sampled, int* __restrict__ seq_token,
                                     int* __restrict__ seq_pos) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= batch) return;
  const int s = row_seq[r];
  if (s < 0) return;
  seq_pos[s] += 1;
  if (sampled != nullptr) seq_token[s] = sampled[r];
}

absl::Status CheckRows(const char* what, const int* row_seq, int batch) {
  if (row_seq == nullptr || batch <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": null rows or batch ", batch));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status GatherStepRows(const int* row_seq, const int* seq_token, const int* seq_pos, int batch,
                            int* tokens, int* positions, cudaStream_t stream) {
  if (absl::Status s = CheckRows("GatherStepRows", row_seq, batch); !s.ok()) return s;
  if (!seq_token || !seq_pos || !tokens || !positions) {
    return absl::InvalidArgumentError("GatherStepRows: null pointer");
  }
  GatherStepRowsKernel<<<(batch + kThreads - 1) / kThreads, kThreads, 0, stream>>>(
      row_seq, seq_token, seq_pos, batch, tokens, positions);
  DPL_CUDA_CHECK_LAUNCH();
  return absl::OkStatus();
}

absl::Status FinishStepRows(const int* row_seq, int batch, const int* sampled, int* seq_token,
                            int* seq_pos, cudaStream_t stream) {
  if (absl::Status s = CheckRows("FinishStepRows", row_seq, batch); !s.ok()) return s;
  if (!seq_pos || (sampled != nullptr && seq_token == nullptr)) {
    return absl::InvalidArgumentError("FinishStepRows: null pointer");
  }
  FinishStepRowsKernel<<<(batch + kThreads - 1) / kThreads, kThreads, 0, stream>>>(
      row_seq, batch, sampled, seq_token, seq_pos);
  DPL_CUDA_CHECK_LAUNCH();
  return absl::OkStatus();
}

}  // namespace dpl::kernels
