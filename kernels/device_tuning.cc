#include "kernels/device_tuning.h"

#include <cuda_runtime.h>

#include "base/status_macros.h"
#include "kernels/cuda_check.h"
#include "kernels/matvec/matvec.h"

namespace dpl::kernels {

absl::StatusOr<DecodeTuning> DecodeTuningForDevice() {
  int device = 0;
  DPL_CUDA_CHECK(cudaGetDevice(&device));
  cudaDeviceProp prop;
  DPL_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  DecodeTuning t;
  t.num_sms = prop.multiProcessorCount;
  // The geometry the q6_K planner sizes its one-wave grids for.
  DPL_ASSIGN_OR_RETURN(t.q6k_ctas_per_sm,
                       ResidentCtasPerSm(MatVecKernel::kQ6KDpl, MatVecGeometry{1, 4, 1, true}));
  return t;
}

}  // namespace dpl::kernels
