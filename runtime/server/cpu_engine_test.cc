// The CPU engine against the single-sequence path: the same prompts, greedy,
// give generate::Generate's tokens with the CPU decoder, whether the slots
// decode alone or together in one Step, and a released slot starts afresh.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <memory>
#include <vector>

#include "formats/model_file.h"
#include "runtime/generate/generate.h"
#include "runtime/reference/reference_model.h"
#include "runtime/server/cpu_engine.h"
#include "runtime/tokenizer/tokenizer.h"
#include "tests/shared_dir.h"

namespace dpl::server {
namespace {

// A generate::Decoder over one reference model (what dpl-run --device cpu runs).
class RefDecoder : public generate::Decoder {
 public:
  explicit RefDecoder(std::unique_ptr<reference::ReferenceModel> m) : m_(std::move(m)) {}
  int32_t n_vocab() const override { return m_->n_vocab(); }
  int64_t n_ctx() const override { return m_->n_ctx(); }
  int64_t n_past() const override { return m_->n_past(); }
  absl::Status Eval(absl::Span<const int32_t> tokens, std::vector<float>* last,
                    std::vector<float>*) override {
    for (int32_t t : tokens) {
      auto l = m_->Forward(t, m_->n_past());
      if (!l.ok()) return l.status();
      *last = *std::move(l);
    }
    return absl::OkStatus();
  }
  absl::Status Rewind(int64_t) override { return absl::UnimplementedError("no"); }

 private:
  std::unique_ptr<reference::ReferenceModel> m_;
};

std::shared_ptr<formats::ModelFile> Model(const std::string& name = "small-qwen2-q4km") {
  auto f = formats::ModelFile::Open(testing::SharedDir() + "/oracle/" + name + ".gguf");
  REQUIRE_MESSAGE(f.ok(), f.status().ToString());
  return *f;
}

std::vector<int32_t> Reference(std::shared_ptr<formats::ModelFile> file,
                               const std::vector<int32_t>& prompt, int n) {
  reference::ReferenceOptions ro;
  ro.n_ctx = 64;
  auto m = reference::ReferenceModel::Load(file, ro);
  REQUIRE(m.ok());
  RefDecoder dec(*std::move(m));
  auto tok = tokenizer::Tokenizer::FromMetadata(file->metadata());
  REQUIRE(tok.ok());
  SamplerParams p;
  p.temperature = 0;
  generate::Sampler sampler(p);
  generate::GenerateRequest req;
  req.prompt = prompt;
  req.n_predict = n;
  generate::Timings t;
  auto out = generate::Generate(dec, *tok, sampler, req, [](absl::string_view) {}, &t);
  REQUIRE(out.ok());
  return *out;
}

// A CPU engine of `slots` slots of 64 positions over `file`.
std::unique_ptr<CpuEngine> LoadEngine(std::shared_ptr<formats::ModelFile> file, int slots) {
  CpuEngineOptions o;
  o.n_slots = slots;
  o.n_ctx = 64;
  auto engine = CpuEngine::Load(std::move(file), o);
  REQUIRE_MESSAGE(engine.ok(), engine.status().ToString());
  return *std::move(engine);
}

TEST_CASE("greedy slots decoded together give the single-sequence tokens") {
  auto file = Model();
  const std::vector<std::vector<int32_t>> prompts = {{1, 2, 3, 4}, {100, 7}, {1, 2, 3, 4}};
  constexpr int kTokens = 6;
  std::vector<std::vector<int32_t>> want;
  for (const auto& p : prompts) want.push_back(Reference(file, p, kTokens));

  const std::unique_ptr<CpuEngine> engine = LoadEngine(file, 3);
  CpuEngine& e = *engine;
  CHECK(e.n_slots() == 3);
  CHECK(e.n_ctx() == 64);
  SamplerParams greedy;
  greedy.temperature = 0;
  std::vector<std::vector<int32_t>> got(3);
  // Slot 1's prompt in two chunks.
  auto a = e.Prefill(0, prompts[0], true, greedy);
  auto b0 = e.Prefill(1, absl::MakeConstSpan(prompts[1]).subspan(0, 1), false, greedy);
  auto b1 = e.Prefill(1, absl::MakeConstSpan(prompts[1]).subspan(1), true, greedy);
  auto c = e.Prefill(2, prompts[2], true, greedy);
  REQUIRE((a.ok() && b0.ok() && b1.ok() && c.ok()));
  CHECK(*b0 == -1);
  got[0].push_back(*a);
  got[1].push_back(*b1);
  got[2].push_back(*c);
  for (int step = 1; step < kTokens; ++step) {
    const std::vector<int> slots = {0, 1, 2};
    std::vector<int32_t> next(3);
    REQUIRE(e.Step(slots, absl::MakeSpan(next)).ok());
    for (int i = 0; i < 3; ++i) got[i].push_back(next[i]);
  }
  CHECK(e.n_past(0) == 4 + kTokens - 1);
  for (int i = 0; i < 3; ++i) CHECK(got[i] == want[i]);

  // A released slot starts a new sequence: same tokens again, stepping alone.
  e.Release(1);
  CHECK(e.n_past(1) == 0);
  auto again = e.Prefill(1, prompts[1], true, greedy);
  REQUIRE(again.ok());
  std::vector<int32_t> alone = {*again};
  for (int step = 1; step < kTokens; ++step) {
    const int slot[1] = {1};
    int32_t next[1];
    REQUIRE(e.Step(slot, absl::MakeSpan(next)).ok());
    alone.push_back(next[0]);
  }
  CHECK(alone == want[1]);
}

// The CPU engine runs a mixture of experts as any model (issue 31), and a
// slot kept to a prefix of what it ran (the prompt cache), or given that
// prefix copied from another slot, continues from it as the model does alone.
TEST_CASE("a qwen3moe model in the engine; a kept or copied start continues as alone") {
  auto file = Model("mini-qwen3moe-q4km");
  const std::vector<int32_t> prompt = {5, 900, 31, 7, 1200};
  constexpr int kTokens = 6;
  const std::vector<int32_t> want = Reference(file, prompt, kTokens);
  const std::unique_ptr<CpuEngine> engine = LoadEngine(file, 2);
  CpuEngine& e = *engine;
  SamplerParams greedy;
  greedy.temperature = 0;
  auto run = [&](int slot, absl::Span<const int32_t> rest, int n) {
    auto first = e.Prefill(slot, rest, true, greedy);
    REQUIRE(first.ok());
    std::vector<int32_t> out = {*first};
    while (static_cast<int>(out.size()) < n) {
      int32_t next = -1;
      REQUIRE(e.Step(absl::MakeConstSpan(&slot, 1), absl::MakeSpan(&next, 1)).ok());
      out.push_back(next);
    }
    return out;
  };
  CHECK(run(1, prompt, kTokens) == want);
  // Keep the prompt and the first two answer tokens; the third runs next.
  std::vector<int32_t> kept = prompt;
  kept.push_back(want[0]);
  kept.push_back(want[1]);
  CHECK(!e.KeepPrefix(1, std::vector<int32_t>(e.n_past(1) + 1, 1)).ok());
  REQUIRE(e.KeepPrefix(1, kept).ok());
  CHECK(e.n_past(1) == static_cast<int64_t>(kept.size()));
  const std::vector<int32_t> rest = run(1, absl::MakeConstSpan(&want[2], 1), kTokens - 3);
  CHECK(rest == std::vector<int32_t>(want.begin() + 3, want.end()));
  // The same start copied into the other slot continues the same way, and
  // the slot copied from is left as it was.
  const int64_t had = e.n_past(1);
  CHECK(!e.CopyPrefix(0, 1, std::vector<int32_t>(had + 1, 1)).ok());
  CHECK(!e.CopyPrefix(1, 1, kept).ok());
  CHECK(!e.CopyPrefix(0, 2, kept).ok());
  REQUIRE(e.CopyPrefix(0, 1, kept).ok());
  CHECK(e.n_past(0) == static_cast<int64_t>(kept.size()));
  CHECK(e.n_past(1) == had);
  CHECK(run(0, absl::MakeConstSpan(&want[2], 1), kTokens - 3) == rest);
}

TEST_CASE("engine errors: bad slot, bad token, a step without a pending token, a full context") {
  CpuEngineOptions o;
  o.n_slots = 1;
  o.n_ctx = 4;
  auto engine = CpuEngine::Load(Model(), o);
  REQUIRE(engine.ok());
  CpuEngine& e = **engine;
  SamplerParams p;
  const std::vector<int32_t> one = {1};
  CHECK(e.Prefill(1, one, true, p).status().code() == absl::StatusCode::kInvalidArgument);
  const std::vector<int32_t> bad = {5000};
  CHECK(e.Prefill(0, bad, true, p).status().code() == absl::StatusCode::kInvalidArgument);
  const int slot[1] = {0};
  int32_t next[1];
  CHECK(e.Step(slot, absl::MakeSpan(next)).code() == absl::StatusCode::kFailedPrecondition);
  const std::vector<int32_t> five = {1, 2, 3, 4, 5};
  CHECK(e.Prefill(0, five, true, p).status().code() == absl::StatusCode::kOutOfRange);
  const std::vector<int32_t> four = {1, 2, 3, 4};
  REQUIRE(e.Prefill(0, four, true, p).ok());
  CHECK(e.Step(slot, absl::MakeSpan(next)).code() == absl::StatusCode::kOutOfRange);
  CHECK(!CpuEngine::Load(Model(), CpuEngineOptions{0}).ok());
}

}  // namespace
}  // namespace dpl::server
