// GGUF -> .dpl conversion: every q6_K tensor rewritten into the dense
// split-plane layout, every other tensor copied byte for byte, metadata
// preserved whole. The output appears whole or not at all (formats::OutputFile).
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <ostream>
#include <string>

#include "absl/status/statusor.h"
#include "formats/dpl_file.h"
#include "formats/gguf.h"

namespace dpl::converter {

// Compression workers: --threads takes 0 (all cores) or 1..kMaxThreads.
inline constexpr int kMaxThreads = 1024;

struct ConvertOptions {
  // Store the data region as independent zstd frames of `frame_bytes`
  // (the shipping form); the default is the uncompressed, mappable form.
  bool compress = false;
  int compress_level = 3;            // zstd's range (ZSTD_minCLevel..ZSTD_maxCLevel)
  uint64_t frame_bytes = 4ull << 20;  // kDplMinFrameBytes..kDplMaxFrameBytes
  // Compression workers: 0 = all cores, fewer if their buffers would not fit
  // in the memory budget; an explicit count that does not fit is refused.
  int threads = 0;
  // Bytes the conversion may hold in buffers; 0 = half the physical memory
  // (or of RLIMIT_AS when set). Compressing holds about
  // 4 x threads x frame_bytes plus one zstd context per thread.
  uint64_t memory_budget = 0;
  // Read the finished file back and prove it (VerifyConversion) before it
  // replaces out_path: a failed or interrupted verify leaves no output.
  bool verify = false;
  // Per-tensor lines and the summary go here (nullptr: silent).
  std::ostream* log = nullptr;
  // Polled while writing and verifying: when set, the conversion stops
  // (kCancelled) and nothing is written.
  const std::atomic<bool>* cancel = nullptr;
};

struct VerifyStats {
  uint64_t n_tensors = 0;
  uint64_t n_dpl_rows = 0;   // q6_K rows restored from dpl and compared
  uint64_t bytes_compared = 0;
};

struct ConvertStats {
  uint64_t n_tensors = 0;
  uint64_t n_dpl_tensors = 0;
  uint64_t input_bytes = 0;   // GGUF file size
  uint64_t output_bytes = 0;  // .dpl file size
  uint64_t data_bytes = 0;    // logical data region
  int threads = 1;            // compression workers used
  double seconds = 0;
  std::optional<VerifyStats> verify;  // with options.verify
};

// Converts `in_path` (GGUF) to `out_path` (.dpl) through formats::OutputFile:
// on any error, cancellation or signal nothing is left at out_path (an
// existing file there is only replaced on success). Refused before anything
// is written: options out of range or over the memory budget, out_path being
// the input (same inode: also a symlink or hard link to it), an existing
// read-only out_path, a directory or non-regular file there.
absl::StatusOr<ConvertStats> ConvertGgufToDpl(const std::string& in_path,
                                              const std::string& out_path,
                                              const ConvertOptions& options);

// Proves that `dpl` holds `gguf` exactly: the same metadata, the same tensor
// set, shapes and types; undoing the dpl layout restores every q6_K block bit
// for bit (and row padding is zero); every other tensor is byte-identical;
// every stored checksum matches. `cancel` is polled between tensors.
absl::StatusOr<VerifyStats> VerifyConversion(const formats::GgufFile& gguf,
                                             const formats::DplFile& dpl,
                                             const std::atomic<bool>* cancel = nullptr);

}  // namespace dpl::converter
