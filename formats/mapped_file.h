// Read-only memory mapping of a whole file (POSIX mmap). Movable, not copyable.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "base/status_macros.h"

namespace dpl::formats {

class MappedFile {
 public:
  // Maps `path` read-only. An empty file maps to size 0 with a null data().
  static absl::StatusOr<std::shared_ptr<MappedFile>> Open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile(std::string path, const uint8_t* data, uint64_t size)
      : path_(std::move(path)), data_(data), size_(size) {}
  std::string path_;
  const uint8_t* data_;
  uint64_t size_;
};

// Parses a mapped file with T::Parse(data, size, owner), the result keeping
// the mapping alive; errors are prefixed with the file's path.
template <typename T>
absl::StatusOr<T> ParseMapped(const std::shared_ptr<MappedFile>& m) {
  absl::StatusOr<T> parsed = T::Parse(m->data(), m->size(), m);
  DPL_RETURN_IF_ERROR(dpl::Annotate(dpl::StatusOf(parsed), m->path()));
  return parsed;
}

// Maps `path` and parses it as above.
template <typename T>
absl::StatusOr<T> OpenMapped(const std::string& path) {
  DPL_ASSIGN_OR_RETURN(const std::shared_ptr<MappedFile> m, MappedFile::Open(path));
  return ParseMapped<T>(m);
}

}  // namespace dpl::formats
