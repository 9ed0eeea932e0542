// Transitional: the q6_K names of the dpl transform, for the kernels/ tests
// that still include this header (kernels/matvec/matvec_test_util.h,
// kernels/matvec/matvec_plan_test.cc, kernels/ops/ops_gpu_test.cc). They
// forward to the one generic transform in formats/dpl_layout.h; delete this
// file once those include dpl_layout.h and call RowToDpl / DplRowToRaw.
#pragma once

#include <cstdint>

#include "formats/dpl_layout.h"

namespace dpl::formats {

// RowToDpl(q6_K, ...): raw_row (nbe, 210) -> dpl_row DplQ6KRowStride(nbe) bytes.
inline void Q6KRowToDpl(const uint8_t* raw_row, uint64_t nbe, uint8_t* dpl_row) {
  RowToDpl(GgmlType::kQ6_K, raw_row, nbe, dpl_row).IgnoreError();  // q6_K has planes
}

// DplRowToRaw(q6_K, ...).
inline void DplRowToQ6K(const uint8_t* dpl_row, uint64_t nbe, uint8_t* raw_row) {
  DplRowToRaw(GgmlType::kQ6_K, dpl_row, nbe, raw_row).IgnoreError();  // q6_K has planes
}

}  // namespace dpl::formats
