// The layout arithmetic of //formats:types against docs/FORMAT.md's numbers.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include "formats/tensor_layout.h"

#include <algorithm>
#include <optional>
#include <vector>

namespace dpl::formats {
namespace {

// The raw block fields and the planes, as FORMAT.md writes them out.
static_assert(kQ6KQlOffset == 0 && kQ6KQhOffset == 128 && kQ6KScOffset == 192 &&
              kQ6KDOffset == 208 && kQ6KBlockBytes == 210);
static_assert(Q6KDplPlanes(14).qh == 14 * 128 && Q6KDplPlanes(14).sc == 14 * 192 &&
              Q6KDplPlanes(14).d == 14 * 208 && Q6KDplPlanes(14).ql == 0);
// The kernels' q6_K plane offsets are the generic table's.
constexpr DplPlaneSpec kQ6K = DplPlanesOf(GgmlType::kQ6_K);
static_assert(DplPlaneOffset(kQ6K, 1, 14) == Q6KDplPlanes(14).qh &&
              DplPlaneOffset(kQ6K, 2, 14) == Q6KDplPlanes(14).sc &&
              DplPlaneOffset(kQ6K, 3, 14) == Q6KDplPlanes(14).d &&
              DplPlaneOffset(kQ6K, 4, 14) == 14 * kQ6KBlockBytes);

TEST_CASE("every dpl plane table tiles its raw block exactly, wide planes first") {
  int n_types = 0;
  for (uint32_t id = 0; id < 64; ++id) {
    const std::optional<GgmlTypeTraits> tr = FindGgmlType(id);
    if (!tr || !HasDplPlanes(tr->type)) continue;
    CAPTURE(tr->name);
    ++n_types;
    const DplPlaneSpec spec = DplPlanesOf(tr->type);
    REQUIRE(spec.n <= 4);
    CHECK(tr->block_elems > 1);  // block types only
    // Each raw byte belongs to exactly one plane.
    std::vector<int> owner(tr->block_bytes, 0);
    for (uint32_t p = 0; p < spec.n; ++p) {
      const BlockField& f = spec.f[p];
      CHECK(f.bytes > 0);
      CHECK(f.name != nullptr);
      REQUIRE(f.offset + f.bytes <= tr->block_bytes);
      for (uint32_t b = f.offset; b < f.offset + f.bytes; ++b) ++owner[b];
    }
    CHECK(std::count(owner.begin(), owner.end(), 1) == static_cast<long>(tr->block_bytes));
    CHECK(DplPlaneOffset(spec, spec.n, 7) == 7 * uint64_t{tr->block_bytes});
    // The planes of 16-byte multiples per block come first (the aligned
    // 16-byte loads of the layout's why), the narrow ones after them.
    CHECK(spec.f[0].bytes % 16 == 0);
    bool narrow_seen = false;
    for (uint32_t p = 0; p < spec.n; ++p) {
      const bool wide = spec.f[p].bytes % 16 == 0;
      CHECK(!(wide && narrow_seen));
      narrow_seen |= !wide;
    }
  }
  CHECK(n_types == 10);
  CHECK(!HasDplPlanes(GgmlType::kQ4_K));
  CHECK(!HasDplPlanes(GgmlType::kF32));
}

TEST_CASE("dpl q6_K rows are padded to 16 bytes; raw rows are not") {
  CHECK(DplQ6KRowStride(1) == 224);
  CHECK(DplQ6KRowStride(3) == 640);       // 630 rounded up
  CHECK(DplQ6KRowStride(20) == 4208);     // 5120 wide: 4200 content bytes
  CHECK(DplQ6KRowStride(54) == 11344);    // 13824 wide
  CHECK(LayoutRowStride(TensorLayout::kRaw, 3, kQ6KBlockBytes) == 630);
  CHECK(LayoutRowStride(TensorLayout::kRaw, 14, 144) == 14 * 144);
  CHECK(TensorLayoutName(TensorLayout::kDpl) == "dpl");
  CHECK(TensorLayoutName(static_cast<TensorLayout>(7)) == "unknown");
}

TEST_CASE("a derived tensor table entry assigns its geometry in one step") {
  struct Entry : TensorGeometry {
    int extra = 5;
  };
  TensorGeometry g;
  g.type = GgmlType::kQ6_K;
  g.layout = TensorLayout::kDpl;
  g.n_dims = 2;
  g.ne = {512, 3, 1, 1};
  g.n_rows = 3;
  g.row_stride = DplQ6KRowStride(2);
  g.n_bytes = 3 * g.row_stride;
  Entry e;
  e.geometry() = g;
  CHECK(e.type == GgmlType::kQ6_K);
  CHECK(e.ne[0] == 512);
  CHECK(e.n_bytes == 3 * 432);
  CHECK(e.extra == 5);
}

}  // namespace
}  // namespace dpl::formats
