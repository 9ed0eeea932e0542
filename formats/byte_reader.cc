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

namespace {

// Length of the well-formed UTF-8 sequence at s[i], 0 when there is none.
size_t Utf8SequenceAt(absl::string_view s, size_t i) {
  const auto at = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
  const uint8_t c = at(i);
  if (c < 0x80) return 1;
  size_t n;
  uint8_t lo = 0x80, hi = 0xBF;  // the second byte's range
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;   // no overlong forms
    if (c == 0xED) hi = 0x9F;   // no surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;   // no overlong forms
    if (c == 0xF4) hi = 0x8F;   // nothing past U+10FFFF
  } else {
    return 0;
  }
  if (s.size() - i < n || at(i + 1) < lo || at(i + 1) > hi) return 0;
  for (size_t k = 2; k < n; ++k) {
    if ((at(i + k) & 0xC0) != 0x80) return 0;
  }
  return n;
}

}  // namespace

size_t FirstBadNameByte(absl::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const size_t n = s[i] == '\0' ? 0 : Utf8SequenceAt(s, i);
    if (n == 0) return i;
    i += n;
  }
  return absl::string_view::npos;
}

absl::Status CheckName(absl::string_view name, uint64_t at, absl::string_view what) {
  const size_t bad = FirstBadNameByte(name);
  if (bad == absl::string_view::npos) return absl::OkStatus();
  const uint8_t c = static_cast<uint8_t>(name[bad]);
  return absl::InvalidArgumentError(absl::StrCat(
      "invalid ", what, " at offset ", at + bad, ": ",
      c == 0 ? std::string("a NUL byte")
             : absl::StrCat("byte 0x", absl::Hex(c, absl::kZeroPad2), " is not valid UTF-8")));
}

}  // namespace dpl::formats
