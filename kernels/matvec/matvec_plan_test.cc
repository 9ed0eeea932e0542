// CPU tests of the matvec planner: kernel choice per type/layout/alignment,
// minimum strides, grid limits and the errors for what no kernel handles.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cstdint>
#include <string>

#include "formats/q6k_dpl.h"
#include "kernels/matvec/matvec_plan.h"

namespace dpl::kernels {
namespace {

using formats::GgmlType;
using formats::TensorLayout;

// A fake device address with the given alignment (the planner never reads it).
const void* Addr(uintptr_t a) { return reinterpret_cast<const void*>(a); }

WeightMatrix Make(GgmlType t, TensorLayout l, int64_t rows, int64_t cols, int64_t stride = -1,
                  uintptr_t addr = 0x10000) {
  WeightMatrix w;
  w.data = Addr(addr);
  w.type = t;
  w.layout = l;
  w.n_rows = rows;
  w.n_cols = cols;
  w.row_stride = stride >= 0 ? stride : MinRowStride(t, l, cols);
  return w;
}

TEST_CASE("MinRowStride per type and layout") {
  CHECK(MinRowStride(GgmlType::kQ4_K, TensorLayout::kRaw, 3584) == 14 * 144);
  CHECK(MinRowStride(GgmlType::kQ6_K, TensorLayout::kRaw, 18944) == 74 * 210);
  CHECK(MinRowStride(GgmlType::kQ6_K, TensorLayout::kDplQ6K, 18944) ==
        static_cast<int64_t>(formats::DplQ6KRowStride(74)));
  CHECK(MinRowStride(GgmlType::kQ6_K, TensorLayout::kDplQ6K, 13824) == 11344);  // 54*210 -> 16
  CHECK(MinRowStride(GgmlType::kQ8_0, TensorLayout::kRaw, 896) == 28 * 34);
  CHECK(MinRowStride(GgmlType::kQ5_0, TensorLayout::kRaw, 96) == 66);
  CHECK(MinRowStride(GgmlType::kF16, TensorLayout::kRaw, 100) == 200);
  CHECK(MinRowStride(GgmlType::kQ4_K, TensorLayout::kRaw, 100) == 0);   // not whole blocks
  CHECK(MinRowStride(GgmlType::kQ4_K, TensorLayout::kDplQ6K, 256) == 0);  // dpl is q6_K only
}

TEST_CASE("PlanMatVec picks the kernel for each type and layout") {
  MatVecKernel k;
  CHECK(PlanMatVec(Make(GgmlType::kQ4_K, TensorLayout::kRaw, 18944, 3584), &k).ok());
  CHECK(k == MatVecKernel::kQ4K);
  CHECK(PlanMatVec(Make(GgmlType::kQ6_K, TensorLayout::kDplQ6K, 3584, 18944), &k).ok());
  CHECK(k == MatVecKernel::kQ6KDpl);
  CHECK(PlanMatVec(Make(GgmlType::kQ6_K, TensorLayout::kRaw, 3584, 18944), &k).ok());
  CHECK(k == MatVecKernel::kQ6KRaw);
  CHECK(PlanMatVec(Make(GgmlType::kQ8_0, TensorLayout::kRaw, 67, 96), &k).ok());  // 102-B rows
  CHECK(k == MatVecKernel::kQ8_0);
  CHECK(PlanMatVec(Make(GgmlType::kQ5_0, TensorLayout::kRaw, 67, 96), &k).ok());  // 66-B rows
  CHECK(k == MatVecKernel::kQ5_0);
  CHECK(PlanMatVec(Make(GgmlType::kF32, TensorLayout::kRaw, 8, 512), &k).ok());
  CHECK(k == MatVecKernel::kF32);
  CHECK(PlanMatVec(Make(GgmlType::kF32, TensorLayout::kRaw, 8, 99), &k).ok());
  CHECK(k == MatVecKernel::kF32Scalar);
  CHECK(PlanMatVec(Make(GgmlType::kF16, TensorLayout::kRaw, 8, 896), &k).ok());
  CHECK(k == MatVecKernel::kF16);
  CHECK(PlanMatVec(Make(GgmlType::kF16, TensorLayout::kRaw, 8, 896, -1, 0x10002), &k).ok());
  CHECK(k == MatVecKernel::kF16Scalar);  // base only 2-byte aligned
  CHECK(UsesQuantizedActivations(MatVecKernel::kQ4K));
  CHECK(!UsesQuantizedActivations(MatVecKernel::kF16));
}

TEST_CASE("PlanMatVec errors name what is wrong") {
  MatVecKernel k;
  absl::Status st = PlanMatVec(Make(GgmlType::kQ4_0, TensorLayout::kRaw, 4, 64), &k);
  CHECK(absl::IsUnimplemented(st));
  CHECK(st.message().find("q4_0") != std::string::npos);
  st = PlanMatVec(Make(GgmlType::kQ4_K, TensorLayout::kDplQ6K, 4, 256, 144), &k);
  CHECK(!st.ok());
  CHECK(st.message().find("dpl_q6k") != std::string::npos);
  st = PlanMatVec(Make(GgmlType::kQ4_K, TensorLayout::kRaw, 4, 256, 140), &k);  // short stride
  CHECK(!st.ok());
  CHECK(st.message().find("row_stride") != std::string::npos);
  st = PlanMatVec(Make(GgmlType::kQ4_K, TensorLayout::kRaw, 4, 256, 152), &k);  // not 16-aligned
  CHECK(!st.ok());
  CHECK(st.message().find("aligned") != std::string::npos);
  st = PlanMatVec(Make(GgmlType::kQ6_K, TensorLayout::kDplQ6K, 4, 256, -1, 0x10008), &k);
  CHECK(!st.ok());
  st = PlanMatVec(Make(GgmlType::kQ8_0, TensorLayout::kRaw, 4, 48), &k);  // not whole blocks
  CHECK(!st.ok());
  CHECK(st.message().find("q8_0") != std::string::npos);
  st = PlanMatVec(Make(GgmlType::kQ8_0, TensorLayout::kRaw, 4, 64, -1, 0x10001), &k);
  CHECK(!st.ok());
  WeightMatrix null_w = Make(GgmlType::kF32, TensorLayout::kRaw, 4, 64);
  null_w.data = nullptr;
  CHECK(!PlanMatVec(null_w, &k).ok());
  CHECK(!PlanMatVec(Make(GgmlType::kF32, TensorLayout::kRaw, 0, 64), &k).ok());
}

TEST_CASE("MatVecGridFor covers every row and token, within CUDA limits") {
  MatVecGrid g;
  CHECK(KSplitFor(152064) == 1);
  CHECK(KSplitFor(18944) == 1);
  CHECK(KSplitFor(13824) == kKSplit);
  CHECK(KSplitFor(3584) == kKSplit);
  CHECK(DecodeDepthFor(152064) == 4);
  CHECK(DecodeDepthFor(18944) == 2);
  REQUIRE(MatVecGridFor(152064, 1, 1, 1, &g).ok());
  CHECK(g.y == 152064 / kRowsPerCta);
  CHECK(g.x == 1);
  REQUIRE(MatVecGridFor(3584, 1, 1, kKSplit, &g).ok());
  CHECK(g.y == 3584 / RowsPerCta(kKSplit));
  for (int ks : {1, kKSplit}) {
    REQUIRE(MatVecGridFor(67, 13, kTokenTile, ks, &g).ok());
    CHECK(g.y * RowsPerCta(ks) >= 67);
    CHECK((g.y - 1) * RowsPerCta(ks) < 67);
    CHECK(g.x == 2);
  }
  CHECK(!MatVecGridFor(kMaxGridY * kRowsPerCta + 1, 1, 1, 1, &g).ok());
  CHECK(!MatVecGridFor(0, 1, 1, 1, &g).ok());
  CHECK(!MatVecGridFor(10, 1, 1, 3, &g).ok());
  CHECK(kRowsPerCta == kThreadsPerCta / kLanesPerRow);
}

}  // namespace
}  // namespace dpl::kernels
