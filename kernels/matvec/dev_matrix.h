// A test matrix (testutil::HostMatrix) copied to the device, as the GPU tests
// of the matvec and prompt GEMM kernels read it.
#pragma once

#include <cuda_runtime.h>

#include "kernels/gpu_test.h"
#include "kernels/matvec/matvec_test_util.h"
#include "kernels/weight_matrix.h"

namespace dpl::kernels::testutil {

struct DevMatrix {
  void* p = nullptr;
  WeightMatrix w;
  explicit DevMatrix(const HostMatrix& m) {
    // 256 extra bytes: tensors in the runtime's weight blob are 256-aligned
    // and followed by other tensors.
    CUDA_OK(cudaMalloc(&p, m.bytes.size() + 256));
    CUDA_OK(cudaMemcpy(p, m.bytes.data(), m.bytes.size(), cudaMemcpyHostToDevice));
    w = WeightMatrix{p, m.type, m.layout, m.n_rows, m.n_cols, m.row_stride};
  }
  ~DevMatrix() { cudaFree(p); }
  DevMatrix(const DevMatrix&) = delete;
  DevMatrix& operator=(const DevMatrix&) = delete;
};

}  // namespace dpl::kernels::testutil
