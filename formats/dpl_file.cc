#include "formats/dpl_file.h"

#include <xxhash.h>
#include <zstd.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "formats/byte_reader.h"
#include "formats/dpl_layout.h"
#include "formats/mapped_file.h"

namespace dpl::formats {
namespace {

constexpr uint64_t kHeaderChecksummedBytes = kDplHeaderBytes - 8;
constexpr uint64_t kMinEntryBytes = 4 + 1 + 16 + 32 + 32;
constexpr uint32_t kMaxNameBytes = 4096;

// Header field offsets (docs/FORMAT.md, "Header").
enum HeaderOffset : uint64_t {
  kOffMagic = 0,
  kOffVersion = 8,
  kOffFlags = 12,
  kOffFileBytes = 16,
  kOffMetaOffset = 24,
  kOffMetaStored = 32,
  kOffMetaRaw = 40,
  kOffMetaCount = 48,
  kOffTableOffset = 56,
  kOffTableBytes = 64,
  kOffNTensors = 72,
  kOffFramesOffset = 80,
  kOffNFrames = 88,
  kOffFrameRaw = 96,
  kOffDataOffset = 104,
  kOffDataBytes = 112,
  kOffDataStored = 120,
  kOffIndexXxh3 = 128,
  kOffReservedBegin = 136,  // zero up to 248
  kOffHeaderXxh3 = 248,
};

// The u64 header fields between flags and the reserved bytes, in file order:
// the one list the encoder and the parser both walk.
struct U64Field {
  HeaderOffset at;
  uint64_t DplHeader::*field;
};
constexpr U64Field kU64Fields[] = {
    {kOffFileBytes, &DplHeader::file_bytes},
    {kOffMetaOffset, &DplHeader::meta_offset},
    {kOffMetaStored, &DplHeader::meta_stored_bytes},
    {kOffMetaRaw, &DplHeader::meta_raw_bytes},
    {kOffMetaCount, &DplHeader::meta_count},
    {kOffTableOffset, &DplHeader::table_offset},
    {kOffTableBytes, &DplHeader::table_bytes},
    {kOffNTensors, &DplHeader::n_tensors},
    {kOffFramesOffset, &DplHeader::frames_offset},
    {kOffNFrames, &DplHeader::n_frames},
    {kOffFrameRaw, &DplHeader::frame_raw_bytes},
    {kOffDataOffset, &DplHeader::data_offset},
    {kOffDataBytes, &DplHeader::data_bytes},
    {kOffDataStored, &DplHeader::data_stored_bytes},
    {kOffIndexXxh3, &DplHeader::index_xxh3},
};

template <typename T>
void PutAt(std::string& out, uint64_t at, T v) {
  std::memcpy(out.data() + at, &v, sizeof(T));
}
template <typename T>
T GetAt(const uint8_t* p, uint64_t at) {
  T v;
  std::memcpy(&v, p + at, sizeof(T));
  return v;
}

absl::Status Bad(absl::string_view what, uint64_t at, absl::string_view detail) {
  return absl::InvalidArgumentError(absl::StrCat("invalid ", what, " at offset ", at, ": ", detail));
}

// [begin, begin + len) lies inside [0, limit).
bool InRange(uint64_t begin, uint64_t len, uint64_t limit) {
  uint64_t end;
  return CheckedAdd(begin, len, &end) && end <= limit;
}

// [begin, begin + len) lies inside the index area [256, data_offset).
bool InIndex(uint64_t begin, uint64_t len, const DplHeader& h) {
  return begin >= kDplHeaderBytes && InRange(begin, len, h.data_offset);
}

// The fixed part of a tensor table entry, after the name.
struct FixedEntry {
  uint32_t type, layout, n_dims, reserved;
  uint64_t ne[4], row_stride, offset, n_bytes, xxh3;
};
static_assert(sizeof(FixedEntry) == kMinEntryBytes - 5, "entry = u32 name_len, name, fixed");

// Reads the header fields and checks, in docs/FORMAT.md's order, everything
// that can be checked before the index is read: magic, version, header
// checksum, reserved bytes, flags, sizes, ranges, then the index checksum.
absl::StatusOr<DplHeader> ParseHeader(const uint8_t* data, uint64_t size) {
  const bool magic_ok = size >= 8 && std::memcmp(data, kDplMagic, 8) == 0;
  if (size >= 8 && !magic_ok) return Bad("magic", 0, "not a .dpl file (expected \"DPLMODEL\")");
  if (size < kDplHeaderBytes) {
    return absl::OutOfRangeError(absl::StrCat("truncated header: the file has ", size,
                                              " bytes, the header needs ", kDplHeaderBytes));
  }
  DplHeader h;
  h.version = GetAt<uint32_t>(data, kOffVersion);
  if (h.version < kDplMinVersion || h.version > kDplMaxVersion) {
    return Bad("format version", kOffVersion,
               absl::StrCat(h.version, " is not supported (this reader knows versions ",
                            kDplMinVersion, " to ", kDplMaxVersion, ")"));
  }
  h.header_xxh3 = GetAt<uint64_t>(data, kOffHeaderXxh3);
  if (XXH3_64bits(data, kHeaderChecksummedBytes) != h.header_xxh3) {
    return Bad("header checksum", kOffHeaderXxh3, "the header is corrupt");
  }
  for (uint64_t i = kOffReservedBegin; i < kOffHeaderXxh3; ++i) {
    if (data[i] != 0) return Bad("reserved header byte", i, "must be zero");
  }
  h.flags = GetAt<uint32_t>(data, kOffFlags);
  for (const U64Field& f : kU64Fields) h.*f.field = GetAt<uint64_t>(data, f.at);
  if ((h.flags & ~kDplFlagCompressed) != 0) {
    return Bad("flags", kOffFlags, absl::StrCat("unknown flag bits 0x", absl::Hex(h.flags)));
  }
  if (h.file_bytes != size) {
    return absl::OutOfRangeError(absl::StrCat("file size mismatch: header says ", h.file_bytes,
                                              " bytes, the file has ", size,
                                              " (truncated or extended)"));
  }
  if (h.data_offset % kDplDataAlignment != 0 || h.data_offset < kDplHeaderBytes ||
      h.data_offset > size) {
    return Bad("data offset", kOffDataOffset,
               absl::StrCat(h.data_offset, " (must be a multiple of ", kDplDataAlignment,
                            " inside the file)"));
  }
  if (!InRange(h.data_offset, h.data_stored_bytes, size) ||
      h.data_offset + h.data_stored_bytes != size) {
    return Bad("data stored size", kOffDataStored,
               absl::StrCat(h.data_stored_bytes, " bytes from offset ", h.data_offset,
                            " do not end the ", size, "-byte file"));
  }
  if (!h.compressed() && h.data_stored_bytes != h.data_bytes) {
    return Bad("data size", kOffDataBytes,
               absl::StrCat(h.data_bytes, " differs from the stored size ", h.data_stored_bytes,
                            " of an uncompressed file"));
  }
  if (!InIndex(h.meta_offset, h.meta_stored_bytes, h)) {
    return Bad("metadata range", kOffMetaOffset, "outside the index area");
  }
  if (!InIndex(h.table_offset, h.table_bytes, h)) {
    return Bad("tensor table range", kOffTableOffset, "outside the index area");
  }
  if (XXH3_64bits(data + kDplHeaderBytes, h.data_offset - kDplHeaderBytes) != h.index_xxh3) {
    return Bad("index checksum", kOffIndexXxh3,
               "the metadata, tensor table or frame index is corrupt");
  }
  return h;
}

// The metadata: one zstd frame holding exactly meta_count GGUF key/value pairs.
absl::StatusOr<Metadata> ParseMetadata(const uint8_t* data, const DplHeader& h) {
  uint64_t ratio_cap;
  if (!CheckedMul(h.meta_stored_bytes, kDplMetaRatioCap, &ratio_cap)) ratio_cap = UINT64_MAX;
  const uint64_t cap = std::min(kDplMaxMetaBytes, std::max(kDplMetaRawFloor, ratio_cap));
  if (h.meta_raw_bytes > cap) {
    return Bad("metadata size", kOffMetaRaw,
               absl::StrCat(h.meta_raw_bytes, " bytes exceeds the limit of ", cap, " for ",
                            h.meta_stored_bytes, " stored bytes (max(", kDplMetaRawFloor, ", ",
                            kDplMetaRatioCap, " x stored), at most ", kDplMaxMetaBytes, ")"));
  }
  const uint8_t* frame = data + h.meta_offset;
  if (ZSTD_getFrameContentSize(frame, h.meta_stored_bytes) != h.meta_raw_bytes) {
    return Bad("metadata frame", h.meta_offset,
               "its content size is missing or differs from the header");
  }
  std::string raw(h.meta_raw_bytes, '\0');
  const size_t got = ZSTD_decompress(raw.data(), raw.size(), frame, h.meta_stored_bytes);
  if (ZSTD_isError(got) || got != h.meta_raw_bytes) {
    return Bad("metadata frame", h.meta_offset,
               ZSTD_isError(got) ? ZSTD_getErrorName(got) : "short decompression");
  }
  ByteReader r(reinterpret_cast<const uint8_t*>(raw.data()), raw.size());
  absl::StatusOr<Metadata> meta = ParseGgufKv(r, h.meta_count);
  DPL_RETURN_IF_ERROR(dpl::Annotate(dpl::StatusOf(meta), "metadata (decompressed)"));
  if (r.remaining() != 0) {
    return Bad("metadata", h.meta_offset,
               absl::StrCat(r.remaining(), " trailing bytes after ", h.meta_count, " pairs"));
  }
  return meta;
}

// Layout 1 (dpl) on `type` in a file of `version`: version 1 allows it on
// q6_K only, version 2 on every type with a dpl layout. `at` is the file
// offset of the layout field.
absl::Status CheckLayoutAllowed(GgmlType type, TensorLayout layout, uint32_t version,
                                const std::string& tw, uint64_t at) {
  if (layout != TensorLayout::kDpl) return absl::OkStatus();
  if (const absl::Status planes = CheckDplType(type); !planes.ok()) {
    return Bad(absl::StrCat(tw, " layout"), at, planes.message());
  }
  // Why: version 1 readers know only q6_K's planes. Any other dpl tensor
  // raises the version, so an old reader refuses the file at its version
  // field instead of reading planes as blocks.
  if (version < kDplVersionAnyDpl && type != GgmlType::kQ6_K) {
    return Bad(absl::StrCat(tw, " layout"), at,
               absl::StrCat("dpl on ", TraitsOf(type).name, " needs format version ",
                            kDplVersionAnyDpl, "; this file is version ", version,
                            ", where only q6_K may use it"));
  }
  return absl::OkStatus();
}

// The shape and geometry of one entry, checked against the layout's stride
// and the data region; `at` is the file offset of the fixed part.
absl::Status ReadGeometry(const FixedEntry& fx, uint64_t at, const std::string& tw,
                          const DplHeader& h, DplTensorEntry& t) {
  const std::optional<GgmlTypeTraits> ty = FindGgmlType(fx.type);
  if (!ty) return Bad(absl::StrCat(tw, " type"), at, absl::StrCat("unknown ggml type id ", fx.type));
  t.type = ty->type;
  if (fx.layout > static_cast<uint32_t>(TensorLayout::kDpl)) {
    return Bad(absl::StrCat(tw, " layout"), at + 4, absl::StrCat("unknown layout ", fx.layout));
  }
  t.layout = static_cast<TensorLayout>(fx.layout);
  DPL_RETURN_IF_ERROR(CheckLayoutAllowed(t.type, t.layout, h.version, tw, at + 4));
  if (fx.n_dims == 0 || fx.n_dims > 4) {
    return Bad(absl::StrCat(tw, " n_dims"), at + 8, absl::StrCat(fx.n_dims, " (1..4)"));
  }
  if (fx.reserved != 0) return Bad(absl::StrCat(tw, " reserved field"), at + 12, "must be zero");
  t.n_dims = fx.n_dims;
  uint64_t n_elems = 1;
  for (uint32_t d = 0; d < 4; ++d) {
    t.ne[d] = fx.ne[d];
    if (d >= t.n_dims && t.ne[d] != 1) {
      return Bad(absl::StrCat(tw, " ne[", d, "]"), at + 16 + 8 * d, "must be 1 beyond n_dims");
    }
    if (!CheckedMul(n_elems, t.ne[d], &n_elems) || n_elems > INT64_MAX) {
      return Bad(absl::StrCat(tw, " shape"), at + 16, "the element count overflows");
    }
  }
  t.n_rows = t.ne[1] * t.ne[2] * t.ne[3];
  const absl::StatusOr<uint64_t> stride = RowStrideFor(t.type, t.layout, t.ne[0]);
  if (!stride.ok()) return Bad(absl::StrCat(tw, " shape"), at + 16, stride.status().message());
  t.row_stride = fx.row_stride;
  if (t.row_stride != *stride) {
    return Bad(absl::StrCat(tw, " row stride"), at + 48,
               absl::StrCat(t.row_stride, " but ", ty->name, "/", TensorLayoutName(t.layout),
                            " rows of ", t.ne[0], " take ", *stride));
  }
  t.n_bytes = fx.n_bytes;
  uint64_t expect_bytes;
  if (!CheckedMul(t.n_rows, t.row_stride, &expect_bytes) || expect_bytes != t.n_bytes) {
    return Bad(absl::StrCat(tw, " byte size"), at + 64,
               absl::StrCat(t.n_bytes, " is not rows x stride"));
  }
  t.offset = fx.offset;
  if (t.offset % kDplTensorAlignment != 0) {
    return Bad(absl::StrCat(tw, " offset"), at + 56,
               absl::StrCat(t.offset, " is not a multiple of ", kDplTensorAlignment));
  }
  if (!InRange(t.offset, t.n_bytes, h.data_bytes)) {
    return Bad(absl::StrCat(tw, " range"), at + 56,
               absl::StrCat("[", t.offset, ", +", t.n_bytes, ") runs past the ", h.data_bytes,
                            "-byte data region"));
  }
  return absl::OkStatus();
}

// Table entry #i at the reader's cursor.
absl::StatusOr<DplTensorEntry> ReadEntry(ByteReader& r, uint64_t i, const DplHeader& h) {
  DplTensorEntry t;
  const uint64_t at = r.offset();
  const std::string what = absl::StrCat("tensor entry #", i);
  DPL_ASSIGN_OR_RETURN(const uint32_t name_len, r.Read<uint32_t>(absl::StrCat(what, " name length")));
  if (name_len == 0 || name_len > kMaxNameBytes) {
    return Bad(absl::StrCat(what, " name length"), at, absl::StrCat(name_len, " (1..4096)"));
  }
  const uint64_t name_at = r.offset();
  DPL_ASSIGN_OR_RETURN(const absl::string_view name, r.ReadBytes(name_len, absl::StrCat(what, " name")));
  DPL_RETURN_IF_ERROR(CheckName(name, name_at, absl::StrCat(what, " name")));
  t.name = std::string(name);
  const std::string tw = absl::StrCat("tensor '", t.name, "'");
  const uint64_t fixed_at = r.offset();
  DPL_ASSIGN_OR_RETURN(const FixedEntry fx, r.Read<FixedEntry>(absl::StrCat(tw, " entry")));
  DPL_RETURN_IF_ERROR(ReadGeometry(fx, fixed_at, tw, h, t));
  t.xxh3 = fx.xxh3;
  return t;
}

// The tensor table: n_tensors entries filling table_bytes exactly, unique
// names, disjoint ranges.
absl::Status ParseTable(const uint8_t* data, const DplHeader& h,
                        std::vector<DplTensorEntry>* tensors, NameIndex* names) {
  uint64_t min_table;
  if (!CheckedMul(h.n_tensors, kMinEntryBytes, &min_table) || min_table > h.table_bytes) {
    return Bad("tensor count", kOffNTensors,
               absl::StrCat(h.n_tensors, " entries cannot fit in a ", h.table_bytes,
                            "-byte table"));
  }
  ByteReader r(data + h.table_offset, h.table_bytes, h.table_offset);
  tensors->reserve(h.n_tensors);
  for (uint64_t i = 0; i < h.n_tensors; ++i) {
    const uint64_t at = r.offset();
    DPL_ASSIGN_OR_RETURN(DplTensorEntry t, ReadEntry(r, i, h));
    if (!names->try_emplace(t.name, tensors->size()).second) {
      return Bad(absl::StrCat("tensor entry #", i), at,
                 absl::StrCat("duplicate tensor name '", t.name, "'"));
    }
    tensors->push_back(std::move(t));
  }
  if (r.remaining() != 0) {
    return Bad("tensor table", r.offset(), absl::StrCat(r.remaining(), " trailing bytes"));
  }
  return CheckDisjoint(*tensors, "data offset", 0);
}

// Frame #i of the index at `at` (offsets still relative to data_offset),
// checked: frames tile the stored region in order (`expect_stored` is where
// this one must start), and its zstd header declares exactly its logical
// size, which zstd's bound allows for its stored size.
absl::StatusOr<DplFile::Frame> ReadFrame(const uint8_t* data, const DplHeader& h, uint64_t i,
                                         uint64_t expect_stored) {
  const uint64_t at = h.frames_offset + 16 * i;
  DplFile::Frame fr;
  fr.stored_offset = GetAt<uint64_t>(data, at);
  fr.stored_bytes = GetAt<uint64_t>(data, at + 8);
  if (fr.stored_offset != expect_stored || fr.stored_bytes == 0 ||
      !InRange(fr.stored_offset, fr.stored_bytes, h.data_stored_bytes)) {
    return Bad(absl::StrCat("frame #", i), at, "frames must tile the stored data region in order");
  }
  fr.stored_offset += h.data_offset;
  fr.raw_offset = i * h.frame_raw_bytes;  // < data_bytes: i < n_frames
  fr.raw_bytes = std::min(h.frame_raw_bytes, h.data_bytes - fr.raw_offset);
  const unsigned long long content =
      ZSTD_getFrameContentSize(data + fr.stored_offset, fr.stored_bytes);
  if (content != fr.raw_bytes) {
    const bool known = content != ZSTD_CONTENTSIZE_UNKNOWN && content != ZSTD_CONTENTSIZE_ERROR;
    return Bad(absl::StrCat("data frame #", i), fr.stored_offset,
               known ? absl::StrCat("its zstd header declares ", content, " bytes, the frame holds ",
                                    fr.raw_bytes)
                     : std::string("not a zstd frame with a declared content size"));
  }
  uint64_t bound;
  if (CheckedMul(fr.stored_bytes, kZstdMaxRatio, &bound) && fr.raw_bytes > bound) {
    return Bad(absl::StrCat("data frame #", i), fr.stored_offset,
               absl::StrCat(fr.stored_bytes, " stored bytes cannot inflate to ", fr.raw_bytes,
                            " (zstd inflates at most ", kZstdMaxRatio, "x)"));
  }
  return fr;
}

// The frame index of the compressed form (none in the uncompressed form):
// n_frames frames that tile the stored data region in order.
absl::StatusOr<std::vector<DplFile::Frame>> ParseFrames(const uint8_t* data, const DplHeader& h) {
  std::vector<DplFile::Frame> frames;
  if (!h.compressed()) {
    if (h.n_frames != 0 || h.frames_offset != 0 || h.frame_raw_bytes != 0) {
      return Bad("frame index", kOffFramesOffset, "present in an uncompressed file");
    }
    return frames;
  }
  if (h.frame_raw_bytes < kDplMinFrameBytes || h.frame_raw_bytes > kDplMaxFrameBytes) {
    return Bad("frame size", kOffFrameRaw,
               absl::StrCat(h.frame_raw_bytes, " (", kDplMinFrameBytes, "..", kDplMaxFrameBytes, ")"));
  }
  // ceil(data_bytes / frame_raw_bytes) without the overflow of data_bytes + frame - 1.
  const uint64_t want_frames =
      h.data_bytes / h.frame_raw_bytes + (h.data_bytes % h.frame_raw_bytes != 0 ? 1 : 0);
  if (h.n_frames != want_frames) {
    return Bad("frame count", kOffNFrames,
               absl::StrCat(h.n_frames, " frames but ", h.data_bytes, " bytes in frames of ",
                            h.frame_raw_bytes, " need ", want_frames));
  }
  uint64_t index_bytes;
  if (!CheckedMul(h.n_frames, 16, &index_bytes) || !InIndex(h.frames_offset, index_bytes, h)) {
    return Bad("frame index range", kOffFramesOffset,
               absl::StrCat(h.n_frames, " frames at ", h.frames_offset, ": outside the index area"));
  }
  frames.reserve(h.n_frames);  // the index holds them: at most data_offset / 16
  uint64_t expect_stored = 0;
  for (uint64_t i = 0; i < h.n_frames; ++i) {
    DPL_ASSIGN_OR_RETURN(const DplFile::Frame fr, ReadFrame(data, h, i, expect_stored));
    expect_stored += fr.stored_bytes;
    frames.push_back(fr);
  }
  if (expect_stored != h.data_stored_bytes) {
    return Bad("frame index", h.frames_offset, "frames do not cover the stored data region");
  }
  return frames;
}

}  // namespace

absl::StatusOr<uint64_t> RowStrideFor(GgmlType type, TensorLayout layout, uint64_t ne0) {
  const GgmlTypeTraits tr = TraitsOf(type);
  if (ne0 % tr.block_elems != 0) {
    return absl::InvalidArgumentError(absl::StrCat("row length ", ne0, " is not a whole number of ",
                                                   tr.name, " blocks"));
  }
  if (layout != TensorLayout::kRaw && layout != TensorLayout::kDpl) {
    return absl::InvalidArgumentError(absl::StrCat("unknown layout ", static_cast<uint32_t>(layout)));
  }
  if (layout == TensorLayout::kDpl) DPL_RETURN_IF_ERROR(dpl::Annotate(CheckDplType(type), "layout dpl"));
  const uint64_t blocks = ne0 / tr.block_elems;
  uint64_t bytes;
  if (!CheckedMul(blocks, tr.block_bytes, &bytes) ||
      (layout == TensorLayout::kDpl && !CheckedAdd(bytes, 15, &bytes))) {
    return absl::InvalidArgumentError("row size overflows");
  }
  return LayoutRowStride(layout, blocks, tr.block_bytes);
}

uint32_t DplVersionFor(const std::vector<DplTensorEntry>& tensors) {
  for (const DplTensorEntry& t : tensors) {
    if (t.layout == TensorLayout::kDpl && t.type != GgmlType::kQ6_K) return kDplVersionAnyDpl;
  }
  return kDplVersionQ6KDpl;
}

std::string EncodeDplHeader(const DplHeader& h) {
  std::string out(kDplHeaderBytes, '\0');
  std::memcpy(out.data() + kOffMagic, kDplMagic, 8);
  PutAt<uint32_t>(out, kOffVersion, h.version);
  PutAt<uint32_t>(out, kOffFlags, h.flags);
  for (const U64Field& f : kU64Fields) PutAt<uint64_t>(out, f.at, h.*f.field);
  PutAt<uint64_t>(out, kOffHeaderXxh3, XXH3_64bits(out.data(), kHeaderChecksummedBytes));
  return out;
}

uint64_t DplTensorEntryBytes(const DplTensorEntry& t) { return kMinEntryBytes - 1 + t.name.size(); }

void EncodeDplTensorEntry(const DplTensorEntry& t, std::string& out) {
  AppendLE<uint32_t>(out, t.name.size());
  out += t.name;
  FixedEntry fx = {static_cast<uint32_t>(t.type), static_cast<uint32_t>(t.layout), t.n_dims, 0,
                   {t.ne[0], t.ne[1], t.ne[2], t.ne[3]}, t.row_stride, t.offset, t.n_bytes, t.xxh3};
  AppendLE(out, fx);
}

absl::StatusOr<DplFile> DplFile::Parse(const uint8_t* data, uint64_t size,
                                       std::shared_ptr<const void> owner) {
  DplFile f;
  DPL_ASSIGN_OR_RETURN(f.header_, ParseHeader(data, size));
  f.owner_ = std::move(owner);
  f.data_ = data;
  DPL_ASSIGN_OR_RETURN(f.metadata_, ParseMetadata(data, f.header_));
  DPL_RETURN_IF_ERROR(ParseTable(data, f.header_, &f.tensors_, &f.names_));
  DPL_ASSIGN_OR_RETURN(f.frames_, ParseFrames(data, f.header_));
  return f;
}

absl::StatusOr<DplFile> DplFile::Open(const std::string& path) {
  return OpenMapped<DplFile>(path);
}

const DplTensorEntry* DplFile::FindTensor(absl::string_view name) const {
  return FindIndexed(tensors_, names_, name);
}

const uint8_t* DplFile::data_region() const {
  return compressed() ? nullptr : data_ + header_.data_offset;
}

}  // namespace dpl::formats
