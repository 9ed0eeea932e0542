// The .dpl container: a GGUF model re-laid-out for the runtime. Specified in
// docs/FORMAT.md; this header is its executable form.
//
//   [header: 256 bytes]
//   [metadata: one zstd frame of the GGUF key/value encoding]
//   [tensor table: n_tensors variable-length entries]
//   [frame index: n_frames x {u64 stored_offset, u64 stored_bytes}] (compressed form only)
//   [zero padding to a 4 KiB boundary]
//   [data region: tensors at 256-byte aligned offsets; or, compressed form,
//    the zstd frames that decompress to it]
//
// Why: the runtime maps the file and copies the data region into one device
// allocation as it is; a tensor's device pointer is base + offset. Every
// layout decision (which tensors get the dpl planes, alignment) was made by
// the converter.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "formats/byte_reader.h"
#include "formats/ggml_types.h"
#include "formats/mapped_file.h"
#include "formats/metadata.h"
#include "formats/tensor_layout.h"

namespace dpl::formats {

inline constexpr char kDplMagic[8] = {'D', 'P', 'L', 'M', 'O', 'D', 'E', 'L'};
// Format versions (docs/FORMAT.md, "Versioning"). Version 1 allows layout 1
// (dpl) on q6_K only; version 2 on every type with a dpl layout. A writer
// stamps the lowest version that holds its tensors (DplVersionFor), so a file
// whose only dpl tensors are q6_K stays loadable by version-1 readers.
inline constexpr uint32_t kDplVersionQ6KDpl = 1;
inline constexpr uint32_t kDplVersionAnyDpl = 2;
// The versions this reader knows: kDplMinVersion..kDplMaxVersion.
inline constexpr uint32_t kDplMinVersion = kDplVersionQ6KDpl;
inline constexpr uint32_t kDplMaxVersion = kDplVersionAnyDpl;
inline constexpr uint64_t kDplHeaderBytes = 256;
inline constexpr uint64_t kDplDataAlignment = 4096;    // data region start
inline constexpr uint64_t kDplTensorAlignment = 256;   // every tensor offset
inline constexpr uint32_t kDplFlagCompressed = 1u << 0;
// Limits for untrusted .dpl files.
inline constexpr uint64_t kDplMaxMetaBytes = 1ull << 30;
inline constexpr uint64_t kDplMinFrameBytes = 64 * 1024;
inline constexpr uint64_t kDplMaxFrameBytes = 1ull << 30;
// The metadata frame may inflate to at most max(16 MiB, 64 x its stored
// size): real vocabularies compress about 4x (Qwen2's and Llama 3's: 3.8x
// and 4.1x), while a few hundred KB of zstd can declare gigabytes.
inline constexpr uint64_t kDplMetaRatioCap = 64;
inline constexpr uint64_t kDplMetaRawFloor = 16ull << 20;
// zstd's own bound on a frame: every block (at most 128 KiB) takes at least
// 4 bytes, so no frame inflates more than 32768x its size. A data frame must
// declare its content size in its header, equal to its logical size.
inline constexpr uint64_t kZstdMaxRatio = 32768;

// The 256-byte header's fields (docs/FORMAT.md, "Header"; all little-endian).
struct DplHeader {
  uint32_t version = kDplVersionQ6KDpl;  // writers: DplVersionFor(tensors)
  uint32_t flags = 0;
  uint64_t file_bytes = 0;
  uint64_t meta_offset = 0;
  uint64_t meta_stored_bytes = 0;
  uint64_t meta_raw_bytes = 0;
  uint64_t meta_count = 0;
  uint64_t table_offset = 0;
  uint64_t table_bytes = 0;
  uint64_t n_tensors = 0;
  uint64_t frames_offset = 0;  // 0 unless compressed
  uint64_t n_frames = 0;
  uint64_t frame_raw_bytes = 0;  // decompressed bytes per frame (last may be short)
  uint64_t data_offset = 0;      // multiple of 4096
  uint64_t data_bytes = 0;       // logical (decompressed) size of the data region
  uint64_t data_stored_bytes = 0;  // bytes the data region occupies in the file
  uint64_t index_xxh3 = 0;       // XXH3-64 of file bytes [256, data_offset)
  uint64_t header_xxh3 = 0;      // XXH3-64 of header bytes [0, 248)

  bool compressed() const { return (flags & kDplFlagCompressed) != 0; }
};

// One tensor table entry (docs/FORMAT.md, "Tensor table").
struct DplTensorEntry : TensorGeometry {
  std::string name;
  uint64_t offset = 0;  // inside the data region, multiple of 256
  uint64_t xxh3 = 0;    // XXH3-64 of the tensor's n_bytes bytes
};

// Bytes of one row of `ne0` elements of `type` in `layout` (LayoutRowStride);
// error when the combination is not allowed (dpl needs a type with a dpl
// layout, CheckDplType), the row is not whole blocks or its size overflows.
absl::StatusOr<uint64_t> RowStrideFor(GgmlType type, TensorLayout layout, uint64_t ne0);

// The version a file holding `tensors` must carry: kDplVersionAnyDpl when a
// tensor other than q6_K uses the dpl layout, else kDplVersionQ6KDpl.
uint32_t DplVersionFor(const std::vector<DplTensorEntry>& tensors);

class DplFile {
 public:
  static absl::StatusOr<DplFile> Parse(const uint8_t* data, uint64_t size,
                                       std::shared_ptr<const void> owner = nullptr);
  static absl::StatusOr<DplFile> Open(const std::string& path);

  const DplHeader& header() const { return header_; }
  bool compressed() const { return header_.compressed(); }
  const Metadata& metadata() const { return metadata_; }
  const std::vector<DplTensorEntry>& tensors() const { return tensors_; }
  const DplTensorEntry* FindTensor(absl::string_view name) const;

  // Uncompressed form: the data region inside the image (nullptr if compressed).
  const uint8_t* data_region() const;
  const uint8_t* image() const { return data_; }

  // Compressed form: frame i decompresses to data region bytes
  // [i * frame_raw_bytes, min((i + 1) * frame_raw_bytes, data_bytes)).
  struct Frame {
    uint64_t stored_offset;  // absolute file offset
    uint64_t stored_bytes;
    uint64_t raw_offset;     // offset in the data region
    uint64_t raw_bytes;
  };
  const std::vector<Frame>& frames() const { return frames_; }
  // Decompresses frame i into dst (frame.raw_bytes bytes).
  absl::Status DecompressFrame(size_t i, uint8_t* dst) const;
  // Decompresses the whole data region into dst (data_bytes bytes) with
  // `threads` workers.
  absl::Status DecompressAll(uint8_t* dst, int threads) const;

  // Checks a tensor's XXH3 against its table entry; `region` is the logical
  // data region (the image's for the uncompressed form, or a decompressed copy).
  absl::Status VerifyChecksum(const DplTensorEntry& t, const uint8_t* region) const;
  // Checks every tensor's XXH3. The compressed form is inflated frame by
  // frame (`threads` frames at a time, at most 256 MiB of them in memory)
  // and hashed as it streams, never as a whole region.
  absl::Status VerifyChecksums(int threads) const;

  // Runs fn, which reads the image, and turns a truncation of the mapped
  // file meanwhile into an error naming it (MappedFile::SafeRead); just fn
  // for an image in memory. DecompressFrame, DecompressAll, VerifyChecksum
  // and VerifyChecksums read through it already.
  absl::Status SafeRead(const std::function<absl::Status()>& fn) const {
    return SafeReadOf(mapping_.get(), fn);
  }
  // The mapped file under the image; null for an image in memory.
  const std::shared_ptr<const MappedFile>& mapping() const { return mapping_; }

 private:
  template <typename T>
  friend absl::StatusOr<T> ParseMapped(const std::shared_ptr<MappedFile>& m);
  // Inflates frames [first, first + n), frame i into dst(i), on `threads`
  // workers, under SafeRead.
  absl::Status DecompressFrames(size_t first, size_t n, const std::function<uint8_t*(size_t)>& dst,
                                int threads) const;
  std::shared_ptr<const MappedFile> mapping_;  // null for an image in memory
  std::shared_ptr<const void> owner_;
  const uint8_t* data_ = nullptr;  // the whole file (header_.file_bytes bytes)
  DplHeader header_;
  Metadata metadata_;
  std::vector<DplTensorEntry> tensors_;
  NameIndex names_;
  std::vector<Frame> frames_;
};

// Serialization helpers for the writer (converter). The writer lays the file
// out as: header, metadata, table, frame index, padding, data.
std::string EncodeDplHeader(const DplHeader& h);  // 256 bytes, header_xxh3 filled in
void EncodeDplTensorEntry(const DplTensorEntry& t, std::string& out);
// Size of one encoded entry (depends only on the name length).
uint64_t DplTensorEntryBytes(const DplTensorEntry& t);

}  // namespace dpl::formats
