#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include "formats/dequant.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <vector>

#include "formats/ggml_types.h"
#include "formats/dpl_layout.h"
#include "tests/shared_dir.h"

namespace dpl::formats {
namespace {

std::vector<uint8_t> ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE_MESSAGE(in.good(), "cannot open ", path);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::string DequantDir() { return dpl::testing::SharedDir() + "/oracle/dequant"; }

uint32_t Bits(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  return x;
}

TEST_CASE("every oracle TYPE.blocks dequantizes bit for bit to TYPE.f32") {
  std::set<std::string> seen;
  for (const auto& entry : std::filesystem::directory_iterator(DequantDir())) {
    if (entry.path().extension() != ".blocks") continue;
    const std::string name = entry.path().stem().string();
    CAPTURE(name);
    const std::optional<GgmlType> type = GgmlTypeFromName(name);
    REQUIRE_MESSAGE(type.has_value(), "oracle type ", name, " unknown to ggml_types");
    REQUIRE(IsDequantSupported(*type));
    const GgmlTypeTraits tr = TraitsOf(*type);
    const std::vector<uint8_t> blocks = ReadAll(entry.path().string());
    const std::vector<uint8_t> want_bytes = ReadAll(DequantDir() + "/" + name + ".f32");
    REQUIRE(blocks.size() % tr.block_bytes == 0);
    const uint64_t n = blocks.size() / tr.block_bytes * tr.block_elems;
    REQUIRE(want_bytes.size() == n * 4);
    std::vector<float> got(n);
    REQUIRE(DequantizeBlocks(*type, blocks.data(), n, got.data()).ok());
    // Report the first mismatch precisely, then require byte equality.
    for (uint64_t i = 0; i < n; ++i) {
      float want;
      std::memcpy(&want, want_bytes.data() + 4 * i, 4);
      if (Bits(got[i]) != Bits(want)) {
        FAIL_CHECK(name, " element ", i, ": got ", got[i], " want ", want);
        break;
      }
    }
    CHECK(std::memcmp(got.data(), want_bytes.data(), n * 4) == 0);
    // Row-wise entry point on the raw layout gives the same values.
    std::vector<float> row(n);
    REQUIRE(DequantizeRow(*type, TensorLayout::kRaw, blocks.data(), n, row.data()).ok());
    CHECK(std::memcmp(row.data(), want_bytes.data(), n * 4) == 0);
    seen.insert(name);
  }
  // Every type the oracle ships must have been checked; a missing one means
  // the data is gone.
  for (const char* name : {"f16", "bf16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_K",
                           "q3_K", "q4_K", "q5_K", "q6_K", "iq4_nl", "iq4_xs"}) {
    CAPTURE(name);
    CHECK(seen.count(name) == 1);
  }
}

TEST_CASE("every type with a dpl layout: dequant(dpl(row)) == dequant(row) bit for bit") {
  std::set<std::string> seen;
  for (const auto& entry : std::filesystem::directory_iterator(DequantDir())) {
    if (entry.path().extension() != ".blocks") continue;
    const std::string name = entry.path().stem().string();
    const std::optional<GgmlType> type = GgmlTypeFromName(name);
    REQUIRE(type.has_value());
    if (!HasDplPlanes(*type)) continue;
    CAPTURE(name);
    const GgmlTypeTraits tr = TraitsOf(*type);
    const std::vector<uint8_t> blocks = ReadAll(entry.path().string());
    const uint64_t n_blocks = blocks.size() / tr.block_bytes;
    REQUIRE(n_blocks >= 4);
    // The oracle's blocks as rows of several block counts, including ones
    // whose stride needs padding.
    for (uint64_t nbe : {uint64_t{1}, uint64_t{3}, uint64_t{4}, n_blocks}) {
      CAPTURE(nbe);
      const uint64_t n = nbe * tr.block_elems;
      for (uint64_t first = 0; first + nbe <= n_blocks; first += nbe) {
        const uint8_t* raw = blocks.data() + first * tr.block_bytes;
        std::vector<uint8_t> dpl(DplRowStride(*type, nbe));
        REQUIRE(RowToDpl(*type, raw, nbe, dpl.data()).ok());
        std::vector<float> want(n), got(n);
        REQUIRE(DequantizeRow(*type, TensorLayout::kRaw, raw, n, want.data()).ok());
        REQUIRE(DequantizeRow(*type, TensorLayout::kDpl, dpl.data(), n, got.data()).ok());
        REQUIRE(std::memcmp(want.data(), got.data(), n * 4) == 0);
      }
    }
    seen.insert(name);
  }
  // Every type with a dpl layout has oracle blocks, so each was checked.
  for (const char* name : {"q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_K", "q3_K", "q6_K",
                           "iq4_nl", "iq4_xs"}) {
    CAPTURE(name);
    CHECK(seen.count(name) == 1);
  }
  CHECK(seen.size() == 10);
}

TEST_CASE("F16 conversions: exact widening, round-to-nearest-even narrowing") {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = F16ToF32(static_cast<uint16_t>(h));
    const bool is_nan = (h & 0x7C00) == 0x7C00 && (h & 0x3FF) != 0;
    if (is_nan) {
      REQUIRE(std::isnan(f));
      REQUIRE(std::isnan(F16ToF32(F32ToF16(f))));
      continue;
    }
    REQUIRE(F32ToF16(f) == h);  // every half survives the round trip
  }
  CHECK(F16ToF32(0x3C00) == 1.0f);
  CHECK(F16ToF32(0xC000) == -2.0f);
  CHECK(F16ToF32(0x0001) == std::ldexp(1.0f, -24));
  CHECK(F16ToF32(0x7BFF) == 65504.0f);
  // Midpoints between neighbours go to the even one; a hair above goes up.
  for (uint16_t h : {uint16_t{0x0000}, uint16_t{0x0001}, uint16_t{0x03FF}, uint16_t{0x3C00},
                     uint16_t{0x3C01}, uint16_t{0x7BFE}, uint16_t{0x8400}}) {
    CAPTURE(h);
    const double a = F16ToF32(h), b = F16ToF32(static_cast<uint16_t>(h + 1));
    const float mid = static_cast<float>((a + b) / 2);  // exact in float
    REQUIRE(static_cast<double>(mid) == (a + b) / 2);
    const uint16_t even = (h & 1) ? static_cast<uint16_t>(h + 1) : h;
    CHECK(F32ToF16(mid) == even);
    CHECK(F32ToF16(std::nextafter(mid, mid > 0 ? 1e9f : -1e9f)) == h + 1);
    CHECK(F32ToF16(std::nextafter(mid, 0.0f)) == h);
  }
  CHECK(F32ToF16(65519.0f) == 0x7BFF);
  CHECK(F32ToF16(65520.0f) == 0x7C00);  // tie with an odd mantissa: to inf
  CHECK(F32ToF16(1e10f) == 0x7C00);
  CHECK(F32ToF16(-1e10f) == 0xFC00);
  CHECK(F32ToF16(std::ldexp(1.0f, -25)) == 0x0000);   // tie to even (zero)
  CHECK(F32ToF16(std::ldexp(1.5f, -25)) == 0x0001);
  CHECK(F32ToF16(-0.0f) == 0x8000);
  CHECK(F32ToF16(std::ldexp(1.0f, -30)) == 0x0000);
}

TEST_CASE("bf16 conversions") {
  CHECK(Bf16ToF32(0x3F80) == 1.0f);
  CHECK(Bf16ToF32(0xC040) == -3.0f);
  CHECK(F32ToBf16(1.0f) == 0x3F80);
  // 1 + 2^-8 is halfway between bf16 1.0 and 1 + 2^-7: ties to even (1.0).
  CHECK(F32ToBf16(1.0f + std::ldexp(1.0f, -8)) == 0x3F80);
  CHECK(F32ToBf16(1.0f + 3 * std::ldexp(1.0f, -8)) == 0x3F82);  // odd tie rounds up
  CHECK(F32ToBf16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)) == 0x3F81);
  CHECK(std::isnan(Bf16ToF32(F32ToBf16(std::nanf("")))));
  CHECK(F32ToBf16(INFINITY) == 0x7F80);
  const uint8_t raw[4] = {0x80, 0x3F, 0x40, 0xC0};  // LE 0x3F80, 0xC040
  float out[2];
  REQUIRE(DequantizeBlocks(GgmlType::kBF16, raw, 2, out).ok());
  CHECK(out[0] == 1.0f);
  CHECK(out[1] == -3.0f);
}

TEST_CASE("f32 rows copy through") {
  const float in[3] = {1.5f, -0.0f, 3e-40f};
  float out[3];
  REQUIRE(DequantizeBlocks(GgmlType::kF32, reinterpret_cast<const uint8_t*>(in), 3, out).ok());
  CHECK(std::memcmp(in, out, sizeof in) == 0);
}

TEST_CASE("errors name the type") {
  uint8_t blocks[256] = {};
  float out[256];
  absl::Status s = DequantizeBlocks(GgmlType::kIQ2_XXS, blocks, 256, out);
  CHECK(s.code() == absl::StatusCode::kUnimplemented);
  CHECK(s.message().find("iq2_xxs") != absl::string_view::npos);
  CHECK(!IsDequantSupported(GgmlType::kQ8_1));
  CHECK(!IsDequantSupported(GgmlType::kIQ2_XXS));
  s = DequantizeBlocks(GgmlType::kQ8_0, blocks, 33, out);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(s.message().find("q8_0") != absl::string_view::npos);
  s = DequantizeRow(GgmlType::kQ4_K, TensorLayout::kDpl, blocks, 256, out);
  CHECK(!s.ok());
  CHECK(s.message().find("type q4_K has no dpl layout") != absl::string_view::npos);
  s = DequantizeRow(GgmlType::kQ8_0, TensorLayout::kDpl, blocks, 48, out);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(s.message().find("q8_0 (dpl): 48 elements") != absl::string_view::npos);
}

}  // namespace
}  // namespace dpl::formats
