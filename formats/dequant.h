// Dequantization of ggml weight blocks to float32, bit-exact with llama.cpp's
// gguf-py (the oracle in shared/oracle/dequant), plus the half-precision
// conversions the rest of the project uses. Pure CPU code, no file knowledge.
//
// Supported: f32, f16, bf16, q4_0, q4_1, q5_0, q5_1, q8_0, q2_K, q3_K, q4_K,
// q5_K, q6_K, iq4_nl, iq4_xs.
//
// Float order matters for bit-exactness: k-quants (and iq4_xs) compute the
// sub-block scale `d * sc` in float32 first, then multiply by the integer `q`,
// then (q2_K, q4_K, q5_K) subtract `dmin * m`, each step rounded to float32.
// q4_1/q5_1 round `d * q` to float32 before adding the block min `m`.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "formats/ggml_types.h"
#include "formats/model_file.h"

namespace dpl::formats {

// IEEE half <-> float. F16ToF32 is exact (subnormals, inf, NaN kept);
// F32ToF16 rounds to nearest even, overflows to inf, keeps NaN a NaN.
float F16ToF32(uint16_t h);
uint16_t F32ToF16(float f);

// bfloat16 <-> float. Bf16ToF32 is exact; F32ToBf16 rounds to nearest even
// and keeps NaN a (quiet) NaN.
float Bf16ToF32(uint16_t h);
uint16_t F32ToBf16(float f);

// The 16 non-linear levels of iq4_nl and iq4_xs (ggml's kvalues_iq4nl): a
// 4-bit q stands for d * kIq4NlValues[q] (times the sub-block scale in iq4_xs).
inline constexpr int8_t kIq4NlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                            1,    13,   25,  38,  53,  69,  89,  113};

// True when DequantizeBlocks/DequantizeRow handle this type.
bool IsDequantSupported(GgmlType type);

// Dequantizes `n_elems` weights stored as consecutive GGUF blocks of `type`
// (n_elems must be a multiple of the block size).
//   blocks: (n_elems / block_elems, block_bytes) bytes
//   out:    (n_elems) floats
// Errors: unsupported type (named), n_elems not a whole number of blocks.
absl::Status DequantizeBlocks(GgmlType type, const uint8_t* blocks, uint64_t n_elems,
                              float* out);

// Dequantizes one row of `n_elems` weights stored in `layout`; `row` points at
// the start of the row (TensorView::data + r * row_stride). kRaw is the GGUF
// block sequence; kDpl the dense split-plane row of any type with a dpl layout
// (HasDplPlanes; formats/tensor_layout.h), same floats as its raw blocks.
absl::Status DequantizeRow(GgmlType type, TensorLayout layout, const uint8_t* row,
                           uint64_t n_elems, float* out);

}  // namespace dpl::formats
