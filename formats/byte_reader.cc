#include "formats/byte_reader.h"

namespace dpl::formats {

absl::Status ByteReader::Seek(uint64_t pos, absl::string_view what) {
  if (pos > size_) {
    return absl::OutOfRangeError(absl::StrCat(what, ": offset ", base_ + pos,
                                              " is past the end (", base_ + size_, ")"));
  }
  pos_ = pos;
  return absl::OkStatus();
}

absl::Status ByteReader::Skip(uint64_t n, absl::string_view what) {
  if (remaining() < n) return Truncated(what, n);
  pos_ += n;
  return absl::OkStatus();
}

absl::StatusOr<absl::string_view> ByteReader::ReadBytes(uint64_t n, absl::string_view what) {
  if (remaining() < n) return Truncated(what, n);
  absl::string_view v(reinterpret_cast<const char*>(data_ + pos_), n);
  pos_ += n;
  return v;
}

absl::Status ByteReader::Truncated(absl::string_view what, uint64_t need) const {
  return absl::OutOfRangeError(absl::StrCat("truncated ", what, " at offset ", offset(),
                                            ": needs ", need, " bytes, ", remaining(),
                                            " left"));
}

absl::Status ByteReader::Invalid(absl::string_view what, absl::string_view detail) const {
  return InvalidAt(offset(), what, detail);
}

absl::Status ByteReader::InvalidAt(uint64_t abs_offset, absl::string_view what,
                                   absl::string_view detail) const {
  return absl::InvalidArgumentError(
      absl::StrCat("invalid ", what, " at offset ", abs_offset, ": ", detail));
}

}  // namespace dpl::formats
