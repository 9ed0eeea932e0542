// Per-step bookkeeping kernels of the captured decode graph: the position
// lives in device memory and the graph advances it itself, so replaying the
// same graph walks through the context with no host write in between.
#pragma once

#include <cuda_runtime.h>

#include "absl/status/status.h"

namespace dpl::kernels {

// *d_pos += 1 (one thread).
absl::Status AdvancePosition(int* d_pos, cudaStream_t stream);

}  // namespace dpl::kernels
