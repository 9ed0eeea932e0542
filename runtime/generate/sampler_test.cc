#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "runtime/generate/sampler.h"

namespace dpl::generate {
namespace {

const std::vector<float> kLogits = {1.0f, 3.0f, 2.5f, -1.0f, 3.0f, 0.0f, 2.9f, -4.0f};

// Sampling at `temperature` with top-k, top-p and min-p off; tests turn on
// what they check.
SamplerParams Plain(float temperature) {
  SamplerParams p;
  p.temperature = temperature;
  p.top_k = 0;
  p.top_p = 1;
  p.min_p = 0;
  return p;
}

TEST_CASE("greedy picks the argmax, ties to the lowest id") {
  SamplerParams p;
  p.temperature = 0;
  Sampler s(p);
  CHECK(s.Sample(kLogits) == 1);
}

TEST_CASE("top-k 1 equals greedy at any temperature") {
  SamplerParams p = Plain(5);
  p.top_k = 1;
  Sampler s(p);
  for (int i = 0; i < 50; ++i) CHECK(s.Sample(kLogits) == 1);
}

TEST_CASE("same seed, same tokens; other seed, other tokens") {
  SamplerParams p = Plain(1.5f);
  p.seed = 42;
  Sampler a(p), b(p);
  std::vector<int> ta, tb, tc;
  p.seed = 43;
  Sampler c(p);
  for (int i = 0; i < 100; ++i) {
    ta.push_back(a.Sample(kLogits));
    tb.push_back(b.Sample(kLogits));
    tc.push_back(c.Sample(kLogits));
  }
  CHECK(ta == tb);
  CHECK(ta != tc);
}

TEST_CASE("temperature sampling follows softmax") {
  Sampler s(Plain(1));
  std::vector<int> counts(kLogits.size());
  const int n = 40000;
  for (int i = 0; i < n; ++i) ++counts[s.Sample(kLogits)];
  double total = 0;
  for (float l : kLogits) total += std::exp(l);
  for (size_t i = 0; i < kLogits.size(); ++i) {
    const double want = std::exp(kLogits[i]) / total;
    CHECK(std::abs(counts[i] / double(n) - want) < 0.01);
  }
}

TEST_CASE("top-p and min-p cut the tail") {
  SamplerParams p = Plain(1);
  p.top_p = 0.5f;  // ids 1 and 4 (3.0 each) hold 0.54 of the mass
  Sampler s(p);
  for (int i = 0; i < 2000; ++i) {
    const int t = s.Sample(kLogits);
    CHECK((t == 1 || t == 4));
  }
  p.top_p = 1;
  p.min_p = 0.5f;  // keep logit >= 3 + ln 0.5 = 2.31: ids 1, 4, 6, 2
  Sampler m(p);
  for (int i = 0; i < 2000; ++i) {
    const int t = m.Sample(kLogits);
    CHECK((t == 1 || t == 4 || t == 6 || t == 2));
  }
}

TEST_CASE("repetition penalty pushes recent tokens down") {
  SamplerParams p;
  p.temperature = 0;
  p.repeat_penalty = 2.0f;
  Sampler s(p);
  s.Accept(1);
  s.Accept(4);
  CHECK(s.Sample(kLogits) == 6);  // 3.0 / 2 = 1.5 for ids 1 and 4
}

// OpenAI's presence and frequency penalties, as llama.cpp applies them over
// the window: l -= frequency x count + presence.
TEST_CASE("presence and frequency penalties subtract per recent token") {
  const std::vector<float> l = {1.0f, 5.0f, 4.5f, 4.0f};
  SamplerParams p;
  p.temperature = 0;
  {
    p.presence_penalty = 0.6f;
    Sampler s(p);
    s.Accept(1);
    CHECK(s.Sample(l) == 2);  // 5 - 0.6 = 4.4 < 4.5
  }
  {
    p.presence_penalty = 0.0f;
    p.frequency_penalty = 0.3f;
    Sampler s(p);
    s.Accept(1);
    CHECK(s.Sample(l) == 1);  // 5 - 0.3 = 4.7
    s.Accept(1);              // window: 1, 1
    CHECK(s.Sample(l) == 2);  // 5 - 0.6 = 4.4 < 4.5
  }
  {
    p.frequency_penalty = -1.5f;  // negative: encourages
    Sampler s(p);
    s.Accept(3);
    CHECK(s.Sample(l) == 3);  // 4 + 1.5 = 5.5 > 5
  }
}

// A mask of kLogits' 8 tokens allowing `ids`.
std::vector<uint32_t> Allow(std::initializer_list<int> ids) {
  std::vector<uint32_t> m(1, 0);
  for (int id : ids) m[0] |= 1u << id;
  return m;
}

TEST_CASE("a mask: greedy takes the best allowed token") {
  SamplerParams p;
  p.temperature = 0;
  Sampler s(p);
  CHECK(*s.SampleAllowed(kLogits, Allow({0, 3, 6})) == 6);
  CHECK(*s.SampleAllowed(kLogits, Allow({7})) == 7);
  CHECK(*s.SampleAllowed(kLogits, Allow({0, 1, 2, 3, 4, 5, 6, 7})) == 1);
}

TEST_CASE("a mask: random draws never pick a masked token, whatever the filters") {
  for (float t : {0.5f, 1.0f, 50.0f}) {
    SamplerParams p = Plain(t);
    p.top_k = 2;  // the two best overall (1, 4) are both masked
    p.top_p = 0.9f;
    p.min_p = 0.05f;
    p.seed = 7;
    Sampler s(p);
    for (int i = 0; i < 300; ++i) {
      const int32_t id = *s.SampleAllowed(kLogits, Allow({3, 5, 7}));
      CHECK((id == 3 || id == 5 || id == 7));
    }
  }
  // Only a very unlikely token allowed: it is the draw every time (the
  // rounding fallback is an allowed token too).
  SamplerParams p = Plain(0.01f);
  Sampler s(p);
  for (int i = 0; i < 50; ++i) CHECK(*s.SampleAllowed(kLogits, Allow({7})) == 7);
}

TEST_CASE("a mask: none allowed or the wrong size is an error") {
  Sampler s(Plain(1));
  absl::StatusOr<int32_t> none = s.SampleAllowed(kLogits, Allow({}));
  CHECK(none.status().code() == absl::StatusCode::kFailedPrecondition);
  std::vector<uint32_t> two(2, ~0u);
  CHECK(s.SampleAllowed(kLogits, two).status().code() == absl::StatusCode::kInvalidArgument);
  SamplerParams g;
  g.temperature = 0;
  Sampler greedy(g);
  CHECK(!greedy.SampleAllowed(kLogits, Allow({})).ok());
}

// OpenAI's logit_bias: added to the logits before anything else.
TEST_CASE("a logit bias changes the greedy choice") {
  SamplerParams p;
  p.temperature = 0;
  CHECK(Sampler(p, {{6, 0.2f}}).Sample(kLogits) == 6);             // 2.9 + 0.2 beats 3.0
  CHECK(Sampler(p, {{1, -100.0f}}).Sample(kLogits) == 4);          // 1 banned in practice: its tie, 4
  CHECK(Sampler(p, {{1, -100.0f}, {4, -0.2f}}).Sample(kLogits) == 6);
  CHECK(Sampler(p, {{7, 10.0f}}).Sample(kLogits) == 7);            // the worst, pushed to the top
  CHECK(Sampler(p, {{99, 50.0f}}).Sample(kLogits) == 1);           // outside the vocabulary: skipped
  Sampler s(p, {{2, 1.0f}});
  const absl::Span<const float> biased = s.Penalized(kLogits);
  CHECK(biased[2] == 3.5f);
  CHECK(biased[1] == 3.0f);
}

TEST_CASE("a -inf bias (false) bans a token at any temperature, whatever the filters and seed") {
  const std::vector<LogitBias> ban = {{1, -INFINITY}, {4, -INFINITY}, {6, -INFINITY}};
  for (float t : {0.0f, 0.5f, 1.0f, 50.0f}) {
    for (uint64_t seed = 0; seed < 100; ++seed) {
      SamplerParams p = Plain(t);
      p.seed = seed;
      if (seed % 2 == 1) {  // the default filters on half of them
        p.top_k = 2;       // the two best overall (1, 4) are both banned
        p.top_p = 0.9f;
        p.min_p = 0.05f;
      }
      Sampler s(p, ban);
      for (int i = 0; i < 20; ++i) {
        const int32_t id = s.Sample(kLogits);
        CHECK((id != 1 && id != 4 && id != 6));
      }
    }
  }
  // Every token but the least likely banned: it is every draw, even at a
  // temperature whose weights of the others would round to nothing.
  std::vector<LogitBias> all_but_7;
  for (int32_t id = 0; id < 7; ++id) all_but_7.push_back({id, -INFINITY});
  for (float t : {0.01f, 1.0f, 1000.0f}) {
    Sampler s(Plain(t), all_but_7);
    for (int i = 0; i < 50; ++i) CHECK(s.Sample(kLogits) == 7);
  }
  // A ban holds with a mask too, which leaves only banned tokens and 5.
  Sampler m(Plain(1), ban);
  for (int i = 0; i < 50; ++i) CHECK(*m.SampleAllowed(kLogits, Allow({1, 4, 5, 6})) == 5);
}

// llama.cpp's chain: logit bias, then the penalties, on the biased logit.
// Token 0 (1.0) is recent under repeat_penalty 2 and biased +1: first the
// bias, then the penalty: (1 + 1) / 2 = 1.0 < 1.2, token 1 wins; the other
// order would give 1 / 2 + 1 = 1.5 and token 0.
TEST_CASE("the bias comes before the penalties") {
  const std::vector<float> l = {1.0f, 1.2f};
  SamplerParams p;
  p.temperature = 0;
  p.repeat_penalty = 2.0f;
  Sampler s(p, {{0, 1.0f}});
  s.Accept(0);
  CHECK(s.Penalized(l)[0] == 1.0f);
  CHECK(s.Sample(l) == 1);
  // A negative logit: the penalty multiplies the biased value,
  // (-1 - 1) x 2 = -4 < -3.5 (the other order: -1 x 2 - 1 = -3 > -3.5).
  const std::vector<float> neg = {-1.0f, -3.5f};
  Sampler n(p, {{0, -1.0f}});
  n.Accept(0);
  CHECK(n.Penalized(neg)[0] == -4.0f);
  CHECK(n.Sample(neg) == 1);
  // And the presence penalty subtracts from the biased logit.
  SamplerParams q;
  q.temperature = 0;
  q.presence_penalty = 1.5f;
  Sampler pr(q, {{0, 1.0f}});
  pr.Accept(0);
  CHECK(pr.Penalized(l)[0] == 0.5f);
  CHECK(pr.Sample(l) == 1);
}

}  // namespace
}  // namespace dpl::generate
