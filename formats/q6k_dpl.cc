#include "formats/q6k_dpl.h"

#include <array>
#include <cstring>

namespace dpl::formats {
namespace {

// One q6_K field of a row of nbe blocks: where its plane starts in the dpl
// row, where it sits in each raw block, and its bytes per block.
struct Field {
  uint64_t plane;
  uint32_t offset, bytes;
};

std::array<Field, 4> Fields(uint64_t nbe) {
  const Q6KPlanes p = Q6KDplPlanes(nbe);
  return {{{p.ql, kQ6KQlOffset, kQ6KQlBytes},
           {p.qh, kQ6KQhOffset, kQ6KQhBytes},
           {p.sc, kQ6KScOffset, kQ6KScBytes},
           {p.d, kQ6KDOffset, kQ6KDBytes}}};
}

}  // namespace

void Q6KRowToDpl(const uint8_t* raw_row, uint64_t nbe, uint8_t* dpl_row) {
  for (const Field& f : Fields(nbe)) {
    uint8_t* plane = dpl_row + f.plane;  // (nbe, f.bytes)
    for (uint64_t i = 0; i < nbe; ++i) {
      std::memcpy(plane + i * f.bytes, raw_row + i * kQ6KBlockBytes + f.offset, f.bytes);
    }
  }
  const uint64_t content = nbe * kQ6KBlockBytes;
  std::memset(dpl_row + content, 0, DplQ6KRowStride(nbe) - content);
}

void DplRowToQ6K(const uint8_t* dpl_row, uint64_t nbe, uint8_t* raw_row) {
  for (const Field& f : Fields(nbe)) {
    const uint8_t* plane = dpl_row + f.plane;  // (nbe, f.bytes)
    for (uint64_t i = 0; i < nbe; ++i) {
      std::memcpy(raw_row + i * kQ6KBlockBytes + f.offset, plane + i * f.bytes, f.bytes);
    }
  }
}

}  // namespace dpl::formats
