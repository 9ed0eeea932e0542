// The dense split-plane (dpl) layout of q6_K rows: the converter's core
// transform and its inverse. A GGUF q6_K row of nbe blocks
//   nbe x [ql:128][qh:64][sc:16][d:2]              (210 bytes per block)
// becomes four planes, each block's fields at the same index in every plane:
//   [ql: nbe*128][qh: nbe*64][sc: nbe*16][d: nbe*2][zero padding]
// with the row stride rounded up to 16 bytes. Pure byte moves, so dequantized
// values are identical.
#pragma once

#include <cstdint>

namespace dpl::formats {

// Bytes from one dpl q6_K row to the next: (nbe * 210 + 15) & ~15.
uint64_t DplQ6KRowStride(uint64_t nbe);

// raw_row: (nbe, 210) GGUF q6_K blocks. dpl_row: DplQ6KRowStride(nbe) bytes,
// all written (the padding after the d plane is zeroed).
void Q6KRowToDpl(const uint8_t* raw_row, uint64_t nbe, uint8_t* dpl_row);

// Inverse: dpl_row as above (padding ignored) -> raw_row: nbe * 210 bytes.
void DplRowToQ6K(const uint8_t* dpl_row, uint64_t nbe, uint8_t* raw_row);

}  // namespace dpl::formats
