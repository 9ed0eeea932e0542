// The dense split-plane (dpl) transform of one row and its inverse, for every
// type DplPlanesOf describes: what the converter writes, what the CPU
// dequantizer and dpl-convert --verify undo. The layout itself (plane order,
// fields, stride and why) is defined once in formats/tensor_layout.h. Pure
// byte moves, so dequantized values are identical.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "formats/ggml_types.h"
#include "formats/tensor_layout.h"

namespace dpl::formats {

// OK when `type` has a dpl layout; else InvalidArgument "type T has no dpl
// layout (it is defined for q4_0, q4_1, ...)".
absl::Status CheckDplType(GgmlType type);

// Bytes from one dpl row of nbe blocks of `type` to the next:
// (nbe * block_bytes + 15) & ~15. `type` has a dpl layout and the product
// does not overflow (RowStrideFor checks both for untrusted shapes).
uint64_t DplRowStride(GgmlType type, uint64_t nbe);

// raw_row: nbe GGUF blocks of `type` (nbe * block_bytes bytes).
// dpl_row: DplRowStride(type, nbe) bytes, all written (the padding after the
// last plane is zeroed). Error (CheckDplType) when `type` has no dpl layout.
absl::Status RowToDpl(GgmlType type, const uint8_t* raw_row, uint64_t nbe, uint8_t* dpl_row);

// Inverse: dpl_row as above (padding ignored) -> raw_row: nbe * block_bytes
// bytes.
absl::Status DplRowToRaw(GgmlType type, const uint8_t* dpl_row, uint64_t nbe, uint8_t* raw_row);

// The planes of `type` as dpl-inspect prints them: "qs[32] | d[2]" (each
// plane's field name and bytes per block, in row order); "" when the type
// has no dpl layout.
std::string DplPlanesString(GgmlType type);

}  // namespace dpl::formats
