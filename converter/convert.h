// GGUF -> .dpl conversion: the tensors whose type the layout policy picks
// (by default AutoLayout's table: q6_K) rewritten into the dense split-plane
// (dpl) layout, every other tensor copied byte for byte, metadata preserved
// whole. The output appears whole or not at all (formats::OutputFile).
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <optional>
#include <ostream>
#include <string>

#include "absl/status/statusor.h"
#include "formats/dpl_file.h"
#include "formats/gguf.h"

namespace dpl::converter {

// Compression workers: --threads takes 0 (all cores) or 1..kMaxThreads.
inline constexpr int kMaxThreads = 1024;

// Which tensors get the dpl layout (dpl-convert --layout).
enum class LayoutPolicy {
  kAuto,  // AutoLayout's per-type table (the default)
  kRaw,   // every tensor raw
  kDpl,   // every tensor of a type with dpl planes (A/B benchmarks, tests)
};

// "auto", "raw", "dpl".
absl::string_view LayoutPolicyName(LayoutPolicy policy);
// The policy called `name`; InvalidArgument naming it and the three choices.
absl::StatusOr<LayoutPolicy> LayoutPolicyFromName(absl::string_view name);

// --layout auto's choice for a tensor of `type`: one row per type with dpl
// planes in convert.cc, decided by the H200 kernel bench (raw vs dpl matvec
// of the same matrix, bit-identical outputs); kRaw for every other type.
formats::TensorLayout AutoLayout(formats::GgmlType type);

// The layout `policy` gives a tensor of `type`.
formats::TensorLayout LayoutFor(LayoutPolicy policy, formats::GgmlType type);

struct ConvertOptions {
  LayoutPolicy layout = LayoutPolicy::kAuto;
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
  // One "warning: ..." line per tensor whose type the CUDA runtime has no
  // kernel for (model::CheckGpuType); the conversion goes on (nullptr: none).
  std::ostream* warn = nullptr;
  // Polled while writing and verifying: when set, the conversion stops
  // (kCancelled) and nothing is written.
  const std::atomic<bool>* cancel = nullptr;
};

struct VerifyStats {
  uint64_t n_tensors = 0;
  uint64_t n_dpl_rows = 0;   // rows restored from dpl (every type) and compared
  uint64_t bytes_compared = 0;
};

struct ConvertStats {
  uint64_t n_tensors = 0;
  uint64_t n_dpl_tensors = 0;
  std::map<formats::GgmlType, uint64_t> n_dpl_by_type;  // the dpl tensors per type
  uint32_t version = 0;       // the .dpl format version written (DplVersionFor)
  uint64_t n_gpu_warnings = 0;  // tensors of a type the CUDA runtime has no kernel for
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
// set, shapes and types; undoing the dpl layout restores every block of every
// dpl tensor bit for bit, whatever its type (and row padding is zero); every
// other tensor is byte-identical; every stored checksum matches; the file's
// version is the one its layouts need (formats::DplVersionFor). `cancel` is
// polled between tensors.
absl::StatusOr<VerifyStats> VerifyConversion(const formats::GgufFile& gguf,
                                             const formats::DplFile& dpl,
                                             const std::atomic<bool>* cancel = nullptr);

// Whether the CUDA runtime can run the converted model at `path`: OK when
// model::BindModel accepts it (architecture, hyperparameters, tensor set and
// shapes) and the GPU has kernels for every tensor's type; else the first
// reason, plus how many more tensors the per-tensor warnings named
// (model::CheckGpuType, the same message). dpl-convert prints it as a note.
absl::Status CheckRunnable(const std::string& path);

}  // namespace dpl::converter
