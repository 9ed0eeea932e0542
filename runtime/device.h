// Picks the device a model runs on: "cuda" (the GPU runtime, the default)
// or "cpu" (the float64 reference forward pass, slow but exact).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "runtime/generate/decoder.h"

namespace dpl::runtime {

struct DeviceOptions {
  std::string device = "cuda";  // "cuda" or "cpu"
  int threads = 0;              // cpu: worker threads (0: all cores)
  int64_t n_ctx = 4096;         // KV cache positions (0: the model's context length)
  int max_batch = 256;          // cuda: prompt tokens per forward pass
  bool eager = false;           // cuda: launch kernel by kernel (DPL_EAGER=1), no graph
};

// Loads `path` onto the chosen device. Errors name an unknown device, a
// missing GPU, a GGUF given to the GPU runtime, or memory that does not fit.
absl::StatusOr<std::unique_ptr<generate::Decoder>> CreateDecoder(const std::string& path,
                                                                 const DeviceOptions& options);

}  // namespace dpl::runtime
