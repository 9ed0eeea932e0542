// CPU tests of the matvec planner: kernel choice per type/layout/alignment,
// minimum strides, grid limits and the errors for what no kernel handles.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "formats/tensor_layout.h"
#include "kernels/act_quant.h"
#include "kernels/matvec/matvec_plan.h"
#include "kernels/matvec/matvec_rope.h"

namespace dpl::kernels {
namespace {

using formats::GgmlType;
using formats::TensorLayout;

// A fake device address with the given alignment (the planner never reads it).
const void* Addr(uintptr_t a) { return reinterpret_cast<const void*>(a); }

// The H200's facts (132 SMs, 7 resident q6_K decode CTAs per SM).
DecodeTuning H200() {
  DecodeTuning t;
  t.pdl = false;
  t.num_sms = 132;
  t.q6k_ctas_per_sm = 7;
  return t;
}

// The planned kernel, or an error status.
absl::StatusOr<MatVecKernel> KernelOf(const WeightMatrix& w) {
  absl::StatusOr<MatVecPlan> plan = PlanMatVec(w, H200());
  if (!plan.ok()) return plan.status();
  return plan->kernel;
}

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
  CHECK(MinRowStride(GgmlType::kQ6_K, TensorLayout::kDpl, 18944) ==
        static_cast<int64_t>(formats::DplQ6KRowStride(74)));
  CHECK(MinRowStride(GgmlType::kQ6_K, TensorLayout::kDpl, 13824) == 11344);  // 54*210 -> 16
  CHECK(MinRowStride(GgmlType::kQ8_0, TensorLayout::kRaw, 896) == 28 * 34);
  CHECK(MinRowStride(GgmlType::kQ5_0, TensorLayout::kRaw, 96) == 66);
  CHECK(MinRowStride(GgmlType::kF16, TensorLayout::kRaw, 100) == 200);
  CHECK(MinRowStride(GgmlType::kQ4_K, TensorLayout::kRaw, 100) == 0);   // not whole blocks
  CHECK(MinRowStride(GgmlType::kQ4_K, TensorLayout::kDpl, 256) == 0);  // q4_K has no dpl layout
  CHECK(MinRowStride(GgmlType::kQ8_0, TensorLayout::kDpl, 896) == 28 * 34 + 8);  // padded to 16
  CHECK(MinRowStride(GgmlType::kQ3_K, TensorLayout::kDpl, 3584) == 14 * 110 + 12);
  CHECK(MinRowStride(GgmlType::kIQ4_XS, TensorLayout::kRaw, 512) == 272);
}

TEST_CASE("PlanMatVec picks the kernel for each type and layout") {
  MatVecKernel k;
  REQUIRE(KernelOf(Make(GgmlType::kQ4_K, TensorLayout::kRaw, 18944, 3584)).ok());
  k = *KernelOf(Make(GgmlType::kQ4_K, TensorLayout::kRaw, 18944, 3584));
  CHECK(k == MatVecKernel::kQ4K);
  REQUIRE(KernelOf(Make(GgmlType::kQ6_K, TensorLayout::kDpl, 3584, 18944)).ok());
  k = *KernelOf(Make(GgmlType::kQ6_K, TensorLayout::kDpl, 3584, 18944));
  CHECK(k == MatVecKernel::kQ6KDpl);
  REQUIRE(KernelOf(Make(GgmlType::kQ6_K, TensorLayout::kRaw, 3584, 18944)).ok());
  k = *KernelOf(Make(GgmlType::kQ6_K, TensorLayout::kRaw, 3584, 18944));
  CHECK(k == MatVecKernel::kQ6KRaw);
  REQUIRE(KernelOf(Make(GgmlType::kQ8_0, TensorLayout::kRaw, 67, 96)).ok());
  k = *KernelOf(Make(GgmlType::kQ8_0, TensorLayout::kRaw, 67, 96));  // 102-B rows
  CHECK(k == MatVecKernel::kQ8_0);
  REQUIRE(KernelOf(Make(GgmlType::kQ5_0, TensorLayout::kRaw, 67, 96)).ok());
  k = *KernelOf(Make(GgmlType::kQ5_0, TensorLayout::kRaw, 67, 96));  // 66-B rows
  CHECK(k == MatVecKernel::kQ5_0);
  REQUIRE(KernelOf(Make(GgmlType::kF32, TensorLayout::kRaw, 8, 512)).ok());
  k = *KernelOf(Make(GgmlType::kF32, TensorLayout::kRaw, 8, 512));
  CHECK(k == MatVecKernel::kF32);
  REQUIRE(KernelOf(Make(GgmlType::kF32, TensorLayout::kRaw, 8, 99)).ok());
  k = *KernelOf(Make(GgmlType::kF32, TensorLayout::kRaw, 8, 99));
  CHECK(k == MatVecKernel::kF32Scalar);
  REQUIRE(KernelOf(Make(GgmlType::kF16, TensorLayout::kRaw, 8, 896)).ok());
  k = *KernelOf(Make(GgmlType::kF16, TensorLayout::kRaw, 8, 896));
  CHECK(k == MatVecKernel::kF16);
  REQUIRE(KernelOf(Make(GgmlType::kF16, TensorLayout::kRaw, 8, 896, -1, 0x10002)).ok());
  k = *KernelOf(Make(GgmlType::kF16, TensorLayout::kRaw, 8, 896, -1, 0x10002));
  CHECK(k == MatVecKernel::kF16Scalar);  // base only 2-byte aligned
  CHECK(UsesQuantizedActivations(MatVecKernel::kQ4K));
  CHECK(!UsesQuantizedActivations(MatVecKernel::kF16));
  CHECK(!UsesQuantizedActivations(MatVecKernel::kBF16));
  // Every weight type the GPU runs, raw and (where DplPlanesOf has one) dpl.
  const struct {
    GgmlType type;
    MatVecKernel raw, dpl;  // dpl == raw: no dpl layout
  } types[] = {
      {GgmlType::kQ8_0, MatVecKernel::kQ8_0, MatVecKernel::kQ8_0Dpl},
      {GgmlType::kQ4_0, MatVecKernel::kQ4_0, MatVecKernel::kQ4_0Dpl},
      {GgmlType::kQ4_1, MatVecKernel::kQ4_1, MatVecKernel::kQ4_1Dpl},
      {GgmlType::kQ5_0, MatVecKernel::kQ5_0, MatVecKernel::kQ5_0Dpl},
      {GgmlType::kQ5_1, MatVecKernel::kQ5_1, MatVecKernel::kQ5_1Dpl},
      {GgmlType::kIQ4_NL, MatVecKernel::kIQ4NL, MatVecKernel::kIQ4NLDpl},
      {GgmlType::kQ2_K, MatVecKernel::kQ2K, MatVecKernel::kQ2KDpl},
      {GgmlType::kQ3_K, MatVecKernel::kQ3K, MatVecKernel::kQ3KDpl},
      {GgmlType::kQ4_K, MatVecKernel::kQ4K, MatVecKernel::kQ4K},
      {GgmlType::kQ5_K, MatVecKernel::kQ5K, MatVecKernel::kQ5K},
      {GgmlType::kQ6_K, MatVecKernel::kQ6KRaw, MatVecKernel::kQ6KDpl},
      {GgmlType::kIQ4_XS, MatVecKernel::kIQ4XS, MatVecKernel::kIQ4XSDpl},
      {GgmlType::kBF16, MatVecKernel::kBF16, MatVecKernel::kBF16},
  };
  for (const auto& t : types) {
    CAPTURE(formats::TraitsOf(t.type).name);
    absl::StatusOr<MatVecKernel> raw = KernelOf(Make(t.type, TensorLayout::kRaw, 64, 4096));
    REQUIRE_MESSAGE(raw.ok(), raw.status().ToString());
    CHECK(*raw == t.raw);
    CHECK(UsesQuantizedActivations(*raw) == (t.type != GgmlType::kBF16));
    absl::StatusOr<MatVecKernel> dpl = KernelOf(Make(t.type, TensorLayout::kDpl, 64, 4096));
    CHECK(dpl.ok() == (t.dpl != t.raw));
    if (dpl.ok()) CHECK(*dpl == t.dpl);
  }
  CHECK(KernelOf(Make(GgmlType::kBF16, TensorLayout::kRaw, 8, 100)).value() == MatVecKernel::kBF16Scalar);
  // Raw blocks need their own alignment (q5_1: 24-byte blocks, 8-aligned), dpl rows 16.
  CHECK(!KernelOf(Make(GgmlType::kQ5_1, TensorLayout::kRaw, 4, 64, -1, 0x10004)).ok());
  CHECK(KernelOf(Make(GgmlType::kQ5_1, TensorLayout::kRaw, 4, 64, -1, 0x10008)).ok());
  CHECK(!KernelOf(Make(GgmlType::kQ8_0, TensorLayout::kDpl, 4, 64, -1, 0x10008)).ok());
}

TEST_CASE("PlanMatVec errors name what is wrong") {
  absl::Status st = KernelOf(Make(GgmlType::kIQ2_XXS, TensorLayout::kRaw, 4, 256)).status();
  CHECK(absl::IsUnimplemented(st));
  CHECK(st.message().find("iq2_xxs") != std::string::npos);
  st = KernelOf(Make(GgmlType::kQ4_K, TensorLayout::kDpl, 4, 256, 144)).status();
  CHECK(!st.ok());
  CHECK(st.message().find("q4_K has no dpl layout") != std::string::npos);
  st = KernelOf(Make(GgmlType::kQ4_K, TensorLayout::kRaw, 4, 256, 140)).status();  // short stride
  CHECK(!st.ok());
  CHECK(st.message().find("row_stride") != std::string::npos);
  st = KernelOf(Make(GgmlType::kQ4_K, TensorLayout::kRaw, 4, 256, 152)).status();  // not 16-aligned
  CHECK(!st.ok());
  CHECK(st.message().find("aligned") != std::string::npos);
  st = KernelOf(Make(GgmlType::kQ6_K, TensorLayout::kDpl, 4, 256, -1, 0x10008)).status();
  CHECK(!st.ok());
  st = KernelOf(Make(GgmlType::kQ8_0, TensorLayout::kRaw, 4, 48)).status();  // not whole blocks
  CHECK(!st.ok());
  CHECK(st.message().find("q8_0") != std::string::npos);
  st = KernelOf(Make(GgmlType::kQ8_0, TensorLayout::kRaw, 4, 64, -1, 0x10001)).status();
  CHECK(!st.ok());
  WeightMatrix null_w = Make(GgmlType::kF32, TensorLayout::kRaw, 4, 64);
  null_w.data = nullptr;
  CHECK(!KernelOf(null_w).ok());
  CHECK(!KernelOf(Make(GgmlType::kF32, TensorLayout::kRaw, 0, 64)).ok());
}

TEST_CASE("decode geometry per type and height reproduces the H200 sweep") {
  const DecodeTuning t = H200();
  const MatVecGeometry plain_long = {1, 1, 2, false}, plain_short = {1, 4, 2, false};
  const MatVecGeometry head = {1, 1, 4, false};
  // lm heads: many waves, no k-split; q6_K depth 1, other types depth 4.
  CHECK(DecodeGeometryFor(MatVecKernel::kQ6KDpl, 152064, t) == MatVecGeometry{1, 1, 1, false});
  CHECK(DecodeGeometryFor(MatVecKernel::kQ6KRaw, 152064, t) == MatVecGeometry{1, 1, 1, false});
  CHECK(DecodeGeometryFor(MatVecKernel::kQ4K, 152064, t) == head);
  // 512-row attn_k/v: launch-bound, k-split 4.
  CHECK(DecodeGeometryFor(MatVecKernel::kQ4K, 512, t) == plain_short);
  // q4_K mid-size: depth 1 pipelined, k-split 1 from 32768 rows, 2 from
  // 6144, else 4.
  CHECK(DecodeGeometryFor(MatVecKernel::kQ4K, 37888, t) == MatVecGeometry{1, 1, 1, true});
  CHECK(DecodeGeometryFor(MatVecKernel::kQ4K, 32767, t) == MatVecGeometry{1, 2, 1, true});
  CHECK(DecodeGeometryFor(MatVecKernel::kQ4K, 27648, t) == MatVecGeometry{1, 2, 1, true});
  CHECK(DecodeGeometryFor(MatVecKernel::kQ4K, 7168, t) == MatVecGeometry{1, 2, 1, true});
  CHECK(DecodeGeometryFor(MatVecKernel::kQ4K, 5120, t) == MatVecGeometry{1, 4, 1, true});
  CHECK(DecodeGeometryFor(MatVecKernel::kQ4K, 3584, t) == MatVecGeometry{1, 4, 1, true});
  // q6_K: the largest k-split whose grid is one wave of 7 x 132 CTAs.
  CHECK(DecodeGeometryFor(MatVecKernel::kQ6KDpl, 3584, t) == MatVecGeometry{1, 4, 1, true});
  CHECK(DecodeGeometryFor(MatVecKernel::kQ6KDpl, 5120, t) == MatVecGeometry{1, 2, 1, true});
  CHECK(DecodeGeometryFor(MatVecKernel::kQ6KRaw, 5120, t) == MatVecGeometry{1, 2, 1, true});
  CHECK(DecodeGeometryFor(MatVecKernel::kQ6KDpl, 18944, t) == plain_long);
  // A GPU with half the SMs has half the wave: 5120 rows no longer fit k-split 2.
  DecodeTuning small = t;
  small.num_sms = 66;
  CHECK(DecodeGeometryFor(MatVecKernel::kQ6KDpl, 3584, small) == MatVecGeometry{1, 2, 1, true});
  CHECK(DecodeGeometryFor(MatVecKernel::kQ6KDpl, 5120, small) == plain_short);
  // q5_K: no pipe from 8192 rows; q8_0 dpl: depth 4 from 16384 rows.
  CHECK(DecodeGeometryFor(MatVecKernel::kQ5K, 18944, t) == MatVecGeometry{1, 1, 1, false});
  CHECK(DecodeGeometryFor(MatVecKernel::kQ5K, 3584, t) == MatVecGeometry{1, 4, 1, true});
  CHECK(DecodeGeometryFor(MatVecKernel::kQ8_0Dpl, 18944, t) == MatVecGeometry{1, 1, 4, false});
  CHECK(DecodeGeometryFor(MatVecKernel::kQ8_0Dpl, 3584, t) == plain_short);
  // A MoE router (f32, few rows): eight warps a CTA, four loads deep; taller
  // f32 matrices keep the plain geometry.
  CHECK(DecodeGeometryFor(MatVecKernel::kF32, 128, t) == MatVecGeometry{1, 8, 4, false});
  CHECK(DecodeGeometryFor(MatVecKernel::kF32, 2048, t) == plain_short);
  // Other types keep the plain geometry.
  CHECK(DecodeGeometryFor(MatVecKernel::kQ8_0, 3584, t) == plain_short);
  CHECK(DecodeGeometryFor(MatVecKernel::kQ8_0, 18944, t) == plain_long);
  // Every planned geometry is compiled; prompts use the token tile.
  const absl::StatusOr<MatVecPlan> plan =
      PlanMatVec(Make(GgmlType::kQ4_K, TensorLayout::kRaw, 18944, 3584), t);
  REQUIRE(plan.ok());
  CHECK(IsCompiledGeometry(plan->decode));
  CHECK(IsCompiledGeometry(plan->prompt));
  CHECK(plan->prompt.token_tile == kTokenTile);
  CHECK(plan->prompt.ksplit == 1);  // 1184 row blocks of 16
  // Without f32_wide_tile, the token tile splits k 4 ways where row blocks
  // of 16 leave SMs idle (a MoE router: 8 blocks of 16 rows, 32 of 4), not
  // past one a SM.
  DecodeTuning plain = t;
  plain.f32_wide_tile = false;
  const absl::StatusOr<MatVecPlan> router =
      PlanMatVec(Make(GgmlType::kF32, TensorLayout::kRaw, 128, 2048), plain);
  REQUIRE(router.ok());
  CHECK(router->prompt == MatVecGeometry{kTokenTile, 4, 2, false});
  CHECK(IsCompiledGeometry(router->prompt));
  // With it (the default), an f32 matrix of few row blocks takes the deeper
  // tile, compiled for the f32 kernel alone; a q4_K one keeps the plain.
  CHECK(t.f32_wide_tile);
  const absl::StatusOr<MatVecPlan> wide_router = PlanMatVec(Make(GgmlType::kF32, TensorLayout::kRaw, 128, 2048), t);
  REQUIRE(wide_router.ok());
  CHECK(wide_router->prompt == kF32WideTile);
  CHECK(IsCompiledFor(MatVecKernel::kF32, kF32WideTile));
  CHECK_FALSE(IsCompiledFor(MatVecKernel::kQ4K, kF32WideTile));
  CHECK(MatVecGridFor(128, 4, kF32WideTile).ok());
  const absl::StatusOr<MatVecPlan> wide_q4 = PlanMatVec(Make(GgmlType::kQ4_K, TensorLayout::kRaw, 512, 3584), t);
  REQUIRE(wide_q4.ok());
  CHECK(wide_q4->prompt == MatVecGeometry{kTokenTile, 4, 2, false});
  for (const DecodeTuning& u : {plain, t}) {
    CAPTURE(u.f32_wide_tile);
    const absl::StatusOr<MatVecPlan> edge =
        PlanMatVec(Make(GgmlType::kF32, TensorLayout::kRaw, 16 * t.num_sms, 2048), u);
    REQUIRE(edge.ok());
    CHECK(edge->prompt.ksplit == 1);
  }
  const absl::StatusOr<MatVecPlan> below =
      PlanMatVec(Make(GgmlType::kF32, TensorLayout::kRaw, 16 * t.num_sms - 16, 2048), plain);
  REQUIRE(below.ok());
  CHECK(below->prompt.ksplit == 4);
  const absl::StatusOr<MatVecPlan> below_wide =
      PlanMatVec(Make(GgmlType::kF32, TensorLayout::kRaw, 16 * t.num_sms - 16, 2048), t);
  REQUIRE(below_wide.ok());
  CHECK(below_wide->prompt == kF32WideTile);
}

TEST_CASE("PlanMatVecGroups: one launch per kernel, planned for the total height") {
  const DecodeTuning t = H200();
  // A qwen2.5-7B layer of Q4_K_M: q and k q4_K, v q6_K (dpl) in some layers.
  const WeightMatrix q = Make(GgmlType::kQ4_K, TensorLayout::kRaw, 3584, 3584);
  const WeightMatrix k = Make(GgmlType::kQ4_K, TensorLayout::kRaw, 512, 3584);
  const WeightMatrix v6 = Make(GgmlType::kQ6_K, TensorLayout::kDpl, 512, 3584);
  absl::StatusOr<std::vector<MatVecGroupPlan>> g = PlanMatVecGroups({q, k, k}, t);
  REQUIRE(g.ok());
  REQUIRE(g->size() == 1);
  CHECK((*g)[0].members == std::vector<int>{0, 1, 2});
  CHECK((*g)[0].plan.kernel == MatVecKernel::kQ4K);
  CHECK((*g)[0].plan.decode == DecodeGeometryFor(MatVecKernel::kQ4K, 4608, t));
  CHECK(!(*g)[0].plan.mixed);
  // A 14B layer's q6_K V joins the q4_K launch as its mixed last part, at
  // q4_K's geometry for the three heights (k-split 2: 896 CTAs, one wave of
  // 7 x 132).
  const WeightMatrix q14 = Make(GgmlType::kQ4_K, TensorLayout::kRaw, 5120, 5120);
  const WeightMatrix k14 = Make(GgmlType::kQ4_K, TensorLayout::kRaw, 1024, 5120);
  const WeightMatrix v14 = Make(GgmlType::kQ6_K, TensorLayout::kDpl, 1024, 5120);
  g = PlanMatVecGroups({q14, k14, v14}, t);
  REQUIRE(g.ok());
  REQUIRE(g->size() == 1);
  CHECK((*g)[0].members == std::vector<int>{0, 1, 2});
  CHECK((*g)[0].plan.kernel == MatVecKernel::kQ4K);
  CHECK((*g)[0].plan.mixed);
  CHECK((*g)[0].plan.last_kernel == MatVecKernel::kQ6KDpl);
  CHECK((*g)[0].plan.decode == MatVecGeometry{1, 2, 1, true});
  CHECK(MixedGeometryFor(MatVecKernel::kQ4K, 7168, t) == MatVecGeometry{1, 2, 1, true});
  CHECK(MixedGeometryFor(MatVecKernel::kQ4K, 3696, t) == MatVecGeometry{1, 4, 1, true});
  // Also in another input order: the group of one goes last.
  g = PlanMatVecGroups({v14, q14, k14}, t);
  REQUIRE(g.ok());
  REQUIRE(g->size() == 1);
  CHECK((*g)[0].members == std::vector<int>{1, 2, 0});
  // The 7B's (4608 rows at k-split 4: 1152 CTAs, 1.25 waves) stays two
  // launches, the q6_K one planned for its own height.
  CHECK(MixedGeometryFor(MatVecKernel::kQ4K, 4608, t).ksplit == 0);
  g = PlanMatVecGroups({q, k, v6}, t);
  REQUIRE(g.ok());
  REQUIRE(g->size() == 2);
  CHECK((*g)[0].members == std::vector<int>{0, 1});
  CHECK((*g)[1].members == std::vector<int>{2});
  CHECK((*g)[1].plan.kernel == MatVecKernel::kQ6KDpl);
  CHECK((*g)[1].plan.decode == DecodeGeometryFor(MatVecKernel::kQ6KDpl, 512, t));
  // No mixed launch either: two q6_K members, a q4_K group of three, a
  // geometry without a mixed form (below 2048 rows), a grid past one wave.
  g = PlanMatVecGroups({v6, k, v6}, t);  // same kernel, not adjacent: still one launch
  REQUIRE(g.ok());
  REQUIRE(g->size() == 2);
  CHECK((*g)[0].members == std::vector<int>{0, 2});
  CHECK(!(*g)[0].plan.mixed);
  CHECK(!(*g)[1].plan.mixed);
  g = PlanMatVecGroups({k, v6}, t);
  REQUIRE(g.ok());
  CHECK(g->size() == 2);
  CHECK(MixedGeometryFor(MatVecKernel::kQ4K, 14784, t).ksplit == 0);  // k-split 2: 1848 CTAs
  // Three q4_K members leave no room for a fourth part.
  g = PlanMatVecGroups({q, k, k, v6}, t);
  REQUIRE(g.ok());
  CHECK(g->size() == 2);
  // Different widths cannot share x.
  CHECK(!PlanMatVecGroups({q, Make(GgmlType::kQ4_K, TensorLayout::kRaw, 512, 4096)}, t).ok());
  // Ungrouped (A/B): one launch per matrix.
  DecodeTuning apart = t;
  apart.group_matvecs = false;
  g = PlanMatVecGroups({q, k, k}, apart);
  REQUIRE(g.ok());
  CHECK(g->size() == 3);
  CHECK((*g)[2].plan.decode == DecodeGeometryFor(MatVecKernel::kQ4K, 512, t));
  // pdl comes from the tuning.
  DecodeTuning pdl = t;
  pdl.pdl = true;
  CHECK(PlanMatVec(q, pdl)->pdl);
  pdl.pdl = false;
  CHECK(!PlanMatVec(q, pdl)->pdl);
}

TEST_CASE("a tuning's geometry override replaces the planned one for its kernel and shape only") {
  DecodeTuning t = H200();
  t.matvec_geometry = {{"q4_K", 4608, 3584, 8, 2, false}, {"q4_K", 3584, 18944, 2, 4, false}};
  const WeightMatrix q = Make(GgmlType::kQ4_K, TensorLayout::kRaw, 3584, 3584);
  const WeightMatrix k = Make(GgmlType::kQ4_K, TensorLayout::kRaw, 512, 3584);
  // The grouped launch is matched by its total height.
  absl::StatusOr<std::vector<MatVecGroupPlan>> g = PlanMatVecGroups({q, k, k}, t);
  REQUIRE(g.ok());
  REQUIRE(g->size() == 1);
  CHECK((*g)[0].plan.decode == MatVecGeometry{1, 8, 2, false});
  // A single matrix by its own shape; the width is part of the key.
  absl::StatusOr<MatVecPlan> down = PlanMatVec(Make(GgmlType::kQ4_K, TensorLayout::kRaw, 3584, 18944), t);
  REQUIRE(down.ok());
  CHECK(down->decode == MatVecGeometry{1, 2, 4, false});
  absl::StatusOr<MatVecPlan> wo = PlanMatVec(q, t);
  REQUIRE(wo.ok());
  CHECK(wo->decode == DecodeGeometryFor(MatVecKernel::kQ4K, 3584, t));
  // Another kernel of the same shape keeps its own plan.
  absl::StatusOr<MatVecPlan> down6 = PlanMatVec(Make(GgmlType::kQ6_K, TensorLayout::kDpl, 3584, 18944), t);
  REQUIRE(down6.ok());
  CHECK(down6->decode == DecodeGeometryFor(MatVecKernel::kQ6KDpl, 3584, t));
}

TEST_CASE("FoldsRope: the planned q4_K / q6_K Q/K/V launches, nothing else") {
  const DecodeTuning t = H200();
  const MatVecKernel q4 = MatVecKernel::kQ4K, q6 = MatVecKernel::kQ6KDpl;
  // The 7B's q/k (+ v) launch, its lone q6_K V, the 14B's mixed launch.
  const WeightMatrix q = Make(GgmlType::kQ4_K, TensorLayout::kRaw, 3584, 3584);
  const WeightMatrix k = Make(GgmlType::kQ4_K, TensorLayout::kRaw, 512, 3584);
  const WeightMatrix v6 = Make(GgmlType::kQ6_K, TensorLayout::kDpl, 512, 3584);
  absl::StatusOr<std::vector<MatVecGroupPlan>> g = PlanMatVecGroups({q, k, v6}, t);
  REQUIRE(g.ok());
  REQUIRE(g->size() == 2);
  for (const MatVecGroupPlan& p : *g) {
    CHECK(FoldsRope(p.plan.kernel, p.plan.mixed ? p.plan.last_kernel : p.plan.kernel, p.plan.decode));
  }
  CHECK(FoldsRope(q4, q6, MixedGeometryFor(q4, 7168, t)));
  // Not: other types, several tokens, the unpipelined lm-head geometry, k-split 8,
  // a q6_K-first mixed pair.
  CHECK(!FoldsRope(MatVecKernel::kQ8_0Dpl, MatVecKernel::kQ8_0Dpl, MatVecGeometry{1, 4, 1, true}));
  CHECK(!FoldsRope(q4, q4, MatVecGeometry{kTokenTile, 1, 2, false}));
  CHECK(!FoldsRope(q6, q6, MatVecGeometry{1, 1, 1, false}));
  CHECK(!FoldsRope(q4, q4, MatVecGeometry{1, 8, 1, true}));
  CHECK(!FoldsRope(q6, q4, MatVecGeometry{1, 4, 1, true}));
  CHECK(!FoldsRope(q4, q6, MatVecGeometry{1, 4, 2, false}));
}

TEST_CASE("MatVecGridFor covers every row and token, within CUDA limits") {
  const MatVecGeometry one = {1, 1, 2, false}, split = {1, 4, 2, false};
  absl::StatusOr<MatVecGrid> g = MatVecGridFor(152064, 1, one);
  REQUIRE(g.ok());
  CHECK(g->y == 152064 / 16);
  CHECK(g->x == 1);
  g = MatVecGridFor(3584, 1, split);
  REQUIRE(g.ok());
  CHECK(g->y == 3584 / 4);
  CHECK(RowsPerCta(2) == 8);
  CHECK(RowsPerCta(8) == 4);
  for (int ks : {1, 4}) {
    g = MatVecGridFor(67, 13, MatVecGeometry{kTokenTile, ks, 2, false});
    REQUIRE(g.ok());
    CHECK(g->y * RowsPerCta(ks) >= 67);
    CHECK((g->y - 1) * RowsPerCta(ks) < 67);
    CHECK(g->x == 2);
  }
  CHECK(!MatVecGridFor(kMaxGridY * 16 + 1, 1, one).ok());
  CHECK(!MatVecGridFor(0, 1, one).ok());
  CHECK(!MatVecGridFor(10, 1, MatVecGeometry{1, 3, 2, false}).ok());        // k-split 3
  CHECK(!MatVecGridFor(10, 9, MatVecGeometry{kTokenTile, 2, 2, false}).ok());  // not compiled
  CHECK(!MatVecGridFor(10, 9, MatVecGeometry{kTokenTile, 1, 2, true}).ok());
}

TEST_CASE("the int8 mma form covers the types of Q4_K_M, Q5_K_M, Q6_K and Q8_0 files") {
  for (MatVecKernel k : {MatVecKernel::kQ4K, MatVecKernel::kQ5K, MatVecKernel::kQ6KDpl,
                         MatVecKernel::kQ6KRaw, MatVecKernel::kQ8_0, MatVecKernel::kQ8_0Dpl}) {
    CAPTURE(MatVecKernelName(k));
    CHECK(MatVecMmaSupports(k));
  }
  for (MatVecKernel k : {MatVecKernel::kF32, MatVecKernel::kF16, MatVecKernel::kQ4_0,
                         MatVecKernel::kQ4_0Dpl, MatVecKernel::kQ3K, MatVecKernel::kQ2K,
                         MatVecKernel::kIQ4XS}) {
    CAPTURE(MatVecKernelName(k));
    CHECK(!MatVecMmaSupports(k));
  }
  CHECK(MatVecMmaSupports(MatVecKernel::kQ8_0Dpl, 1280));
  CHECK(!MatVecMmaSupports(MatVecKernel::kQ8_0Dpl, 896));  // 3.5 blocks of 256: the token tile
  CHECK(!MatVecMmaSupports(MatVecKernel::kQ4_0, 4096));
  CHECK(kMmaMaxTokens == 64);
  CHECK(DecodeTuning{}.mma_max_tokens <= kMmaMaxTokens);
  // The f16 form: q4_K, q5_K, q6_K dpl and q8_0 dpl, whole 256-column blocks.
  CHECK(MatVecMmaF16Supports(MatVecKernel::kQ4K, 3584));
  CHECK(MatVecMmaF16Supports(MatVecKernel::kQ6KDpl, 18944));
  CHECK(MatVecMmaF16Supports(MatVecKernel::kQ8_0Dpl, 3584));
  CHECK(MatVecMmaF16Supports(MatVecKernel::kQ5K, 3584));
  CHECK(!MatVecMmaF16Supports(MatVecKernel::kQ4K, 3584 + 32));
  CHECK(!MatVecMmaF16Supports(MatVecKernel::kQ8_0Dpl, 896));
  for (MatVecKernel k : {MatVecKernel::kQ6KRaw, MatVecKernel::kQ8_0, MatVecKernel::kF16}) {
    CAPTURE(MatVecKernelName(k));
    CHECK(!MatVecMmaF16Supports(k, 3584));
  }
}

// A plan carries the f16 form's threshold only where the kernel has it.
TEST_CASE("the f16 mma threshold reaches q4_K, q5_K, q6_K dpl and q8_0 dpl plans only") {
  DecodeTuning t = H200();
  // The f16 forms of q4_K, q5_K, q6_K and q8_0 are on by default (the
  // thresholds measured, tuning.h).
  for (int min : {t.mma_f16_min_tokens, t.mma_f16_min_tokens_q5k, t.mma_f16_min_tokens_q6k,
                  t.mma_f16_min_tokens_q8_0}) {
    CHECK(min >= 2);
    CHECK(min <= kMmaMaxTokens);
  }
  t.mma_f16_min_tokens = 16;
  t.mma_f16_min_tokens_q5k = 12;
  t.mma_f16_min_tokens_q6k = 4;
  t.mma_f16_min_tokens_q8_0 = 24;
  t.mma_f16_small_ctas_per_sm = 4;
  const absl::StatusOr<MatVecPlan> q4 = PlanMatVec(Make(GgmlType::kQ4_K, TensorLayout::kRaw, 512, 3584), t);
  REQUIRE(q4.ok());
  CHECK(q4->mma_f16_min_tokens == 16);
  CHECK(q4->mma_f16_small_ctas == 4);
  CHECK(q4->num_sms == t.num_sms);
  // The other types: their own threshold, or none (0) without the form.
  const struct {
    GgmlType type;
    TensorLayout layout;
    int want;
  } cases[] = {{GgmlType::kQ5_K, TensorLayout::kRaw, 12}, {GgmlType::kQ6_K, TensorLayout::kDpl, 4},
               {GgmlType::kQ6_K, TensorLayout::kRaw, 0},  {GgmlType::kQ8_0, TensorLayout::kDpl, 24},
               {GgmlType::kQ8_0, TensorLayout::kRaw, 0},  {GgmlType::kQ4_0, TensorLayout::kDpl, 0}};
  for (const auto& c : cases) {
    CAPTURE(static_cast<int>(c.type));
    CAPTURE(static_cast<int>(c.layout));
    const absl::StatusOr<MatVecPlan> plan = PlanMatVec(Make(c.type, c.layout, 512, 3584), t);
    REQUIRE(plan.ok());
    CHECK(plan->mma_f16_min_tokens == c.want);
    // The wide launch's limit reaches the same plans (and only past 64).
    t.mma_f16_max_tokens = 512;
    t.mma_f16_wide_split = false;
    const absl::StatusOr<MatVecPlan> wide = PlanMatVec(Make(c.type, c.layout, 512, 3584), t);
    REQUIRE(wide.ok());
    CHECK(wide->mma_f16_max_tokens == (c.want > 0 ? 512 : 0));
    CHECK(!wide->mma_f16_wide_split);  // off when asked off
    t.mma_f16_wide_split = true;
    const absl::StatusOr<MatVecPlan> split = PlanMatVec(Make(c.type, c.layout, 512, 3584), t);
    REQUIRE(split.ok());
    CHECK(split->mma_f16_wide_split == (c.want > 0));
    t.mma_f16_wide_split = false;
    t.mma_f16_max_tokens = kMmaMaxTokens;
    const absl::StatusOr<MatVecPlan> narrow = PlanMatVec(Make(c.type, c.layout, 512, 3584), t);
    REQUIRE(narrow.ok());
    CHECK(narrow->mma_f16_max_tokens == 0);
    t.mma_f16_max_tokens = 0;
  }
}

// The f16 copy of the activations (act_quant.h): every (token, column) of a
// pass has its own half in [0, slots x columns); up to 64 tokens one
// chunk-major tile of F16TokenSlots slots; past 64, tiles of 64 tokens
// each h_cols x 64 halves, so the f16 form's CTA for tile x finds its
// tokens at x 64 h_cols, laid out as a 64-token copy would be.
TEST_CASE("the f16 copy's index: a half per value, 64-token tiles past 64 tokens") {
  CHECK(F16TokenSlots(1) == 8);
  CHECK(F16TokenSlots(9) == 16);
  CHECK(F16TokenSlots(33) == 64);
  CHECK(F16TokenSlots(64) == 64);
  CHECK(F16TokenSlots(65) == 128);
  CHECK(F16TokenSlots(512) == 512);
  CHECK(F16TokenSlots(513) == 576);
  const int cols = 96;
  for (int n : {5, 33, 64, 65, 130}) {
    CAPTURE(n);
    const int slots = F16TokenSlots(n);
    std::vector<int> seen(static_cast<size_t>(slots) * cols, 0);
    bool inside = true;
    for (int t = 0; t < n; ++t) {
      for (int c = 0; c < cols; ++c) {
        const int64_t i = F16Index(t, c, slots, cols);
        if (i < 0 || i >= static_cast<int64_t>(seen.size())) {
          inside = false;
          continue;
        }
        ++seen[static_cast<size_t>(i)];
        if (t >= 64) {  // a later tile: the first tile's place, one tile of halves on
          CHECK(i == F16Index(t % 64, c, 64, cols) + int64_t{t / 64} * 64 * cols);
        }
      }
    }
    CHECK(inside);
    int twice = 0;
    for (int v : seen) twice += v > 1;
    CHECK(twice == 0);
  }
  // Within a tile: chunk-major, 16-byte chunks of 8 halves a token slot
  // (column 0..7 of the block order F16MmaPos gives).
  CHECK(F16Index(0, 0, 64, cols) == 0);
  CHECK(F16Index(1, 0, 64, cols) == 8);
  CHECK(F16Index(0, 8, 64, cols) == 2);  // column 8 is position 2 of the block: F16MmaPos
  CHECK(F16Index(0, 32, 64, cols) == 4 * 64 * 8);  // block 1's first chunk after block 0's four
}

// The scratch for the k-split partials (kMmaMaxPartialRows a token, per
// launch of up to kMaxMatVecParts matrices) must hold what MmaSplits asks of
// any matrix; a split needs at least one 256-column block.
TEST_CASE("the mma k-split fits its scratch and its blocks for every matrix") {
  CHECK(MmaSplits(18944, 3584) == 2);  // 7B gate/up: 296 row blocks
  CHECK(MmaSplits(3584, 18944) == 8);  // 7B down: 56
  CHECK(MmaSplits(512, 3584) == 8);    // 7B k/v: 8
  CHECK(MmaSplits(152064, 3584) == 1);  // lm head
  CHECK(MmaSplits(4096, 256) == 1);     // one block: nothing to split
  CHECK(MmaSplits(64, 512) == 2);       // two blocks
  CHECK(MmaF16Splits(18944, 3584) == 2);  // 7B gate/up: 148 row blocks of 128
  CHECK(MmaF16Splits(3584, 18944) == 8);  // 7B down: 28
  CHECK(MmaF16Splits(3584, 18944, 196) == 7);  // a smaller target: Q/K/V in one wave of 264
  CHECK(MmaF16Splits(18944, 3584, 0) == 1);    // no target: no split
  CHECK(MmaF16Splits(40000, 1280) == 1);  // 313
  CHECK(MmaF16Splits(67, 256) == 2);      // two 128-column stages
  for (int64_t rows = 1; rows <= 70000; rows += rows < 2048 ? 1 : 97) {
    for (int64_t cols : {256, 512, 768, 1280, 3584, 5120, 18944, 27648}) {
      const int s16 = MmaF16Splits(rows, cols);
      const int64_t ctas16 = (rows + kMmaF16CtaRows - 1) / kMmaF16CtaRows;
      CAPTURE(rows);
      CAPTURE(cols);
      REQUIRE(s16 >= 1);
      REQUIRE(s16 <= kMmaMaxSplits);
      REQUIRE(s16 <= cols / 128);
      if (s16 > 1) REQUIRE(s16 * ctas16 * kMmaF16CtaRows * kMaxMatVecParts <= kMmaMaxPartialRows);
      const int s = MmaSplits(rows, cols);
      const int64_t row_ctas = (rows + kMmaCtaRows - 1) / kMmaCtaRows;
      REQUIRE(s >= 1);
      REQUIRE(s <= kMmaMaxSplits);
      REQUIRE(s <= cols / 256);
      if (s > 1) {
        // Each split's rows fit one part's share of the partial scratch.
        REQUIRE(s * row_ctas * kMmaCtaRows * kMaxMatVecParts <= kMmaMaxPartialRows);
        REQUIRE(row_ctas < kMmaTargetCtas);
      }
    }
  }
}

}  // namespace
}  // namespace dpl::kernels
