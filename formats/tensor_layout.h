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
  // The dense split-plane (dpl) row: each field of the type's blocks in a
  // plane of its own (DplPlanesOf below). Version 1 files use it for q6_K
  // only; version 2 for every type DplPlanesOf describes.
  kDpl = 1,
};

// "raw", "dpl"; "unknown" for an id outside the enum.
constexpr absl::string_view TensorLayoutName(TensorLayout layout) {
  switch (layout) {
    case TensorLayout::kRaw: return "raw";
    case TensorLayout::kDpl: return "dpl";
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

// ---- The dense split-plane (dpl) layout (docs/FORMAT.md, layout 1).
//
// A row of nbe blocks becomes one plane per field of the block, in the order
// DplPlanesOf lists them; block i's bytes of field f sit at index i of plane
// f, each plane follows the previous one without a gap, and the row is
// padded with zeros to a multiple of 16 bytes:
//   [plane 0: nbe * bytes_0][plane 1: nbe * bytes_1]...[0..15 zero bytes]
// Why: blocks whose size is not a multiple of 16 bytes (q6_K 210, q8_0 34,
// q4_0 18, ...) break 16-byte alignment at every block, so a kernel must
// either stream a padded copy or give up 16-byte loads. In planes, the wide
// fields come first and are multiples of 16 bytes per block, so every
// 16-byte load inside them stays aligned (the row stride is 16-aligned), and
// the narrow fields (scales) follow, packed: a lane's scales for several
// consecutive blocks are one load. It is a pure byte move (same values).

// Rows in the dpl layout are padded to a multiple of this many bytes.
inline constexpr uint64_t kDplRowAlignment = 16;

// One plane's field of a block: where it sits in a raw GGUF block, its size,
// and its name in ggml's block struct (adjacent fields that share a plane
// are joined by '+', as "d+m").
struct BlockField {
  uint32_t offset;  // bytes from the block start
  uint32_t bytes;
  const char* name;
};

// The planes of a type's dpl rows, in row order (n == 0: the type has no dpl
// layout). The fields tile the raw block exactly (tensor_layout_test).
struct DplPlaneSpec {
  uint32_t n = 0;
  BlockField f[4] = {};
};

// Field tables (ggml-common.h's block structs):
//   q6_K  210 B: ql[128] qh[64] scales[16] d       -> ql | qh | scales | d
//   q8_0   34 B: d qs[32]                          -> qs | d
//   q4_0   18 B: d qs[16]                          -> qs | d
//   iq4_nl 18 B: d qs[16]                          -> qs | d
//   q4_1   20 B: d m qs[16]                        -> qs | d,m
//   q5_0   22 B: d qh[4] qs[16]                    -> qs | qh | d
//   q5_1   24 B: d m qh[4] qs[16]                  -> qs | qh | d,m
//   q3_K  110 B: hmask[32] qs[64] scales[12] d     -> hmask | qs | scales | d
//   q2_K   84 B: scales[16] qs[64] d dmin          -> qs | scales | d,dmin
//   iq4_xs 136 B: d scales_h scales_l[4] qs[128]   -> qs | d,scales_h,scales_l
DPL_HD constexpr DplPlaneSpec DplPlanesOf(GgmlType type) {
  switch (type) {
    case GgmlType::kQ6_K:
      return {4, {{0, 128, "ql"}, {128, 64, "qh"}, {192, 16, "scales"}, {208, 2, "d"}}};
    case GgmlType::kQ8_0: return {2, {{2, 32, "qs"}, {0, 2, "d"}}};
    case GgmlType::kQ4_0:
    case GgmlType::kIQ4_NL: return {2, {{2, 16, "qs"}, {0, 2, "d"}}};
    case GgmlType::kQ4_1: return {2, {{4, 16, "qs"}, {0, 4, "d+m"}}};
    case GgmlType::kQ5_0: return {3, {{6, 16, "qs"}, {2, 4, "qh"}, {0, 2, "d"}}};
    case GgmlType::kQ5_1: return {3, {{8, 16, "qs"}, {4, 4, "qh"}, {0, 4, "d+m"}}};
    case GgmlType::kQ3_K:
      return {4, {{0, 32, "hmask"}, {32, 64, "qs"}, {96, 12, "scales"}, {108, 2, "d"}}};
    case GgmlType::kQ2_K: return {3, {{16, 64, "qs"}, {0, 16, "scales"}, {80, 4, "d+dmin"}}};
    case GgmlType::kIQ4_XS: return {2, {{8, 128, "qs"}, {0, 8, "d+scales_h+scales_l"}}};
    default: return {};
  }
}

// Bytes from the row start to plane `i` (i == spec.n: the content's end) in a
// dpl row of nbe blocks.
DPL_HD constexpr uint64_t DplPlaneOffset(const DplPlaneSpec& spec, uint32_t i, uint64_t nbe) {
  uint64_t off = 0;
  for (uint32_t k = 0; k < i && k < spec.n; ++k) off += nbe * spec.f[k].bytes;
  return off;
}

// True when `type` has a dpl layout (DplPlanesOf describes it).
DPL_HD constexpr bool HasDplPlanes(GgmlType type) { return DplPlanesOf(type).n > 0; }

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

// The dpl q6_K row by field name: [ql: nbe*128][qh: nbe*64][sc: nbe*16][d: nbe*2]
// (DplPlanesOf(q6_K); each plane starts at nbe times its field's raw offset).
struct Q6KPlanes {
  uint64_t ql, qh, sc, d;  // byte offsets of the planes from the row start
};

DPL_HD constexpr Q6KPlanes Q6KDplPlanes(uint64_t blocks_per_row) {
  return {blocks_per_row * kQ6KQlOffset, blocks_per_row * kQ6KQhOffset,
          blocks_per_row * kQ6KScOffset, blocks_per_row * kQ6KDOffset};
}

// Bytes from one row of `blocks` blocks of `block_bytes` to the next:
// raw rows are the blocks back to back; dpl rows are padded to 16 bytes
// (so uint4 loads inside the wide planes stay aligned). The caller has
// checked that the layout fits the type and that the product cannot overflow.
DPL_HD constexpr uint64_t LayoutRowStride(TensorLayout layout, uint64_t blocks,
                                          uint64_t block_bytes) {
  return layout == TensorLayout::kDpl
             ? (blocks * block_bytes + kDplRowAlignment - 1) & ~(kDplRowAlignment - 1)
             : blocks * block_bytes;
}

// Bytes from one dpl q6_K row of nbe blocks to the next: (nbe * 210 + 15) & ~15.
DPL_HD constexpr uint64_t DplQ6KRowStride(uint64_t nbe) {
  return LayoutRowStride(TensorLayout::kDpl, nbe, kQ6KBlockBytes);
}

}  // namespace dpl::formats
