#include "formats/metadata.h"

#include <cassert>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"

namespace dpl::formats {
namespace {

bool IsKnownType(uint32_t t) { return t <= static_cast<uint32_t>(GgufValueType::kF64); }

template <typename T>
uint64_t BitsOf(T v) {
  static_assert(sizeof(T) <= 8);
  if constexpr (std::is_floating_point_v<T>) {
    uint64_t bits = 0;
    std::memcpy(&bits, &v, sizeof(T));
    return bits;
  } else if constexpr (std::is_signed_v<T>) {
    return static_cast<uint64_t>(static_cast<int64_t>(v));
  } else {
    return static_cast<uint64_t>(v);
  }
}

template <typename T>
MetaValue Scalar(GgufValueType type, T v) {
  MetaValue m;
  m.type = type;
  m.scalar_bits = BitsOf(v);
  return m;
}

template <typename T>
MetaValue NumericArray(GgufValueType elem_type, const std::vector<T>& v) {
  MetaValue m;
  m.type = GgufValueType::kArray;
  m.elem_type = elem_type;
  m.count = v.size();
  m.bytes.assign(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
  return m;
}

// Reads one scalar element of `type` from raw little-endian bytes.
int64_t ReadIntElem(GgufValueType type, const char* p) {
  switch (type) {
    case GgufValueType::kU8: return static_cast<uint8_t>(*p);
    case GgufValueType::kI8: return static_cast<int8_t>(*p);
    case GgufValueType::kBool: return static_cast<uint8_t>(*p) != 0;
    case GgufValueType::kU16: { uint16_t v; std::memcpy(&v, p, 2); return v; }
    case GgufValueType::kI16: { int16_t v; std::memcpy(&v, p, 2); return v; }
    case GgufValueType::kU32: { uint32_t v; std::memcpy(&v, p, 4); return v; }
    case GgufValueType::kI32: { int32_t v; std::memcpy(&v, p, 4); return v; }
    case GgufValueType::kU64: { uint64_t v; std::memcpy(&v, p, 8); return static_cast<int64_t>(v); }
    case GgufValueType::kI64: { int64_t v; std::memcpy(&v, p, 8); return v; }
    case GgufValueType::kF32: { float v; std::memcpy(&v, p, 4); return static_cast<int64_t>(v); }
    case GgufValueType::kF64: { double v; std::memcpy(&v, p, 8); return static_cast<int64_t>(v); }
    default: return 0;
  }
}

double ReadFloatElem(GgufValueType type, const char* p) {
  switch (type) {
    case GgufValueType::kF32: { float v; std::memcpy(&v, p, 4); return v; }
    case GgufValueType::kF64: { double v; std::memcpy(&v, p, 8); return v; }
    case GgufValueType::kU64: { uint64_t v; std::memcpy(&v, p, 8); return static_cast<double>(v); }
    default: return static_cast<double>(ReadIntElem(type, p));
  }
}

}  // namespace

std::string GgufValueTypeName(GgufValueType type) {
  switch (type) {
    case GgufValueType::kU8: return "u8";
    case GgufValueType::kI8: return "i8";
    case GgufValueType::kU16: return "u16";
    case GgufValueType::kI16: return "i16";
    case GgufValueType::kU32: return "u32";
    case GgufValueType::kI32: return "i32";
    case GgufValueType::kF32: return "f32";
    case GgufValueType::kBool: return "bool";
    case GgufValueType::kString: return "string";
    case GgufValueType::kArray: return "array";
    case GgufValueType::kU64: return "u64";
    case GgufValueType::kI64: return "i64";
    case GgufValueType::kF64: return "f64";
  }
  return absl::StrCat("type#", static_cast<uint32_t>(type));
}

uint32_t GgufScalarBytes(GgufValueType type) {
  switch (type) {
    case GgufValueType::kU8: case GgufValueType::kI8: case GgufValueType::kBool: return 1;
    case GgufValueType::kU16: case GgufValueType::kI16: return 2;
    case GgufValueType::kU32: case GgufValueType::kI32: case GgufValueType::kF32: return 4;
    case GgufValueType::kU64: case GgufValueType::kI64: case GgufValueType::kF64: return 8;
    default: return 0;
  }
}

MetaValue MetaValue::U8(uint8_t v) { return Scalar(GgufValueType::kU8, v); }
MetaValue MetaValue::I8(int8_t v) { return Scalar(GgufValueType::kI8, v); }
MetaValue MetaValue::U16(uint16_t v) { return Scalar(GgufValueType::kU16, v); }
MetaValue MetaValue::I16(int16_t v) { return Scalar(GgufValueType::kI16, v); }
MetaValue MetaValue::U32(uint32_t v) { return Scalar(GgufValueType::kU32, v); }
MetaValue MetaValue::I32(int32_t v) { return Scalar(GgufValueType::kI32, v); }
MetaValue MetaValue::U64(uint64_t v) { return Scalar(GgufValueType::kU64, v); }
MetaValue MetaValue::I64(int64_t v) { return Scalar(GgufValueType::kI64, v); }
MetaValue MetaValue::F32(float v) { return Scalar(GgufValueType::kF32, v); }
MetaValue MetaValue::F64(double v) { return Scalar(GgufValueType::kF64, v); }
MetaValue MetaValue::Bool(bool v) { return Scalar(GgufValueType::kBool, static_cast<uint8_t>(v)); }

MetaValue MetaValue::String(absl::string_view v) {
  MetaValue m;
  m.type = GgufValueType::kString;
  m.bytes = std::string(v);
  return m;
}

MetaValue MetaValue::StringArray(const std::vector<std::string>& v) {
  MetaValue m;
  m.type = GgufValueType::kArray;
  m.elem_type = GgufValueType::kString;
  m.count = v.size();
  m.string_ends.reserve(v.size());
  for (const std::string& s : v) {
    m.bytes += s;
    m.string_ends.push_back(m.bytes.size());
  }
  return m;
}

MetaValue MetaValue::I32Array(const std::vector<int32_t>& v) {
  return NumericArray(GgufValueType::kI32, v);
}

MetaValue MetaValue::F32Array(const std::vector<float>& v) {
  return NumericArray(GgufValueType::kF32, v);
}

bool MetaValue::is_integer() const {
  switch (type) {
    case GgufValueType::kU8: case GgufValueType::kI8: case GgufValueType::kU16:
    case GgufValueType::kI16: case GgufValueType::kU32: case GgufValueType::kI32:
    case GgufValueType::kU64: case GgufValueType::kI64:
      return true;
    default:
      return false;
  }
}

bool MetaValue::is_float() const {
  return type == GgufValueType::kF32 || type == GgufValueType::kF64;
}

absl::string_view MetaValue::StringAt(uint64_t i) const {
  assert(elem_type == GgufValueType::kString && i < count);
  const uint64_t begin = i == 0 ? 0 : string_ends[i - 1];
  return absl::string_view(bytes).substr(begin, string_ends[i] - begin);
}

int64_t MetaValue::IntAt(uint64_t i) const {
  const uint32_t w = GgufScalarBytes(elem_type);
  assert(w != 0 && i < count);
  return ReadIntElem(elem_type, bytes.data() + i * w);
}

double MetaValue::FloatAt(uint64_t i) const {
  const uint32_t w = GgufScalarBytes(elem_type);
  assert(w != 0 && i < count);
  return ReadFloatElem(elem_type, bytes.data() + i * w);
}

int64_t MetaValue::AsInt() const { return static_cast<int64_t>(scalar_bits); }
uint64_t MetaValue::AsUint() const { return scalar_bits; }

double MetaValue::AsDouble() const {
  if (type == GgufValueType::kF32) {
    float f;
    const uint32_t b = static_cast<uint32_t>(scalar_bits);
    std::memcpy(&f, &b, 4);
    return f;
  }
  if (type == GgufValueType::kF64) {
    double d;
    std::memcpy(&d, &scalar_bits, 8);
    return d;
  }
  if (type == GgufValueType::kU64) return static_cast<double>(scalar_bits);
  return static_cast<double>(AsInt());
}

std::string MetaValue::DebugString(size_t max_elems) const {
  auto quote = [](absl::string_view s, size_t max_len) {
    std::string out = "\"";
    for (size_t i = 0; i < s.size() && i < max_len; ++i) {
      const unsigned char c = s[i];
      if (c == '\n') out += "\\n";
      else if (c == '"') out += "\\\"";
      else if (c == '\\') out += "\\\\";
      else if (c < 0x20) out += absl::StrFormat("\\x%02x", c);
      else out += static_cast<char>(c);
    }
    if (s.size() > max_len) out += absl::StrCat("...(", s.size(), " bytes)");
    return out + "\"";
  };
  switch (type) {
    case GgufValueType::kString:
      return quote(bytes, 120);
    case GgufValueType::kBool:
      return scalar_bits ? "true" : "false";
    case GgufValueType::kF32:
    case GgufValueType::kF64:
      return absl::StrFormat("%g", AsDouble());
    case GgufValueType::kU64:
      return absl::StrCat(scalar_bits);
    case GgufValueType::kArray: {
      std::string out = absl::StrCat("[", GgufValueTypeName(elem_type), " x ", count, "] [");
      for (uint64_t i = 0; i < count && i < max_elems; ++i) {
        if (i) out += ", ";
        if (elem_type == GgufValueType::kString) out += quote(StringAt(i), 40);
        else if (elem_type == GgufValueType::kF32 || elem_type == GgufValueType::kF64)
          out += absl::StrFormat("%g", FloatAt(i));
        else out += absl::StrCat(IntAt(i));
      }
      if (count > max_elems) out += ", ...";
      return out + "]";
    }
    default:
      return absl::StrCat(AsInt());
  }
}

const MetaValue* Metadata::Find(absl::string_view key) const {
  const auto it = index_.find(key);
  return it == index_.end() ? nullptr : &entries_[it->second].value;
}

void Metadata::Set(absl::string_view key, MetaValue value) {
  const auto it = index_.find(key);
  if (it != index_.end()) {
    entries_[it->second].value = std::move(value);
    return;
  }
  Add(key, std::move(value));
}

bool Metadata::Add(absl::string_view key, MetaValue value) {
  if (!index_.try_emplace(key, entries_.size()).second) return false;
  entries_.push_back(MetaKV{std::string(key), std::move(value)});
  return true;
}

bool Metadata::Erase(absl::string_view key) {
  const auto it = index_.find(key);
  if (it == index_.end()) return false;
  const size_t pos = it->second;
  index_.erase(it);
  entries_.erase(entries_.begin() + pos);
  for (auto& [k, i] : index_) {
    if (i > pos) --i;
  }
  return true;
}

namespace {
absl::Status Missing(absl::string_view key) {
  return absl::NotFoundError(absl::StrCat("metadata key '", key, "' is missing"));
}
absl::Status WrongType(absl::string_view key, const MetaValue& v, absl::string_view want) {
  return absl::InvalidArgumentError(absl::StrCat("metadata key '", key, "' is ",
                                                 GgufValueTypeName(v.type), ", expected ",
                                                 want));
}
}  // namespace

absl::StatusOr<uint64_t> Metadata::GetUint(absl::string_view key) const {
  const MetaValue* v = Find(key);
  if (v == nullptr) return Missing(key);
  if (!v->is_integer()) return WrongType(key, *v, "an integer");
  const bool is_signed = v->type == GgufValueType::kI8 || v->type == GgufValueType::kI16 ||
                         v->type == GgufValueType::kI32 || v->type == GgufValueType::kI64;
  if (is_signed && v->AsInt() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("metadata key '", key, "' is negative (", v->AsInt(), ")"));
  }
  return v->AsUint();
}

absl::StatusOr<int64_t> Metadata::GetInt(absl::string_view key) const {
  const MetaValue* v = Find(key);
  if (v == nullptr) return Missing(key);
  if (!v->is_integer()) return WrongType(key, *v, "an integer");
  if (v->type == GgufValueType::kU64 && v->scalar_bits > INT64_MAX) {
    return absl::InvalidArgumentError(absl::StrCat("metadata key '", key, "' is too large"));
  }
  return v->AsInt();
}

absl::StatusOr<double> Metadata::GetFloat(absl::string_view key) const {
  const MetaValue* v = Find(key);
  if (v == nullptr) return Missing(key);
  if (!v->is_float() && !v->is_integer()) return WrongType(key, *v, "a number");
  return v->AsDouble();
}

absl::StatusOr<bool> Metadata::GetBool(absl::string_view key) const {
  const MetaValue* v = Find(key);
  if (v == nullptr) return Missing(key);
  if (v->type != GgufValueType::kBool) return WrongType(key, *v, "a bool");
  return v->scalar_bits != 0;
}

absl::StatusOr<absl::string_view> Metadata::GetString(absl::string_view key) const {
  const MetaValue* v = Find(key);
  if (v == nullptr) return Missing(key);
  if (v->type != GgufValueType::kString) return WrongType(key, *v, "a string");
  return absl::string_view(v->bytes);
}

absl::StatusOr<const MetaValue*> Metadata::GetArray(absl::string_view key) const {
  const MetaValue* v = Find(key);
  if (v == nullptr) return Missing(key);
  if (v->type != GgufValueType::kArray) return WrongType(key, *v, "an array");
  return v;
}

absl::StatusOr<uint64_t> Metadata::GetUintOr(absl::string_view key, uint64_t dflt) const {
  if (Find(key) == nullptr) return dflt;
  return GetUint(key);
}

absl::StatusOr<double> Metadata::GetFloatOr(absl::string_view key, double dflt) const {
  if (Find(key) == nullptr) return dflt;
  return GetFloat(key);
}

absl::StatusOr<bool> Metadata::GetBoolOr(absl::string_view key, bool dflt) const {
  if (Find(key) == nullptr) return dflt;
  return GetBool(key);
}

namespace {

// Reads a GGUF string (u64 length + bytes) with a length cap.
absl::StatusOr<absl::string_view> ReadString(ByteReader& r, absl::string_view what,
                                            uint64_t max_len) {
  const uint64_t at = r.offset();
  DPL_ASSIGN_OR_RETURN(const uint64_t len, r.Read<uint64_t>(absl::StrCat(what, " length")));
  if (len > max_len) {
    return r.InvalidAt(at, absl::StrCat(what, " length"),
                       absl::StrCat(len, " exceeds the limit of ", max_len, " bytes"));
  }
  if (len > r.remaining()) {
    return r.InvalidAt(at, absl::StrCat(what, " length"),
                       absl::StrCat(len, " bytes but only ", r.remaining(), " left in the file"));
  }
  return r.ReadBytes(len, what);
}

// An array's element type, count and elements into `v`. The element type is
// checked before anything is read, and the count against the bytes left.
absl::Status ReadArray(ByteReader& r, absl::string_view key, const std::string& what,
                       MetaValue& v) {
  const std::string elem_what = absl::StrCat("array element type of '", key, "'");
  const uint64_t type_at = r.offset();
  DPL_ASSIGN_OR_RETURN(const uint32_t elem, r.Read<uint32_t>(elem_what));
  if (!IsKnownType(elem)) {
    return r.InvalidAt(type_at, elem_what, absl::StrCat("unknown value type ", elem));
  }
  if (elem == static_cast<uint32_t>(GgufValueType::kArray)) {
    return r.InvalidAt(type_at, elem_what, "nested arrays are not supported");
  }
  v.elem_type = static_cast<GgufValueType>(elem);
  const std::string count_what = absl::StrCat("array count of '", key, "'");
  const uint64_t count_at = r.offset();
  DPL_ASSIGN_OR_RETURN(v.count, r.Read<uint64_t>(count_what));
  const uint64_t min_elem_bytes =
      v.elem_type == GgufValueType::kString ? 8 : GgufScalarBytes(v.elem_type);
  uint64_t min_bytes;
  if (!CheckedMul(v.count, min_elem_bytes, &min_bytes) || min_bytes > r.remaining()) {
    return r.InvalidAt(count_at, count_what,
                       absl::StrCat(v.count, " elements of ", GgufValueTypeName(v.elem_type),
                                    " do not fit in the ", r.remaining(), " bytes left"));
  }
  if (v.elem_type != GgufValueType::kString) {
    DPL_ASSIGN_OR_RETURN(const absl::string_view raw, r.ReadBytes(min_bytes, what));
    v.bytes = std::string(raw);
    return absl::OkStatus();
  }
  v.string_ends.reserve(v.count);
  for (uint64_t i = 0; i < v.count; ++i) {
    // The element's name is spelled only for an error: vocabularies hold
    // hundreds of thousands of strings.
    const uint64_t left = r.remaining();
    uint64_t len = 0;
    if (left >= 8) std::memcpy(&len, r.data() + r.pos(), 8);
    if (left < 8 || len > kMaxStringBytes || len > left - 8) {  // fails, naming the element
      return ReadString(r, absl::StrCat(what, "[", i, "]"), kMaxStringBytes).status();
    }
    v.bytes.append(reinterpret_cast<const char*>(r.data() + r.pos() + 8), len);
    v.string_ends.push_back(v.bytes.size());
    DPL_RETURN_IF_ERROR(r.Skip(8 + len, what));
  }
  return absl::OkStatus();
}

absl::StatusOr<MetaValue> ReadValue(ByteReader& r, absl::string_view key, uint32_t type_id) {
  const std::string what = absl::StrCat("value of '", key, "'");
  if (!IsKnownType(type_id)) {
    return r.InvalidAt(r.offset() - 4, absl::StrCat("type of '", key, "'"),
                       absl::StrCat("unknown value type ", type_id));
  }
  const auto type = static_cast<GgufValueType>(type_id);
  MetaValue v;
  v.type = type;
  if (type == GgufValueType::kString) {
    DPL_ASSIGN_OR_RETURN(const absl::string_view s, ReadString(r, what, kMaxStringBytes));
    v.bytes = std::string(s);
  } else if (type == GgufValueType::kArray) {
    DPL_RETURN_IF_ERROR(ReadArray(r, key, what, v));
  } else {
    DPL_ASSIGN_OR_RETURN(const absl::string_view raw, r.ReadBytes(GgufScalarBytes(type), what));
    // Signed integers are sign-extended; everything else keeps its raw bits.
    const bool is_signed = type == GgufValueType::kI8 || type == GgufValueType::kI16 ||
                           type == GgufValueType::kI32 || type == GgufValueType::kI64;
    if (is_signed) {
      v.scalar_bits = static_cast<uint64_t>(ReadIntElem(type, raw.data()));
    } else {
      std::memcpy(&v.scalar_bits, raw.data(), raw.size());  // little-endian host
    }
  }
  return v;
}

}  // namespace

absl::StatusOr<Metadata> ParseGgufKv(ByteReader& r, uint64_t n_kv) {
  // Each pair needs at least 8 (key length) + 4 (type) + 1 bytes.
  uint64_t min_bytes;
  if (!CheckedMul(n_kv, 13, &min_bytes) || min_bytes > r.remaining()) {
    return r.Invalid("metadata count",
                     absl::StrCat(n_kv, " key/value pairs cannot fit in the ", r.remaining(),
                                  " bytes left"));
  }
  Metadata meta;
  for (uint64_t i = 0; i < n_kv; ++i) {
    const uint64_t key_at = r.offset();
    const std::string what = absl::StrCat("key #", i);
    DPL_ASSIGN_OR_RETURN(const absl::string_view key, ReadString(r, what, kMaxKeyBytes));
    if (key.empty()) return r.InvalidAt(key_at, what, "empty key");
    if (meta.Find(key) != nullptr) {
      return r.InvalidAt(key_at, what, absl::StrCat("duplicate key '", key, "'"));
    }
    DPL_ASSIGN_OR_RETURN(const uint32_t type, r.Read<uint32_t>(absl::StrCat("type of '", key, "'")));
    DPL_ASSIGN_OR_RETURN(MetaValue value, ReadValue(r, key, type));
    meta.Add(key, std::move(value));
  }
  return meta;
}

namespace {

void PutString(std::string& out, absl::string_view s) {
  AppendLE<uint64_t>(out, s.size());
  out.append(s.data(), s.size());
}

}  // namespace

void SerializeGgufKv(const Metadata& meta, std::string& out) {
  for (const MetaKV& kv : meta.entries()) {
    PutString(out, kv.key);
    const MetaValue& v = kv.value;
    AppendLE<uint32_t>(out, static_cast<uint32_t>(v.type));
    if (v.type == GgufValueType::kString) {
      PutString(out, v.bytes);
    } else if (v.type == GgufValueType::kArray) {
      AppendLE<uint32_t>(out, static_cast<uint32_t>(v.elem_type));
      AppendLE<uint64_t>(out, v.count);
      if (v.elem_type == GgufValueType::kString) {
        for (uint64_t i = 0; i < v.count; ++i) PutString(out, v.StringAt(i));
      } else {
        out += v.bytes;
      }
    } else {
      out.append(reinterpret_cast<const char*>(&v.scalar_bits), GgufScalarBytes(v.type));
    }
  }
}

}  // namespace dpl::formats
