#include "formats/dequant.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "formats/q6k_dpl.h"

namespace dpl::formats {
namespace {

uint16_t LoadU16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
uint32_t LoadU32(const uint8_t* p) {
  return uint32_t{p[0]} | (uint32_t{p[1]} << 8) | (uint32_t{p[2]} << 16) | (uint32_t{p[3]} << 24);
}
float LoadF16(const uint8_t* p) { return F16ToF32(LoadU16(p)); }

uint32_t FloatBits(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  return x;
}
float BitsFloat(uint32_t x) {
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

// q8_0 block (34 bytes): d:f16, qs:i8[32]. w = d * q.
void DequantQ8_0(const uint8_t* __restrict b, float* __restrict out) {
  const float d = LoadF16(b);
  const int8_t* qs = reinterpret_cast<const int8_t*>(b + 2);
  for (int i = 0; i < 32; ++i) out[i] = d * static_cast<float>(qs[i]);
}

// q5_0 block (22 bytes): d:f16, qh:u8[4], qs:u8[16]. w = d * (q - 16), q the
// 5-bit value: low nibble (elements 0..15) or high nibble (16..31) of qs[j]
// plus bit j (or j + 16) of qh as the fifth bit.
void DequantQ5_0(const uint8_t* __restrict b, float* __restrict out) {
  const float d = LoadF16(b);
  const uint32_t qh = LoadU32(b + 2);
  const uint8_t* qs = b + 6;
  for (int j = 0; j < 16; ++j) {
    const int lo = (qs[j] & 0xF) | (((qh >> j) & 1) << 4);
    const int hi = (qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
    out[j] = d * static_cast<float>(lo - 16);
    out[j + 16] = d * static_cast<float>(hi - 16);
  }
}

// q4_K block (144 bytes): d:f16, dmin:f16, scales:u8[12], qs:u8[128].
// w = (d * sc_j) * q - (dmin * m_j), sub-block j = 32 weights.
void DequantQ4_K(const uint8_t* __restrict b, float* __restrict out) {
  const float d = LoadF16(b);
  const float dmin = LoadF16(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qs = b + 16;
  for (int j = 0; j < 8; ++j) {
    int sc, m;
    if (j < 4) {
      sc = scales[j] & 63;
      m = scales[j + 4] & 63;
    } else {
      sc = (scales[j + 4] & 0xF) | ((scales[j - 4] >> 6) << 4);
      m = (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4);
    }
    const float dl = d * static_cast<float>(sc);
    const float ml = dmin * static_cast<float>(m);
    // Chunk c = j / 2 uses qs[32c .. 32c + 31]: low nibbles for even j,
    // high nibbles for odd j.
    const uint8_t* q = qs + 32 * (j / 2);
    const int shift = (j & 1) ? 4 : 0;
    float* o = out + 32 * j;
    for (int l = 0; l < 32; ++l) {
      const float scaled = dl * static_cast<float>((q[l] >> shift) & 0xF);
      o[l] = scaled - ml;
    }
  }
}

// One q6_K block from its four fields (wherever the layout keeps them):
// ql:u8[128], qh:u8[64], sc:i8[16], d:f16. w = (d * sc_s) * (q - 32).
void DequantQ6_KFields(const uint8_t* __restrict ql, const uint8_t* __restrict qh,
                       const uint8_t* __restrict sc_bytes, const uint8_t* __restrict d_bytes,
                       float* __restrict out) {
  const float d = LoadF16(d_bytes);
  const int8_t* sc = reinterpret_cast<const int8_t*>(sc_bytes);
  float ds[16];
  for (int s = 0; s < 16; ++s) ds[s] = d * static_cast<float>(sc[s]);
  for (int h = 0; h < 2; ++h) {
    const uint8_t* l_ = ql + 64 * h;
    const uint8_t* h_ = qh + 32 * h;
    const float* dh = ds + 8 * h;
    float* o = out + 128 * h;
    // Two runs of 16 so each inner loop has fixed scales (it vectorizes).
    for (int s = 0; s < 2; ++s) {
      for (int l = 16 * s; l < 16 * s + 16; ++l) {
        const int q1 = ((l_[l] & 0xF) | (((h_[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((l_[l + 32] & 0xF) | (((h_[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((l_[l] >> 4) | (((h_[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((l_[l + 32] >> 4) | (((h_[l] >> 6) & 3) << 4)) - 32;
        o[l] = dh[s + 0] * static_cast<float>(q1);
        o[l + 32] = dh[s + 2] * static_cast<float>(q2);
        o[l + 64] = dh[s + 4] * static_cast<float>(q3);
        o[l + 96] = dh[s + 6] * static_cast<float>(q4);
      }
    }
  }
}

void DequantQ6_K(const uint8_t* b, float* out) {
  DequantQ6_KFields(b, b + kQ6KQlBytes, b + kQ6KQlBytes + kQ6KQhBytes,
                    b + kQ6KQlBytes + kQ6KQhBytes + kQ6KScBytes, out);
}

}  // namespace

float F16ToF32(uint16_t h) {
  const uint32_t sign = uint32_t{h & 0x8000u} << 16;
  const uint32_t exp = (h >> 10) & 0x1F;
  const uint32_t mant = h & 0x3FF;
  if (exp == 0) {
    if (mant == 0) return BitsFloat(sign);
    // Subnormal: mant * 2^-24, exactly representable in float.
    const float v = static_cast<float>(mant) * (1.0f / 16777216.0f);
    return sign ? -v : v;
  }
  if (exp == 31) return BitsFloat(sign | 0x7F800000u | (mant << 13));  // inf / NaN
  return BitsFloat(sign | ((exp + (127 - 15)) << 23) | (mant << 13));
}

uint16_t F32ToF16(float f) {
  const uint32_t x = FloatBits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000);
  const uint32_t ax = x & 0x7FFFFFFFu;
  if (ax >= 0x7F800000u) {  // inf or NaN (NaN keeps its top payload, stays NaN)
    if (ax == 0x7F800000u) return sign | 0x7C00;
    return static_cast<uint16_t>(sign | 0x7E00 | ((ax >> 13) & 0x3FF));
  }
  // 65520 = halfway between 65504 (max half, odd mantissa) and 2^16: ties to
  // even round it, and everything above, to inf.
  if (ax >= 0x477FF000u) return sign | 0x7C00;
  if (ax < 0x38800000u) {  // below 2^-14: half subnormal (units of 2^-24) or 0
    const int e = static_cast<int>(ax >> 23);
    if (e < 102) return sign;  // < 2^-25: rounds to 0
    const uint32_t m = (ax & 0x7FFFFFu) | 0x800000u;  // value = m * 2^(e-150)
    const int shift = 126 - e;                        // 14..24
    uint32_t q = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1))) ++q;  // may carry into 0x400 (normal)
    return static_cast<uint16_t>(sign | q);
  }
  uint32_t h = (ax >> 13) - ((127 - 15) << 10);
  const uint32_t rem = ax & 0x1FFF;
  if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) ++h;  // carry may reach the exponent
  return static_cast<uint16_t>(sign | h);
}

float Bf16ToF32(uint16_t h) { return BitsFloat(uint32_t{h} << 16); }

uint16_t F32ToBf16(float f) {
  const uint32_t x = FloatBits(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((x >> 16) | 0x40);  // NaN
  const uint32_t rounding = 0x7FFF + ((x >> 16) & 1);
  return static_cast<uint16_t>((x + rounding) >> 16);
}

bool IsDequantSupported(GgmlType type) {
  switch (type) {
    case GgmlType::kF32:
    case GgmlType::kF16:
    case GgmlType::kBF16:
    case GgmlType::kQ8_0:
    case GgmlType::kQ5_0:
    case GgmlType::kQ4_K:
    case GgmlType::kQ6_K:
      return true;
    default:
      return false;
  }
}

absl::Status DequantizeBlocks(GgmlType type, const uint8_t* blocks, uint64_t n_elems,
                              float* out) {
  if (!IsDequantSupported(type)) {
    return absl::UnimplementedError(
        absl::StrCat("dequantize: unsupported tensor type ", TraitsOf(type).name));
  }
  const GgmlTypeTraits tr = TraitsOf(type);
  if (n_elems % tr.block_elems != 0) {
    return absl::InvalidArgumentError(absl::StrCat("dequantize ", tr.name, ": ", n_elems,
                                                   " elements is not a whole number of ",
                                                   tr.block_elems, "-element blocks"));
  }
  const uint64_t nb = n_elems / tr.block_elems;
  switch (type) {
    case GgmlType::kF32:
      std::memcpy(out, blocks, n_elems * 4);
      break;
    case GgmlType::kF16:
      for (uint64_t i = 0; i < n_elems; ++i) out[i] = LoadF16(blocks + 2 * i);
      break;
    case GgmlType::kBF16:
      for (uint64_t i = 0; i < n_elems; ++i) out[i] = Bf16ToF32(LoadU16(blocks + 2 * i));
      break;
    case GgmlType::kQ8_0:
      for (uint64_t i = 0; i < nb; ++i) DequantQ8_0(blocks + i * 34, out + i * 32);
      break;
    case GgmlType::kQ5_0:
      for (uint64_t i = 0; i < nb; ++i) DequantQ5_0(blocks + i * 22, out + i * 32);
      break;
    case GgmlType::kQ4_K:
      for (uint64_t i = 0; i < nb; ++i) DequantQ4_K(blocks + i * 144, out + i * 256);
      break;
    case GgmlType::kQ6_K:
      for (uint64_t i = 0; i < nb; ++i) {
        DequantQ6_K(blocks + i * kQ6KBlockBytes, out + i * kQ6KBlockElems);
      }
      break;
    default:
      break;  // unreachable: IsDequantSupported checked above
  }
  return absl::OkStatus();
}

absl::Status DequantizeRow(GgmlType type, TensorLayout layout, const uint8_t* row,
                           uint64_t n_elems, float* out) {
  switch (layout) {
    case TensorLayout::kRaw:
      return DequantizeBlocks(type, row, n_elems, out);
    case TensorLayout::kDplQ6K: {
      if (type != GgmlType::kQ6_K) {
        return absl::InvalidArgumentError(absl::StrCat(
            "dequantize: layout dpl_q6k holds only q6_K, not ", TraitsOf(type).name));
      }
      if (n_elems % kQ6KBlockElems != 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "dequantize q6_K (dpl_q6k): ", n_elems, " elements is not a whole number of blocks"));
      }
      const uint64_t nbe = n_elems / kQ6KBlockElems;
      const uint8_t* ql = row;                      // (nbe, 128)
      const uint8_t* qh = ql + nbe * kQ6KQlBytes;   // (nbe, 64)
      const uint8_t* sc = qh + nbe * kQ6KQhBytes;   // (nbe, 16)
      const uint8_t* d = sc + nbe * kQ6KScBytes;    // (nbe, 2)
      for (uint64_t i = 0; i < nbe; ++i) {
        DequantQ6_KFields(ql + i * kQ6KQlBytes, qh + i * kQ6KQhBytes, sc + i * kQ6KScBytes,
                          d + i * kQ6KDBytes, out + i * kQ6KBlockElems);
      }
      return absl::OkStatus();
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("dequantize: unknown tensor layout ", static_cast<uint32_t>(layout)));
}

}  // namespace dpl::formats
