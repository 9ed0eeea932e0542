// The GGUF reader on hostile input: a table of named corrupt files, each
// beside a passing twin that differs only in the corrupted field, plus
// round trips through the writer and the real files in ../shared.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "formats/gguf.h"
#include "formats/hostile_files.h"
#include "formats/hostile_test_util.h"
#include "formats/model_file.h"
#include "tests/shared_dir.h"

namespace dpl::formats {
namespace {

using hostile::EncodedPair;
using hostile::RawGguf;
using hostile::U32;
using hostile::U64;
RawGguf ValidBase() { return hostile::ValidGguf(); }

absl::StatusOr<GgufFile> ParseImage(const std::string& image) {
  return GgufFile::Parse(reinterpret_cast<const uint8_t*>(image.data()), image.size());
}

using HostileGguf = HostileCase<RawGguf>;

// One row per corruption: a table, longer than a function should be.
const std::vector<HostileGguf>& Cases() {
  static const std::vector<HostileGguf> cases = {
      {"BAD_MAGIC", [](RawGguf& g) { g.magic = 0x46554748; }, [](RawGguf&) {}, "not a GGUF file"},
      {"BAD_VERSION_1", [](RawGguf& g) { g.version = 1; }, [](RawGguf& g) { g.version = 2; },
       "version 1 is not supported"},
      {"BAD_VERSION_99", [](RawGguf& g) { g.version = 99; }, [](RawGguf& g) { g.version = 3; },
       "version 99"},
      {"TRUNCATED_HEADER", [](RawGguf& g) { g.truncate_to = 10; }, [](RawGguf&) {}, "truncated"},
      {"TRUNCATED_IN_KV",
       [](RawGguf& g) { g.truncate_to = 24 + 8 + 10; }, [](RawGguf&) {}, "cannot fit"},
      {"TRUNCATED_IN_TENSOR_INFOS",
       [](RawGguf& g) { g.truncate_to = 24 + static_cast<int64_t>(g.kv_bytes.size()) + 20; },
       [](RawGguf&) {}, "cannot fit"},
      {"TRUNCATED_DATA", [](RawGguf& g) { g.data_bytes = 200; }, [](RawGguf& g) { g.data_bytes = 240; },
       "runs past the data section"},
      {"HUGE_N_TENSORS", [](RawGguf& g) { g.n_tensors_override = 1ull << 62; }, [](RawGguf&) {},
       "cannot fit"},
      {"HUGE_N_KV", [](RawGguf& g) { g.n_kv_override = UINT64_MAX - 1; }, [](RawGguf&) {},
       "cannot fit"},
      {"HUGE_KEY_LENGTH",
       [](RawGguf& g) { g.AddRaw(U64(1ull << 60) + "x"); },
       [](RawGguf& g) { g.AddString("x", "y"); }, "exceeds the limit"},
      {"KEY_LENGTH_PAST_END",
       [](RawGguf& g) { g.AddRaw(U64(60000) + "xyz"); },
       [](RawGguf& g) { g.AddString("xyz", ""); }, "left in the file"},
      {"HUGE_STRING_LENGTH",
       [](RawGguf& g) { g.AddRaw(EncodedPair("s", 8, U64(UINT64_MAX) + "abc")); },
       [](RawGguf& g) { g.AddRaw(EncodedPair("s", 8, U64(3) + "abc")); }, "exceeds the limit"},
      {"EMPTY_KEY", [](RawGguf& g) { g.AddString("", "v"); }, [](RawGguf& g) { g.AddString("k", "v"); },
       "empty key"},
      {"DUPLICATE_KEY", [](RawGguf& g) { g.AddU32("llama.block_count", 2); },
       [](RawGguf& g) { g.AddU32("llama.block_count2", 2); }, "duplicate key"},
      {"BAD_VALUE_TYPE", [](RawGguf& g) { g.AddRaw(EncodedPair("k", 13, U32(0))); },
       [](RawGguf& g) { g.AddRaw(EncodedPair("k", 4, U32(0))); }, "unknown value type 13"},
      {"BAD_ARRAY_ELEMENT_TYPE",
       [](RawGguf& g) { g.AddRaw(EncodedPair("arr", 9, U32(77) + U64(1) + U32(5))); },
       [](RawGguf& g) { g.AddRaw(EncodedPair("arr", 9, U32(4) + U64(1) + U32(5))); },
       "unknown value type 77"},
      {"NESTED_ARRAY",
       [](RawGguf& g) { g.AddRaw(EncodedPair("arr", 9, U32(9) + U64(0))); },
       [](RawGguf& g) { g.AddRaw(EncodedPair("arr", 9, U32(4) + U64(0))); }, "nested arrays"},
      {"HUGE_ARRAY_COUNT",
       [](RawGguf& g) { g.AddRaw(EncodedPair("arr", 9, U32(4) + U64(1ull << 61) + U32(5))); },
       [](RawGguf& g) { g.AddRaw(EncodedPair("arr", 9, U32(4) + U64(1) + U32(5))); }, "do not fit"},
      {"HUGE_STRING_ARRAY_COUNT",
       [](RawGguf& g) { g.AddRaw(EncodedPair("arr", 9, U32(8) + U64(1ull << 40) + U64(0))); },
       [](RawGguf& g) { g.AddRaw(EncodedPair("arr", 9, U32(8) + U64(1) + U64(0))); }, "do not fit"},
      {"ALIGNMENT_NOT_POWER_OF_TWO", [](RawGguf& g) { g.AddU32("general.alignment", 48); },
       [](RawGguf& g) { g.AddU32("general.alignment", 32); }, "power of two"},
      {"ALIGNMENT_ZERO", [](RawGguf& g) { g.AddU32("general.alignment", 0); },
       [](RawGguf& g) { g.AddU32("general.alignment", 16); }, "power of two"},
      {"ALIGNMENT_TOO_LARGE", [](RawGguf& g) { g.AddU32("general.alignment", 1u << 21); },
       [](RawGguf& g) { g.AddU32("general.alignment", 16); }, "no larger than"},
      {"ALIGNMENT_WRONG_TYPE", [](RawGguf& g) { g.AddString("general.alignment", "32"); },
       [](RawGguf& g) { g.AddU32("general.alignment", 32); }, "expected u32"},
      {"N_DIMS_TOO_LARGE", [](RawGguf& g) { g.tensors[0].n_dims_override = 5; g.tensors[0].ne = {8, 2, 1, 1, 1}; },
       [](RawGguf& g) { g.tensors[0].ne = {8, 2, 1, 1}; }, "n_dims"},
      {"N_DIMS_ZERO", [](RawGguf& g) { g.tensors[2].ne = {}; g.tensors[2].n_dims_override = 0; },
       [](RawGguf&) {}, "n_dims"},
      {"DIMS_PRODUCT_OVERFLOWS", [](RawGguf& g) { g.tensors[0].ne = {1ull << 32, 1ull << 32}; },
       [](RawGguf& g) { g.tensors[0].ne = {4, 4}; }, "overflows"},
      {"DIMS_PRODUCT_OVERFLOWS_INT64", [](RawGguf& g) { g.tensors[0].ne = {1ull << 31, 1ull << 32}; },
       [](RawGguf& g) { g.tensors[0].ne = {2, 8}; }, "overflows"},
      {"BAD_TENSOR_TYPE", [](RawGguf& g) { g.tensors[1].type = 4; },  // removed Q4_2
       [](RawGguf& g) { g.tensors[1].type = 12; }, "unknown ggml type id 4"},
      {"HUGE_TENSOR_TYPE", [](RawGguf& g) { g.tensors[1].type = 0xFFFFFFFF; },
       [](RawGguf&) {}, "unknown ggml type"},
      {"PARTIAL_BLOCK_ROW", [](RawGguf& g) { g.tensors[1].ne = {128, 1}; },
       [](RawGguf& g) { g.tensors[1].ne = {256, 1}; }, "whole number"},
      {"OFFSET_OUT_OF_FILE", [](RawGguf& g) { g.tensors[2].offset = 1ull << 40; },
       [](RawGguf& g) { g.tensors[2].offset = 224; }, "runs past the data section"},
      {"OFFSET_PLUS_SIZE_WRAPS", [](RawGguf& g) { g.tensors[2].offset = UINT64_MAX - 31; },
       [](RawGguf&) {}, "runs past the data section"},
      {"MISALIGNED_OFFSET", [](RawGguf& g) { g.tensors[2].offset = 228; },
       [](RawGguf& g) { g.tensors[2].offset = 224; }, "not a multiple of the alignment"},
      {"OVERLAPPING_TENSORS", [](RawGguf& g) { g.tensors[1].offset = 32; },
       [](RawGguf& g) { g.tensors[1].offset = 64; }, "overlap"},
      {"DUPLICATE_TENSOR_NAME", [](RawGguf& g) { g.tensors[2].name = "a.weight"; },
       [](RawGguf& g) { g.tensors[2].name = "d.weight"; }, "duplicate tensor name"},
      {"EMPTY_TENSOR_NAME", [](RawGguf& g) { g.tensors[2].name = ""; }, [](RawGguf&) {},
       "name length"},
      {"HUGE_TENSOR_NAME", [](RawGguf& g) { g.tensors[2].name = std::string(5000, 'n'); },
       [](RawGguf& g) { g.tensors[2].name = std::string(4000, 'n'); }, "name length"},
      {"TENSOR_NAME_NUL", [](RawGguf& g) { g.tensors[2].name = std::string("c\0", 2); },
       [](RawGguf& g) { g.tensors[2].name = "c0"; }, "a NUL byte"},
      {"TENSOR_NAME_INVALID_UTF8", [](RawGguf& g) { g.tensors[2].name = "c\x80"; },
       [](RawGguf& g) { g.tensors[2].name = "c\xc2\x80"; }, "byte 0x80 is not valid UTF-8"},
      {"TENSOR_NAME_OVERLONG", [](RawGguf& g) { g.tensors[2].name = "c\xe0\x80\xaf"; },
       [](RawGguf& g) { g.tensors[2].name = "c\xe0\xa0\x80"; }, "byte 0xe0"},
  };
  return cases;
}

TEST_CASE("the valid base file parses") {
  auto f = ParseImage(ValidBase().Build());
  REQUIRE_MESSAGE(f.ok(), f.status().ToString());
  CHECK(f->version() == 3);
  CHECK(f->tensors().size() == 3);
  CHECK(f->FindTensor("b.weight")->type == GgmlType::kQ4_K);
  CHECK(f->FindTensor("b.weight")->n_bytes == 144);
  CHECK(*f->metadata().GetString("general.architecture") == "llama");
}

TEST_CASE("hostile GGUF files are rejected with a named error; their twins pass") {
  CheckHostileCases<RawGguf>(Cases(), ValidBase,
                             [](const RawGguf& g) { return ParseImage(g.Build()).status(); });
}

TEST_CASE("errors name the byte offset") {
  RawGguf g = ValidBase();
  g.tensors[2].offset = 228;
  auto f = ParseImage(g.Build());
  REQUIRE(!f.ok());
  CHECK(std::string(f.status().message()).find("at offset ") != std::string::npos);
}

TEST_CASE("every truncation of a valid file is rejected without a crash") {
  const std::string image = ValidBase().Build();
  auto full = ParseImage(image);
  REQUIRE(full.ok());
  // Bytes past the last tensor's end are not needed; every shorter file is invalid.
  const size_t needed = full->data_offset() + 240;
  for (size_t n = 0; n < needed; ++n) {
    auto f = ParseImage(image.substr(0, n));
    CHECK_MESSAGE(!f.ok(), "accepted a file truncated to ", n, " bytes");
  }
}

TEST_CASE("single-byte corruptions never crash") {
  // Not every flip is invalid (a flipped data byte is fine); none may crash.
  const std::string image = ValidBase().Build();
  for (size_t i = 0; i < image.size(); ++i) {
    for (int bit : {0, 7}) {
      std::string mutated = image;
      mutated[i] = static_cast<char>(mutated[i] ^ (1 << bit));
      (void)ParseImage(mutated);
    }
  }
}

TEST_CASE("writer round trip: BuildGgufHeader output parses back identically") {
  Metadata meta;
  meta.Set("general.architecture", MetaValue::String("qwen2"));
  meta.Set("qwen2.block_count", MetaValue::U32(2));
  meta.Set("qwen2.rope.freq_base", MetaValue::F32(1e6f));
  meta.Set("tokenizer.ggml.tokens", MetaValue::StringArray({"a", "", "ccc"}));
  meta.Set("tokenizer.ggml.token_type", MetaValue::I32Array({1, 3, -2}));
  meta.Set("x.f64", MetaValue::F64(-0.25));
  meta.Set("x.i8", MetaValue::I8(-5));
  meta.Set("x.bool", MetaValue::Bool(true));
  meta.Set("general.alignment", MetaValue::U32(64));
  std::vector<GgufTensorSpec> specs = {{"t0", {256, 3}, GgmlType::kQ6_K},
                                       {"t1", {7}, GgmlType::kF32},
                                       {"t2", {64, 2, 2}, GgmlType::kQ8_0}};
  auto h = BuildGgufHeader(meta, specs);
  REQUIRE(h.ok());
  std::string image = h->bytes + std::string(h->data_bytes, '\0');
  auto f = ParseImage(image);
  REQUIRE_MESSAGE(f.ok(), f.status().ToString());
  CHECK(f->alignment() == 64);
  CHECK(*f->metadata().GetUint("qwen2.block_count") == 2);
  CHECK(*f->metadata().GetFloat("qwen2.rope.freq_base") == doctest::Approx(1e6));
  CHECK(*f->metadata().GetInt("x.i8") == -5);
  CHECK(*f->metadata().GetBool("x.bool"));
  CHECK(*f->metadata().GetFloat("x.f64") == -0.25);
  const MetaValue* toks = *f->metadata().GetArray("tokenizer.ggml.tokens");
  REQUIRE(toks->count == 3);
  CHECK(toks->StringAt(0) == "a");
  CHECK(toks->StringAt(1) == "");
  CHECK(toks->StringAt(2) == "ccc");
  CHECK((*f->metadata().GetArray("tokenizer.ggml.token_type"))->IntAt(2) == -2);
  REQUIRE(f->tensors().size() == 3);
  CHECK(f->tensors()[0].n_bytes == 3 * 210);
  CHECK(f->tensors()[1].offset % 64 == 0);
  CHECK(f->tensors()[2].ne[2] == 2);
  // Re-serializing the parsed metadata gives the same bytes.
  std::string a, b;
  SerializeGgufKv(meta, a);
  SerializeGgufKv(f->metadata(), b);
  CHECK(a == b);
}

TEST_CASE("typed getters report wrong types and missing keys by name") {
  Metadata meta;
  meta.Set("k.str", MetaValue::String("x"));
  meta.Set("k.neg", MetaValue::I32(-1));
  CHECK(std::string(meta.GetUint("k.str").status().message()).find("'k.str' is string") !=
        std::string::npos);
  CHECK(std::string(meta.GetUint("k.neg").status().message()).find("negative") != std::string::npos);
  CHECK(std::string(meta.GetUint("k.none").status().message()).find("'k.none' is missing") !=
        std::string::npos);
  CHECK(*meta.GetUintOr("k.none", 7) == 7);
}

TEST_CASE("every GGUF in ../shared parses") {
  namespace fs = std::filesystem;
  int n = 0;
  for (const char* sub : {"oracle", "vocab"}) {
    for (const auto& entry : fs::directory_iterator(fs::path(testing::SharedDir()) / sub)) {
      if (entry.path().extension() != ".gguf") continue;
      CAPTURE(entry.path().string());
      auto f = GgufFile::Open(entry.path().string());
      CHECK_MESSAGE(f.ok(), f.status().ToString());
      auto m = ModelFile::Open(entry.path().string());
      REQUIRE_MESSAGE(m.ok(), m.status().ToString());
      CHECK((*m)->container() == Container::kGguf);
      CHECK(*DetectContainer(entry.path().string()) == Container::kGguf);
      ++n;
    }
  }
  CHECK(n >= 7);
}

TEST_CASE("ModelFile rejects a file that is neither GGUF nor .dpl") {
  const std::string path = testing::TempDir() + "/not_a_model.bin";
  FILE* f = std::fopen(path.c_str(), "wb");
  REQUIRE(f != nullptr);
  std::fputs("hello world, not a model", f);
  std::fclose(f);
  auto m = ModelFile::Open(path);
  REQUIRE(!m.ok());
  CHECK(std::string(m.status().message()).find("not a model file") != std::string::npos);
  const absl::StatusOr<Container> c = DetectContainer(path);
  REQUIRE(!c.ok());
  CHECK(std::string(c.status().message()).find("not_a_model.bin: not a model file") !=
        std::string::npos);
  CHECK(!ModelFile::Open(testing::TempDir() + "/does_not_exist.gguf").ok());
  CHECK(!DetectContainer(testing::TempDir() + "/does_not_exist.gguf").ok());
}

}  // namespace
}  // namespace dpl::formats
