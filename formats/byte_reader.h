// A bounds-checked little-endian cursor over untrusted bytes. Every read
// either succeeds or returns a Status naming what was being read and the
// absolute byte offset; nothing reads past the end. Also what the GGUF and
// .dpl readers and writers share below it: little-endian appends,
// overflow-checked size arithmetic and the tensor-overlap check.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace dpl::formats {

class ByteReader {
 public:
  // `base_offset` is added to positions in error messages (the absolute file
  // offset of data[0]).
  ByteReader(const uint8_t* data, uint64_t size, uint64_t base_offset = 0)
      : data_(data), size_(size), base_(base_offset) {}

  uint64_t pos() const { return pos_; }
  uint64_t offset() const { return base_ + pos_; }  // absolute offset
  uint64_t remaining() const { return size_ - pos_; }
  uint64_t size() const { return size_; }
  const uint8_t* data() const { return data_; }

  absl::Status Seek(uint64_t pos, absl::string_view what);
  absl::Status Skip(uint64_t n, absl::string_view what);

  template <typename T>
  absl::StatusOr<T> Read(absl::string_view what) {
    static_assert(std::is_trivially_copyable_v<T>);
    if (remaining() < sizeof(T)) return Truncated(what, sizeof(T));
    T v;
    std::memcpy(&v, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  // Returns a view of the next n bytes and advances.
  absl::StatusOr<absl::string_view> ReadBytes(uint64_t n, absl::string_view what);

  // Error helpers that carry the current offset.
  absl::Status Truncated(absl::string_view what, uint64_t need) const;
  absl::Status Invalid(absl::string_view what, absl::string_view detail) const;
  absl::Status InvalidAt(uint64_t abs_offset, absl::string_view what,
                         absl::string_view detail) const;

 private:
  const uint8_t* data_;
  uint64_t size_;
  uint64_t base_;
  uint64_t pos_ = 0;
};

// Appends the little-endian bytes of `v` to `out`: the writers' counterpart
// of ByteReader::Read (the host is little-endian, as the formats are).
template <typename T>
void AppendLE(std::string& out, T v) {
  static_assert(std::is_trivially_copyable_v<T>);
  out.append(reinterpret_cast<const char*>(&v), sizeof(T));
}

// Overflow-checked arithmetic for sizes and offsets from untrusted files.
inline bool CheckedAdd(uint64_t a, uint64_t b, uint64_t* out) {
  return !__builtin_add_overflow(a, b, out);
}
inline bool CheckedMul(uint64_t a, uint64_t b, uint64_t* out) {
  return !__builtin_mul_overflow(a, b, out);
}
// Rounds up to a power-of-two alignment; false on overflow.
inline bool CheckedAlignUp(uint64_t v, uint64_t align, uint64_t* out) {
  uint64_t t;
  if (!CheckedAdd(v, align - 1, &t)) return false;
  *out = t & ~(align - 1);
  return true;
}

// The position of the first byte of `s` that is a NUL or not part of
// well-formed UTF-8 (RFC 3629: no overlong forms, surrogates or code points
// past U+10FFFF), or npos when there is none. Tensor names must pass.
size_t FirstBadNameByte(absl::string_view s);
// OK when FirstBadNameByte finds nothing; else an InvalidArgument error
// "invalid WHAT at offset N: ..." with N the bad byte's absolute offset
// (`at` is the name's).
absl::Status CheckName(absl::string_view name, uint64_t at, absl::string_view what);

// Tensor name -> position in its table: what the readers' FindTensor and
// duplicate checks use, so lookups stay O(1) however many tensors a file has.
using NameIndex = absl::flat_hash_map<std::string, size_t>;
template <typename T>
const T* FindIndexed(const std::vector<T>& tensors, const NameIndex& index, absl::string_view name) {
  const auto it = index.find(name);
  return it == index.end() ? nullptr : &tensors[it->second];
}

// Tensors (with `name`, `offset` and `n_bytes`, ranges already known not to
// wrap) must not overlap: an InvalidArgument error "tensors 'a' and 'b'
// overlap at WHERE N" (N = base + the second one's offset) for the earliest
// overlap, OK when all ranges are disjoint.
template <typename T>
absl::Status CheckDisjoint(const std::vector<T>& tensors, absl::string_view where, uint64_t base) {
  std::vector<const T*> sorted;
  sorted.reserve(tensors.size());
  for (const T& t : tensors) sorted.push_back(&t);
  std::sort(sorted.begin(), sorted.end(), [](const T* a, const T* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < sorted.size(); ++i) {
    const T& a = *sorted[i - 1];
    const T& b = *sorted[i];
    if (b.offset < a.offset + a.n_bytes) {
      return absl::InvalidArgumentError(absl::StrCat("tensors '", a.name, "' and '", b.name,
                                                     "' overlap at ", where, " ", base + b.offset));
    }
  }
  return absl::OkStatus();
}

}  // namespace dpl::formats
