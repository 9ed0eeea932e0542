#include "formats/gguf.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "formats/byte_reader.h"
#include "formats/mapped_file.h"

namespace dpl::formats {
namespace {

// Smallest possible encodings, used to bound counts before anything is read.
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;  // name len, n_dims, ne[0], type, offset

bool IsPowerOfTwo(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

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

namespace {

// general.alignment when present (a power-of-two u32 up to kMaxAlignment).
absl::StatusOr<uint64_t> ReadAlignment(const Metadata& meta) {
  const MetaValue* a = meta.Find("general.alignment");
  if (a == nullptr) return kGgufDefaultAlignment;
  if (a->type != GgufValueType::kU32) {
    return absl::InvalidArgumentError(absl::StrCat(
        "invalid general.alignment: type ", GgufValueTypeName(a->type), ", expected u32"));
  }
  if (!IsPowerOfTwo(a->AsUint()) || a->AsUint() > kMaxAlignment) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid general.alignment ", a->AsUint(),
                     ": must be a power of two no larger than ", kMaxAlignment));
  }
  return a->AsUint();
}

// Tensor info #i at the reader's cursor: name, shape, type and offset, with
// the geometry derived and checked (whole blocks per row, no overflow).
absl::StatusOr<GgufTensorInfo> ReadTensorInfo(ByteReader& r, uint64_t i, uint64_t alignment) {
  GgufTensorInfo t;
  const uint64_t info_at = r.offset();
  const std::string what = absl::StrCat("tensor #", i);
  DPL_ASSIGN_OR_RETURN(const uint64_t len, r.Read<uint64_t>(absl::StrCat(what, " name length")));
  if (len == 0 || len > kMaxTensorNameBytes || len > r.remaining()) {
    return r.InvalidAt(info_at, absl::StrCat(what, " name length"),
                       absl::StrCat(len, " (must be 1..", kMaxTensorNameBytes,
                                    " and within the file)"));
  }
  const uint64_t name_at = r.offset();
  DPL_ASSIGN_OR_RETURN(const absl::string_view name, r.ReadBytes(len, absl::StrCat(what, " name")));
  DPL_RETURN_IF_ERROR(CheckName(name, name_at, absl::StrCat(what, " name")));
  t.name = std::string(name);
  const std::string tw = absl::StrCat("tensor '", t.name, "'");
  const uint64_t dims_at = r.offset();
  DPL_ASSIGN_OR_RETURN(t.n_dims, r.Read<uint32_t>(absl::StrCat(tw, " n_dims")));
  if (t.n_dims == 0 || t.n_dims > kMaxDims) {
    return r.InvalidAt(dims_at, absl::StrCat(tw, " n_dims"),
                       absl::StrCat(t.n_dims, " (must be 1..", kMaxDims, ")"));
  }
  t.n_elements = 1;
  for (uint32_t d = 0; d < t.n_dims; ++d) {
    const uint64_t ne_at = r.offset();
    DPL_ASSIGN_OR_RETURN(t.ne[d], r.Read<uint64_t>(absl::StrCat(tw, " ne[", d, "]")));
    // ggml keeps shapes in int64: the product must fit there too.
    if (!CheckedMul(t.n_elements, t.ne[d], &t.n_elements) || t.n_elements > INT64_MAX) {
      return r.InvalidAt(ne_at, absl::StrCat(tw, " shape"), "the element count overflows 63 bits");
    }
  }
  const uint64_t type_at = r.offset();
  DPL_ASSIGN_OR_RETURN(const uint32_t type_id, r.Read<uint32_t>(absl::StrCat(tw, " type")));
  const std::optional<GgmlTypeTraits> tr = FindGgmlType(type_id);
  if (!tr) {
    return r.InvalidAt(type_at, absl::StrCat(tw, " type"),
                       absl::StrCat("unknown ggml type id ", type_id));
  }
  t.type = tr->type;
  if (t.ne[0] % tr->block_elems != 0) {
    return r.InvalidAt(dims_at, absl::StrCat(tw, " shape"),
                       absl::StrCat("row length ", t.ne[0], " is not a whole number of ",
                                    tr->name, " blocks (", tr->block_elems, ")"));
  }
  t.n_rows = t.ne[1] * t.ne[2] * t.ne[3];  // cannot overflow: bounded by n_elements
  uint64_t row_bytes;
  if (!CheckedMul(t.ne[0] / tr->block_elems, tr->block_bytes, &row_bytes) ||
      !CheckedMul(row_bytes, t.n_rows, &t.n_bytes)) {
    return r.InvalidAt(dims_at, absl::StrCat(tw, " size"), "the byte size overflows");
  }
  t.row_stride = LayoutRowStride(TensorLayout::kRaw, t.ne[0] / tr->block_elems, tr->block_bytes);
  const uint64_t off_at = r.offset();
  DPL_ASSIGN_OR_RETURN(t.offset, r.Read<uint64_t>(absl::StrCat(tw, " offset")));
  if (t.offset % alignment != 0) {
    return r.InvalidAt(off_at, absl::StrCat(tw, " offset"),
                       absl::StrCat(t.offset, " is not a multiple of the alignment ", alignment));
  }
  return t;
}

// Every tensor inside the data section [data_offset, data_offset + data_size)
// of the file, no two overlapping.
absl::Status CheckTensorRanges(const std::vector<GgufTensorInfo>& tensors, uint64_t data_offset,
                               uint64_t data_size) {
  for (const GgufTensorInfo& t : tensors) {
    uint64_t end;
    if (!CheckedAdd(t.offset, t.n_bytes, &end) || end > data_size) {
      return absl::OutOfRangeError(absl::StrCat(
          "tensor '", t.name, "' [", t.offset, ", +", t.n_bytes, ") at file offset ",
          data_offset + std::min(t.offset, data_size), " runs past the data section (",
          data_size, " bytes)"));
    }
  }
  return CheckDisjoint(tensors, "file offset", data_offset);
}

}  // namespace

absl::StatusOr<GgufFile> GgufFile::Parse(const uint8_t* data, uint64_t size,
                                         std::shared_ptr<const void> owner) {
  GgufFile f;
  f.owner_ = std::move(owner);
  f.data_ = data;
  f.size_ = size;
  ByteReader r(data, size);

  DPL_ASSIGN_OR_RETURN(const uint32_t magic, r.Read<uint32_t>("magic"));
  if (magic != kGgufMagic) return r.InvalidAt(0, "magic", "not a GGUF file (expected \"GGUF\")");
  DPL_ASSIGN_OR_RETURN(f.version_, r.Read<uint32_t>("version"));
  if (f.version_ != 2 && f.version_ != 3) {
    return r.InvalidAt(4, "version",
                       absl::StrCat("GGUF version ", f.version_, " is not supported (2 or 3)"));
  }
  DPL_ASSIGN_OR_RETURN(const uint64_t n_tensors, r.Read<uint64_t>("tensor count"));
  DPL_ASSIGN_OR_RETURN(const uint64_t n_kv, r.Read<uint64_t>("metadata count"));
  uint64_t min_infos;
  if (!CheckedMul(n_tensors, kMinTensorInfoBytes, &min_infos) || min_infos > r.remaining()) {
    return r.InvalidAt(8, "tensor count",
                       absl::StrCat(n_tensors, " tensors cannot fit in a ", size, "-byte file"));
  }
  DPL_ASSIGN_OR_RETURN(f.metadata_, ParseGgufKv(r, n_kv));
  DPL_ASSIGN_OR_RETURN(f.alignment_, ReadAlignment(f.metadata_));

  // Tensor infos.
  if (min_infos > r.remaining()) {
    return r.Invalid("tensor count", absl::StrCat(n_tensors, " tensor infos cannot fit in the ",
                                                  r.remaining(), " bytes left"));
  }
  f.tensors_.reserve(n_tensors);
  for (uint64_t i = 0; i < n_tensors; ++i) {
    const uint64_t info_at = r.offset();
    DPL_ASSIGN_OR_RETURN(GgufTensorInfo t, ReadTensorInfo(r, i, f.alignment_));
    if (!f.names_.try_emplace(t.name, f.tensors_.size()).second) {
      return r.InvalidAt(info_at, absl::StrCat("tensor #", i),
                         absl::StrCat("duplicate tensor name '", t.name, "'"));
    }
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
  DPL_RETURN_IF_ERROR(CheckTensorRanges(f.tensors_, data_offset, size - data_offset));
  return f;
}

absl::StatusOr<GgufFile> GgufFile::Open(const std::string& path) {
  return OpenMapped<GgufFile>(path);
}

const GgufTensorInfo* GgufFile::FindTensor(absl::string_view name) const {
  return FindIndexed(tensors_, names_, name);
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
  AppendLE<uint32_t>(out, kGgufMagic);
  AppendLE<uint32_t>(out, 3);
  AppendLE<uint64_t>(out, tensors.size());
  AppendLE<uint64_t>(out, meta.size());
  SerializeGgufKv(meta, out);
  uint64_t offset = 0;
  for (const GgufTensorSpec& t : tensors) {
    const absl::StatusOr<uint64_t> bytes = TensorBytes(t.type, t.ne);
    DPL_RETURN_IF_ERROR(dpl::Annotate(dpl::StatusOf(bytes), absl::StrCat("tensor '", t.name, "'")));
    AppendLE<uint64_t>(out, t.name.size());
    out += t.name;
    AppendLE<uint32_t>(out, t.ne.size());
    for (uint64_t ne : t.ne) AppendLE<uint64_t>(out, ne);
    AppendLE<uint32_t>(out, static_cast<uint32_t>(t.type));
    AppendLE<uint64_t>(out, offset);
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
