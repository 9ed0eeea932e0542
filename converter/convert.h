// GGUF -> .dpl conversion: every q6_K tensor rewritten into the dense
// split-plane layout, every other tensor copied byte for byte, metadata
// preserved whole. The output appears atomically (temp file, fsync, rename).
#pragma once

#include <atomic>
#include <cstdint>
#include <ostream>
#include <string>

#include "absl/status/statusor.h"
#include "formats/dpl_file.h"
#include "formats/gguf.h"

namespace dpl::converter {

struct ConvertOptions {
  // Store the data region as independent zstd frames of `frame_bytes`
  // (the shipping form); the default is the uncompressed, mappable form.
  bool compress = false;
  int compress_level = 3;
  uint64_t frame_bytes = 4ull << 20;
  int threads = 0;  // 0: hardware concurrency (compression workers)
  // Per-tensor lines and the summary go here (nullptr: silent).
  std::ostream* log = nullptr;
  // Polled between chunks; set by a signal handler to stop cleanly.
  const std::atomic<bool>* cancel = nullptr;
};

struct ConvertStats {
  uint64_t n_tensors = 0;
  uint64_t n_dpl_tensors = 0;
  uint64_t input_bytes = 0;   // GGUF file size
  uint64_t output_bytes = 0;  // .dpl file size
  uint64_t data_bytes = 0;    // logical data region
  double seconds = 0;
};

// Converts `in_path` (GGUF) to `out_path` (.dpl). On any error or
// cancellation nothing is left at out_path (an existing file there is only
// replaced on success).
absl::StatusOr<ConvertStats> ConvertGgufToDpl(const std::string& in_path,
                                              const std::string& out_path,
                                              const ConvertOptions& options);

struct VerifyStats {
  uint64_t n_tensors = 0;
  uint64_t n_dpl_rows = 0;   // q6_K rows restored from dpl and compared
  uint64_t bytes_compared = 0;
};

// Proves that `dpl` holds `gguf` exactly: the same metadata, the same tensor
// set, shapes and types; undoing the dpl layout restores every q6_K block bit
// for bit (and row padding is zero); every other tensor is byte-identical;
// every stored checksum matches.
absl::StatusOr<VerifyStats> VerifyConversion(const formats::GgufFile& gguf,
                                             const formats::DplFile& dpl);

}  // namespace dpl::converter
