#include "formats/dequant.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "formats/dpl_layout.h"

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

// q4_0 block (18 bytes): d:f16, qs:u8[16]. Element j (0..15) is the low
// nibble of qs[j], element j + 16 the high nibble; w = d * (q - 8).
void DequantQ4_0(const uint8_t* __restrict b, float* __restrict out) {
  const float d = LoadF16(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    out[j] = d * static_cast<float>((qs[j] & 0xF) - 8);
    out[j + 16] = d * static_cast<float>((qs[j] >> 4) - 8);
  }
}

// q4_1 block (20 bytes): d:f16, m:f16, qs:u8[16], nibbles as in q4_0.
// w = (d * q) + m: the product is rounded to float32 before the add.
void DequantQ4_1(const uint8_t* __restrict b, float* __restrict out) {
  const float d = LoadF16(b);
  const float m = LoadF16(b + 2);
  const uint8_t* qs = b + 4;
  for (int j = 0; j < 16; ++j) {
    const float lo = d * static_cast<float>(qs[j] & 0xF);
    const float hi = d * static_cast<float>(qs[j] >> 4);
    out[j] = lo + m;
    out[j + 16] = hi + m;
  }
}

// q5_1 block (24 bytes): d:f16, m:f16, qh:u8[4], qs:u8[16]. The 5-bit q is
// built as in q5_0 (nibble of qs[j], bit j or j + 16 of the LE u32 qh) but
// unsigned: w = (d * q) + m, product rounded to float32 first.
void DequantQ5_1(const uint8_t* __restrict b, float* __restrict out) {
  const float d = LoadF16(b);
  const float m = LoadF16(b + 2);
  const uint32_t qh = LoadU32(b + 4);
  const uint8_t* qs = b + 8;
  for (int j = 0; j < 16; ++j) {
    const int lo = (qs[j] & 0xF) | (((qh >> j) & 1) << 4);
    const int hi = (qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
    const float lo_scaled = d * static_cast<float>(lo);
    const float hi_scaled = d * static_cast<float>(hi);
    out[j] = lo_scaled + m;
    out[j + 16] = hi_scaled + m;
  }
}

// iq4_nl block (18 bytes): d:f16, qs:u8[16], nibbles as in q4_0 (element j
// low nibble of qs[j], element j + 16 high nibble). w = d * kvalues[q].
void DequantIQ4_NL(const uint8_t* __restrict b, float* __restrict out) {
  const float d = LoadF16(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    out[j] = d * static_cast<float>(kIq4NlValues[qs[j] & 0xF]);
    out[j + 16] = d * static_cast<float>(kIq4NlValues[qs[j] >> 4]);
  }
}

// The 6-bit scale `sc` and min `m` of sub-block j (0..7) of a q4_K/q5_K
// block, packed in 12 bytes:
//   j < 4:  sc = scales[j] & 63,  m = scales[j + 4] & 63
//   j >= 4: sc = (scales[j + 4] & 0xF) | ((scales[j - 4] >> 6) << 4),
//           m  = (scales[j + 4] >> 4)  | ((scales[j] >> 6) << 4)
void KScaleMin(const uint8_t* scales, int j, int* sc, int* m) {
  if (j < 4) {
    *sc = scales[j] & 63;
    *m = scales[j + 4] & 63;
  } else {
    *sc = (scales[j + 4] & 0xF) | ((scales[j - 4] >> 6) << 4);
    *m = (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4);
  }
}

// q4_K block (144 bytes): d:f16, dmin:f16, scales:u8[12], qs:u8[128].
// q5_K block (176 bytes): the same header, then qh:u8[32], then qs:u8[128].
// Sub-block j (32 weights) takes its low 4 bits from qs[32 * (j / 2) + l]
// (low nibble for even j, high for odd) and, in q5_K, its fifth bit from bit
// j of qh[l]. w = (d * sc_j) * q - (dmin * m_j).
template <bool kQ5>
void DequantQ4Q5_K(const uint8_t* __restrict b, float* __restrict out) {
  const float d = LoadF16(b);
  const float dmin = LoadF16(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qh = b + 16;  // q5_K only
  const uint8_t* qs = b + (kQ5 ? 48 : 16);
  for (int j = 0; j < 8; ++j) {
    int sc, m;
    KScaleMin(scales, j, &sc, &m);
    const float dl = d * static_cast<float>(sc);
    const float ml = dmin * static_cast<float>(m);
    const uint8_t* q = qs + 32 * (j / 2);
    const int shift = (j & 1) ? 4 : 0;
    float* o = out + 32 * j;
    for (int l = 0; l < 32; ++l) {
      int v = (q[l] >> shift) & 0xF;
      if constexpr (kQ5) v |= ((qh[l] >> j) & 1) << 4;
      const float scaled = dl * static_cast<float>(v);
      o[l] = scaled - ml;
    }
  }
}

// q3_K block (110 bytes): hmask:u8[32], qs:u8[64], scales:u8[12], d:f16.
// 16 sub-blocks of 16 with a signed 6-bit scale:
//   sc_k = ((scales[k % 8] >> 4 * (k / 8)) & 0xF
//          | ((scales[8 + k % 4] >> 2 * (k / 4)) & 3) << 4) - 32.
// Weight i = 128c + 32s + l (c 0..1, s 0..3, l 0..31): low 2 bits
// (qs[32c + l] >> 2s) & 3, high bit (hmask[l] >> (4c + s)) & 1, and
// q = low - (high ? 0 : 4). w = (d * sc_{i / 16}) * q.
void DequantQ3_K(const uint8_t* __restrict b, float* __restrict out) {
  const uint8_t* hmask = b;
  const uint8_t* qs = b + 32;
  const uint8_t* scales = b + 96;
  const float d = LoadF16(b + 108);
  float dl[16];
  for (int k = 0; k < 16; ++k) {
    const int lo = (scales[k % 8] >> (4 * (k / 8))) & 0xF;
    const int hi = (scales[8 + k % 4] >> (2 * (k / 4))) & 3;
    dl[k] = d * static_cast<float>((lo | (hi << 4)) - 32);
  }
  for (int c = 0; c < 2; ++c) {
    for (int s = 0; s < 4; ++s) {
      const int bit = 4 * c + s;
      float* o = out + 128 * c + 32 * s;
      const float* dls = dl + 8 * c + 2 * s;  // sub-blocks of o[0..15], o[16..31]
      for (int l = 0; l < 32; ++l) {
        const int low = (qs[32 * c + l] >> (2 * s)) & 3;
        const int q = low - (((hmask[l] >> bit) & 1) ? 0 : 4);
        o[l] = dls[l / 16] * static_cast<float>(q);
      }
    }
  }
}

// q2_K block (84 bytes): scales:u8[16], qs:u8[64], d:f16, dmin:f16.
// Sub-block k (16 weights) has scale scales[k] & 0xF and min scales[k] >> 4.
// Weight i = 128c + 32s + l: q = (qs[32c + l] >> 2s) & 3.
// w = (d * sc_k) * q - (dmin * m_k), k = i / 16.
void DequantQ2_K(const uint8_t* __restrict b, float* __restrict out) {
  const uint8_t* scales = b;
  const uint8_t* qs = b + 16;
  const float d = LoadF16(b + 80);
  const float dmin = LoadF16(b + 82);
  for (int c = 0; c < 2; ++c) {
    for (int s = 0; s < 4; ++s) {
      float* o = out + 128 * c + 32 * s;
      for (int h = 0; h < 2; ++h) {
        const int k = 8 * c + 2 * s + h;
        const float dl = d * static_cast<float>(scales[k] & 0xF);
        const float ml = dmin * static_cast<float>(scales[k] >> 4);
        for (int l = 16 * h; l < 16 * h + 16; ++l) {
          const float scaled = dl * static_cast<float>((qs[32 * c + l] >> (2 * s)) & 3);
          o[l] = scaled - ml;
        }
      }
    }
  }
}

// iq4_xs block (136 bytes): d:f16, scales_h:u16, scales_l:u8[4], qs:u8[128].
// Sub-block j (0..7, 32 weights) has the signed 6-bit scale
//   ls_j = ((scales_l[j / 2] >> 4 * (j % 2)) & 0xF | ((scales_h >> 2j) & 3) << 4) - 32;
// its weights are the low nibbles of qs[16j .. 16j + 15], then the high
// nibbles. w = (d * ls_j) * kvalues[q].
void DequantIQ4_XS(const uint8_t* __restrict b, float* __restrict out) {
  const float d = LoadF16(b);
  const uint16_t scales_h = LoadU16(b + 2);
  const uint8_t* scales_l = b + 4;
  const uint8_t* qs = b + 8;
  for (int j = 0; j < 8; ++j) {
    const int lo = (scales_l[j / 2] >> (4 * (j % 2))) & 0xF;
    const int hi = (scales_h >> (2 * j)) & 3;
    const float dl = d * static_cast<float>((lo | (hi << 4)) - 32);
    const uint8_t* q = qs + 16 * j;
    float* o = out + 32 * j;
    for (int l = 0; l < 16; ++l) {
      o[l] = dl * static_cast<float>(kIq4NlValues[q[l] & 0xF]);
      o[l + 16] = dl * static_cast<float>(kIq4NlValues[q[l] >> 4]);
    }
  }
}

// One q6_K block from its four fields (DequantQ6_K: a raw block's):
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
  DequantQ6_KFields(b + kQ6KQlOffset, b + kQ6KQhOffset, b + kQ6KScOffset, b + kQ6KDOffset, out);
}

// The largest block of a type with a dpl layout (q6_K's); DequantizeRow
// gathers one block at a time into a buffer of this size.
constexpr uint32_t kMaxDplBlockBytes = kQ6KBlockBytes;

// One block of a quantized type: `block` (block_bytes) -> `out` (block_elems).
using BlockFn = void (*)(const uint8_t* block, float* out);

// The block dequantizer of a quantized type, or nullptr when there is none.
// Block geometry comes from TraitsOf(type).
BlockFn BlockDequantizer(GgmlType type) {
  switch (type) {
    case GgmlType::kQ4_0: return DequantQ4_0;
    case GgmlType::kQ4_1: return DequantQ4_1;
    case GgmlType::kQ5_0: return DequantQ5_0;
    case GgmlType::kQ5_1: return DequantQ5_1;
    case GgmlType::kQ8_0: return DequantQ8_0;
    case GgmlType::kQ2_K: return DequantQ2_K;
    case GgmlType::kQ3_K: return DequantQ3_K;
    case GgmlType::kQ4_K: return DequantQ4Q5_K<false>;
    case GgmlType::kQ5_K: return DequantQ4Q5_K<true>;
    case GgmlType::kQ6_K: return DequantQ6_K;
    case GgmlType::kIQ4_NL: return DequantIQ4_NL;
    case GgmlType::kIQ4_XS: return DequantIQ4_XS;
    default: return nullptr;
  }
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
      return true;
    default:
      return BlockDequantizer(type) != nullptr;
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
  switch (type) {
    case GgmlType::kF32:
      std::memcpy(out, blocks, n_elems * 4);
      return absl::OkStatus();
    case GgmlType::kF16:
      for (uint64_t i = 0; i < n_elems; ++i) out[i] = LoadF16(blocks + 2 * i);
      return absl::OkStatus();
    case GgmlType::kBF16:
      for (uint64_t i = 0; i < n_elems; ++i) out[i] = Bf16ToF32(LoadU16(blocks + 2 * i));
      return absl::OkStatus();
    default:
      break;
  }
  const BlockFn fn = BlockDequantizer(type);  // non-null: IsDequantSupported checked
  const uint64_t nb = n_elems / tr.block_elems;
  for (uint64_t i = 0; i < nb; ++i) fn(blocks + i * tr.block_bytes, out + i * tr.block_elems);
  return absl::OkStatus();
}

absl::Status DequantizeRow(GgmlType type, TensorLayout layout, const uint8_t* row,
                           uint64_t n_elems, float* out) {
  switch (layout) {
    case TensorLayout::kRaw:
      return DequantizeBlocks(type, row, n_elems, out);
    case TensorLayout::kDpl: {
      DPL_RETURN_IF_ERROR(dpl::Annotate(CheckDplType(type), "dequantize (layout dpl)"));
      const GgmlTypeTraits tr = TraitsOf(type);
      if (n_elems % tr.block_elems != 0) {
        return absl::InvalidArgumentError(absl::StrCat("dequantize ", tr.name, " (dpl): ", n_elems,
                                                       " elements is not a whole number of blocks"));
      }
      // Each block gathered back from the planes into its raw bytes, then the
      // raw block dequantizer: the dpl path gives the raw path's floats by
      // construction.
      const uint64_t nbe = n_elems / tr.block_elems;
      const DplPlaneSpec spec = DplPlanesOf(type);
      const BlockFn fn = BlockDequantizer(type);
      if (fn == nullptr || tr.block_bytes > kMaxDplBlockBytes) {
        return absl::UnimplementedError(
            absl::StrCat("dequantize: unsupported tensor type ", tr.name, " (dpl)"));
      }
      uint8_t block[kMaxDplBlockBytes];
      for (uint64_t i = 0; i < nbe; ++i) {
        for (uint32_t p = 0; p < spec.n; ++p) {
          const BlockField& f = spec.f[p];
          std::memcpy(block + f.offset, row + DplPlaneOffset(spec, p, nbe) + i * f.bytes, f.bytes);
        }
        fn(block, out + i * tr.block_elems);
      }
      return absl::OkStatus();
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("dequantize: unknown tensor layout ", static_cast<uint32_t>(layout)));
}

}  // namespace dpl::formats
