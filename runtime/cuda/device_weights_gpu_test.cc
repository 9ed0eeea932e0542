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

TEST_CASE("both .dpl forms load onto the device bit for bit") {
  for (bool compress : {false, true}) {
    const std::string path = MakeDpl("small-llama", compress);
    LoadOptions opt;
    opt.staging_bytes = 1 << 20;  // several rounds through both staging buffers
    auto w = DeviceWeights::Load(path, opt);
    REQUIRE_MESSAGE(w.ok(), w.status().ToString());
    std::vector<uint8_t> back((*w)->device_bytes());
    REQUIRE(cudaMemcpy(back.data(), (*w)->device_base(), back.size(), cudaMemcpyDeviceToHost) ==
            cudaSuccess);
    auto model = formats::ModelFile::Open(path);  // inflates the compressed form
    REQUIRE(model.ok());
    for (const formats::TensorView& t : (*model)->tensors()) {
      CAPTURE(t.name);
      CHECK(std::memcmp(back.data() + t.data_offset, t.data, t.n_bytes) == 0);
      auto p = (*w)->TensorPtr(t.name);
      REQUIRE(p.ok());
      CHECK(*p == (*w)->device_base() + t.data_offset);
    }
    std::printf("load %s: %.1f MB in %.3f s (%.2f GB/s)\n", compress ? "compressed" : "plain",
                (*w)->stats().bytes / 1e6, (*w)->stats().seconds, (*w)->stats().gb_per_s());
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
