// Host-side helpers shared by the matvec GPU test and benchmark: random weight
// matrices in GGUF/dpl byte layouts (with sane f16 scales, never NaN/inf) and
// the CPU emulation of the activation quantization.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "formats/dequant.h"
#include "formats/ggml_types.h"
#include "formats/model_file.h"
#include "formats/q6k_dpl.h"
#include "kernels/matvec/matvec_plan.h"

namespace dpl::kernels::testutil {

inline void PutF16(uint8_t* p, float v) {
  const uint16_t h = formats::F32ToF16(v);
  std::memcpy(p, &h, 2);
}

// One random row of `type` (raw GGUF block layout) of n_cols weights into
// out: (MinRowStride) bytes. Scales are finite f16 values of realistic size.
inline void RandomRawRow(formats::GgmlType type, int64_t n_cols, std::mt19937_64& rng,
                         uint8_t* out) {
  using formats::GgmlType;
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(0.002f, 0.02f);
  std::normal_distribution<float> normal(0.f, 0.5f);
  switch (type) {
    case GgmlType::kF32:
      for (int64_t i = 0; i < n_cols; ++i) {
        const float v = normal(rng);
        std::memcpy(out + 4 * i, &v, 4);
      }
      break;
    case GgmlType::kF16:
      for (int64_t i = 0; i < n_cols; ++i) PutF16(out + 2 * i, normal(rng));
      break;
    case GgmlType::kQ8_0:
      for (int64_t b = 0; b < n_cols / 32; ++b) {
        uint8_t* blk = out + 34 * b;
        PutF16(blk, scale(rng));
        for (int i = 0; i < 32; ++i) {
          blk[2 + i] = static_cast<uint8_t>(static_cast<int8_t>(byte(rng) % 255 - 127));
        }
      }
      break;
    case GgmlType::kQ5_0:
      for (int64_t b = 0; b < n_cols / 32; ++b) {
        uint8_t* blk = out + 22 * b;
        PutF16(blk, scale(rng));
        for (int i = 2; i < 22; ++i) blk[i] = static_cast<uint8_t>(byte(rng));
      }
      break;
    case GgmlType::kQ4_K:
      for (int64_t b = 0; b < n_cols / 256; ++b) {
        uint8_t* blk = out + 144 * b;
        PutF16(blk, scale(rng));
        PutF16(blk + 2, scale(rng));
        for (int i = 4; i < 144; ++i) blk[i] = static_cast<uint8_t>(byte(rng));
      }
      break;
    case GgmlType::kQ6_K:
      for (int64_t b = 0; b < n_cols / 256; ++b) {
        uint8_t* blk = out + 210 * b;
        for (int i = 0; i < 208; ++i) blk[i] = static_cast<uint8_t>(byte(rng));
        PutF16(blk + 208, scale(rng) * 0.1f);
      }
      break;
    default:
      break;
  }
}

// A random host matrix in the requested layout with row_stride >= the
// minimum (extra bytes are filled with garbage the kernels must not read as
// weights).
struct HostMatrix {
  formats::GgmlType type;
  formats::TensorLayout layout;
  int64_t n_rows, n_cols, row_stride;
  std::vector<uint8_t> bytes;  // (n_rows, row_stride)
  std::vector<uint8_t> raw;    // q6_K dpl only: the raw rows it came from (n_rows, nbe*210)
};

inline HostMatrix RandomMatrix(formats::GgmlType type, formats::TensorLayout layout,
                               int64_t n_rows, int64_t n_cols, int64_t extra_stride,
                               uint64_t seed) {
  std::mt19937_64 rng(seed);
  HostMatrix m{type, layout, n_rows, n_cols, 0, {}, {}};
  const int64_t raw_stride = MinRowStride(type, formats::TensorLayout::kRaw, n_cols);
  m.row_stride = MinRowStride(type, layout, n_cols) + extra_stride;
  m.bytes.assign(static_cast<size_t>(n_rows * m.row_stride), 0xA5);
  std::vector<uint8_t> row(static_cast<size_t>(raw_stride));
  if (layout == formats::TensorLayout::kDpl) m.raw.resize(static_cast<size_t>(n_rows * raw_stride));
  for (int64_t r = 0; r < n_rows; ++r) {
    RandomRawRow(type, n_cols, rng, row.data());
    uint8_t* dst = m.bytes.data() + r * m.row_stride;
    if (layout == formats::TensorLayout::kDpl) {
      std::memcpy(m.raw.data() + r * raw_stride, row.data(), row.size());
      formats::Q6KRowToDpl(row.data(), static_cast<uint64_t>(n_cols / 256), dst);
    } else {
      std::memcpy(dst, row.data(), row.size());
    }
  }
  return m;
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
