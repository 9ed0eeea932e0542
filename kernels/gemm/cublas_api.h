// cuBLAS, opened at run time (dlopen of libcublas.so.13) instead of linked:
// the few entry points PromptGemm calls, resolved once per process.
//
// Why not linked (H100 box, docs/PERF.md "Start-up"): a linked libcublas
// and libcublasLt (~600 MB) run their constructors before main, 60-90 ms of
// every start whether or not a prompt ever reaches the GPU GEMM; opened on a
// thread beside the CUDA context's creation (PreloadCublas), that time is
// hidden. A machine without cuBLAS now fails only where a GEMM is set up,
// with an error naming the library.
#pragma once

#include <cublas_v2.h>

#include "absl/status/statusor.h"

namespace dpl::kernels {

struct CublasApi {
  decltype(&cublasCreate_v2) create;
  decltype(&cublasDestroy_v2) destroy;
  decltype(&cublasSetStream_v2) set_stream;
  decltype(&cublasSetWorkspace_v2) set_workspace;
  decltype(&cublasSetMathMode) set_math_mode;
  decltype(&cublasSetSmCountTarget) set_sm_count_target;
  // cublasGemmEx (C++ also sees an inline overload taking a cudaDataType compute type).
  cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                            const void*, const void*, cudaDataType, int, const void*, cudaDataType,
                            int, const void*, void*, cudaDataType, int, cublasComputeType_t,
                            cublasGemmAlgo_t);
  decltype(&cublasGetStatusName) status_name;
  decltype(&cublasGetStatusString) status_string;
};

// The library's entry points, opened on the first call (thread-safe; later
// calls return the same result). FailedPrecondition naming the library and
// the loader's message when it cannot be opened or lacks a symbol.
absl::StatusOr<const CublasApi*> Cublas();

// Opens the library now (ignoring the result: Cublas() reports it), for a
// background thread at start-up.
void PreloadCublas();

}  // namespace dpl::kernels
