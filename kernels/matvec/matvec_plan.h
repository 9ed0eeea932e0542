// CPU-side description of a weight matrix for the matvec kernels, and the
// checks that decide which kernel may read it. No CUDA here: this is what CI
// tests without a GPU (matvec_plan_test).
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "formats/ggml_types.h"
#include "formats/model_file.h"
#include "kernels/matvec/matvec_geometry.h"

namespace dpl::kernels {

// A device-resident weight matrix W of shape (n_rows, n_cols): row r holds
// the n_cols weights that are dotted with x, stored at data + r * row_stride.
struct WeightMatrix {
  const void* data = nullptr;  // device, (n_rows, row_stride) bytes
  formats::GgmlType type = formats::GgmlType::kF32;
  formats::TensorLayout layout = formats::TensorLayout::kRaw;
  int64_t n_rows = 0;
  int64_t n_cols = 0;
  int64_t row_stride = 0;  // bytes
};

const char* MatVecKernelName(MatVecKernel k);

// True when the kernel reads the int8 quantized copy of x (see matvec.h).
bool UsesQuantizedActivations(MatVecKernel k);

// Smallest legal row stride (bytes) for `type`/`layout` rows of n_cols
// weights, or 0 when n_cols is not a whole number of blocks.
int64_t MinRowStride(formats::GgmlType type, formats::TensorLayout layout, int64_t n_cols);

// Checks shape, stride and alignment of `w` and picks its kernel. Errors name
// the type/layout/field that is wrong (unsupported types included).
absl::Status PlanMatVec(const WeightMatrix& w, MatVecKernel* kernel);

struct MatVecGrid {
  int64_t x = 0;  // token tiles
  int64_t y = 0;  // row blocks of RowsPerCta(ksplit) rows
};
// Errors when the grid does not fit CUDA's limits (n_rows too large).
absl::Status MatVecGridFor(int64_t n_rows, int64_t n_tokens, int token_tile, int ksplit,
                           MatVecGrid* grid);

}  // namespace dpl::kernels
