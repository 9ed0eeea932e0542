// DecodeTuning (kernels/tuning.h) for the current CUDA device, queried once
// at load: the SM count from cudaDeviceProp and the resident CTAs per SM of
// the q6_K decode kernel from the occupancy API.
#pragma once

#include "absl/status/statusor.h"
#include "kernels/tuning.h"

namespace dpl::kernels {

absl::StatusOr<DecodeTuning> DecodeTuningForDevice();

}  // namespace dpl::kernels
