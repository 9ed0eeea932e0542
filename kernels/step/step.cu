#include "kernels/step/step.h"

#include "kernels/cuda_check.h"

namespace dpl::kernels {
namespace {

// pos = pos + 1
__global__ void AdvancePositionKernel(int* d_pos) { *d_pos += 1; }

}  // namespace

absl::Status AdvancePosition(int* d_pos, cudaStream_t stream) {
  AdvancePositionKernel<<<1, 1, 0, stream>>>(d_pos);
  DPL_CUDA_CHECK_LAUNCH();
  return absl::OkStatus();
}

}  // namespace dpl::kernels
