// libFuzzer target: the compressed .dpl form with its frames inflated.
//
// Each input is made a compressed .dpl before it is parsed: flag bit 0 set,
// header and index checksums recomputed (random bytes never carry them), so
// mutations of the frame index, the frames' zstd headers and the zstd data
// reach the frame checks, ZSTD_decompressDCtx and the streaming checksums.
#include <xxhash.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "formats/dpl_file.h"

namespace {

// Inflating is part of the reader's surface; cap what one input may ask for
// so a fuzzed data_bytes cannot spend the run on one file.
constexpr uint64_t kMaxRegionBytes = 64ull << 20;

void Exercise(const uint8_t* data, size_t size) {
  auto f = dpl::formats::DplFile::Parse(data, size);
  if (!f.ok() || !f->compressed()) return;
  const dpl::formats::DplHeader& h = f->header();
  if (h.data_bytes > kMaxRegionBytes || h.frame_raw_bytes > kMaxRegionBytes) return;
  (void)f->VerifyChecksums(2);  // frame by frame, streaming
  std::vector<uint8_t> region(h.data_bytes);
  if (!f->DecompressAll(region.data(), 2).ok()) return;
  for (const dpl::formats::DplTensorEntry& t : f->tensors()) (void)f->VerifyChecksum(t, region.data());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using dpl::formats::kDplHeaderBytes;
  if (size < kDplHeaderBytes) return 0;
  std::vector<uint8_t> fixed(data, data + size);
  fixed[12] |= dpl::formats::kDplFlagCompressed;
  uint64_t data_offset;
  std::memcpy(&data_offset, fixed.data() + 104, 8);
  if (data_offset >= kDplHeaderBytes && data_offset <= size) {
    const uint64_t index = XXH3_64bits(fixed.data() + kDplHeaderBytes, data_offset - kDplHeaderBytes);
    std::memcpy(fixed.data() + 128, &index, 8);
  }
  const uint64_t header = XXH3_64bits(fixed.data(), kDplHeaderBytes - 8);
  std::memcpy(fixed.data() + kDplHeaderBytes - 8, &header, 8);
  Exercise(fixed.data(), fixed.size());
  return 0;
}
