#include "formats/dpl_file.h"

#include <xxhash.h>
#include <zstd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "formats/byte_reader.h"
#include "formats/mapped_file.h"
#include "formats/parallel_for.h"

namespace dpl::formats {
namespace {

constexpr uint64_t kHeaderChecksummedBytes = kDplHeaderBytes - 8;
constexpr uint64_t kMinEntryBytes = 4 + 1 + 16 + 32 + 32;

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

}  // namespace

absl::StatusOr<uint64_t> RowStrideFor(GgmlType type, TensorLayout layout, uint64_t ne0) {
  const GgmlTypeTraits tr = TraitsOf(type);
  if (ne0 % tr.block_elems != 0) {
    return absl::InvalidArgumentError(absl::StrCat("row length ", ne0, " is not a whole number of ",
                                                   tr.name, " blocks"));
  }
  const uint64_t blocks = ne0 / tr.block_elems;
  uint64_t bytes;
  if (!CheckedMul(blocks, tr.block_bytes, &bytes)) {
    return absl::InvalidArgumentError("row size overflows");
  }
  switch (layout) {
    case TensorLayout::kRaw:
      return bytes;
    case TensorLayout::kDplQ6K:
      if (type != GgmlType::kQ6_K) {
        return absl::InvalidArgumentError(
            absl::StrCat("layout dpl_q6k needs type q6_K, not ", tr.name));
      }
      // Rows padded to 16 bytes so uint4 loads inside ql/qh stay aligned.
      if (!CheckedAlignUp(bytes, 16, &bytes)) return absl::InvalidArgumentError("row overflows");
      return bytes;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown layout ", static_cast<uint32_t>(layout)));
}

std::string EncodeDplHeader(const DplHeader& h) {
  std::string out(kDplHeaderBytes, '\0');
  std::memcpy(out.data() + kOffMagic, kDplMagic, 8);
  PutAt<uint32_t>(out, kOffVersion, h.version);
  PutAt<uint32_t>(out, kOffFlags, h.flags);
  PutAt<uint64_t>(out, kOffFileBytes, h.file_bytes);
  PutAt<uint64_t>(out, kOffMetaOffset, h.meta_offset);
  PutAt<uint64_t>(out, kOffMetaStored, h.meta_stored_bytes);
  PutAt<uint64_t>(out, kOffMetaRaw, h.meta_raw_bytes);
  PutAt<uint64_t>(out, kOffMetaCount, h.meta_count);
  PutAt<uint64_t>(out, kOffTableOffset, h.table_offset);
  PutAt<uint64_t>(out, kOffTableBytes, h.table_bytes);
  PutAt<uint64_t>(out, kOffNTensors, h.n_tensors);
  PutAt<uint64_t>(out, kOffFramesOffset, h.frames_offset);
  PutAt<uint64_t>(out, kOffNFrames, h.n_frames);
  PutAt<uint64_t>(out, kOffFrameRaw, h.frame_raw_bytes);
  PutAt<uint64_t>(out, kOffDataOffset, h.data_offset);
  PutAt<uint64_t>(out, kOffDataBytes, h.data_bytes);
  PutAt<uint64_t>(out, kOffDataStored, h.data_stored_bytes);
  PutAt<uint64_t>(out, kOffIndexXxh3, h.index_xxh3);
  PutAt<uint64_t>(out, kOffHeaderXxh3, XXH3_64bits(out.data(), kHeaderChecksummedBytes));
  return out;
}

uint64_t DplTensorEntryBytes(const DplTensorEntry& t) { return kMinEntryBytes - 1 + t.name.size(); }

void EncodeDplTensorEntry(const DplTensorEntry& t, std::string& out) {
  auto put32 = [&](uint32_t v) { out.append(reinterpret_cast<const char*>(&v), 4); };
  auto put64 = [&](uint64_t v) { out.append(reinterpret_cast<const char*>(&v), 8); };
  put32(static_cast<uint32_t>(t.name.size()));
  out += t.name;
  put32(static_cast<uint32_t>(t.type));
  put32(static_cast<uint32_t>(t.layout));
  put32(t.n_dims);
  put32(0);  // reserved
  for (uint64_t ne : t.ne) put64(ne);
  put64(t.row_stride);
  put64(t.offset);
  put64(t.n_bytes);
  put64(t.xxh3);
}

absl::StatusOr<DplFile> DplFile::Parse(const uint8_t* data, uint64_t size,
                                       std::shared_ptr<const void> owner) {
  DplFile f;
  f.owner_ = std::move(owner);
  f.data_ = data;
  f.size_ = size;
  if (size < kDplHeaderBytes) {
    if (size >= 8 && std::memcmp(data, kDplMagic, 8) != 0) {
      return Bad("magic", 0, "not a .dpl file (expected \"DPLMODEL\")");
    }
    return absl::OutOfRangeError(absl::StrCat("truncated header: the file has ", size,
                                              " bytes, the header needs ", kDplHeaderBytes));
  }
  if (std::memcmp(data, kDplMagic, 8) != 0) {
    return Bad("magic", 0, "not a .dpl file (expected \"DPLMODEL\")");
  }
  DplHeader& h = f.header_;
  h.version = GetAt<uint32_t>(data, kOffVersion);
  if (h.version != kDplVersion) {
    return Bad("format version", kOffVersion,
               absl::StrCat(h.version, " is not supported (this build reads ", kDplVersion, ")"));
  }
  h.header_xxh3 = GetAt<uint64_t>(data, kOffHeaderXxh3);
  if (XXH3_64bits(data, kHeaderChecksummedBytes) != h.header_xxh3) {
    return Bad("header checksum", kOffHeaderXxh3, "the header is corrupt");
  }
  for (uint64_t i = kOffReservedBegin; i < kOffHeaderXxh3; ++i) {
    if (data[i] != 0) return Bad("reserved header byte", i, "must be zero");
  }
  h.flags = GetAt<uint32_t>(data, kOffFlags);
  h.file_bytes = GetAt<uint64_t>(data, kOffFileBytes);
  h.meta_offset = GetAt<uint64_t>(data, kOffMetaOffset);
  h.meta_stored_bytes = GetAt<uint64_t>(data, kOffMetaStored);
  h.meta_raw_bytes = GetAt<uint64_t>(data, kOffMetaRaw);
  h.meta_count = GetAt<uint64_t>(data, kOffMetaCount);
  h.table_offset = GetAt<uint64_t>(data, kOffTableOffset);
  h.table_bytes = GetAt<uint64_t>(data, kOffTableBytes);
  h.n_tensors = GetAt<uint64_t>(data, kOffNTensors);
  h.frames_offset = GetAt<uint64_t>(data, kOffFramesOffset);
  h.n_frames = GetAt<uint64_t>(data, kOffNFrames);
  h.frame_raw_bytes = GetAt<uint64_t>(data, kOffFrameRaw);
  h.data_offset = GetAt<uint64_t>(data, kOffDataOffset);
  h.data_bytes = GetAt<uint64_t>(data, kOffDataBytes);
  h.data_stored_bytes = GetAt<uint64_t>(data, kOffDataStored);
  h.index_xxh3 = GetAt<uint64_t>(data, kOffIndexXxh3);

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
  // The index (metadata, table, frames) lies between the header and the data.
  if (h.meta_offset < kDplHeaderBytes || !InRange(h.meta_offset, h.meta_stored_bytes, h.data_offset)) {
    return Bad("metadata range", kOffMetaOffset, "outside the index area");
  }
  if (h.table_offset < kDplHeaderBytes || !InRange(h.table_offset, h.table_bytes, h.data_offset)) {
    return Bad("tensor table range", kOffTableOffset, "outside the index area");
  }
  if (XXH3_64bits(data + kDplHeaderBytes, h.data_offset - kDplHeaderBytes) != h.index_xxh3) {
    return Bad("index checksum", kOffIndexXxh3,
               "the metadata, tensor table or frame index is corrupt");
  }

  // Metadata: one zstd frame holding the GGUF key/value encoding.
  if (h.meta_raw_bytes > kDplMaxMetaBytes) {
    return Bad("metadata size", kOffMetaRaw,
               absl::StrCat(h.meta_raw_bytes, " exceeds the limit of ", kDplMaxMetaBytes));
  }
  const unsigned long long content =
      ZSTD_getFrameContentSize(data + h.meta_offset, h.meta_stored_bytes);
  if (content != h.meta_raw_bytes) {
    return Bad("metadata frame", h.meta_offset,
               "its content size is missing or differs from the header");
  }
  std::string meta_raw(h.meta_raw_bytes, '\0');
  const size_t got = ZSTD_decompress(meta_raw.data(), meta_raw.size(), data + h.meta_offset,
                                     h.meta_stored_bytes);
  if (ZSTD_isError(got) || got != h.meta_raw_bytes) {
    return Bad("metadata frame", h.meta_offset,
               ZSTD_isError(got) ? ZSTD_getErrorName(got) : "short decompression");
  }
  {
    ByteReader mr(reinterpret_cast<const uint8_t*>(meta_raw.data()), meta_raw.size());
    auto meta = ParseGgufKv(mr, h.meta_count);
    if (!meta.ok()) {
      return absl::Status(meta.status().code(),
                          absl::StrCat("metadata (decompressed): ", meta.status().message()));
    }
    if (mr.remaining() != 0) {
      return Bad("metadata", h.meta_offset,
                 absl::StrCat(mr.remaining(), " trailing bytes after ", h.meta_count, " pairs"));
    }
    f.metadata_ = std::move(*meta);
  }

  // Tensor table.
  uint64_t min_table;
  if (!CheckedMul(h.n_tensors, kMinEntryBytes, &min_table) || min_table > h.table_bytes) {
    return Bad("tensor count", kOffNTensors,
               absl::StrCat(h.n_tensors, " entries cannot fit in a ", h.table_bytes,
                            "-byte table"));
  }
  ByteReader tr(data + h.table_offset, h.table_bytes, h.table_offset);
  f.tensors_.reserve(h.n_tensors);
  absl::flat_hash_set<std::string> names;
  for (uint64_t i = 0; i < h.n_tensors; ++i) {
    DplTensorEntry t;
    const uint64_t at = tr.offset();
    const std::string what = absl::StrCat("tensor entry #", i);
    auto name_len = tr.Read<uint32_t>(absl::StrCat(what, " name length"));
    if (!name_len.ok()) return name_len.status();
    if (*name_len == 0 || *name_len > 4096) {
      return Bad(absl::StrCat(what, " name length"), at, absl::StrCat(*name_len, " (1..4096)"));
    }
    auto name = tr.ReadBytes(*name_len, absl::StrCat(what, " name"));
    if (!name.ok()) return name.status();
    t.name = std::string(*name);
    if (!names.insert(t.name).second) {
      return Bad(what, at, absl::StrCat("duplicate tensor name '", t.name, "'"));
    }
    const std::string tw = absl::StrCat("tensor '", t.name, "'");
    struct Fixed {
      uint32_t type, layout, n_dims, reserved;
      uint64_t ne[4], row_stride, offset, n_bytes, xxh3;
    };
    const uint64_t fixed_at = tr.offset();
    auto fx = tr.Read<Fixed>(absl::StrCat(tw, " entry"));
    if (!fx.ok()) return fx.status();
    const std::optional<GgmlTypeTraits> ty = FindGgmlType(fx->type);
    if (!ty) return Bad(absl::StrCat(tw, " type"), fixed_at, absl::StrCat("unknown ggml type id ", fx->type));
    t.type = ty->type;
    if (fx->layout > static_cast<uint32_t>(TensorLayout::kDplQ6K)) {
      return Bad(absl::StrCat(tw, " layout"), fixed_at + 4, absl::StrCat("unknown layout ", fx->layout));
    }
    t.layout = static_cast<TensorLayout>(fx->layout);
    if (fx->n_dims == 0 || fx->n_dims > 4) {
      return Bad(absl::StrCat(tw, " n_dims"), fixed_at + 8, absl::StrCat(fx->n_dims, " (1..4)"));
    }
    if (fx->reserved != 0) return Bad(absl::StrCat(tw, " reserved field"), fixed_at + 12, "must be zero");
    t.n_dims = fx->n_dims;
    uint64_t n_elems = 1;
    for (uint32_t d = 0; d < 4; ++d) {
      t.ne[d] = fx->ne[d];
      if (d >= t.n_dims && t.ne[d] != 1) {
        return Bad(absl::StrCat(tw, " ne[", d, "]"), fixed_at + 16 + 8 * d, "must be 1 beyond n_dims");
      }
      if (!CheckedMul(n_elems, t.ne[d], &n_elems) || n_elems > INT64_MAX) {
        return Bad(absl::StrCat(tw, " shape"), fixed_at + 16, "the element count overflows");
      }
    }
    t.n_rows = t.ne[1] * t.ne[2] * t.ne[3];
    auto stride = RowStrideFor(t.type, t.layout, t.ne[0]);
    if (!stride.ok()) return Bad(absl::StrCat(tw, " shape"), fixed_at + 16, stride.status().message());
    t.row_stride = fx->row_stride;
    if (t.row_stride != *stride) {
      return Bad(absl::StrCat(tw, " row stride"), fixed_at + 48,
                 absl::StrCat(t.row_stride, " but ", TraitsOf(t.type).name, "/",
                              TensorLayoutName(t.layout), " rows of ", t.ne[0], " take ", *stride));
    }
    t.offset = fx->offset;
    t.n_bytes = fx->n_bytes;
    t.xxh3 = fx->xxh3;
    uint64_t expect_bytes;
    if (!CheckedMul(t.n_rows, t.row_stride, &expect_bytes) || expect_bytes != t.n_bytes) {
      return Bad(absl::StrCat(tw, " byte size"), fixed_at + 64,
                 absl::StrCat(t.n_bytes, " is not rows x stride"));
    }
    if (t.offset % kDplTensorAlignment != 0) {
      return Bad(absl::StrCat(tw, " offset"), fixed_at + 56,
                 absl::StrCat(t.offset, " is not a multiple of ", kDplTensorAlignment));
    }
    if (!InRange(t.offset, t.n_bytes, h.data_bytes)) {
      return Bad(absl::StrCat(tw, " range"), fixed_at + 56,
                 absl::StrCat("[", t.offset, ", +", t.n_bytes, ") runs past the ", h.data_bytes,
                              "-byte data region"));
    }
    f.tensors_.push_back(std::move(t));
  }
  if (tr.remaining() != 0) {
    return Bad("tensor table", tr.offset(), absl::StrCat(tr.remaining(), " trailing bytes"));
  }
  std::vector<const DplTensorEntry*> sorted;
  sorted.reserve(f.tensors_.size());
  for (const DplTensorEntry& t : f.tensors_) sorted.push_back(&t);
  std::sort(sorted.begin(), sorted.end(),
            [](const DplTensorEntry* a, const DplTensorEntry* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < sorted.size(); ++i) {
    if (sorted[i]->offset < sorted[i - 1]->offset + sorted[i - 1]->n_bytes) {
      return absl::InvalidArgumentError(absl::StrCat("tensors '", sorted[i - 1]->name, "' and '",
                                                     sorted[i]->name, "' overlap at data offset ",
                                                     sorted[i]->offset));
    }
  }

  // Frame index (compressed form).
  if (!h.compressed()) {
    if (h.n_frames != 0 || h.frames_offset != 0 || h.frame_raw_bytes != 0) {
      return Bad("frame index", kOffFramesOffset, "present in an uncompressed file");
    }
    return f;
  }
  if (h.frame_raw_bytes < kDplMinFrameBytes || h.frame_raw_bytes > kDplMaxFrameBytes) {
    return Bad("frame size", kOffFrameRaw,
               absl::StrCat(h.frame_raw_bytes, " (", kDplMinFrameBytes, "..", kDplMaxFrameBytes, ")"));
  }
  const uint64_t want_frames = (h.data_bytes + h.frame_raw_bytes - 1) / h.frame_raw_bytes;
  if (h.n_frames != want_frames) {
    return Bad("frame count", kOffNFrames,
               absl::StrCat(h.n_frames, " frames but ", h.data_bytes, " bytes in frames of ",
                            h.frame_raw_bytes, " need ", want_frames));
  }
  if (h.frames_offset < kDplHeaderBytes || !InRange(h.frames_offset, h.n_frames * 16, h.data_offset)) {
    return Bad("frame index range", kOffFramesOffset, "outside the index area");
  }
  f.frames_.reserve(h.n_frames);
  uint64_t expect_stored = 0;
  for (uint64_t i = 0; i < h.n_frames; ++i) {
    const uint64_t at = h.frames_offset + 16 * i;
    Frame fr;
    fr.stored_offset = GetAt<uint64_t>(data, at);
    fr.stored_bytes = GetAt<uint64_t>(data, at + 8);
    if (fr.stored_offset != expect_stored || fr.stored_bytes == 0 ||
        !InRange(fr.stored_offset, fr.stored_bytes, h.data_stored_bytes)) {
      return Bad(absl::StrCat("frame #", i), at, "frames must tile the stored data region in order");
    }
    expect_stored += fr.stored_bytes;
    fr.stored_offset += h.data_offset;
    fr.raw_offset = i * h.frame_raw_bytes;
    fr.raw_bytes = std::min(h.frame_raw_bytes, h.data_bytes - fr.raw_offset);
    f.frames_.push_back(fr);
  }
  if (expect_stored != h.data_stored_bytes) {
    return Bad("frame index", h.frames_offset, "frames do not cover the stored data region");
  }
  return f;
}

absl::StatusOr<DplFile> DplFile::Open(const std::string& path) {
  auto mapped = MappedFile::Open(path);
  if (!mapped.ok()) return mapped.status();
  const std::shared_ptr<MappedFile> m = *mapped;
  auto parsed = Parse(m->data(), m->size(), m);
  if (!parsed.ok()) {
    return absl::Status(parsed.status().code(), absl::StrCat(path, ": ", parsed.status().message()));
  }
  return parsed;
}

const DplTensorEntry* DplFile::FindTensor(absl::string_view name) const {
  for (const DplTensorEntry& t : tensors_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

const uint8_t* DplFile::data_region() const {
  return compressed() ? nullptr : data_ + header_.data_offset;
}

absl::Status DplFile::DecompressFrame(size_t i, uint8_t* dst) const {
  const Frame& fr = frames_.at(i);
  const size_t got = ZSTD_decompress(dst, fr.raw_bytes, data_ + fr.stored_offset, fr.stored_bytes);
  if (ZSTD_isError(got)) {
    return Bad(absl::StrCat("data frame #", i), fr.stored_offset, ZSTD_getErrorName(got));
  }
  if (got != fr.raw_bytes) {
    return Bad(absl::StrCat("data frame #", i), fr.stored_offset,
               absl::StrCat("decompressed to ", got, " bytes, expected ", fr.raw_bytes));
  }
  return absl::OkStatus();
}

absl::Status DplFile::DecompressAll(uint8_t* dst, int threads) const {
  return ParallelFor(threads, frames_.size(),
                     [&](size_t i) { return DecompressFrame(i, dst + frames_[i].raw_offset); });
}

absl::Status DplFile::VerifyChecksum(const DplTensorEntry& t, const uint8_t* region) const {
  const uint64_t got = XXH3_64bits(region + t.offset, t.n_bytes);
  if (got != t.xxh3) {
    return absl::DataLossError(absl::StrCat("tensor '", t.name, "': checksum mismatch (stored ",
                                            absl::Hex(t.xxh3, absl::kZeroPad16), ", computed ",
                                            absl::Hex(got, absl::kZeroPad16), ")"));
  }
  return absl::OkStatus();
}

}  // namespace dpl::formats
