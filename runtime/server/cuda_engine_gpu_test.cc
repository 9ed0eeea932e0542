// The one-slot CUDA engine against the decoder's own sampling loop (needs a
// GPU; tags manual): same prompt, same greedy and seeded tokens; a released
// slot starts over; bad calls are errors.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "converter/convert.h"
#include "runtime/cuda/cuda_decoder.h"
#include "runtime/server/cuda_engine.h"
#include "tools/synth.h"

namespace dpl::server {
namespace {

std::string MakeModel() {
  const std::string dir = std::getenv("TEST_TMPDIR") != nullptr ? std::getenv("TEST_TMPDIR") : "/tmp";
  const std::string gguf = dir + "/engine.gguf", dpl = dir + "/engine.dpl";
  synth::SynthOptions so;
  so.preset = *synth::FindPreset("small-llama");
  so.seed = 5;
  REQUIRE(synth::WriteSyntheticModel(so, gguf).ok());
  REQUIRE(converter::ConvertGgufToDpl(gguf, dpl, {}).ok());
  return dpl;
}

// The tokens dpl-run would print: Eval, then SampleLoop for n tokens. The
// prompt goes in the same two chunks as ThroughEngine's: a chunk's size
// picks its matmul path (tensor cores from 8 tokens, dp4a below), and the
// paths round differently.
std::vector<int32_t> Reference(const std::string& path, const std::vector<int32_t>& prompt,
                               const SamplerParams& p, int n) {
  runtime::CudaDecoderOptions o;
  o.n_ctx = 256;
  auto d = runtime::CudaDecoder::Create(path, o);
  REQUIRE(d.ok());
  const size_t half = prompt.size() / 2;
  REQUIRE((*d)->Eval(absl::MakeConstSpan(prompt).subspan(0, half), nullptr, nullptr).ok());
  REQUIRE((*d)->Eval(absl::MakeConstSpan(prompt).subspan(half), nullptr, nullptr).ok());
  std::vector<int32_t> out;
  REQUIRE((*d)->SampleLoop(p, prompt, n, [&](int32_t t) {
                 out.push_back(t);
                 return true;
               }).ok());
  return out;
}

std::vector<int32_t> ThroughEngine(CudaEngine& e, const std::vector<int32_t>& prompt,
                                   const SamplerParams& p, int n) {
  std::vector<int32_t> out;
  // The prompt in two chunks, as the scheduler may feed it.
  const size_t half = prompt.size() / 2;
  auto first = e.Prefill(0, absl::MakeConstSpan(prompt).subspan(0, half), false, p);
  REQUIRE(first.ok());
  CHECK(*first == -1);
  auto t = e.Prefill(0, absl::MakeConstSpan(prompt).subspan(half), true, p);
  REQUIRE(t.ok());
  out.push_back(*t);
  const int slot = 0;
  while (static_cast<int>(out.size()) < n) {
    int32_t next = -1;
    REQUIRE(e.Step(absl::MakeConstSpan(&slot, 1), absl::MakeSpan(&next, 1)).ok());
    out.push_back(next);
  }
  CHECK(e.n_past(0) == static_cast<int64_t>(prompt.size()) + n - 1);
  return out;
}

TEST_CASE("the CUDA engine gives the decoder's own tokens, greedy and seeded, slot reused") {
  const std::string path = MakeModel();
  runtime::CudaDecoderOptions o;
  o.n_ctx = 256;
  auto engine = CudaEngine::Load(path, o);
  REQUIRE(engine.ok());
  CudaEngine& e = **engine;
  CHECK(e.n_slots() == 1);
  const std::vector<int32_t> prompt = {1, 17, 240, 33, 5, 99, 7, 1000};
  SamplerParams greedy;
  greedy.temperature = 0;
  SamplerParams seeded;
  seeded.seed = 42;
  seeded.repeat_penalty = 1.1f;
  for (const SamplerParams& p : {greedy, seeded, greedy}) {
    const std::vector<int32_t> want = Reference(path, prompt, p, 24);
    CHECK(ThroughEngine(e, prompt, p, 24) == want);
    e.Release(0);
    CHECK(e.n_past(0) == 0);
  }
}

TEST_CASE("the CUDA engine refuses what it cannot do") {
  const std::string path = MakeModel();
  runtime::CudaDecoderOptions o;
  o.n_ctx = 16;
  auto engine = CudaEngine::Load(path, o);
  REQUIRE(engine.ok());
  CudaEngine& e = **engine;
  SamplerParams p;
  const int32_t tok = 3;
  int32_t next = 0;
  const int slot0 = 0, slot1 = 1;
  CHECK(!e.Prefill(1, absl::MakeConstSpan(&tok, 1), true, p).ok());
  CHECK(!e.Prefill(0, {}, true, p).ok());
  CHECK(!e.Step(absl::MakeConstSpan(&slot0, 1), absl::MakeSpan(&next, 1)).ok());  // nothing pending
  const int32_t bad = e.n_vocab();
  CHECK(!e.Prefill(0, absl::MakeConstSpan(&bad, 1), true, p).ok());
  const std::vector<int32_t> long_prompt(17, 3);
  CHECK(!e.Prefill(0, long_prompt, true, p).ok());
  REQUIRE(e.Prefill(0, absl::MakeConstSpan(&tok, 1), true, p).ok());
  CHECK(!e.Step(absl::MakeConstSpan(&slot1, 1), absl::MakeSpan(&next, 1)).ok());
  // The context fills up: 1 prompt position + 15 steps, then an error.
  for (int i = 0; i < 15; ++i) REQUIRE(e.Step(absl::MakeConstSpan(&slot0, 1), absl::MakeSpan(&next, 1)).ok());
  CHECK(!e.Step(absl::MakeConstSpan(&slot0, 1), absl::MakeSpan(&next, 1)).ok());
}

}  // namespace
}  // namespace dpl::server
