// The one CUDA error check used on every runtime API call and after every
// launch: failures become absl::Status values naming the call, file and line.
#pragma once

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace dpl::kernels {

inline absl::Status CudaStatus(cudaError_t err, const char* what, const char* file, int line) {
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, " failed at ", file, ":", line, ": ",
                                          cudaGetErrorName(err), " (", cudaGetErrorString(err),
                                          ")"));
}

}  // namespace dpl::kernels

// Returns from the enclosing function (which returns absl::Status or
// absl::StatusOr<T>) when the CUDA call fails.
#define DPL_CUDA_CHECK(call)                                                               \
  do {                                                                                     \
    const cudaError_t dpl_cuda_err_ = (call);                                              \
    if (dpl_cuda_err_ != cudaSuccess) {                                                    \
      /* Consume the error so the next launch check does not report it again. */          \
      (void)cudaGetLastError();                                                            \
      return ::dpl::kernels::CudaStatus(dpl_cuda_err_, #call, __FILE__, __LINE__);         \
    }                                                                                      \
  } while (0)

// After a kernel launch: the launch error (bad configuration), if any.
#define DPL_CUDA_CHECK_LAUNCH() DPL_CUDA_CHECK(cudaGetLastError())
