// GGUF (v2, v3; little-endian) reader for untrusted files.
//
// File layout (ggml's docs/gguf.md):
//   u32 magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv
//   n_kv x (string key, u32 value type, value)
//   n_tensors x (string name, u32 n_dims, u64 ne[n_dims], u32 ggml type, u64 offset)
//   padding to general.alignment (default 32)
//   data section: tensor bytes at their offsets (relative to its start)
// Strings are u64 length + bytes (no terminator).
//
// Parse() validates everything before returning: counts and lengths against
// the bytes left, overflow-checked sizes, known types, n_dims <= 4, whole
// blocks per row, aligned in-bounds non-overlapping tensor ranges, unique
// keys, unique names of well-formed UTF-8 without NUL. Every error names the
// field and the byte offset.
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

inline constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" read as LE u32
inline constexpr uint64_t kGgufDefaultAlignment = 32;
inline constexpr uint64_t kMaxAlignment = 1 << 20;
inline constexpr uint32_t kMaxDims = 4;
inline constexpr uint64_t kMaxTensorNameBytes = 4096;

// A tensor info; the layout is always kRaw (row_stride = ne[0] / block_elems
// * block_bytes).
struct GgufTensorInfo : TensorGeometry {
  std::string name;
  uint64_t offset = 0;      // relative to the data section
  uint64_t n_elements = 0;  // ne[0] * n_rows
};

class GgufFile {
 public:
  // Parses an in-memory image. `data` must outlive the GgufFile unless
  // `owner` keeps it alive.
  static absl::StatusOr<GgufFile> Parse(const uint8_t* data, uint64_t size,
                                        std::shared_ptr<const void> owner = nullptr);
  // Maps and parses a file; errors are prefixed with the path.
  static absl::StatusOr<GgufFile> Open(const std::string& path);

  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }  // absolute file offset
  uint64_t file_size() const { return size_; }
  const Metadata& metadata() const { return metadata_; }
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* FindTensor(absl::string_view name) const;

  // The tensor's bytes inside the image (validated at parse time). Reads of
  // them belong inside SafeRead when the image is a mapped file.
  const uint8_t* TensorData(const GgufTensorInfo& t) const {
    return data_ + data_offset_ + t.offset;
  }
  const uint8_t* image() const { return data_; }
  // Runs fn, which reads the image, and turns a truncation of the mapped
  // file meanwhile into an error naming it (MappedFile::SafeRead); just fn
  // for an image in memory.
  absl::Status SafeRead(const std::function<absl::Status()>& fn) const {
    return SafeReadOf(mapping_.get(), fn);
  }
  // The mapped file under the image; null for an image in memory.
  const std::shared_ptr<const MappedFile>& mapping() const { return mapping_; }

 private:
  template <typename T>
  friend absl::StatusOr<T> ParseMapped(const std::shared_ptr<MappedFile>& m);
  std::shared_ptr<const MappedFile> mapping_;  // null for an image in memory
  std::shared_ptr<const void> owner_;
  const uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
  uint32_t version_ = 0;
  uint64_t alignment_ = kGgufDefaultAlignment;
  uint64_t data_offset_ = 0;
  Metadata metadata_;
  std::vector<GgufTensorInfo> tensors_;
  NameIndex names_;
};

// Writes GGUF v3 files (used by dpl-synth and tests). Tensor data is streamed
// by a callback so multi-gigabyte models never sit in memory at once.
struct GgufTensorSpec {
  std::string name;
  std::vector<uint64_t> ne;  // ne[0] = row length
  GgmlType type;
};

// Computes the size in bytes of a tensor of this spec; error if the row
// length is not a whole number of blocks or the size overflows.
absl::StatusOr<uint64_t> TensorBytes(GgmlType type, const std::vector<uint64_t>& ne);

// The header (magic..tensor infos, padded to `alignment`) that precedes the
// data section, with every tensor's offset in `offsets` (relative to the data
// section, each aligned).
struct GgufHeader {
  std::string bytes;
  std::vector<uint64_t> offsets;
  std::vector<uint64_t> sizes;
  uint64_t data_bytes = 0;  // total data section size, padded to alignment
};
absl::StatusOr<GgufHeader> BuildGgufHeader(const Metadata& meta,
                                           const std::vector<GgufTensorSpec>& tensors,
                                           uint64_t alignment = kGgufDefaultAlignment);

}  // namespace dpl::formats
