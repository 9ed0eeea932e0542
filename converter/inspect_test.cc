// dpl-inspect on hostile files: --json is valid JSON whatever bytes the file
// holds, and the report needs no weights (a tiny file declaring 4 GiB is
// described within 512 MB; its checksums stream frame by frame).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>
#include <string>

#include "converter/inspect.h"
#include "formats/hostile_files.h"
#include "formats/hostile_test_util.h"
#include "tests/shared_dir.h"

namespace dpl::converter {
namespace {

namespace hostile = formats::hostile;

std::string WriteTemp(const std::string& name, const std::string& bytes) {
  const std::string path = testing::TempDir() + "/" + name;
  std::ofstream(path, std::ios::binary).write(bytes.data(), bytes.size());
  return path;
}

TEST_CASE("--json writes valid JSON from invalid UTF-8 metadata") {
  hostile::RawGguf g = hostile::ValidGguf();
  g.AddString("bad.string", "ok \xff\xfe\xc0\xaf end \x01\"\\");
  g.AddString("bad.key\xe2\x82", "value");
  g.AddRaw(hostile::EncodedPair("bad.array", 9, hostile::U32(8) + hostile::U64(2) + hostile::U64(1) +
                                                    "\x80" + hostile::U64(2) + "ok"));
  const std::string path = WriteTemp("bad_utf8.gguf", g.Build());
  InspectOptions opt;
  opt.json = true;
  std::ostringstream out;
  const absl::Status s = Inspect(path, opt, out);
  REQUIRE_MESSAGE(s.ok(), s.ToString());
  nlohmann::json j;
  CHECK_NOTHROW(j = nlohmann::json::parse(out.str()));  // strict: throws on invalid UTF-8
  CHECK(j["metadata"]["bad.string"]["value"] == "ok \xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd end \x01\"\\");
  CHECK(j["metadata"]["bad.array"]["value"]["head"][0] == "\xef\xbf\xbd");
  CHECK(j["metadata"]["bad.array"]["value"]["count"] == 2);
  CHECK(j["tensors"].size() == 3);
  CHECK(j["tensors"][1]["name"] == "b.weight");
}

TEST_CASE("a version 2 .dpl: the version, and one planes line and JSON entry per dpl type") {
  const std::string path = WriteTemp("v2.dpl", hostile::ValidDplV2().Build());
  std::ostringstream text;
  REQUIRE(Inspect(path, {}, text).ok());
  CHECK(text.str().find(": .dpl v2, ") != std::string::npos);
  CHECK(text.str().find("\ndpl planes:\n"
                        "  q4_0 dpl: qs[16] | d[2] per block, rows padded to 16 B\n"
                        "  q8_0 dpl: qs[32] | d[2] per block, rows padded to 16 B\n"
                        "  q6_K dpl: ql[128] | qh[64] | scales[16] | d[2] per block, rows padded to 16 B\n") !=
        std::string::npos);
  InspectOptions opt;
  opt.json = true;
  std::ostringstream out;
  REQUIRE(Inspect(path, opt, out).ok());
  const nlohmann::json j = nlohmann::json::parse(out.str());
  CHECK(j["version"] == 2);
  REQUIRE(j["planes"].size() == 3);
  CHECK(j["planes"][1] == nlohmann::json::parse(
                              R"({"type": "q8_0", "planes": [{"field": "qs", "raw_offset": 2, "bytes": 32},
                                  {"field": "d", "raw_offset": 0, "bytes": 2}], "row_alignment": 16})"));
  // A GGUF has no dpl tensors: no planes line, an empty array.
  hostile::RawGguf g = hostile::ValidGguf();
  const std::string gguf = WriteTemp("planes.gguf", g.Build());
  std::ostringstream gtext, gjson;
  REQUIRE(Inspect(gguf, {}, gtext).ok());
  CHECK(gtext.str().find("dpl planes") == std::string::npos);
  REQUIRE(Inspect(gguf, opt, gjson).ok());
  CHECK(nlohmann::json::parse(gjson.str())["planes"].empty());
}

// Inspect in a child process under `max_address_bytes` and 10 s.
formats::BoundedRun InspectBounded(const std::string& path, const InspectOptions& opt,
                                   uint64_t max_address_bytes) {
  return formats::RunBounded(
      [&] {
        std::ostringstream out;
        return Inspect(path, opt, out);
      },
      max_address_bytes, formats::kHostileMaxSeconds);
}

TEST_CASE("a tiny .dpl declaring 4 GiB: described without weights, checksums bounded") {
  for (const hostile::CraftedFile& f : hostile::CraftedFiles()) {
    if (f.name != "DPL_4GIB_REGION_IN_128KB") continue;
    const std::string path = WriteTemp("four_gib_inspect.dpl", f.bad);
    InspectOptions json;
    json.json = true;
    const formats::BoundedRun report = InspectBounded(path, json, 512ull << 20);
    CHECK_MESSAGE(report.ok, report.Describe());
    InspectOptions checksums;
    checksums.verify_checksums = true;
    const formats::BoundedRun verify = InspectBounded(path, checksums, formats::kHostileMaxAddressBytes);
    CAPTURE(verify.Describe());
    CHECK(verify.exited);
    CHECK(verify.message.find("checksum mismatch") != std::string::npos);
  }
}

}  // namespace
}  // namespace dpl::converter
