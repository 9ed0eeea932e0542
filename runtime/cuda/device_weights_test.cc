// CPU: --weights-upload's names, and MeasureHostCopy (host work only) on a
// real file, a short one and one truncated under its mapping.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "formats/mapped_file.h"
#include "runtime/cuda/device_weights.h"
#include "tests/shared_dir.h"

namespace dpl::runtime {
namespace {

std::shared_ptr<formats::MappedFile> MapFile(const std::string& path, size_t bytes) {
  {
    std::ofstream out(path, std::ios::binary);
    const std::string data(bytes, 'w');
    out.write(data.data(), static_cast<std::streamsize>(data.size()));
  }
  auto m = formats::MappedFile::Open(path);
  REQUIRE_MESSAGE(m.ok(), m.status().ToString());
  return *m;
}

TEST_CASE("--weights-upload names") {
  CHECK(*ParseUploadMethod("auto") == UploadMethod::kAuto);
  CHECK(*ParseUploadMethod("pin") == UploadMethod::kPinnedFile);
  CHECK(*ParseUploadMethod("staged") == UploadMethod::kStaged);
  const auto bad = ParseUploadMethod("mmap");
  REQUIRE(!bad.ok());
  CHECK(std::string(bad.status().message()).find("expected auto, pin or staged") != std::string::npos);
}

TEST_CASE("MeasureHostCopy: a copy speed for the file's first bytes, at most the file") {
  const std::string path = testing::TempDir() + "/host_copy.bin";
  const auto m = MapFile(path, 24 << 20);
  const double rate = MeasureHostCopy(*m, 256ull << 20, 2, LoadOptions());  // more than the file
  CAPTURE(rate);
  CHECK(rate > 0.05);  // GB/s: any machine copies 24 MiB in well under half a second
  CHECK(MeasureHostCopy(*m, 0, 2, LoadOptions()) == 0);  // nothing to copy
  // Truncated under the mapping: zeros past the end (the guard), no SIGBUS;
  // the mapping reports it for the load that follows.
  REQUIRE(::truncate(path.c_str(), 4096) == 0);
  MeasureHostCopy(*m, 8 << 20, 2, LoadOptions());
  CHECK(!m->Intact().ok());
  std::remove(path.c_str());
}

}  // namespace
}  // namespace dpl::runtime
