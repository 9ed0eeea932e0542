#include "formats/gguf.h"

#include <algorithm>
#include <numeric>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

namespace dpl::formats {
namespace {

// Smallest possible encodings, used to bound counts before anything is read.
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;  // name len, n_dims, ne[0], type, offset

bool IsPowerOfTwo(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

struct Range {
  uint64_t begin, end;
  size_t index;
};

}  // namespace

absl::StatusOr<uint64_t> TensorBytes(GgmlType type, const std::vector<uint64_t>& ne) {
  const GgmlTypeTraits tr = TraitsOf(type);
  if (ne.empty() || ne.size() > kMaxDims) {
    return absl::InvalidArgumentError(absl::StrCat("tensor has ", ne.size(), " dims (1..4)"));
  }
  if (ne[0] % tr.block_elems != 0) {
    return absl::InvalidArgumentError(absl::StrCat("row length ", ne[0],
                                                   " is not a multiple of the ", tr.name,
                                                   " block size ", tr.block_elems));
  }
  uint64_t rows = 1;
  for (size_t i = 1; i < ne.size(); ++i) {
    if (!CheckedMul(rows, ne[i], &rows)) return absl::InvalidArgumentError("shape overflows");
  }
  uint64_t bytes;
  if (!CheckedMul(ne[0] / tr.block_elems, tr.block_bytes, &bytes) ||
      !CheckedMul(bytes, rows, &bytes)) {
    return absl::InvalidArgumentError("tensor size overflows");
  }
  return bytes;
}

absl::StatusOr<GgufFile> GgufFile::Parse(const uint8_t* data, uint64_t size,
                                         std::shared_ptr<const void> owner) {
  GgufFile f;
  f.owner_ = std::move(owner);
  f.data_ = data;
  f.size_ = size;
  ByteReader r(data, size);

  auto magic = r.Read<uint32_t>("magic");
  if (!magic.ok()) return magic.status();
  if (*magic != kGgufMagic) {
    return r.InvalidAt(0, "magic", "not a GGUF file (expected \"GGUF\")");
  }
  auto version = r.Read<uint32_t>("version");
  if (!version.ok()) return version.status();
  if (*version != 2 && *version != 3) {
    return r.InvalidAt(4, "version",
                       absl::StrCat("GGUF version ", *version, " is not supported (2 or 3)"));
  }
  f.version_ = *version;
  auto n_tensors = r.Read<uint64_t>("tensor count");
  if (!n_tensors.ok()) return n_tensors.status();
  auto n_kv = r.Read<uint64_t>("metadata count");
  if (!n_kv.ok()) return n_kv.status();
  uint64_t min_infos;
  if (!CheckedMul(*n_tensors, kMinTensorInfoBytes, &min_infos) || min_infos > r.remaining()) {
    return r.InvalidAt(8, "tensor count",
                       absl::StrCat(*n_tensors, " tensors cannot fit in a ", size,
                                    "-byte file"));
  }

  auto meta = ParseGgufKv(r, *n_kv);
  if (!meta.ok()) return meta.status();
  f.metadata_ = std::move(*meta);

  if (const MetaValue* a = f.metadata_.Find("general.alignment"); a != nullptr) {
    if (a->type != GgufValueType::kU32) {
      return absl::InvalidArgumentError(absl::StrCat(
          "invalid general.alignment: type ", GgufValueTypeName(a->type), ", expected u32"));
    }
    if (!IsPowerOfTwo(a->AsUint()) || a->AsUint() > kMaxAlignment) {
      return absl::InvalidArgumentError(
          absl::StrCat("invalid general.alignment ", a->AsUint(),
                       ": must be a power of two no larger than ", kMaxAlignment));
    }
    f.alignment_ = a->AsUint();
  }

  // Tensor infos.
  if (min_infos > r.remaining()) {
    return r.Invalid("tensor count", absl::StrCat(*n_tensors, " tensor infos cannot fit in the ",
                                                  r.remaining(), " bytes left"));
  }
  f.tensors_.reserve(*n_tensors);
  absl::flat_hash_set<std::string> names;
  for (uint64_t i = 0; i < *n_tensors; ++i) {
    GgufTensorInfo t;
    const uint64_t info_at = r.offset();
    const std::string what = absl::StrCat("tensor #", i);
    auto len = r.Read<uint64_t>(absl::StrCat(what, " name length"));
    if (!len.ok()) return len.status();
    if (*len == 0 || *len > kMaxTensorNameBytes || *len > r.remaining()) {
      return r.InvalidAt(info_at, absl::StrCat(what, " name length"),
                         absl::StrCat(*len, " (must be 1..", kMaxTensorNameBytes,
                                      " and within the file)"));
    }
    auto name = r.ReadBytes(*len, absl::StrCat(what, " name"));
    if (!name.ok()) return name.status();
    t.name = std::string(*name);
    if (!names.insert(t.name).second) {
      return r.InvalidAt(info_at, what, absl::StrCat("duplicate tensor name '", t.name, "'"));
    }
    const std::string tw = absl::StrCat("tensor '", t.name, "'");
    const uint64_t dims_at = r.offset();
    auto n_dims = r.Read<uint32_t>(absl::StrCat(tw, " n_dims"));
    if (!n_dims.ok()) return n_dims.status();
    if (*n_dims == 0 || *n_dims > kMaxDims) {
      return r.InvalidAt(dims_at, absl::StrCat(tw, " n_dims"),
                         absl::StrCat(*n_dims, " (must be 1..", kMaxDims, ")"));
    }
    t.n_dims = *n_dims;
    uint64_t n_elements = 1;
    for (uint32_t d = 0; d < t.n_dims; ++d) {
      const uint64_t ne_at = r.offset();
      auto ne = r.Read<uint64_t>(absl::StrCat(tw, " ne[", d, "]"));
      if (!ne.ok()) return ne.status();
      t.ne[d] = *ne;
      // ggml keeps shapes in int64: the product must fit there too.
      if (!CheckedMul(n_elements, *ne, &n_elements) || n_elements > INT64_MAX) {
        return r.InvalidAt(ne_at, absl::StrCat(tw, " shape"),
                           "the element count overflows 63 bits");
      }
    }
    t.n_elements = n_elements;
    const uint64_t type_at = r.offset();
    auto type_id = r.Read<uint32_t>(absl::StrCat(tw, " type"));
    if (!type_id.ok()) return type_id.status();
    const std::optional<GgmlTypeTraits> tr = FindGgmlType(*type_id);
    if (!tr) {
      return r.InvalidAt(type_at, absl::StrCat(tw, " type"),
                         absl::StrCat("unknown ggml type id ", *type_id));
    }
    t.type = tr->type;
    if (t.ne[0] % tr->block_elems != 0) {
      return r.InvalidAt(dims_at, absl::StrCat(tw, " shape"),
                         absl::StrCat("row length ", t.ne[0], " is not a whole number of ",
                                      tr->name, " blocks (", tr->block_elems, ")"));
    }
    t.n_rows = t.ne[1] * t.ne[2] * t.ne[3];  // cannot overflow: bounded by n_elements
    t.row_bytes = t.ne[0] / tr->block_elems * tr->block_bytes;
    if (!CheckedMul(t.row_bytes, t.n_rows, &t.n_bytes)) {
      return r.InvalidAt(dims_at, absl::StrCat(tw, " size"), "the byte size overflows");
    }
    const uint64_t off_at = r.offset();
    auto offset = r.Read<uint64_t>(absl::StrCat(tw, " offset"));
    if (!offset.ok()) return offset.status();
    if (*offset % f.alignment_ != 0) {
      return r.InvalidAt(off_at, absl::StrCat(tw, " offset"),
                         absl::StrCat(*offset, " is not a multiple of the alignment ",
                                      f.alignment_));
    }
    t.offset = *offset;
    f.tensors_.push_back(std::move(t));
  }

  // The data section starts at the next alignment boundary.
  uint64_t data_offset;
  if (!CheckedAlignUp(r.offset(), f.alignment_, &data_offset)) {
    return absl::InvalidArgumentError("data section offset overflows");
  }
  if (data_offset > size) {
    if (!f.tensors_.empty()) {
      return absl::OutOfRangeError(absl::StrCat("truncated file: the data section would start at ",
                                                data_offset, " but the file has ", size,
                                                " bytes"));
    }
    data_offset = size;
  }
  f.data_offset_ = data_offset;
  const uint64_t data_size = size - data_offset;

  // Every tensor inside the data section, no two overlapping.
  std::vector<Range> ranges;
  ranges.reserve(f.tensors_.size());
  for (size_t i = 0; i < f.tensors_.size(); ++i) {
    const GgufTensorInfo& t = f.tensors_[i];
    uint64_t end;
    if (!CheckedAdd(t.offset, t.n_bytes, &end) || end > data_size) {
      return absl::OutOfRangeError(absl::StrCat(
          "tensor '", t.name, "' [", t.offset, ", +", t.n_bytes, ") at file offset ",
          data_offset + std::min(t.offset, data_size), " runs past the data section (",
          data_size, " bytes)"));
    }
    ranges.push_back({t.offset, end, i});
  }
  std::sort(ranges.begin(), ranges.end(),
            [](const Range& a, const Range& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].begin < ranges[i - 1].end) {
      const GgufTensorInfo& a = f.tensors_[ranges[i - 1].index];
      const GgufTensorInfo& b = f.tensors_[ranges[i].index];
      return absl::InvalidArgumentError(absl::StrCat(
          "tensors '", a.name, "' and '", b.name, "' overlap at file offset ",
          data_offset + ranges[i].begin));
    }
  }
  return f;
}

absl::StatusOr<GgufFile> GgufFile::Open(const std::string& path) {
  auto mapped = MappedFile::Open(path);
  if (!mapped.ok()) return mapped.status();
  const std::shared_ptr<MappedFile> m = *mapped;
  auto parsed = Parse(m->data(), m->size(), m);
  if (!parsed.ok()) {
    return absl::Status(parsed.status().code(),
                        absl::StrCat(path, ": ", parsed.status().message()));
  }
  return parsed;
}

const GgufTensorInfo* GgufFile::FindTensor(absl::string_view name) const {
  for (const GgufTensorInfo& t : tensors_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

absl::StatusOr<GgufHeader> BuildGgufHeader(const Metadata& meta_in,
                                           const std::vector<GgufTensorSpec>& tensors,
                                           uint64_t alignment) {
  Metadata meta = meta_in;
  if (const MetaValue* a = meta.Find("general.alignment"); a != nullptr) {
    alignment = a->AsUint();
  } else if (alignment != kGgufDefaultAlignment) {
    meta.Set("general.alignment", MetaValue::U32(static_cast<uint32_t>(alignment)));
  }
  if (!IsPowerOfTwo(alignment) || alignment > kMaxAlignment) {
    return absl::InvalidArgumentError(absl::StrCat("bad alignment ", alignment));
  }
  GgufHeader h;
  std::string& out = h.bytes;
  auto put32 = [&](uint32_t v) { out.append(reinterpret_cast<const char*>(&v), 4); };
  auto put64 = [&](uint64_t v) { out.append(reinterpret_cast<const char*>(&v), 8); };
  put32(kGgufMagic);
  put32(3);
  put64(tensors.size());
  put64(meta.size());
  SerializeGgufKv(meta, out);
  uint64_t offset = 0;
  for (const GgufTensorSpec& t : tensors) {
    auto bytes = TensorBytes(t.type, t.ne);
    if (!bytes.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name, "': ",
                                                     bytes.status().message()));
    }
    put64(t.name.size());
    out += t.name;
    put32(static_cast<uint32_t>(t.ne.size()));
    for (uint64_t ne : t.ne) put64(ne);
    put32(static_cast<uint32_t>(t.type));
    put64(offset);
    h.offsets.push_back(offset);
    h.sizes.push_back(*bytes);
    if (!CheckedAlignUp(offset + *bytes, alignment, &offset)) {
      return absl::InvalidArgumentError("model size overflows");
    }
  }
  h.data_bytes = offset;
  out.resize((out.size() + alignment - 1) / alignment * alignment, '\0');
  return h;
}

}  // namespace dpl::formats
