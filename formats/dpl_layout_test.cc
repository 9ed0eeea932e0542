// The generic dpl transform (formats/dpl_layout.h) for every type
// DplPlanesOf describes: random rows round trip bit for bit, the planes hold
// the raw fields where docs/FORMAT.md's table puts them (checked by hand for
// each type), the stride is (nbe * block_bytes + 15) & ~15 with zero padding,
// and q6_K's rows are the bytes the q6_K-only transform wrote.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include "formats/dpl_layout.h"

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "formats/ggml_types.h"

namespace dpl::formats {
namespace {

// Every known type with a dpl layout, by id.
std::vector<GgmlType> DplTypes() {
  std::vector<GgmlType> types;
  for (uint32_t id = 0; id < 64; ++id) {
    const std::optional<GgmlTypeTraits> tr = FindGgmlType(id);
    if (tr && HasDplPlanes(tr->type)) types.push_back(tr->type);
  }
  return types;
}

std::vector<uint8_t> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (uint8_t& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

// The dpl row of `raw` (nbe blocks of `type`).
std::vector<uint8_t> ToDpl(GgmlType type, const std::vector<uint8_t>& raw, uint64_t nbe) {
  std::vector<uint8_t> dpl(DplRowStride(type, nbe), 0xAB);  // padding must be overwritten
  REQUIRE(RowToDpl(type, raw.data(), nbe, dpl.data()).ok());
  return dpl;
}

bool Same(const std::vector<uint8_t>& a, uint64_t at_a, const std::vector<uint8_t>& b,
          uint64_t at_b, uint64_t n) {
  return at_a + n <= a.size() && at_b + n <= b.size() && std::memcmp(&a[at_a], &b[at_b], n) == 0;
}

TEST_CASE("the types with a dpl layout are exactly FORMAT.md's ten") {
  std::vector<std::string> names;
  for (GgmlType t : DplTypes()) names.emplace_back(TraitsOf(t).name);
  CHECK(names == std::vector<std::string>{"q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_K", "q3_K",
                                          "q6_K", "iq4_nl", "iq4_xs"});
}

TEST_CASE("random rows round trip bit for bit; stride 16-aligned, padding zero") {
  for (GgmlType type : DplTypes()) {
    const GgmlTypeTraits tr = TraitsOf(type);
    CAPTURE(tr.name);
    for (uint64_t nbe : {1, 2, 3, 5, 8, 17, 74}) {
      CAPTURE(nbe);
      const std::vector<uint8_t> raw = RandomBytes(nbe * tr.block_bytes, 977 * nbe + tr.block_bytes);
      const std::vector<uint8_t> dpl = ToDpl(type, raw, nbe);
      CHECK(dpl.size() == ((nbe * tr.block_bytes + 15) & ~uint64_t{15}));
      CHECK(dpl.size() == LayoutRowStride(TensorLayout::kDpl, nbe, tr.block_bytes));
      for (uint64_t p = nbe * tr.block_bytes; p < dpl.size(); ++p) REQUIRE(dpl[p] == 0);
      std::vector<uint8_t> back(raw.size(), 0xCD);
      REQUIRE(DplRowToRaw(type, dpl.data(), nbe, back.data()).ok());
      CHECK(back == raw);
      // Every raw byte lands somewhere: the dpl content is a permutation.
      std::vector<uint8_t> a(raw), b(dpl.begin(), dpl.begin() + raw.size());
      std::sort(a.begin(), a.end());
      std::sort(b.begin(), b.end());
      CHECK(a == b);
    }
  }
}

// One hand-written expectation: `n` bytes at dpl offset `dpl_at` equal the
// raw row's bytes at `raw_at` (offsets worked out from FORMAT.md's table).
struct Where {
  uint64_t dpl_at, raw_at, n;
};

TEST_CASE("planes hold the raw fields where FORMAT.md's table puts them") {
  struct Case {
    GgmlType type;
    uint64_t nbe;
    uint64_t stride;
    std::vector<Where> where;
  };
  const Case cases[] = {
      // q8_0 34 B = d[2] qs[32] -> qs | d. nbe 3: qs at 0, d at 96; 102 -> 112.
      {GgmlType::kQ8_0, 3, 112, {{0, 2, 32}, {32, 36, 32}, {64, 70, 32}, {96, 0, 2}, {100, 68, 2}}},
      // q4_0 18 B = d[2] qs[16] -> qs | d. nbe 2: qs at 0, d at 32; 36 -> 48.
      {GgmlType::kQ4_0, 2, 48, {{0, 2, 16}, {16, 20, 16}, {32, 0, 2}, {34, 18, 2}}},
      {GgmlType::kIQ4_NL, 2, 48, {{0, 2, 16}, {16, 20, 16}, {32, 0, 2}, {34, 18, 2}}},
      // q4_1 20 B = d m qs[16] -> qs | d+m. nbe 2: d+m plane at 32; 40 -> 48.
      {GgmlType::kQ4_1, 2, 48, {{0, 4, 16}, {16, 24, 16}, {32, 0, 4}, {36, 20, 4}}},
      // q5_0 22 B = d qh[4] qs[16] -> qs | qh | d. nbe 2: qh at 32, d at 40; 44 -> 48.
      {GgmlType::kQ5_0, 2, 48, {{0, 6, 16}, {16, 28, 16}, {32, 2, 4}, {36, 24, 4}, {40, 0, 2}, {42, 22, 2}}},
      // q5_1 24 B = d m qh[4] qs[16] -> qs | qh | d+m. nbe 1: 24 -> 32.
      {GgmlType::kQ5_1, 1, 32, {{0, 8, 16}, {16, 4, 4}, {20, 0, 4}}},
      // q2_K 84 B = scales[16] qs[64] d dmin -> qs | scales | d+dmin. nbe 2:
      // scales at 128, d+dmin at 160; 168 -> 176.
      {GgmlType::kQ2_K, 2, 176, {{0, 16, 64}, {64, 100, 64}, {128, 0, 16}, {144, 84, 16}, {160, 80, 4}, {164, 164, 4}}},
      // q3_K 110 B = hmask[32] qs[64] scales[12] d -> same order. nbe 2:
      // qs at 64, scales at 192, d at 216; 220 -> 224.
      {GgmlType::kQ3_K, 2, 224, {{0, 0, 32}, {32, 110, 32}, {64, 32, 64}, {128, 142, 64}, {192, 96, 12}, {204, 206, 12}, {216, 108, 2}, {218, 218, 2}}},
      // q6_K 210 B = ql[128] qh[64] scales[16] d -> same order. nbe 3:
      // qh at 384, scales at 576, d at 624; 630 -> 640.
      {GgmlType::kQ6_K, 3, 640, {{128, 210, 128}, {384 + 64, 210 + 128, 64}, {576 + 16, 210 + 192, 16}, {624 + 2, 210 + 208, 2}, {624 + 4, 420 + 208, 2}}},
      // iq4_xs 136 B = d scales_h scales_l[4] qs[128] -> qs | d+scales_h+scales_l.
      // nbe 2: the 8-byte plane at 256; 272, already 16-aligned.
      {GgmlType::kIQ4_XS, 2, 272, {{0, 8, 128}, {128, 144, 128}, {256, 0, 8}, {264, 136, 8}}},
  };
  int n_types = 0;
  for (const Case& c : cases) {
    const GgmlTypeTraits tr = TraitsOf(c.type);
    CAPTURE(tr.name);
    const std::vector<uint8_t> raw = RandomBytes(c.nbe * tr.block_bytes, 31 + tr.block_bytes);
    const std::vector<uint8_t> dpl = ToDpl(c.type, raw, c.nbe);
    CHECK(dpl.size() == c.stride);
    for (const Where& w : c.where) {
      CAPTURE(w.dpl_at);
      CHECK(Same(dpl, w.dpl_at, raw, w.raw_at, w.n));
    }
    ++n_types;
  }
  CHECK(n_types == static_cast<int>(DplTypes().size()));
}

TEST_CASE("q6_K: the bytes of the q6_K-only transform") {
  // Its test vector: raw[i] = i * 17 + 3, three blocks; block 1's fields at
  // ql + 128, qh + 64, sc + 16, d + 2 of their planes; 640 bytes.
  constexpr uint64_t nbe = 3;
  std::vector<uint8_t> raw(nbe * 210);
  for (size_t i = 0; i < raw.size(); ++i) raw[i] = static_cast<uint8_t>(i * 17 + 3);
  const std::vector<uint8_t> dpl = ToDpl(GgmlType::kQ6_K, raw, nbe);
  CHECK(dpl.size() == 640);
  CHECK(Same(dpl, 128, raw, 210, 128));
  CHECK(Same(dpl, nbe * 128 + 64, raw, 210 + 128, 64));
  CHECK(Same(dpl, nbe * 192 + 16, raw, 210 + 192, 16));
  CHECK(Same(dpl, nbe * 208 + 2, raw, 210 + 208, 2));
  // And whole rows of several lengths equal the q6_K-only construction,
  // field by field from the kernels' constants (Q6KDplPlanes, kQ6K*).
  for (uint64_t n : {1, 3, 14, 20, 54, 74}) {
    CAPTURE(n);
    const std::vector<uint8_t> r = RandomBytes(n * kQ6KBlockBytes, 5 + n);
    std::vector<uint8_t> want(DplQ6KRowStride(n), 0);
    const Q6KPlanes p = Q6KDplPlanes(n);
    for (uint64_t i = 0; i < n; ++i) {
      const uint8_t* b = &r[i * kQ6KBlockBytes];
      std::memcpy(&want[p.ql + i * kQ6KQlBytes], b + kQ6KQlOffset, kQ6KQlBytes);
      std::memcpy(&want[p.qh + i * kQ6KQhBytes], b + kQ6KQhOffset, kQ6KQhBytes);
      std::memcpy(&want[p.sc + i * kQ6KScBytes], b + kQ6KScOffset, kQ6KScBytes);
      std::memcpy(&want[p.d + i * kQ6KDBytes], b + kQ6KDOffset, kQ6KDBytes);
    }
    CHECK(ToDpl(GgmlType::kQ6_K, r, n) == want);
  }
}

TEST_CASE("types without a dpl layout are refused, naming them") {
  uint8_t raw[144] = {}, dpl[144] = {};
  const absl::Status s = RowToDpl(GgmlType::kQ4_K, raw, 1, dpl);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(s.message()) ==
        "type q4_K has no dpl layout (it is defined for q4_0, q4_1, q5_0, q5_1, q8_0, q2_K, "
        "q3_K, q6_K, iq4_nl, iq4_xs)");
  CHECK(DplRowToRaw(GgmlType::kF32, dpl, 1, raw).code() == absl::StatusCode::kInvalidArgument);
  CHECK(CheckDplType(GgmlType::kQ8_0).ok());
}

TEST_CASE("dpl-inspect's plane strings") {
  CHECK(DplPlanesString(GgmlType::kQ8_0) == "qs[32] | d[2]");
  CHECK(DplPlanesString(GgmlType::kQ6_K) == "ql[128] | qh[64] | scales[16] | d[2]");
  CHECK(DplPlanesString(GgmlType::kQ4_1) == "qs[16] | d+m[4]");
  CHECK(DplPlanesString(GgmlType::kIQ4_XS) == "qs[128] | d+scales_h+scales_l[8]");
  CHECK(DplPlanesString(GgmlType::kQ4_K).empty());
}

}  // namespace
}  // namespace dpl::formats
