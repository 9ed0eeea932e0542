// DplFile's reads of the data region: inflating frames and checking tensor
// checksums, each through SafeRead (a file truncated meanwhile is an error
// naming it, not a SIGBUS).
#include <xxhash.h>
#include <zstd.h>

#include <algorithm>
#include <memory>
#include <new>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "formats/dpl_file.h"
#include "formats/parallel_for.h"

namespace dpl::formats {
namespace {

// Frames inflated at once by VerifyChecksums, at most this many bytes of them.
constexpr uint64_t kVerifyBatchBytes = 256ull << 20;

struct DCtxFree {
  void operator()(ZSTD_DCtx* c) const { ZSTD_freeDCtx(c); }
};
using DCtxPtr = std::unique_ptr<ZSTD_DCtx, DCtxFree>;
struct Xxh3Free {
  void operator()(XXH3_state_t* s) const { XXH3_freeState(s); }
};
using Xxh3Ptr = std::unique_ptr<XXH3_state_t, Xxh3Free>;

absl::Status ChecksumError(const DplTensorEntry& t, uint64_t got) {
  return absl::DataLossError(absl::StrCat("tensor '", t.name, "': checksum mismatch (stored ",
                                          absl::Hex(t.xxh3, absl::kZeroPad16), ", computed ",
                                          absl::Hex(got, absl::kZeroPad16), ")"));
}

// Feeds the logical bytes [base, base + n) of the region (in `bytes`) to the
// streaming check of the tensors sorted by offset: `next` is the first one
// not yet finished, `open` whether its hash has begun.
absl::Status HashSpan(const std::vector<const DplTensorEntry*>& sorted, const uint8_t* bytes,
                      uint64_t base, uint64_t n, XXH3_state_t* state, size_t* next, bool* open) {
  const uint64_t span_end = base + n;
  while (*next < sorted.size()) {
    const DplTensorEntry& t = *sorted[*next];
    if (t.offset >= span_end && t.n_bytes != 0) break;
    if (!*open) {
      XXH3_64bits_reset(state);
      *open = true;
    }
    const uint64_t begin = std::max(t.offset, base);
    const uint64_t end = std::min(t.offset + t.n_bytes, span_end);
    if (end > begin) XXH3_64bits_update(state, bytes + (begin - base), end - begin);
    if (t.offset + t.n_bytes > span_end) break;  // continues in the next span
    const uint64_t got = XXH3_64bits_digest(state);
    if (got != t.xxh3) return ChecksumError(t, got);
    *open = false;
    ++*next;
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status DplFile::DecompressFrames(size_t first, size_t n,
                                      const std::function<uint8_t*(size_t)>& dst,
                                      int threads) const {
  return SafeRead([&] {
    return ParallelFor(threads, n, [&](size_t k) {
      const DCtxPtr dctx(ZSTD_createDCtx());  // owned here: nothing leaks on any path
      if (dctx == nullptr) return absl::ResourceExhaustedError("zstd: cannot create a context");
      const size_t i = first + k;
      const Frame& fr = frames_.at(i);
      const size_t got = ZSTD_decompressDCtx(dctx.get(), dst(i), fr.raw_bytes,
                                             data_ + fr.stored_offset, fr.stored_bytes);
      const std::string where =
          absl::StrCat("invalid data frame #", i, " at offset ", fr.stored_offset, ": ");
      if (ZSTD_isError(got)) return absl::InvalidArgumentError(where + ZSTD_getErrorName(got));
      if (got != fr.raw_bytes) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, "decompressed to ", got, " bytes, expected ", fr.raw_bytes));
      }
      return absl::OkStatus();
    });
  });
}

absl::Status DplFile::DecompressFrame(size_t i, uint8_t* dst) const {
  return DecompressFrames(i, 1, [dst](size_t) { return dst; }, 1);
}

absl::Status DplFile::DecompressAll(uint8_t* dst, int threads) const {
  return DecompressFrames(0, frames_.size(),
                          [&](size_t i) { return dst + frames_[i].raw_offset; }, threads);
}

absl::Status DplFile::VerifyChecksum(const DplTensorEntry& t, const uint8_t* region) const {
  uint64_t got = 0;
  DPL_RETURN_IF_ERROR(SafeRead([&] {
    got = XXH3_64bits(region + t.offset, t.n_bytes);
    return absl::OkStatus();
  }));
  return got == t.xxh3 ? absl::OkStatus() : ChecksumError(t, got);
}

absl::Status DplFile::VerifyChecksums(int threads) const {
  if (!compressed()) {
    for (const DplTensorEntry& t : tensors_) DPL_RETURN_IF_ERROR(VerifyChecksum(t, data_region()));
    return absl::OkStatus();
  }
  std::vector<const DplTensorEntry*> sorted;
  for (const DplTensorEntry& t : tensors_) sorted.push_back(&t);
  std::sort(sorted.begin(), sorted.end(),
            [](const DplTensorEntry* a, const DplTensorEntry* b) { return a->offset < b->offset; });
  const Xxh3Ptr state(XXH3_createState());
  const uint64_t frame = header_.frame_raw_bytes;
  const size_t batch = std::max<size_t>(
      1, std::min<uint64_t>({static_cast<uint64_t>(std::max(threads, 1)), kVerifyBatchBytes / frame,
                             frames_.size()}));
  std::vector<std::unique_ptr<uint8_t[]>> buffers(frames_.empty() ? 0 : batch);
  for (auto& b : buffers) {
    b.reset(new (std::nothrow) uint8_t[frame]);
    if (b == nullptr) {
      return absl::ResourceExhaustedError(absl::StrCat("cannot allocate a ", frame, "-byte frame buffer"));
    }
  }
  size_t next = 0;
  bool open = false;
  for (size_t first = 0; first < frames_.size(); first += batch) {
    const size_t n = std::min(batch, frames_.size() - first);
    DPL_RETURN_IF_ERROR(DecompressFrames(
        first, n, [&](size_t i) { return buffers[i - first].get(); }, threads));
    for (size_t k = 0; k < n; ++k) {
      const Frame& fr = frames_[first + k];
      DPL_RETURN_IF_ERROR(HashSpan(sorted, buffers[k].get(), fr.raw_offset, fr.raw_bytes,
                                   state.get(), &next, &open));
    }
  }
  // Only empty tensors at the region's end are left.
  return HashSpan(sorted, nullptr, header_.data_bytes, 0, state.get(), &next, &open);
}

}  // namespace dpl::formats
