// A device-resident weight tensor as the kernels see it: where its rows are
// and how they are encoded. The matvec kernels read it as a matrix; the
// embedding gather reads one row of it.
#pragma once

#include <cstdint>

#include "formats/ggml_types.h"
#include "formats/tensor_layout.h"

namespace dpl::kernels {

// W of shape (n_rows, n_cols): row r holds the n_cols weights dotted with x,
// stored at data + r * row_stride in `layout`.
struct WeightMatrix {
  const void* data = nullptr;  // device, (n_rows, row_stride) bytes
  formats::GgmlType type = formats::GgmlType::kF32;
  formats::TensorLayout layout = formats::TensorLayout::kRaw;
  int64_t n_rows = 0;
  int64_t n_cols = 0;
  int64_t row_stride = 0;  // bytes
};

}  // namespace dpl::kernels
