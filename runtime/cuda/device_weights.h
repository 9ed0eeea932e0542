// Loads a .dpl file's data region onto the GPU: one cudaMalloc of exactly
// data_bytes, no per-tensor host work. A tensor's device pointer is base +
// its offset. The region goes up in chunks, one of two ways:
//   pinned: a few threads pin the file mapping's own pages (the page cache;
//     cudaHostRegister, read-only) chunk by chunk, the copy engine reads
//     them, and each chunk is unpinned once copied: no host memcpy;
//   staged: host threads copy the mapping (or inflate zstd frames) into two
//     pinned staging buffers in turn while the other one is copied.
// kPinnedFile pins (an error where it cannot), kStaged stages, kAuto stages
// where the host copies at kStageFromGbPerS or more (measured before the
// load) and pins otherwise, and stages what cannot be pinned: everything
// for a compressed file, a GPU that cannot pin read-only memory or a region
// not on a page, and the chunks a pinning worker failed or left unfinished
// for kPinWatchdog (LoadStats::fallback says why).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "formats/dpl_file.h"
#include "formats/model_file.h"
#include "kernels/cuda_handles.h"

namespace dpl::runtime {

enum class UploadMethod { kAuto, kPinnedFile, kStaged };

// "auto", "pin" or "staged" (the --weights-upload flag); InvalidArgument otherwise.
absl::StatusOr<UploadMethod> ParseUploadMethod(absl::string_view name);

struct LoadOptions {
  UploadMethod method = UploadMethod::kAuto;
  // kAuto: the host's copy speed, GB/s (MeasureHostCopy; 0: not measured,
  // pin). From kStageFromGbPerS up the load stages instead of pinning.
  double host_copy_gb_per_s = 0;
  uint64_t staging_bytes = 64ull << 20;  // a chunk: a staging buffer (two), or a pinned range
  int host_threads = 0;  // memcpy / zstd workers filling staging (0: the cores the pinning leaves, max 16)
  int pin_threads = 4;   // threads pinning chunks (kAuto, kPinnedFile)
};

struct LoadStats {
  int pinned_chunks = 0;     // chunks copied from the file's own pinned pages
  int staged_chunks = 0;     // chunks copied through staging
  std::string fallback;      // why kAuto staged chunks, if it did
  double pin_seconds = 0;    // thread time in cudaHostRegister
  uint64_t bytes = 0;        // data region bytes copied to the device
  double seconds = 0;        // from first read to the last copy's completion
  double staging_seconds = 0;  // of which the pinned staging buffers were allocated
  double fill_seconds = 0;   // of which host threads filled staging buffers
  double wait_seconds = 0;   // and the host waited for a buffer's copy to drain
  double gb_per_s() const { return seconds > 0 ? bytes / seconds / 1e9 : 0; }
};

class DeviceWeights {
 public:
  // Copies the data region of an opened .dpl (ModelFile::OpenIndex; a GGUF
  // gets "convert it first") to the current device.
  static absl::StatusOr<std::unique_ptr<DeviceWeights>> Load(const formats::ModelFile& index,
                                                              const LoadOptions& options);
  // The same after opening `path`.
  static absl::StatusOr<std::unique_ptr<DeviceWeights>> Load(const std::string& path,
                                                              const LoadOptions& options);
  DeviceWeights(const DeviceWeights&) = delete;
  DeviceWeights& operator=(const DeviceWeights&) = delete;

  const formats::DplFile& file() const { return *file_; }
  const uint8_t* device_base() const { return base_.get(); }  // (data_bytes) bytes
  uint64_t device_bytes() const { return file_->header().data_bytes; }
  const LoadStats& stats() const { return stats_; }

  // Device pointer of a tensor, or NotFound naming it.
  absl::StatusOr<const uint8_t*> TensorPtr(absl::string_view name) const;

 private:
  DeviceWeights() = default;
  struct Chunks;
  absl::Status Upload(const LoadOptions& options);
  static void PinWorker(std::shared_ptr<Chunks> c, std::shared_ptr<const formats::DplFile> file,
                        uint8_t* dst, uint64_t chunk, int device, cudaStream_t stream);

  std::shared_ptr<const formats::DplFile> file_;
  kernels::DeviceBuffer<uint8_t> base_;
  LoadStats stats_;
};

// kAuto stages from this host copy speed up, pins below it. Why 30 GB/s
// (H100 boxes, docs/PERF.md "Start-up"): pinning, each chunk unpinned once
// copied, moved 19-29 GB/s on every box; staging costs its buffers (40-60
// ms) plus the bytes at the host's copy speed, which beats 24 GB/s pinned
// from ~30 GB/s (7B: 32, 14B: 28).
inline constexpr double kStageFromGbPerS = 30;

// The staged path's fill speed on this host, GB/s: `threads` workers (0:
// as many as the staging would use) copy the first `bytes` of the file
// mapping (populated first) in 4 MiB slices into a 64 MiB scratch buffer.
// Host work only (no CUDA): it runs beside the CUDA context's creation.
double MeasureHostCopy(const formats::MappedFile& m, uint64_t bytes, int threads,
                       const LoadOptions& options);

// Free and total device memory, for "not enough device memory" errors.
absl::StatusOr<std::pair<uint64_t, uint64_t>> DeviceMemoryInfo();

}  // namespace dpl::runtime
