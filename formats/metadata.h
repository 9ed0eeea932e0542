// GGUF key/value metadata: the typed values, an ordered key -> value table with
// typed getters, and the GGUF binary encoding of that table. The .dpl format
// stores the same encoding (zstd-compressed), so both readers share this code.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "formats/byte_reader.h"

namespace dpl::formats {

// GGUF metadata value types (gguf_type in ggml's gguf.h).
enum class GgufValueType : uint32_t {
  kU8 = 0,
  kI8 = 1,
  kU16 = 2,
  kI16 = 3,
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kU64 = 10,
  kI64 = 11,
  kF64 = 12,
};

// "u32", "string", "array", ... ; "type#N" for an unknown id.
std::string GgufValueTypeName(GgufValueType type);
// Bytes of one scalar of this type; 0 for string/array/unknown.
uint32_t GgufScalarBytes(GgufValueType type);

// One metadata value. Scalars keep their bits in `scalar_bits` (integers
// sign- or zero-extended to 64 bits, f32/f64 as IEEE bits, bool as 0/1).
// Strings keep their bytes in `bytes`. Arrays of numbers keep their elements
// packed little-endian in `bytes`; arrays of strings keep the strings
// concatenated in `bytes` with `string_ends[i]` the end offset of element i
// (8 bytes of bookkeeping per element: never more than the file spent on it).
struct MetaValue {
  GgufValueType type = GgufValueType::kU8;
  uint64_t scalar_bits = 0;
  std::string bytes;
  GgufValueType elem_type = GgufValueType::kU8;  // arrays only
  uint64_t count = 0;                            // arrays only
  std::vector<uint64_t> string_ends;             // arrays of strings only

  static MetaValue U8(uint8_t v);
  static MetaValue I8(int8_t v);
  static MetaValue U16(uint16_t v);
  static MetaValue I16(int16_t v);
  static MetaValue U32(uint32_t v);
  static MetaValue I32(int32_t v);
  static MetaValue U64(uint64_t v);
  static MetaValue I64(int64_t v);
  static MetaValue F32(float v);
  static MetaValue F64(double v);
  static MetaValue Bool(bool v);
  static MetaValue String(absl::string_view v);
  static MetaValue StringArray(const std::vector<std::string>& v);
  static MetaValue I32Array(const std::vector<int32_t>& v);
  static MetaValue F32Array(const std::vector<float>& v);

  bool is_integer() const;  // any integer scalar type
  bool is_float() const;    // f32/f64 scalar

  // Array element access (no bounds check beyond the debug assert).
  absl::string_view StringAt(uint64_t i) const;
  int64_t IntAt(uint64_t i) const;    // integer element types (and bool)
  double FloatAt(uint64_t i) const;   // f32/f64 element types, integers converted
  // Scalar as numbers (valid when is_integer()/is_float()).
  int64_t AsInt() const;
  uint64_t AsUint() const;
  double AsDouble() const;

  // Short human rendering; arrays longer than `max_elems` are summarized.
  std::string DebugString(size_t max_elems = 8) const;
};

struct MetaKV {
  std::string key;
  MetaValue value;
};

// Ordered metadata table (file order is preserved for round trips), with a
// hash index: Find, Set and Add are O(1), so a file of 100,000 keys parses in
// linear time. Erase is O(n) (tools edit a few keys, files never do).
class Metadata {
 public:
  const std::vector<MetaKV>& entries() const { return entries_; }
  size_t size() const { return entries_.size(); }

  const MetaValue* Find(absl::string_view key) const;
  // Inserts or replaces (keeps the original position when replacing).
  void Set(absl::string_view key, MetaValue value);
  // Appends; false (and nothing changed) when the key is already present.
  bool Add(absl::string_view key, MetaValue value);
  bool Erase(absl::string_view key);

  // Typed getters. Errors name the key and what was found instead.
  absl::StatusOr<uint64_t> GetUint(absl::string_view key) const;   // non-negative integers
  absl::StatusOr<int64_t> GetInt(absl::string_view key) const;
  absl::StatusOr<double> GetFloat(absl::string_view key) const;    // floats or integers
  absl::StatusOr<bool> GetBool(absl::string_view key) const;
  absl::StatusOr<absl::string_view> GetString(absl::string_view key) const;
  absl::StatusOr<const MetaValue*> GetArray(absl::string_view key) const;
  // Same, with a default when the key is absent (a present key of the wrong
  // type is still an error).
  absl::StatusOr<uint64_t> GetUintOr(absl::string_view key, uint64_t dflt) const;
  absl::StatusOr<double> GetFloatOr(absl::string_view key, double dflt) const;
  absl::StatusOr<bool> GetBoolOr(absl::string_view key, bool dflt) const;

 private:
  std::vector<MetaKV> entries_;
  absl::flat_hash_map<std::string, size_t> index_;  // key -> position in entries_
};

// Limits applied while parsing untrusted metadata.
inline constexpr uint64_t kMaxKeyBytes = 64 * 1024;
inline constexpr uint64_t kMaxStringBytes = 256ull * 1024 * 1024;

// Parses `n_kv` GGUF key/value pairs at the reader's cursor. Rejects duplicate
// keys, unknown value types, nested arrays, and any length or count that does
// not fit in the bytes left. Errors name the key (when known) and the offset.
absl::StatusOr<Metadata> ParseGgufKv(ByteReader& reader, uint64_t n_kv);

// Appends the GGUF encoding of every entry (key, type, value) to `out`.
void SerializeGgufKv(const Metadata& meta, std::string& out);

}  // namespace dpl::formats
