// GPU test (tags gpu, manual): a synthesized model, converted to both .dpl
// forms, loads onto the device byte for byte; load speed is printed.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include "converter/convert.h"
#include "formats/model_file.h"
#include "runtime/cuda/device_weights.h"
#include "tests/shared_dir.h"
#include "tools/synth.h"

namespace dpl::runtime {
namespace {

std::string MakeDpl(const std::string& preset, bool compress) {
  const std::string gguf = testing::TempDir() + "/" + preset + ".gguf";
  const std::string dpl = testing::TempDir() + "/" + preset + (compress ? ".z.dpl" : ".dpl");
  synth::SynthOptions so;
  so.preset = *synth::FindPreset(preset);
  REQUIRE(synth::WriteSyntheticModel(so, gguf).ok());
  converter::ConvertOptions co;
  co.compress = compress;
  co.frame_bytes = 1 << 20;
  REQUIRE(converter::ConvertGgufToDpl(gguf, dpl, co).ok());
  return dpl;
}

// The device's copy of the data region equals the file's tensors byte for byte.
void CheckLoaded(const DeviceWeights& w, const std::string& path) {
  std::vector<uint8_t> back(w.device_bytes());
  REQUIRE(cudaMemcpy(back.data(), w.device_base(), back.size(), cudaMemcpyDeviceToHost) ==
          cudaSuccess);
  auto model = formats::ModelFile::Open(path);  // inflates the compressed form
  REQUIRE(model.ok());
  for (const formats::TensorView& t : (*model)->tensors()) {
    CAPTURE(t.name);
    CHECK(std::memcmp(back.data() + t.data_offset, t.data, t.n_bytes) == 0);
    auto p = w.TensorPtr(t.name);
    REQUIRE(p.ok());
    CHECK(*p == w.device_base() + t.data_offset);
  }
}

TEST_CASE("both .dpl forms load onto the device bit for bit, pinned and staged") {
  for (bool compress : {false, true}) {
    const std::string path = MakeDpl("small-llama", compress);
    for (UploadMethod method : {UploadMethod::kAuto, UploadMethod::kPinnedFile, UploadMethod::kStaged}) {
      CAPTURE(compress);
      CAPTURE(static_cast<int>(method));
      LoadOptions opt;
      opt.method = method;
      opt.staging_bytes = 1 << 20;  // several chunks, several rounds through both staging buffers
      opt.pin_threads = 2;
      auto w = DeviceWeights::Load(path, opt);
      if (compress && method == UploadMethod::kPinnedFile) {  // asked for, impossible: said so
        REQUIRE(!w.ok());
        CHECK(std::string(w.status().message()).find("compressed file is inflated, not pinned") !=
              std::string::npos);
        continue;
      }
      REQUIRE_MESSAGE(w.ok(), w.status().ToString());
      const LoadStats& st = (*w)->stats();
      const int chunks = static_cast<int>(((*w)->device_bytes() + (1 << 20) - 1) >> 20);
      CHECK(st.pinned_chunks + st.staged_chunks == chunks);
      if (method == UploadMethod::kPinnedFile) CHECK(st.pinned_chunks == chunks);
      if (method == UploadMethod::kStaged || compress) CHECK(st.pinned_chunks == 0);
      // Every Hopper pins read-only memory: only the compressed file stages by fallback.
      CHECK(st.fallback.empty() == !(compress && method == UploadMethod::kAuto));
      CHECK(st.bytes == (*w)->device_bytes());
      CheckLoaded(**w, path);
      std::printf("load %s, method %d: %.1f MB in %.3f s (%.2f GB/s), %d chunks pinned, %d staged%s%s\n",
                  compress ? "compressed" : "plain", static_cast<int>(method), st.bytes / 1e6,
                  st.seconds, st.gb_per_s(), st.pinned_chunks, st.staged_chunks,
                  st.fallback.empty() ? "" : ": ", st.fallback.c_str());
    }
  }
}

TEST_CASE("a GGUF is refused with advice to convert it") {
  const std::string gguf = testing::TempDir() + "/refuse.gguf";
  synth::SynthOptions so;
  so.preset = *synth::FindPreset("tiny-llama");
  REQUIRE(synth::WriteSyntheticModel(so, gguf).ok());
  auto w = DeviceWeights::Load(gguf, {});
  REQUIRE(!w.ok());
  CHECK(std::string(w.status().message()).find("dpl-convert") != std::string::npos);
}

}  // namespace
}  // namespace dpl::runtime
