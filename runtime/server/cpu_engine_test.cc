// The CPU engine against the single-sequence path: the same prompts, greedy,
// give generate::Generate's tokens with the CPU decoder, whether the slots
// decode alone or together in one Step, and a released slot starts afresh.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "formats/model_file.h"
#include "runtime/grammar/grammar.h"
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

// log_softmax(logits)[token] in float64, computed here apart from the engine.
double LogSoftmaxAt(const std::vector<float>& logits, int32_t token) {
  const double max_l = *std::max_element(logits.begin(), logits.end());
  double z = 0;
  for (float l : logits) z += std::exp(static_cast<double>(l) - max_l);
  return static_cast<double>(logits[static_cast<size_t>(token)]) - max_l - std::log(z);
}

// A top list: descending, ties to the lower id, each entry's logprob the
// log-softmax of `logits` at it, and nothing left out that beats its last.
void CheckTop(const std::vector<generate::TokenLogprob>& top, const std::vector<float>& logits, size_t n) {
  REQUIRE(top.size() == n);
  for (size_t k = 0; k < top.size(); ++k) {
    CHECK(top[k].logprob == doctest::Approx(LogSoftmaxAt(logits, top[k].token)).epsilon(1e-5));
    if (k > 0) {
      CHECK((top[k - 1].logprob > top[k].logprob ||
             (top[k - 1].logprob == top[k].logprob && top[k - 1].token < top[k].token)));
    }
  }
  int beating = 0;
  for (float l : logits) beating += l > logits[static_cast<size_t>(top.back().token)];
  CHECK(beating < static_cast<int>(n));
}

// Issue 32: prompt tokens scored with the model's raw logits (position p - 1
// gives token p, across chunks), a draw scored with the penalized logits it
// came from, checked against a second reference model run here.
TEST_CASE("logprobs: prompt scoring across chunks and each draw's, against the reference") {
  auto file = Model();
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 2};
  const std::unique_ptr<CpuEngine> engine = LoadEngine(file, 1);
  CpuEngine& e = *engine;
  SamplerParams p;
  p.temperature = 0.8f;
  p.seed = 7;
  p.repeat_penalty = 1.5f;  // the draw's logprobs come after it
  REQUIRE(e.SetLogprobs(0, 3, true).ok());
  REQUIRE(e.Prefill(0, absl::MakeConstSpan(prompt).subspan(0, 2), false, p).ok());
  auto lp0 = e.TakeLogprobs(0);
  REQUIRE(lp0.ok());
  CHECK(!lp0->draw.has_value());
  auto first = e.Prefill(0, absl::MakeConstSpan(prompt).subspan(2), true, p);
  REQUIRE(first.ok());
  auto lp1 = e.TakeLogprobs(0);
  REQUIRE(lp1.ok());
  std::vector<generate::TokenLogprobs> scored = lp0->prompt;
  scored.insert(scored.end(), lp1->prompt.begin(), lp1->prompt.end());
  REQUIRE(scored.size() == prompt.size() - 1);  // the first token has no logits before it
  REQUIRE(lp1->draw.has_value());
  int32_t next = -1;
  const int slot[1] = {0};
  REQUIRE(e.Step(slot, absl::MakeSpan(&next, 1)).ok());
  auto lp2 = e.TakeLogprobs(0);
  REQUIRE(lp2.ok());
  CHECK(lp2->prompt.empty());
  REQUIRE(lp2->draw.has_value());
  auto empty = e.TakeLogprobs(0);
  REQUIRE(empty.ok());
  CHECK((empty->prompt.empty() && !empty->draw.has_value()));

  reference::ReferenceOptions ro;
  ro.n_ctx = 64;
  auto ref = reference::ReferenceModel::Load(file, ro);
  REQUIRE(ref.ok());
  std::vector<float> logits;
  for (size_t i = 0; i < prompt.size(); ++i) {
    if (i > 0) {
      CHECK(scored[i - 1].chosen.token == prompt[i]);
      CHECK(scored[i - 1].chosen.logprob == doctest::Approx(LogSoftmaxAt(logits, prompt[i])).epsilon(1e-5));
      CheckTop(scored[i - 1].top, logits, 3);
    }
    auto l = (*ref)->Forward(prompt[i], static_cast<int64_t>(i));
    REQUIRE(l.ok());
    logits = *l;
  }
  // The repetition penalty over the prompt's distinct tokens, by hand.
  auto penalize = [&](std::vector<float> l, const std::vector<int32_t>& history) {
    std::vector<int32_t> seen = history;
    std::sort(seen.begin(), seen.end());
    seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
    for (int32_t t : seen) l[t] = l[t] > 0 ? l[t] / 1.5f : l[t] * 1.5f;
    return l;
  };
  std::vector<int32_t> history = prompt;
  std::vector<float> penalized = penalize(logits, history);
  CHECK(lp1->draw->chosen.token == *first);
  CHECK(lp1->draw->chosen.logprob == doctest::Approx(LogSoftmaxAt(penalized, *first)).epsilon(1e-5));
  CheckTop(lp1->draw->top, penalized, 3);
  auto l = (*ref)->Forward(*first, static_cast<int64_t>(prompt.size()));
  REQUIRE(l.ok());
  history.push_back(*first);
  penalized = penalize(*l, history);
  CHECK(lp2->draw->chosen.token == next);
  CHECK(lp2->draw->chosen.logprob == doctest::Approx(LogSoftmaxAt(penalized, next)).epsilon(1e-5));
  CheckTop(lp2->draw->top, penalized, 3);

  // Scoring needs the whole prompt run: refused on a slot that holds some.
  CHECK(e.SetLogprobs(0, 1, true).code() == absl::StatusCode::kFailedPrecondition);
  CHECK(!e.SetLogprobs(0, generate::kMaxTopLogprobs + 1, false).ok());
  // KeepPrefix ends the request: nothing recorded from then on.
  REQUIRE(e.KeepPrefix(0, absl::MakeConstSpan(prompt).subspan(0, 2)).ok());
  REQUIRE(e.Prefill(0, absl::MakeConstSpan(prompt).subspan(2), true, p).ok());
  auto off = e.TakeLogprobs(0);
  REQUIRE(off.ok());
  CHECK((off->prompt.empty() && !off->draw.has_value()));
}

// A `false` logit bias (-inf) bans a token: the draw's logprobs leave it out
// as a masked one (never listed; the others renormalized), not an error.
TEST_CASE("logprobs with a banned token: left out, the rest renormalized") {
  auto file = Model();
  const std::unique_ptr<CpuEngine> engine = LoadEngine(file, 1);
  CpuEngine& e = *engine;
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 2};
  SamplerParams greedy;
  greedy.temperature = 0;
  auto draw = [&](absl::Span<const LogitBias> bias) {
    REQUIRE(e.KeepPrefix(0, {}).ok());
    REQUIRE(e.SetLogitBias(0, bias).ok());
    REQUIRE(e.SetLogprobs(0, 3, false).ok());
    auto t = e.Prefill(0, prompt, true, greedy);
    REQUIRE_MESSAGE(t.ok(), t.status().ToString());
    auto lp = e.TakeLogprobs(0);
    REQUIRE(lp.ok());
    REQUIRE(lp->draw.has_value());
    CHECK(lp->draw->chosen.token == *t);
    return *lp->draw;
  };
  const generate::TokenLogprobs free = draw({});
  const int32_t banned = free.top[0].token;
  const LogitBias ban[1] = {{banned, -INFINITY}};
  const generate::TokenLogprobs without = draw(ban);
  CHECK(without.chosen.token != banned);
  REQUIRE(without.top.size() == 3);
  const double rest = std::log1p(-std::exp(static_cast<double>(free.top[0].logprob)));
  for (size_t k = 0; k < 2; ++k) {
    CHECK(without.top[k].token == free.top[k + 1].token);
    CHECK(without.top[k].logprob == doctest::Approx(free.top[k + 1].logprob - rest).epsilon(1e-5));
  }
  for (const generate::TokenLogprob& t : without.top) CHECK(t.token != banned);
}

TEST_CASE("logprobs under a grammar: masked tokens are never listed") {
  auto file = Model("tiny-qwen2-vocab-q4km");  // qwen2's real vocabulary, random weights
  auto tok = tokenizer::Tokenizer::FromMetadata(file->metadata());
  REQUIRE(tok.ok());
  auto words = grammar::Grammar::Parse("root ::= \"yes\" | \"no\" | \"maybe\"");
  REQUIRE(words.ok());
  const std::unique_ptr<CpuEngine> engine = LoadEngine(file, 1);
  CpuEngine& e = *engine;
  REQUIRE(e.SetGrammar(0, std::make_shared<const grammar::Grammar>(*std::move(words))).ok());
  REQUIRE(e.SetLogprobs(0, generate::kMaxTopLogprobs, false).ok());
  SamplerParams p;
  p.seed = 3;
  auto first = e.Prefill(0, std::vector<int32_t>{1, 2, 3}, true, p);
  REQUIRE(first.ok());
  auto lp = e.TakeLogprobs(0);
  REQUIRE(lp.ok());
  CHECK(lp->prompt.empty());  // no prompt scoring asked
  REQUIRE(lp->draw.has_value());
  CHECK(lp->draw->chosen.token == *first);
  CHECK(std::isfinite(lp->draw->chosen.logprob));
  // Only the words' starts are allowed: a short list, holding all the mass.
  const auto& top = lp->draw->top;
  REQUIRE(!top.empty());
  CHECK(top.size() < static_cast<size_t>(generate::kMaxTopLogprobs));
  double mass = 0;
  for (const auto& t : top) {
    const std::string piece = tok->TokenToPiece(t.token);
    CHECK_MESSAGE((!piece.empty() && (std::string("yes").rfind(piece, 0) == 0 ||
                                      std::string("no").rfind(piece, 0) == 0 ||
                                      std::string("maybe").rfind(piece, 0) == 0)),
                  piece);
    mass += std::exp(static_cast<double>(t.logprob));
  }
  CHECK(mass == doctest::Approx(1.0).epsilon(1e-4));
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

// Issue 32's logit_bias on the engine: a slot's biases reach its draws
// only (the other slot decodes as before), every draw of the request (the
// banned token is the unbiased answer's first, and the tiny model tends to
// repeat it), and KeepPrefix clears them.
TEST_CASE("logit bias: per slot, every draw, cleared when the request ends") {
  auto file = Model();
  const std::vector<int32_t> prompt = {1, 2, 3};
  const std::vector<int32_t> want = Reference(file, prompt, 4);
  REQUIRE(want.size() == 4);
  auto engine = LoadEngine(file, 2);
  SamplerParams greedy;
  greedy.temperature = 0;
  const LogitBias ban[1] = {{want[0], -INFINITY}};
  REQUIRE(engine->SetLogitBias(0, ban).ok());
  auto first0 = engine->Prefill(0, prompt, true, greedy);
  auto first1 = engine->Prefill(1, prompt, true, greedy);
  REQUIRE((first0.ok() && first1.ok()));
  CHECK(*first1 == want[0]);
  CHECK(*first0 != want[0]);
  const int both[2] = {0, 1};
  std::vector<int32_t> got1 = {*first1};
  for (int i = 0; i < 3; ++i) {
    int32_t next[2];
    REQUIRE(engine->Step(both, absl::MakeSpan(next)).ok());
    CHECK(next[0] != want[0]);
    got1.push_back(next[1]);
  }
  CHECK(got1 == want);
  REQUIRE(engine->KeepPrefix(0, {}).ok());
  auto again = engine->Prefill(0, prompt, true, greedy);
  REQUIRE(again.ok());
  CHECK(*again == want[0]);

  const LogitBias outside[1] = {{engine->n_vocab(), 1.0f}};
  CHECK(engine->SetLogitBias(0, outside).code() == absl::StatusCode::kInvalidArgument);
  const LogitBias twice[2] = {{4, 1.0f}, {4, -1.0f}};
  CHECK(engine->SetLogitBias(0, twice).code() == absl::StatusCode::kInvalidArgument);
  CHECK(engine->SetLogitBias(2, {}).code() == absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dpl::server
