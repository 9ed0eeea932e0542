// libFuzzer target: the .dpl reader on arbitrary bytes.
//
// Random bytes almost never carry valid XXH3 checksums, which would stop the
// fuzzer at the first check. So each input is parsed twice: as given, and
// with its header and index checksums recomputed, which lets mutations reach
// the metadata, tensor table and frame index checks behind them.
#include <xxhash.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "formats/dpl_file.h"

namespace {

// Decompressing frames is part of the reader's surface, but cap the region so
// a fuzzed data_bytes cannot ask for gigabytes.
constexpr uint64_t kMaxRegionBytes = 64ull << 20;

void Exercise(const uint8_t* data, size_t size) {
  auto f = dpl::formats::DplFile::Parse(data, size);
  if (!f.ok()) return;
  const uint64_t region_bytes = f->header().data_bytes;
  if (region_bytes > kMaxRegionBytes) return;
  std::vector<uint8_t> region;
  const uint8_t* r = f->data_region();
  if (r == nullptr) {
    region.resize(region_bytes);
    if (!f->DecompressAll(region.data(), 2).ok()) return;
    r = region.data();
  }
  for (const dpl::formats::DplTensorEntry& t : f->tensors()) (void)f->VerifyChecksum(t, r);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Exercise(data, size);
  if (size < dpl::formats::kDplHeaderBytes) return 0;
  std::vector<uint8_t> fixed(data, data + size);
  uint64_t data_offset;
  std::memcpy(&data_offset, fixed.data() + 104, 8);
  if (data_offset >= dpl::formats::kDplHeaderBytes && data_offset <= size) {
    const uint64_t index = XXH3_64bits(fixed.data() + dpl::formats::kDplHeaderBytes,
                                       data_offset - dpl::formats::kDplHeaderBytes);
    std::memcpy(fixed.data() + 128, &index, 8);
  }
  const uint64_t header = XXH3_64bits(fixed.data(), dpl::formats::kDplHeaderBytes - 8);
  std::memcpy(fixed.data() + dpl::formats::kDplHeaderBytes - 8, &header, 8);
  Exercise(fixed.data(), fixed.size());
  return 0;
}
