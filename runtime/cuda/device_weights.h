// Loads a .dpl file's data region onto the GPU: one cudaMalloc of exactly
// data_bytes, filled through two pinned staging buffers (one being filled
// from the file while the other is copied to the device), no per-tensor host
// work. A tensor's device pointer is base + its offset.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "formats/dpl_file.h"
#include "formats/model_file.h"
#include "kernels/cuda_handles.h"

namespace dpl::runtime {

struct LoadOptions {
  uint64_t staging_bytes = 64ull << 20;  // per staging buffer (two of them)
  int host_threads = 0;  // memcpy / zstd workers filling staging (0: all cores, max 16)
};

struct LoadStats {
  uint64_t bytes = 0;        // data region bytes copied to the device
  double seconds = 0;        // from first read to the last copy's completion
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
  absl::Status Upload(const LoadOptions& options);

  std::shared_ptr<const formats::DplFile> file_;
  kernels::DeviceBuffer<uint8_t> base_;
  LoadStats stats_;
};

// Free and total device memory, for "not enough device memory" errors.
absl::StatusOr<std::pair<uint64_t, uint64_t>> DeviceMemoryInfo();

}  // namespace dpl::runtime
