#include "formats/q6k_dpl.h"

#include <cstring>

#include "formats/ggml_types.h"

namespace dpl::formats {
namespace {

// Offsets of the fields inside one GGUF q6_K block.
constexpr uint64_t kQlOff = 0;
constexpr uint64_t kQhOff = kQlOff + kQ6KQlBytes;  // 128
constexpr uint64_t kScOff = kQhOff + kQ6KQhBytes;  // 192
constexpr uint64_t kDOff = kScOff + kQ6KScBytes;   // 208
static_assert(kDOff + kQ6KDBytes == kQ6KBlockBytes, "q6_K block is 210 bytes");

}  // namespace

uint64_t DplQ6KRowStride(uint64_t nbe) {
  return (nbe * kQ6KBlockBytes + 15) & ~uint64_t{15};
}

void Q6KRowToDpl(const uint8_t* raw_row, uint64_t nbe, uint8_t* dpl_row) {
  uint8_t* ql = dpl_row;                    // (nbe, 128)
  uint8_t* qh = ql + nbe * kQ6KQlBytes;     // (nbe, 64)
  uint8_t* sc = qh + nbe * kQ6KQhBytes;     // (nbe, 16)
  uint8_t* d = sc + nbe * kQ6KScBytes;      // (nbe, 2)
  for (uint64_t i = 0; i < nbe; ++i) {
    const uint8_t* b = raw_row + i * kQ6KBlockBytes;
    std::memcpy(ql + i * kQ6KQlBytes, b + kQlOff, kQ6KQlBytes);
    std::memcpy(qh + i * kQ6KQhBytes, b + kQhOff, kQ6KQhBytes);
    std::memcpy(sc + i * kQ6KScBytes, b + kScOff, kQ6KScBytes);
    std::memcpy(d + i * kQ6KDBytes, b + kDOff, kQ6KDBytes);
  }
  const uint64_t content = nbe * kQ6KBlockBytes;
  std::memset(dpl_row + content, 0, DplQ6KRowStride(nbe) - content);
}

void DplRowToQ6K(const uint8_t* dpl_row, uint64_t nbe, uint8_t* raw_row) {
  const uint8_t* ql = dpl_row;
  const uint8_t* qh = ql + nbe * kQ6KQlBytes;
  const uint8_t* sc = qh + nbe * kQ6KQhBytes;
  const uint8_t* d = sc + nbe * kQ6KScBytes;
  for (uint64_t i = 0; i < nbe; ++i) {
    uint8_t* b = raw_row + i * kQ6KBlockBytes;
    std::memcpy(b + kQlOff, ql + i * kQ6KQlBytes, kQ6KQlBytes);
    std::memcpy(b + kQhOff, qh + i * kQ6KQhBytes, kQ6KQhBytes);
    std::memcpy(b + kScOff, sc + i * kQ6KScBytes, kQ6KScBytes);
    std::memcpy(b + kDOff, d + i * kQ6KDBytes, kQ6KDBytes);
  }
}

}  // namespace dpl::formats
