// ggml tensor types as GGUF stores them: id, name and block geometry.
// Pure data: no file or CUDA knowledge (part of //formats:types, which CUDA
// code may include; q6_K block fields and layouts are in tensor_layout.h).
#pragma once

#include <cstdint>
#include <optional>

#include "absl/strings/string_view.h"

namespace dpl::formats {

// The GGUF type ids this project knows (ggml's enum ggml_type). Ids absent
// here (4, 5: removed Q4_2/Q4_3; 31-33, 36-38: removed or repacked-only types)
// are rejected by the readers.
enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kIQ2_XXS = 16,
  kIQ2_XS = 17,
  kIQ3_XXS = 18,
  kIQ1_S = 19,
  kIQ4_NL = 20,
  kIQ3_S = 21,
  kIQ2_S = 22,
  kIQ4_XS = 23,
  kI8 = 24,
  kI16 = 25,
  kI32 = 26,
  kI64 = 27,
  kF64 = 28,
  kIQ1_M = 29,
  kBF16 = 30,
  kTQ1_0 = 34,
  kTQ2_0 = 35,
  kMXFP4 = 39,
};

struct GgmlTypeTraits {
  GgmlType type;
  absl::string_view name;   // ggml's lower-case name, e.g. "q6_K"
  uint32_t block_elems;    // weights per block (1 for plain scalars)
  uint32_t block_bytes;    // bytes per block
};

// Traits of a known type id, or nullopt for an id this project does not know.
std::optional<GgmlTypeTraits> FindGgmlType(uint32_t id);

// Traits of a known type (never fails for an enumerator above).
GgmlTypeTraits TraitsOf(GgmlType type);

// Parses a name as printed by TraitsOf(...).name ("q4_K", "f16", ...).
std::optional<GgmlType> GgmlTypeFromName(absl::string_view name);

}  // namespace dpl::formats
