#include "runtime/tokenizer/unicode.h"

#include <algorithm>
#include <array>

namespace dpl::tokenizer {
namespace {

using internal::CodepointRange;

bool InRanges(uint32_t cp, const CodepointRange* ranges, size_t n) {
  // First range whose last >= cp; cp is inside it if first <= cp.
  const CodepointRange* end = ranges + n;
  const CodepointRange* it = std::lower_bound(
      ranges, end, cp, [](const CodepointRange& r, uint32_t v) { return r.last < v; });
  return it != end && it->first <= cp;
}

bool IsWhitespace(uint32_t cp) {
  // The White_Space property (PropList.txt); stable since Unicode 6.
  if (cp <= 0x20) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D);
  switch (cp) {
    case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029:
    case 0x202F: case 0x205F: case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

struct ByteMaps {
  std::array<uint16_t, 256> to_cp;
  std::array<int16_t, 324> to_byte;  // indexed by code point < 0x144
};

ByteMaps MakeByteMaps() {
  ByteMaps m;
  m.to_byte.fill(-1);
  uint32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    uint32_t cp = printable ? b : next++;
    m.to_cp[b] = static_cast<uint16_t>(cp);
    m.to_byte[cp] = static_cast<int16_t>(b);
  }
  return m;
}

const ByteMaps& Maps() {
  static const ByteMaps maps = MakeByteMaps();
  return maps;
}

// Classes of the ASCII range, computed once.
std::array<uint8_t, 128> MakeAsciiClasses() {
  std::array<uint8_t, 128> c{};
  for (uint32_t cp = 0; cp < 128; ++cp) {
    uint8_t v = 0;
    if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z')) v |= kClassLetter;
    if (cp >= '0' && cp <= '9') v |= kClassNumber;
    if (IsWhitespace(cp)) v |= kClassWhitespace;
    c[cp] = v;
  }
  return c;
}

}  // namespace

void DecodeUtf8(absl::string_view text, std::vector<uint32_t>& out) {
  const auto* s = reinterpret_cast<const uint8_t*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  auto cont = [&](size_t k) { return i + k < n && (s[i + k] & 0xC0) == 0x80; };
  while (i < n) {
    uint8_t b = s[i];
    if (b < 0x80) {
      out.push_back(b);
      i += 1;
    } else if ((b & 0xE0) == 0xC0 && cont(1)) {
      out.push_back((uint32_t(b & 0x1F) << 6) | (s[i + 1] & 0x3F));
      i += 2;
    } else if ((b & 0xF0) == 0xE0 && cont(1) && cont(2)) {
      out.push_back((uint32_t(b & 0x0F) << 12) | (uint32_t(s[i + 1] & 0x3F) << 6) |
                    (s[i + 2] & 0x3F));
      i += 3;
    } else if ((b & 0xF8) == 0xF0 && cont(1) && cont(2) && cont(3)) {
      out.push_back((uint32_t(b & 0x07) << 18) | (uint32_t(s[i + 1] & 0x3F) << 12) |
                    (uint32_t(s[i + 2] & 0x3F) << 6) | (s[i + 3] & 0x3F));
      i += 4;
    } else {
      out.push_back(kReplacementChar);
      i += 1;
    }
  }
}

void AppendUtf8(uint32_t cp, std::string& out) {
  if (cp > 0x10FFFF) cp = kReplacementChar;
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

int Utf8SequenceLength(uint8_t b) {
  if (b < 0x80) return 1;
  if ((b & 0xE0) == 0xC0) return 2;
  if ((b & 0xF0) == 0xE0) return 3;
  if ((b & 0xF8) == 0xF0) return 4;
  return 0;
}

uint8_t ClassOf(uint32_t cp) {
  static const std::array<uint8_t, 128> ascii = MakeAsciiClasses();
  if (cp < 128) return ascii[cp];
  uint8_t v = 0;
  if (InRanges(cp, internal::kLetterRanges, internal::kLetterRangesCount)) {
    v |= kClassLetter;
  } else if (InRanges(cp, internal::kNumberRanges, internal::kNumberRangesCount)) {
    v |= kClassNumber;
  } else if (IsWhitespace(cp)) {
    v |= kClassWhitespace;
  } else if (InRanges(cp, internal::kMarkRanges, internal::kMarkRangesCount)) {
    v |= kClassMark;
  }
  return v;
}

uint32_t ByteToCodepoint(uint8_t b) { return Maps().to_cp[b]; }

int CodepointToByte(uint32_t cp) {
  return cp < Maps().to_byte.size() ? Maps().to_byte[cp] : -1;
}

}  // namespace dpl::tokenizer
