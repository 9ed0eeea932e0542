// The Unicode pieces the BPE pre-tokenizers need: lenient UTF-8 decoding (as
// llama.cpp does it), code point classes (\p{L}, \p{N}, White_Space) and the
// GPT-2 byte <-> "printable code point" map that byte-level BPE vocabularies
// are written in.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace dpl::tokenizer {

inline constexpr uint32_t kReplacementChar = 0xFFFD;

// Decodes UTF-8 the way llama.cpp's unicode_cpts_from_utf8 does: the lead
// byte decides the length, continuation bytes must be 10xxxxxx, and any byte
// that does not start a well-formed sequence becomes one U+FFFD (overlong
// forms and surrogates are not rejected). Appends to `out`.
void DecodeUtf8(absl::string_view text, std::vector<uint32_t>& out);

// Appends the UTF-8 encoding of `cp` (cp <= 0x10FFFF; larger values are
// written as U+FFFD).
void AppendUtf8(uint32_t cp, std::string& out);

// Length of the UTF-8 sequence that lead byte `b` announces: 1..4, or 0 for a
// continuation byte or an invalid lead (0xF8..0xFF).
int Utf8SequenceLength(uint8_t b);

// Code point classes.
enum CodepointClass : uint8_t {
  kClassLetter = 1,      // \p{L}: Lu Ll Lt Lm Lo
  kClassNumber = 2,      // \p{N}: Nd Nl No
  kClassWhitespace = 4,  // \s: the White_Space property
  kClassMark = 8,        // \p{M}: Mn Mc Me
};
uint8_t ClassOf(uint32_t cp);

// GPT-2's bytes_to_unicode: printable Latin-1 bytes map to themselves, the
// other 68 bytes to U+0100.. in byte order. ByteToCodepoint(0x20) = U+0120 'Ġ'.
uint32_t ByteToCodepoint(uint8_t b);
// Inverse; -1 for a code point that is not the image of any byte.
int CodepointToByte(uint32_t cp);

namespace internal {
struct CodepointRange {
  uint32_t first;
  uint32_t last;
};
// Generated tables (unicode_tables.cc), sorted and disjoint.
extern const CodepointRange kLetterRanges[];
extern const size_t kLetterRangesCount;
extern const CodepointRange kNumberRanges[];
extern const size_t kNumberRangesCount;
extern const CodepointRange kMarkRanges[];
extern const size_t kMarkRangesCount;
}  // namespace internal

}  // namespace dpl::tokenizer
