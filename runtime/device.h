// Picks the device a model runs on: "cuda" (the GPU runtime, the default)
// or "cpu" (the float64 reference forward pass, slow but exact).
#pragma once

#include <cstdint>
#include <future>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "formats/model_file.h"
#include "runtime/generate/decoder.h"

namespace dpl::runtime {

struct DeviceOptions {
  std::string device = "cuda";  // "cuda" or "cpu"
  int threads = 0;              // cpu: worker threads (0: all cores)
  int64_t n_ctx = 4096;         // KV cache positions (0: the model's context length)
  int max_batch = 2048;         // cuda: prompt chunk, tokens per forward pass (-ub)
  bool eager = false;           // cuda: launch kernel by kernel (DPL_EAGER=1), no graph
  std::string weights_upload = "auto";  // cuda: auto, pin or staged (DeviceWeights)
  double host_copy_gb_per_s = 0;        // cuda, auto: StartWeightPrefault's measure (0: none)
  // cuda: `path` already opened with ModelFile::OpenIndex (parsed once), or null.
  std::shared_ptr<formats::ModelFile> index;
};

// Starts the device's own start-up on a background thread (cuda: creating the
// CUDA context, a few hundred ms, and opening cuBLAS beside it) so that it overlaps the caller's file and
// tokenizer work; the future holds the seconds it took (0 for cpu).
// CreateDecoder may be called before it is ready (CUDA serializes its
// initialization).
std::future<double> StartDeviceInit(const std::string& device);

// Started beside StartDeviceInit, while the CUDA context is created: first
// measures how fast this host copies the file (runtime::MeasureHostCopy, the
// first 256 MiB: what --weights-upload auto chooses by), then reads the rest
// of the mapping into the page tables (MappedFile::Populate, 64 MiB slices in
// file order, up to 16 threads) so that the upload copies without page
// faults. Zeros for a GGUF or an image without a mapping. The futures keep
// the mapping alive until they are done.
struct WeightPrefault {
  std::future<double> host_copy_gb_per_s;  // ready first
  std::future<double> seconds;             // the whole of it
};
WeightPrefault StartWeightPrefault(std::shared_ptr<const formats::ModelFile> index);

// Loads `path` onto the chosen device. Errors name an unknown device, a
// missing GPU, a GGUF given to the GPU runtime, or memory that does not fit.
absl::StatusOr<std::unique_ptr<generate::Decoder>> CreateDecoder(const std::string& path,
                                                                 const DeviceOptions& options);

}  // namespace dpl::runtime
