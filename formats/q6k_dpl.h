// The dense split-plane (dpl) layout of q6_K rows: the converter's core
// transform and its inverse. The layout itself (plane offsets, row stride and
// why) is defined once in formats/tensor_layout.h. Pure byte moves, so
// dequantized values are identical.
#pragma once

#include <cstdint>

#include "formats/tensor_layout.h"

namespace dpl::formats {

// raw_row: (nbe, 210) GGUF q6_K blocks. dpl_row: DplQ6KRowStride(nbe) bytes,
// all written (the padding after the d plane is zeroed).
void Q6KRowToDpl(const uint8_t* raw_row, uint64_t nbe, uint8_t* dpl_row);

// Inverse: dpl_row as above (padding ignored) -> raw_row: nbe * 210 bytes.
void DplRowToQ6K(const uint8_t* dpl_row, uint64_t nbe, uint8_t* raw_row);

}  // namespace dpl::formats
