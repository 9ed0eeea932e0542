#include "formats/ggml_types.h"

#include <array>

#include "formats/tensor_layout.h"

namespace dpl::formats {
namespace {

// Block geometry from ggml's type_traits table (ggml.c); block sizes follow
// the structs in ggml-common.h.
constexpr std::array<GgmlTypeTraits, 31> kTypes = {{
    {GgmlType::kF32, "f32", 1, 4},
    {GgmlType::kF16, "f16", 1, 2},
    {GgmlType::kQ4_0, "q4_0", 32, 18},
    {GgmlType::kQ4_1, "q4_1", 32, 20},
    {GgmlType::kQ5_0, "q5_0", 32, 22},
    {GgmlType::kQ5_1, "q5_1", 32, 24},
    {GgmlType::kQ8_0, "q8_0", 32, 34},
    {GgmlType::kQ8_1, "q8_1", 32, 36},
    {GgmlType::kQ2_K, "q2_K", 256, 84},
    {GgmlType::kQ3_K, "q3_K", 256, 110},
    {GgmlType::kQ4_K, "q4_K", 256, 144},
    {GgmlType::kQ5_K, "q5_K", 256, 176},
    {GgmlType::kQ6_K, "q6_K", 256, 210},
    {GgmlType::kQ8_K, "q8_K", 256, 292},
    {GgmlType::kIQ2_XXS, "iq2_xxs", 256, 66},
    {GgmlType::kIQ2_XS, "iq2_xs", 256, 74},
    {GgmlType::kIQ3_XXS, "iq3_xxs", 256, 98},
    {GgmlType::kIQ1_S, "iq1_s", 256, 50},
    {GgmlType::kIQ4_NL, "iq4_nl", 32, 18},
    {GgmlType::kIQ3_S, "iq3_s", 256, 110},
    {GgmlType::kIQ2_S, "iq2_s", 256, 82},
    {GgmlType::kIQ4_XS, "iq4_xs", 256, 136},
    {GgmlType::kI8, "i8", 1, 1},
    {GgmlType::kI16, "i16", 1, 2},
    {GgmlType::kI32, "i32", 1, 4},
    {GgmlType::kI64, "i64", 1, 8},
    {GgmlType::kF64, "f64", 1, 8},
    {GgmlType::kIQ1_M, "iq1_m", 256, 56},
    {GgmlType::kBF16, "bf16", 1, 2},
    {GgmlType::kTQ1_0, "tq1_0", 256, 54},
    {GgmlType::kTQ2_0, "tq2_0", 256, 66},
}};

static_assert(kTypes[12].type == GgmlType::kQ6_K && kTypes[12].block_elems == kQ6KBlockElems &&
                  kTypes[12].block_bytes == kQ6KBlockBytes,
              "tensor_layout.h's q6_K block fields add up to ggml's block");

// MXFP4 (id 39) sits apart from the dense range above.
constexpr GgmlTypeTraits kMxfp4 = {GgmlType::kMXFP4, "mxfp4", 32, 17};

}  // namespace

std::optional<GgmlTypeTraits> FindGgmlType(uint32_t id) {
  if (id == static_cast<uint32_t>(GgmlType::kMXFP4)) return kMxfp4;
  for (const GgmlTypeTraits& t : kTypes) {
    if (static_cast<uint32_t>(t.type) == id) return t;
  }
  return std::nullopt;
}

GgmlTypeTraits TraitsOf(GgmlType type) {
  return *FindGgmlType(static_cast<uint32_t>(type));
}

std::optional<GgmlType> GgmlTypeFromName(absl::string_view name) {
  if (name == kMxfp4.name) return kMxfp4.type;
  for (const GgmlTypeTraits& t : kTypes) {
    if (t.name == name) return t.type;
  }
  return std::nullopt;
}

}  // namespace dpl::formats
