// The layout arithmetic of //formats:types against docs/FORMAT.md's numbers.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include "formats/tensor_layout.h"

namespace dpl::formats {
namespace {

// The raw block fields and the planes, as FORMAT.md writes them out.
static_assert(kQ6KQlOffset == 0 && kQ6KQhOffset == 128 && kQ6KScOffset == 192 &&
              kQ6KDOffset == 208 && kQ6KBlockBytes == 210);
static_assert(Q6KDplPlanes(14).qh == 14 * 128 && Q6KDplPlanes(14).sc == 14 * 192 &&
              Q6KDplPlanes(14).d == 14 * 208 && Q6KDplPlanes(14).ql == 0);

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
