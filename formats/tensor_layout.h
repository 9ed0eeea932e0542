// How a tensor's rows lie in memory, and the one description of a tensor that
// the GGUF reader, the .dpl reader and ModelFile share. Pure arithmetic with
// no file knowledge, so host code and CUDA kernels (nvcc compiles this header)
// read plane offsets and strides from the same place.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "absl/strings/string_view.h"
#include "formats/ggml_types.h"

#ifndef DPL_HD
#ifdef __CUDACC__
#define DPL_HD __host__ __device__
#else
#define DPL_HD
#endif
#endif

namespace dpl::formats {

// How a tensor's rows are arranged in the file.
enum class TensorLayout : uint32_t {
  // GGUF's own bytes: each row is ne[0]/block_elems consecutive blocks.
  kRaw = 0,
  // q6_K rows in the dense split-plane layout (Q6KDplPlanes below).
  kDplQ6K = 1,
};

// "raw", "dpl_q6k"; "unknown" for an id outside the enum.
constexpr absl::string_view TensorLayoutName(TensorLayout layout) {
  switch (layout) {
    case TensorLayout::kRaw: return "raw";
    case TensorLayout::kDplQ6K: return "dpl_q6k";
  }
  return "unknown";
}

// A tensor's type, shape and row geometry: what every tensor table in the
// project (GgufTensorInfo, DplTensorEntry, TensorView) says about a tensor
// before it says where the bytes are.
struct TensorGeometry {
  GgmlType type = GgmlType::kF32;             // element type; block size from TraitsOf
  TensorLayout layout = TensorLayout::kRaw;   // row arrangement (always kRaw in a GGUF)
  uint32_t n_dims = 0;                        // 1..4
  std::array<uint64_t, 4> ne = {1, 1, 1, 1};  // shape; ne[0] = row length (elements),
                                              // ne[i] = 1 for i >= n_dims
  uint64_t n_rows = 0;                        // ne[1] * ne[2] * ne[3]
  uint64_t row_stride = 0;                    // bytes from one row to the next (LayoutRowStride)
  uint64_t n_bytes = 0;                       // n_rows * row_stride

  // The geometry part of a derived table entry, so one assignment copies all
  // of it: `view.geometry() = entry.geometry();`.
  TensorGeometry& geometry() { return *this; }
  const TensorGeometry& geometry() const { return *this; }
};

// The entry named `name` of a tensor table (GgufTensorInfo, DplTensorEntry,
// TensorView: anything with a `name`), nullptr when absent.
template <typename T>
const T* FindNamed(const std::vector<T>& tensors, absl::string_view name) {
  for (const T& t : tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

// ggml's block_q6_K: 256 weights in 210 bytes, fields in this order.
inline constexpr uint32_t kQ6KBlockElems = 256;
inline constexpr uint32_t kQ6KQlBytes = 128;  // ql: low 4 bits of the 256 weights
inline constexpr uint32_t kQ6KQhBytes = 64;   // qh: high 2 bits of the 256 weights
inline constexpr uint32_t kQ6KScBytes = 16;   // scales: 16 int8 sub-block scales
inline constexpr uint32_t kQ6KDBytes = 2;     // d: f16 super-block scale
// Byte offsets of the fields inside one raw block, and the block size.
inline constexpr uint32_t kQ6KQlOffset = 0;
inline constexpr uint32_t kQ6KQhOffset = kQ6KQlOffset + kQ6KQlBytes;  // 128
inline constexpr uint32_t kQ6KScOffset = kQ6KQhOffset + kQ6KQhBytes;  // 192
inline constexpr uint32_t kQ6KDOffset = kQ6KScOffset + kQ6KScBytes;   // 208
inline constexpr uint32_t kQ6KBlockBytes = kQ6KDOffset + kQ6KDBytes;  // 210

// The dense split-plane (dpl) q6_K row (docs/FORMAT.md, layout 1). A row of
// nbe blocks becomes four planes, block i's fields at index i of each:
//   [ql: nbe*128][qh: nbe*64][sc: nbe*16][d: nbe*2][zero padding to 16 bytes]
// so each plane starts at nbe times its field's offset in a raw block.
// Why: a 210-byte block breaks 16-byte alignment at every block, so a kernel
// must either stream a padded copy (14 dead bytes per block) or give up
// 16-byte loads. With planes, every 16-byte load inside ql and qh stays
// aligned (both are multiples of 16 per block and the stride is 16-aligned),
// and a 5120-wide row carries 8 padding bytes in 4208.
struct Q6KPlanes {
  uint64_t ql, qh, sc, d;  // byte offsets of the planes from the row start
};

DPL_HD constexpr Q6KPlanes Q6KDplPlanes(uint64_t blocks_per_row) {
  return {blocks_per_row * kQ6KQlOffset, blocks_per_row * kQ6KQhOffset,
          blocks_per_row * kQ6KScOffset, blocks_per_row * kQ6KDOffset};
}

// Bytes from one row of `blocks` blocks of `block_bytes` to the next:
// raw rows are the blocks back to back; dpl_q6k rows are padded to 16 bytes
// (so uint4 loads inside ql and qh stay aligned). The caller has checked that
// the layout fits the type and that the product cannot overflow.
DPL_HD constexpr uint64_t LayoutRowStride(TensorLayout layout, uint64_t blocks,
                                          uint64_t block_bytes) {
  return layout == TensorLayout::kDplQ6K ? (blocks * block_bytes + 15) & ~uint64_t{15}
                                         : blocks * block_bytes;
}

// Bytes from one dpl q6_K row of nbe blocks to the next: (nbe * 210 + 15) & ~15.
DPL_HD constexpr uint64_t DplQ6KRowStride(uint64_t nbe) {
  return LayoutRowStride(TensorLayout::kDplQ6K, nbe, kQ6KBlockBytes);
}

}  // namespace dpl::formats
