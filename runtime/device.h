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
  // cuda: `path` already opened with ModelFile::OpenIndex (parsed once), or null.
  std::shared_ptr<formats::ModelFile> index;
};

// Starts the device's own start-up on a background thread (cuda: creating the
// CUDA context, a few hundred ms, and opening cuBLAS beside it) so that it overlaps the caller's file and
// tokenizer work; the future holds the seconds it took (0 for cpu).
// CreateDecoder may be called before it is ready (CUDA serializes its
// initialization).
std::future<double> StartDeviceInit(const std::string& device);

// Starts reading a .dpl file's mapping into the page tables on background
// threads (MappedFile::Populate, 64 MiB slices in file order, up to 16
// threads) so that the weight upload that follows copies without page
// faults; started beside StartDeviceInit, it runs while the CUDA context is
// created. The future holds the seconds it took (0 for a GGUF or an image
// without a mapping). The future keeps the mapping alive until it is done.
std::future<double> StartWeightPrefault(std::shared_ptr<const formats::ModelFile> index);

// Loads `path` onto the chosen device. Errors name an unknown device, a
// missing GPU, a GGUF given to the GPU runtime, or memory that does not fit.
absl::StatusOr<std::unique_ptr<generate::Decoder>> CreateDecoder(const std::string& path,
                                                                 const DeviceOptions& options);

}  // namespace dpl::runtime
