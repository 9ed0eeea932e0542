// The converter warns about weight types the CUDA runtime cannot run from
// model::GpuHasKernelFor's list; the runtime's own answer is whether the
// matvec planner (and so the loader) takes the type, and the device
// dequantizer the prompt path and embedding gather use. This test holds the
// two to the same list (a CPU test: the planner runs without a GPU).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cstdint>

#include "formats/ggml_types.h"
#include "formats/tensor_layout.h"
#include "kernels/matvec/matvec_plan.h"
#include "model/model.h"

namespace dpl::runtime {
namespace {

TEST_CASE("model::GpuHasKernelFor lists exactly the types the matvec planner runs") {
  kernels::DecodeTuning t;
  t.num_sms = 132;
  t.q6k_ctas_per_sm = 7;
  int runnable = 0;
  for (uint32_t id = 0; id < 64; ++id) {
    const auto tr = formats::FindGgmlType(id);
    if (!tr.has_value()) continue;
    CAPTURE(tr->name);
    kernels::WeightMatrix w;
    w.data = reinterpret_cast<const void*>(uintptr_t{1} << 20);
    w.type = tr->type;
    w.n_rows = 64;
    w.n_cols = 4096;  // whole blocks of every type
    w.row_stride = kernels::MinRowStride(tr->type, formats::TensorLayout::kRaw, w.n_cols);
    const bool planned = w.row_stride > 0 && kernels::PlanMatVec(w, t).ok();
    CHECK(planned == model::GpuHasKernelFor(tr->type));
    runnable += planned;
  }
  CHECK(runnable == 15);
}

// The same for expert tensors: model::GpuHasExpertKernelFor (what the
// converter's note and the loader refuse by) against the expert-indexed
// matvec's kernels, raw and dpl layouts alike.
TEST_CASE("model::GpuHasExpertKernelFor lists exactly the types the expert matvec runs") {
  kernels::DecodeTuning t;
  t.num_sms = 132;
  t.q6k_ctas_per_sm = 7;
  int runnable = 0;
  for (uint32_t id = 0; id < 64; ++id) {
    const auto tr = formats::FindGgmlType(id);
    if (!tr.has_value()) continue;
    for (formats::TensorLayout layout : {formats::TensorLayout::kRaw, formats::TensorLayout::kDpl}) {
      CAPTURE(tr->name);
      CAPTURE(static_cast<int>(layout));
      if (layout == formats::TensorLayout::kDpl && !formats::HasDplPlanes(tr->type)) continue;
      kernels::WeightMatrix w;
      w.data = reinterpret_cast<const void*>(uintptr_t{1} << 20);
      w.type = tr->type;
      w.layout = layout;
      w.n_rows = 64;
      w.n_cols = 4096;
      w.row_stride = kernels::MinRowStride(tr->type, layout, w.n_cols);
      absl::StatusOr<kernels::MatVecPlan> plan =
          w.row_stride > 0 ? kernels::PlanMatVec(w, t) : absl::StatusOr<kernels::MatVecPlan>(absl::UnknownError(""));
      const bool expert = plan.ok() && kernels::MatVecMoeSupports(plan->kernel);
      CHECK(expert == model::GpuHasExpertKernelFor(tr->type));
      runnable += expert && layout == formats::TensorLayout::kRaw;
    }
  }
  CHECK(runnable == 4);
}

}  // namespace
}  // namespace dpl::runtime
