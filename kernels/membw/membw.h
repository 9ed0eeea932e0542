// Measures the device's HBM read bandwidth with a pure streaming kernel, so
// benchmarks can report their fraction of the roofline measured in the same
// run (the H200's figure moves a few percent between machines and clocks).
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"

namespace dpl::kernels {

// Reads a `bytes` buffer (a few GiB: far past the L2) with 16-byte loads,
// `reps` timed passes after one warm-up; returns the median in bytes/second.
// Allocates and frees its own buffer.
absl::StatusOr<double> MeasureReadBandwidth(uint64_t bytes, int reps);

}  // namespace dpl::kernels
