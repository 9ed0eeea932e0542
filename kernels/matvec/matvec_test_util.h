// Host-side helpers shared by the GPU tests and benchmarks of the weight
// kernels (matvec, prompt GEMM dequant, embedding gather): random weight
// matrices of every type in GGUF or dpl layout, and the CPU emulation of the
// activation quantization. The weights come from dpl-synth's generator (the
// project's one source of random blocks: finite f16 scales placed as each
// block struct has them, dequantized std 0.5/sqrt(n_cols)).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "formats/dequant.h"
#include "formats/dpl_layout.h"
#include "formats/ggml_types.h"
#include "formats/model_file.h"
#include "kernels/matvec/matvec_plan.h"
#include "tools/synth.h"

namespace dpl::kernels::testutil {

// A random host matrix in the requested layout with row_stride >= the
// minimum (extra bytes are filled with garbage the kernels must not read as
// weights).
struct HostMatrix {
  formats::GgmlType type;
  formats::TensorLayout layout;
  int64_t n_rows, n_cols, row_stride;
  std::vector<uint8_t> bytes;  // (n_rows, row_stride)
  std::vector<uint8_t> raw;    // dpl layout only: the raw rows it came from (n_rows, raw row bytes)
};

// Rows of `type` (raw GGUF blocks) from dpl-synth, one seed per matrix:
// (n_rows, raw row bytes).
inline std::vector<uint8_t> RandomRawRows(formats::GgmlType type, int64_t n_rows, int64_t n_cols,
                                          uint64_t seed) {
  synth::PlannedTensor t;
  t.spec.name = "test.weight";
  t.spec.ne = {static_cast<uint64_t>(n_cols), static_cast<uint64_t>(n_rows)};
  t.spec.type = type;
  t.role = synth::TensorRole::kMatrix;
  const int64_t raw_stride = MinRowStride(type, formats::TensorLayout::kRaw, n_cols);
  std::vector<uint8_t> out(static_cast<size_t>(n_rows * raw_stride));
  synth::FillRows(t, seed, 0, static_cast<uint64_t>(n_rows), out.data());
  return out;
}

inline HostMatrix RandomMatrix(formats::GgmlType type, formats::TensorLayout layout,
                               int64_t n_rows, int64_t n_cols, int64_t extra_stride,
                               uint64_t seed) {
  HostMatrix m{type, layout, n_rows, n_cols, 0, {}, {}};
  const int64_t raw_stride = MinRowStride(type, formats::TensorLayout::kRaw, n_cols);
  m.row_stride = MinRowStride(type, layout, n_cols) + extra_stride;
  m.bytes.assign(static_cast<size_t>(n_rows * m.row_stride), 0xA5);
  std::vector<uint8_t> raw = RandomRawRows(type, n_rows, n_cols, seed);
  const uint64_t nbe = static_cast<uint64_t>(n_cols / formats::TraitsOf(type).block_elems);
  for (int64_t r = 0; r < n_rows; ++r) {
    uint8_t* dst = m.bytes.data() + r * m.row_stride;
    const uint8_t* src = raw.data() + r * raw_stride;
    if (layout == formats::TensorLayout::kDpl) {
      const absl::Status st = formats::RowToDpl(type, src, nbe, dst);
      if (!st.ok()) std::abort();  // a test asked for a type without planes
    } else {
      std::memcpy(dst, src, static_cast<size_t>(raw_stride));
    }
  }
  if (layout == formats::TensorLayout::kDpl) m.raw = std::move(raw);
  return m;
}

// The same weights in the other layout: a dpl matrix's raw twin (the bitwise
// gate of the dpl kernels).
inline HostMatrix RawTwin(const HostMatrix& dpl) {
  const int64_t raw_stride = MinRowStride(dpl.type, formats::TensorLayout::kRaw, dpl.n_cols);
  return HostMatrix{dpl.type, formats::TensorLayout::kRaw, dpl.n_rows, dpl.n_cols, raw_stride, dpl.raw, {}};
}

// CPU emulation of QuantizeActivations: x~ = d * q per block of 32 values.
inline std::vector<double> QuantizedX(const float* x, int64_t n) {
  std::vector<double> out(static_cast<size_t>(n));
  for (int64_t b = 0; b < n / 32; ++b) {
    float amax = 0.f;
    for (int i = 0; i < 32; ++i) amax = std::fmax(amax, std::fabs(x[32 * b + i]));
    const float d = amax / 127.0f;
    for (int i = 0; i < 32; ++i) {
      int q = 0;
      if (amax > 0.f) {
        q = static_cast<int>(std::nearbyint(x[32 * b + i] / d));
        q = q < -127 ? -127 : (q > 127 ? 127 : q);
      }
      out[static_cast<size_t>(32 * b + i)] = static_cast<double>(d) * q;
    }
  }
  return out;
}

}  // namespace dpl::kernels::testutil
