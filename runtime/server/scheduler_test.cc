// The scheduler on the CPU engine and a tiny model (ids-only vocabulary, so a
// token's text is "<ID>"): requests decoded together give the text each gives
// alone, whatever the prompt chunking; stop strings, stop tokens, max_tokens
// and a full context end them; the queue is bounded; a cancelled request
// frees its slot; shutdown ends every stream. The KV block pool (issue 30):
// tables grow with positions, requests wait for blocks, the newest is
// preempted and completes with the text it gives alone, a request the pool
// can never hold is refused, a copied start shares its full blocks. The
// block cache (issue 30's prefix reuse, on a paged engine that adopts
// blocks): a chat's next turn adopts the blocks its slot no longer holds,
// eviction goes least recently released first, adopted blocks count
// against the pool and are never handed out while in use.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "formats/gguf.h"
#include "formats/model_file.h"
#include "runtime/grammar/grammar.h"
#include "runtime/grammar/json_schema.h"
#include "runtime/grammar/matcher.h"
#include "runtime/kv/seq_tables.h"
#include "runtime/server/cpu_engine.h"
#include "runtime/server/openai_api.h"
#include "runtime/server/scheduler.h"
#include "runtime/tokenizer/tokenizer.h"
#include "tests/shared_dir.h"

namespace dpl::server {
namespace {

struct Fixture {
  std::shared_ptr<formats::ModelFile> file;
  std::unique_ptr<tokenizer::Tokenizer> tok;
  std::unique_ptr<CpuEngine> engine;

  // model: an oracle file's name (../shared/oracle/MODEL.gguf), or a path
  // (starting with '/').
  explicit Fixture(int slots, int64_t n_ctx = 64, const std::string& model = "small-qwen2-q4km") {
    auto f = formats::ModelFile::Open(model[0] == '/' ? model : testing::SharedDir() + "/oracle/" + model + ".gguf");
    REQUIRE_MESSAGE(f.ok(), f.status().ToString());
    file = *f;
    auto t = tokenizer::Tokenizer::FromMetadata(file->metadata());
    REQUIRE(t.ok());
    tok = std::make_unique<tokenizer::Tokenizer>(*std::move(t));
    CpuEngineOptions o;
    o.n_slots = slots;
    o.n_ctx = n_ctx;
    o.threads = 1;
    auto e = CpuEngine::Load(file, o);
    REQUIRE(e.ok());
    engine = *std::move(e);
  }
};

struct Result {
  std::string text;
  StreamEvent final;
  std::vector<generate::TokenLogprobs> logprobs, prompt_logprobs;  // all events'
  int prompt_events = 0;  // events that carried prompt logprobs
};

Result Collect(RequestStream& s) {
  Result r;
  for (;;) {
    for (StreamEvent& e : s.Wait(absl::Seconds(30))) {
      r.text += e.text;
      r.logprobs.insert(r.logprobs.end(), e.logprobs.begin(), e.logprobs.end());
      r.prompt_logprobs.insert(r.prompt_logprobs.end(), e.prompt_logprobs.begin(), e.prompt_logprobs.end());
      r.prompt_events += !e.prompt_logprobs.empty();
      if (e.final) {
        r.final = std::move(e);
        return r;
      }
    }
  }
}

GenerationRequest Greedy(std::vector<int32_t> prompt, int32_t max_tokens) {
  GenerationRequest r;
  r.prompt = std::move(prompt);
  r.sampling.temperature = 0;
  r.max_tokens = max_tokens;
  return r;
}

Result RunAlone(const GenerationRequest& r, int prefill_chunk = 256) {
  Fixture f(1);
  Scheduler s(*f.engine, *f.tok, {4, prefill_chunk});
  auto stream = s.Submit(r);
  REQUIRE(stream.ok());
  return Collect(**stream);
}

std::vector<std::shared_ptr<RequestStream>> SubmitAll(Scheduler& s,
                                                      const std::vector<GenerationRequest>& reqs) {
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (const auto& r : reqs) {
    auto st = s.Submit(r);
    REQUIRE(st.ok());
    streams.push_back(*st);
  }
  return streams;
}

TEST_CASE("requests decoded together give the text each gives alone") {
  const std::vector<GenerationRequest> reqs = {Greedy({1, 2, 3, 4, 5}, 5), Greedy({9, 8}, 7),
                                               Greedy({1, 2, 3}, 4)};
  std::vector<Result> alone;
  for (const auto& r : reqs) alone.push_back(RunAlone(r));
  CHECK(alone[0].text == RunAlone(reqs[0], 2).text);  // prompt in chunks of 2

  Fixture f(2);
  SchedulerOptions apart{4, 2};
  apart.mixed_steps = false;  // a PrefillBatch, then a Step
  Scheduler s(*f.engine, *f.tok, apart);
  const std::vector<std::shared_ptr<RequestStream>> streams = SubmitAll(s, reqs);
  for (size_t i = 0; i < reqs.size(); ++i) {
    const Result got = Collect(*streams[i]);
    CHECK(got.final.error.ok());
    CHECK(got.text == alone[i].text);
    CHECK(got.final.finish == FinishReason::kLength);
    CHECK(got.final.completion_tokens == reqs[i].max_tokens);
    CHECK(got.final.prompt_tokens == static_cast<int64_t>(reqs[i].prompt.size()));
  }
  // The same with each iteration's prompts and step in one engine call (the
  // default).
  SchedulerOptions mixed{4, 2};
  mixed.mixed_steps = true;
  Fixture fm(2);
  Scheduler sm(*fm.engine, *fm.tok, mixed);
  const std::vector<std::shared_ptr<RequestStream>> mixed_streams = SubmitAll(sm, reqs);
  for (size_t i = 0; i < reqs.size(); ++i) CHECK(Collect(*mixed_streams[i]).text == alone[i].text);
  const SchedulerMetrics m = s.metrics();
  CHECK(m.requests_total == 3);
  // {1, 2, 3} may find {1, 2} in the first request's slot.
  CHECK(m.prompt_tokens_total + m.prompt_tokens_cached_total == 10);
  CHECK(m.generated_tokens_total == 5 + 7 + 4);  // the usage's sum, first tokens (from Prefill) too
  CHECK(m.processing == 0);
  CHECK(m.deferred == 0);
  // One observation a request in each (all three made two tokens or more).
  for (const Histogram* h : {&m.time_to_first_token, &m.time_per_output_token, &m.request_latency}) {
    CHECK(h->count == 3);
    CHECK(h->sum > 0);
    int64_t in_buckets = 0;
    for (int64_t c : h->counts) in_buckets += c;
    CHECK(in_buckets == 3);
  }
  CHECK(m.request_latency.sum >= m.time_to_first_token.sum);
  CHECK(m.kv_positions_total == static_cast<int64_t>(s.engine().n_slots()) * s.engine().n_ctx());
  CHECK(m.kv_positions_used <= m.kv_positions_total);
}

TEST_CASE("a histogram counts each value under the first bound at or above it") {
  Histogram h({1.0, 2.0});
  for (double v : {0.5, 1.0, 1.5, 5.0}) h.Observe(v);
  CHECK(h.counts == std::vector<int64_t>{2, 1, 1});
  CHECK(h.count == 4);
  CHECK(h.sum == doctest::Approx(8.0));
}

// The engine calls the scheduler makes, in order: prompt tokens per Prefill
// (its slot), and a Step as -1.
class RecordingEngine : public BatchEngine {
 public:
  explicit RecordingEngine(BatchEngine& e) : e_(e) {}
  int n_slots() const override { return e_.n_slots(); }
  int64_t n_ctx() const override { return e_.n_ctx(); }
  int32_t n_vocab() const override { return e_.n_vocab(); }
  absl::StatusOr<int32_t> Prefill(int slot, absl::Span<const int32_t> tokens, bool last,
                                  const SamplerParams& params) override {
    Log({slot, static_cast<int>(tokens.size())});
    return e_.Prefill(slot, tokens, last, params);
  }
  // The base's PrefillBatch (a Prefill per part, each logged), its sizes kept.
  absl::Status PrefillBatch(absl::Span<const PrefillPart> parts, absl::Span<int32_t> first) override {
    {
      absl::MutexLock lock(&mu_);
      batches_.push_back(static_cast<int>(parts.size()));
    }
    Log({-2, static_cast<int>(parts.size())});
    return BatchEngine::PrefillBatch(parts, first);
  }
  std::vector<int> batches() {
    absl::MutexLock lock(&mu_);
    return batches_;
  }
  absl::Status Step(absl::Span<const int> slots, absl::Span<int32_t> next) override {
    Log({-1, static_cast<int>(slots.size())});
    return e_.Step(slots, next);
  }
  int64_t n_past(int slot) const override { return e_.n_past(slot); }
  absl::Status KeepPrefix(int slot, absl::Span<const int32_t> kept) override {
    return e_.KeepPrefix(slot, kept);
  }
  absl::Status CopyPrefix(int slot, int from, absl::Span<const int32_t> kept) override {
    {
      absl::MutexLock lock(&mu_);
      copies_.push_back({from, slot, static_cast<int>(kept.size())});
    }
    return e_.CopyPrefix(slot, from, kept);
  }
  void Release(int slot) override { e_.Release(slot); }
  // The scheduler's KV block tables: each slot's latest, and every table
  // a slot was given, in order.
  void SetBlockTable(int slot, absl::Span<const int> blocks) override {
    absl::MutexLock lock(&mu_);
    tables_.push_back({slot, std::vector<int>(blocks.begin(), blocks.end())});
  }
  std::vector<std::pair<int, std::vector<int>>> tables() {
    absl::MutexLock lock(&mu_);
    return tables_;
  }
  bool supports_logprobs() const override { return e_.supports_logprobs(); }
  absl::Status SetLogprobs(int slot, int top_n, bool prompt) override { return e_.SetLogprobs(slot, top_n, prompt); }
  absl::StatusOr<SlotLogprobs> TakeLogprobs(int slot) override { return e_.TakeLogprobs(slot); }
  std::vector<std::pair<int, int>> calls() {
    absl::MutexLock lock(&mu_);
    return calls_;
  }
  struct Copy {
    int from, to, n;
    bool operator==(const Copy& o) const { return from == o.from && to == o.to && n == o.n; }
  };
  std::vector<Copy> copies() {
    absl::MutexLock lock(&mu_);
    return copies_;
  }

 private:
  void Log(std::pair<int, int> c) {
    absl::MutexLock lock(&mu_);
    calls_.push_back(c);
  }
  BatchEngine& e_;
  absl::Mutex mu_;
  std::vector<std::pair<int, int>> calls_;  // (slot, tokens), (-1, a step's rows) or (-2, a batch's parts)
  std::vector<Copy> copies_;
  std::vector<int> batches_;  // parts per PrefillBatch call
  std::vector<std::pair<int, std::vector<int>>> tables_;  // SetBlockTable calls
};

// The ids of an ids-only vocabulary's text ("<12><7>" -> {12, 7}).
std::vector<int32_t> Ids(const std::string& text) {
  std::vector<int32_t> ids;
  for (size_t at = 0; (at = text.find('<', at)) != std::string::npos; ++at) {
    ids.push_back(std::stoi(text.substr(at + 1)));
  }
  return ids;
}

std::vector<int32_t> Concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// llama-server's prompt cache: a finished request's slot keeps its prompt
// and the answer it ran; a later prompt that starts with them runs only the
// rest (the slot matching it longest is taken), and its text is the text it
// gives alone. cache_prompt false runs it all.
TEST_CASE("a slot's cache serves the next prompt that starts like it") {
  Fixture f(2);
  RecordingEngine rec(*f.engine);
  Scheduler s(rec, *f.tok, {4, 256});
  auto run = [&s](const GenerationRequest& r) {
    auto st = s.Submit(r);
    REQUIRE(st.ok());
    return Collect(**st);
  };
  const GenerationRequest p = Greedy({5, 6, 7, 8}, 4), q = Greedy({40, 41, 42}, 3);
  const Result rp = run(p);  // slot 0
  const Result rq = run(q);  // slot 1, the one free longest
  CHECK(rp.final.cached_tokens == 0);
  CHECK(rq.final.cached_tokens == 0);
  const std::vector<int32_t> ap = Ids(rp.text), aq = Ids(rq.text);
  REQUIRE(ap.size() == 4);
  REQUIRE(aq.size() == 3);
  // The next turns: each prompt, its answer and more. The slot ran the
  // prompt and all of its answer but the last token (sampled, never run).
  const GenerationRequest p2 = Greedy(Concat(Concat(p.prompt, ap), {9, 10}), 3);
  const GenerationRequest q2 = Greedy(Concat(Concat(q.prompt, aq), {11}), 3);
  const size_t calls_before = rec.calls().size();
  const Result rq2 = run(q2);
  const Result rp2 = run(p2);
  CHECK(rq2.final.cached_tokens == 3 + 2);
  CHECK(rp2.final.cached_tokens == 4 + 3);
  CHECK(rq2.text == RunAlone(q2).text);
  CHECK(rp2.text == RunAlone(p2).text);
  // Only the rest went through Prefill: 7 - 5 and 10 - 7 tokens.
  std::vector<int> fed;
  const std::vector<std::pair<int, int>> calls = rec.calls();
  for (size_t i = calls_before; i < calls.size(); ++i) {
    if (calls[i].first >= 0) fed.push_back(calls[i].second);
  }
  CHECK(fed == std::vector<int>{2, 3});
  // A prompt no longer than what matches keeps its last token to run.
  const Result again = run(p);
  CHECK(again.final.cached_tokens == 3);
  CHECK(again.text == rp.text);
  // Opting out: nothing reused, the same text.
  GenerationRequest off = p2;
  off.cache_prompt = false;
  const Result roff = run(off);
  CHECK(roff.final.cached_tokens == 0);
  CHECK(roff.text == rp2.text);
  const SchedulerMetrics m = s.metrics();
  CHECK(m.prompt_tokens_cached_total == 5 + 7 + 3);
  CHECK(m.prompt_tokens_total == 4 + 3 + 2 + 3 + 1 + 10);
}

// A shared start (a system prompt) that another slot holds is copied, not
// recomputed: from a running request's slot (admitted together: the second
// starts once the first has run its prompt) and from a free slot that keeps
// it, the free slot's own cache left for its conversation's next turn.
// Each text is the text the prompt gives alone; cache_prompt false copies
// nothing.
TEST_CASE("a start that another slot holds is copied into the request's slot") {
  Fixture f(3);
  RecordingEngine rec(*f.engine);
  SchedulerOptions o{4, 256};
  o.defer_for_shared_start = 4;  // b, admitted beside a, waits for a's 6 shared tokens to run
  Scheduler s(rec, *f.tok, o);
  const std::vector<int32_t> system = {21, 22, 23, 24, 25, 26};
  const GenerationRequest a = Greedy(Concat(system, {30, 31}), 4), b = Greedy(Concat(system, {40}), 3);
  const std::vector<std::shared_ptr<RequestStream>> streams = SubmitAll(s, {a, b});
  const Result ra = Collect(*streams[0]), rb = Collect(*streams[1]);
  CHECK(ra.final.cached_tokens == 0);
  CHECK(rb.final.cached_tokens == 6);
  CHECK(ra.text == RunAlone(a).text);
  CHECK(rb.text == RunAlone(b).text);
  REQUIRE(rec.copies().size() == 1);
  CHECK(rec.copies()[0] == RecordingEngine::Copy{0, 1, 6});  // a's slot, running, into b's

  // c takes the third slot (free longest: never used) and copies the
  // system prompt from a free slot, which keeps its own conversation.
  const GenerationRequest c = Greedy(Concat(system, {50, 51, 52}), 2);
  const Result rc = Collect(**s.Submit(c));
  CHECK(rc.final.cached_tokens == 6);
  CHECK(rc.text == RunAlone(c).text);
  REQUIRE(rec.copies().size() == 2);
  CHECK(rec.copies()[1].to == 2);
  CHECK(rec.copies()[1].n == 6);
  // a's next turn finds its whole history in place (slot 0: no copy).
  const GenerationRequest a2 = Greedy(Concat(Concat(a.prompt, Ids(ra.text)), {60}), 2);
  const Result ra2 = Collect(**s.Submit(a2));
  CHECK(ra2.final.cached_tokens == static_cast<int64_t>(a.prompt.size() + 3));
  CHECK(ra2.text == RunAlone(a2).text);
  CHECK(rec.copies().size() == 2);
  GenerationRequest off = Greedy(Concat(system, {70}), 2);
  off.cache_prompt = false;
  const Result roff = Collect(**s.Submit(off));
  CHECK(roff.final.cached_tokens == 0);
  CHECK(roff.text == RunAlone(off).text);
  CHECK(rec.copies().size() == 2);
  const SchedulerMetrics m = s.metrics();
  CHECK(m.prompt_tokens_copied_total == 12);
  CHECK(m.prompt_tokens_cached_total == 12 + a.prompt.size() + 3);
}

// The API's n: samples of one prompt, sample j with seed + j, as
// http_server's AddSamples makes them.
std::vector<GenerationRequest> Samples(GenerationRequest r, int n) {
  std::vector<GenerationRequest> out;
  for (int j = 0; j < n; ++j) {
    out.push_back(r);
    out.back().sampling.seed = r.sampling.seed + static_cast<uint64_t>(j);
  }
  return out;
}

GenerationRequest Sampled(std::vector<int32_t> prompt, int32_t max_tokens, uint64_t seed) {
  GenerationRequest r;
  r.prompt = std::move(prompt);
  r.sampling.temperature = 1;
  r.sampling.seed = seed;
  r.max_tokens = max_tokens;
  return r;
}

// Prompt tokens per slot that went through Prefill since call `from`.
std::vector<int> FedPerSlot(RecordingEngine& rec, int slots, size_t from = 0) {
  std::vector<int> fed(static_cast<size_t>(slots), 0);
  const std::vector<std::pair<int, int>> calls = rec.calls();
  for (size_t i = from; i < calls.size(); ++i) {
    if (calls[i].first >= 0) fed[static_cast<size_t>(calls[i].first)] += calls[i].second;
  }
  return fed;
}

// n = 3 on 3 slots: the prompt runs once, in sample 0's slot; the other two
// wait for it, copy all of it but its last token from that slot and run only
// that token (for their own first draw). Sample j's answer is the answer of
// the request with seed + j alone. The metrics count the prompt once.
TEST_CASE("samples of one prompt (n) run it once; each answer is its seed's alone") {
  Fixture f(3);
  RecordingEngine rec(*f.engine);
  Scheduler s(rec, *f.tok, {4, 256});
  const std::vector<int32_t> prompt = {21, 22, 23, 24, 25, 26, 27, 28};
  const std::vector<GenerationRequest> samples = Samples(Sampled(prompt, 6, 7), 3);
  auto streams = s.SubmitSamples(samples);
  REQUIRE(streams.ok());
  REQUIRE(streams->size() == 3);
  std::vector<std::string> texts;
  for (size_t j = 0; j < 3; ++j) {
    const Result got = Collect(*(*streams)[j]);
    CHECK(got.final.error.ok());
    CHECK(got.final.completion_tokens == 6);
    CHECK(got.final.prompt_tokens == 8);
    CHECK(got.final.cached_tokens == (j == 0 ? 0 : 7));  // its sibling's, copied
    CHECK(got.text == RunAlone(samples[j]).text);
    texts.push_back(got.text);
  }
  CHECK((texts[0] != texts[1] || texts[1] != texts[2]));  // the seeds differ, so do the answers
  std::vector<int> fed = FedPerSlot(rec, 3);
  std::sort(fed.begin(), fed.end());
  CHECK(fed == std::vector<int>{1, 1, 8});
  const std::vector<RecordingEngine::Copy> copies = rec.copies();
  REQUIRE(copies.size() == 2);
  for (const RecordingEngine::Copy& c : copies) {
    CHECK(c.from == copies[0].from);  // sample 0's slot
    CHECK(c.n == 7);
  }
  const SchedulerMetrics m = s.metrics();
  CHECK(m.requests_total == 3);
  CHECK(m.prompt_tokens_total == 8);  // as usage: the prompt once
  CHECK(m.prompt_tokens_cached_total == 0);
  CHECK(m.prompt_tokens_copied_total == 0);
  CHECK(m.generated_tokens_total == 18);

  // Refused: samples of different prompts, or one sample refused.
  std::vector<GenerationRequest> mixed = Samples(Sampled(prompt, 2, 1), 2);
  mixed[1].prompt.push_back(29);
  CHECK(s.SubmitSamples(mixed).status().code() == absl::StatusCode::kInvalidArgument);
  std::vector<GenerationRequest> bad = Samples(Sampled(prompt, 2, 1), 2);
  bad[1].max_tokens = -2;
  CHECK(s.SubmitSamples(bad).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(s.metrics().requests_total == 3);
}

// n = 4 on 2 slots, with a queue of 1 (4 > 2 + 1, but nothing else waits:
// the group goes in): the samples past the slots wait in the queue and run
// as slots free up, each from the prompt that a slot holds (kept in place
// or copied), every answer its seed's.
TEST_CASE("more samples than slots: all complete, the prompt still runs once") {
  Fixture f(2);
  RecordingEngine rec(*f.engine);
  Scheduler s(rec, *f.tok, {1, 256});
  const std::vector<int32_t> prompt = {31, 32, 33, 34, 35, 36};
  const std::vector<GenerationRequest> samples = Samples(Sampled(prompt, 4, 100), 4);
  auto streams = s.SubmitSamples(samples);
  REQUIRE(streams.ok());
  for (size_t j = 0; j < 4; ++j) {
    const Result got = Collect(*(*streams)[j]);
    CHECK(got.final.error.ok());
    CHECK(got.final.completion_tokens == 4);
    CHECK(got.text == RunAlone(samples[j]).text);
  }
  const std::vector<int> fed = FedPerSlot(rec, 2);
  CHECK(fed[0] + fed[1] == 6 + 3);  // the prompt once, then one token a sample
  const SchedulerMetrics m = s.metrics();
  CHECK(m.prompt_tokens_total + m.prompt_tokens_cached_total == 6);
  CHECK(m.processing == 0);
  CHECK(m.deferred == 0);
  // One slot and no queue (--queue 0): the group still goes in whole and
  // runs one sample after the other.
  Fixture one(1);
  Scheduler lone(*one.engine, *one.tok, {0, 256});
  const std::vector<GenerationRequest> short_samples = Samples(Sampled(prompt, 2, 100), 3);
  auto three = lone.SubmitSamples(short_samples);
  REQUIRE(three.ok());
  for (size_t j = 0; j < 3; ++j) CHECK(Collect(*(*three)[j]).text == RunAlone(short_samples[j]).text);
  CHECK(lone.metrics().prompt_tokens_total + lone.metrics().prompt_tokens_cached_total == 6);
}

// cache_prompt false: the samples share the prompt that sample 0 runs (in
// full), but nothing another request left in a slot. With prompt logprobs
// (echo) every sample scores the prompt itself: each runs it whole.
TEST_CASE("samples with cache_prompt false or prompt logprobs") {
  Fixture f(3);
  RecordingEngine rec(*f.engine);
  Scheduler s(rec, *f.tok, {4, 256});
  const std::vector<int32_t> prompt = {41, 42, 43, 44, 45};
  REQUIRE(Collect(**s.Submit(Greedy(prompt, 2))).final.error.ok());  // slot 0 holds the prompt
  GenerationRequest off = Sampled(prompt, 3, 5);
  off.cache_prompt = false;
  const std::vector<GenerationRequest> samples = Samples(off, 2);
  size_t from = rec.calls().size();
  auto streams = s.SubmitSamples(samples);
  REQUIRE(streams.ok());
  for (size_t j = 0; j < 2; ++j) {
    const Result got = Collect(*(*streams)[j]);
    CHECK(got.text == RunAlone(samples[j]).text);
  }
  CHECK(FedPerSlot(rec, 3, from) == std::vector<int>{0, 5, 1});  // slots 1 and 2: the free longest
  REQUIRE(rec.copies().size() == 1);
  CHECK(rec.copies()[0] == RecordingEngine::Copy{1, 2, 4});  // from its sibling, not slot 0

  GenerationRequest scored = Sampled(prompt, 2, 9);
  scored.logprobs = 0;
  scored.prompt_logprobs = true;
  from = rec.calls().size();
  auto scored_streams = s.SubmitSamples(Samples(scored, 2));
  REQUIRE(scored_streams.ok());
  for (const auto& st : *scored_streams) CHECK(Collect(*st).prompt_logprobs.size() == 4);
  const std::vector<int> fed = FedPerSlot(rec, 3, from);
  CHECK(fed[0] + fed[1] + fed[2] == 10);
  CHECK(rec.copies().size() == 1);
}

// Between two steps the scheduler feeds at most prefill_chunk prompt tokens
// in all: several short prompts go in one PrefillBatch (a burst of
// arrivals), a long one in chunks. The texts do not change.
TEST_CASE("short prompts share one step's prefill budget; a long one goes in chunks") {
  const std::vector<GenerationRequest> reqs = {Greedy({1, 2, 3}, 3), Greedy({9, 8}, 3),
                                               Greedy({4, 5, 6, 7}, 3), Greedy({3, 1, 4, 1, 5, 9, 2, 6, 5, 3}, 3)};
  Fixture f(4);
  RecordingEngine rec(*f.engine);
  Scheduler s(rec, *f.tok, {4, 6});
  const std::vector<std::shared_ptr<RequestStream>> streams = SubmitAll(s, reqs);
  for (size_t i = 0; i < reqs.size(); ++i) {
    const Result got = Collect(*streams[i]);
    CHECK(got.final.error.ok());
    CHECK(got.text == RunAlone(reqs[i]).text);
  }
  const std::vector<std::pair<int, int>> calls = rec.calls();
  int fed = 0, back_to_back = 0;
  std::vector<int> slot_tokens(4, 0), slot_calls(4, 0);
  for (size_t i = 0; i < calls.size(); ++i) {
    if (calls[i].first < 0) {
      fed = 0;
      continue;
    }
    fed += calls[i].second;
    CHECK(fed <= 6);  // the budget of one iteration (one PrefillBatch)
    slot_tokens[calls[i].first] += calls[i].second;
    ++slot_calls[calls[i].first];
    if (i > 0 && calls[i - 1].first >= 0 && calls[i - 1].first != calls[i].first) ++back_to_back;
  }
  std::vector<int> sorted = slot_tokens;
  std::sort(sorted.begin(), sorted.end());
  CHECK(sorted == std::vector<int>{2, 3, 4, 10});  // each prompt whole, in its own slot
  for (int k = 0; k < 4; ++k) {
    if (slot_tokens[k] == 10) CHECK(slot_calls[k] >= 2);  // the long prompt in chunks
  }
  // Prompts admitted together run in one iteration, one PrefillBatch (the
  // test submits all four before the first prefill of 3 tokens has finished
  // on the CPU).
  CHECK(back_to_back >= 1);
  const std::vector<int> batches = rec.batches();
  CHECK(*std::max_element(batches.begin(), batches.end()) >= 2);
}


// With mixed steps the decode rows ride in the prompts' pass, so they count
// against its budget: an iteration's prompt tokens and decode rows together
// stay within prefill_chunk (the CUDA engine's max_batch; one row more and
// it runs the pass and the step apart), while at least half of it stays
// the prompts'. The texts do not change.
TEST_CASE("mixed steps: the decode rows count against the prefill budget") {
  const std::vector<GenerationRequest> reqs = {Greedy({1, 2, 3}, 12), Greedy({9, 8, 7}, 12),
                                               Greedy({3, 1, 4, 1, 5, 9, 2, 6, 5, 3}, 6),
                                               Greedy({2, 7, 1, 8, 2, 8, 1, 8, 2, 8}, 6)};
  constexpr int kChunk = 8;
  Fixture f(4);
  RecordingEngine rec(*f.engine);
  SchedulerOptions o{4, kChunk};
  o.mixed_steps = true;
  Scheduler s(rec, *f.tok, o);
  const std::vector<std::shared_ptr<RequestStream>> streams = SubmitAll(s, reqs);
  for (size_t i = 0; i < reqs.size(); ++i) {
    const Result got = Collect(*streams[i]);
    CHECK(got.final.error.ok());
    CHECK(got.text == RunAlone(reqs[i]).text);
  }
  // An iteration: a PrefillBatch (-2) and its parts, then its step (-1).
  int fed = 0, shared = 0;
  for (const auto& [slot, n] : rec.calls()) {
    if (slot == -2) {
      fed = 0;
    } else if (slot >= 0) {
      fed += n;
    } else {
      if (fed > 0) {
        ++shared;
        CAPTURE(n);
        CHECK(fed + n <= kChunk);
      }
      fed = 0;
    }
  }
  CHECK(shared >= 1);  // the long prompts ran beside decode rows
}
TEST_CASE("the step trace: a line per engine call, its rows and prompt tokens those the load ran") {
  const std::vector<GenerationRequest> reqs = {Greedy({1, 2, 3}, 4), Greedy({9, 8, 7, 6, 5}, 3),
                                               Greedy({4, 5, 6, 7}, 5)};
  auto trace = std::make_shared<std::ostringstream>();
  Fixture f(3);
  SchedulerOptions o{4, 4};  // a budget of 4: the 12 prompt tokens take three iterations or more
  o.trace = trace;
  {
    Scheduler s(*f.engine, *f.tok, o);
    for (const auto& st : SubmitAll(s, reqs)) CHECK(Collect(*st).final.error.ok());
  }  // the destructor joins the engine thread: every line is written
  std::istringstream in(trace->str());
  std::string line;
  REQUIRE(std::getline(in, line));
  CHECK(line == "t_ms\tgap_ms\tengine_ms\tdecode_rows\tprompt_parts\tprompt_tokens\tactive\tqueued");
  int calls = 0;
  int64_t rows = 0, prompt_tokens = 0;
  double last_t = -1;
  while (std::getline(in, line)) {
    std::istringstream cols(line);
    double t = 0, gap = 0, engine_ms = 0;
    int64_t decode_rows = 0, parts = 0, tokens = 0, active = 0, queued = 0;
    REQUIRE(static_cast<bool>(cols >> t >> gap >> engine_ms >> decode_rows >> parts >> tokens >> active >> queued));
    CHECK(t >= last_t);  // in order
    CHECK(gap >= 0);
    CHECK(engine_ms > 0);
    CHECK(tokens <= 4);  // within the budget
    CHECK((parts > 0) == (tokens > 0));
    CHECK(active <= 3);
    last_t = t;
    rows += decode_rows;
    prompt_tokens += tokens;
    ++calls;
  }
  CHECK(prompt_tokens == 3 + 5 + 4);
  // Every generated token but each request's first (its prompt's last
  // chunk draws it) and its last (drawn, never run) is a decode row.
  CHECK(rows == (4 - 1) + (3 - 1) + (5 - 1));
  CHECK(calls >= 3);
}

TEST_CASE("stop strings, stop tokens, ignore_eos, max_tokens 0 and a full context") {
  const Result base = RunAlone(Greedy({1, 2, 3}, 6));
  REQUIRE(base.text.size() > 6);
  // The pieces are "<ID>": the third token's piece as a stop string.
  std::vector<std::string> pieces;
  for (size_t at = 0; at < base.text.size();) {
    const size_t end = base.text.find('>', at) + 1;
    pieces.push_back(base.text.substr(at, end - at));
    at = end;
  }
  REQUIRE(pieces.size() == 6);
  GenerationRequest r = Greedy({1, 2, 3}, 6);
  const std::string stop = pieces[2] + pieces[3];  // spans two tokens: the first is held back
  r.stop = {stop};
  Result got = RunAlone(r);
  const size_t cut = base.text.find(stop);
  int64_t tokens_to_stop = 0;  // pieces until the stop string is complete
  for (size_t len = 0; len < cut + stop.size(); len += pieces[tokens_to_stop++].size()) {}
  CHECK(got.text == base.text.substr(0, cut));
  CHECK(got.final.finish == FinishReason::kStop);
  CHECK(got.final.completion_tokens == tokens_to_stop);

  r = Greedy({1, 2, 3}, 6);
  r.stop = {pieces[5] + "never"};  // a prefix at the end is released by the end
  CHECK(RunAlone(r).text == base.text);

  const int32_t first = std::stoi(pieces[0].substr(1));
  r = Greedy({1, 2, 3}, 6);
  r.stop_tokens = {first};
  got = RunAlone(r);
  CHECK(got.text.empty());
  CHECK(got.final.finish == FinishReason::kStop);
  CHECK(got.final.completion_tokens == 0);
  r.ignore_eos = true;
  CHECK(RunAlone(r).text == base.text);

  got = RunAlone(Greedy({1, 2, 3}, 0));
  CHECK(got.text.empty());
  CHECK(got.final.finish == FinishReason::kLength);

  Fixture f(1, 8);
  Scheduler s(*f.engine, *f.tok, {});
  auto st = s.Submit(Greedy({1, 2, 3, 4, 5}, -1));
  REQUIRE(st.ok());
  got = Collect(**st);
  CHECK(got.final.finish == FinishReason::kLength);
  CHECK(got.final.completion_tokens == 8 - 5 + 1);  // the last sampled token needs no position
}

TEST_CASE("refusals: empty, out of the vocabulary, longer than the context, a full queue") {
  Fixture f(1, 16);
  Scheduler s(*f.engine, *f.tok, {1, 256});
  CHECK(s.Submit(Greedy({}, 1)).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(s.Submit(Greedy({1, 99999}, 1)).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(s.Submit(Greedy(std::vector<int32_t>(17, 1), -1)).status().code() ==
        absl::StatusCode::kOutOfRange);
  CHECK(s.Submit(Greedy(std::vector<int32_t>(10, 1), 7)).status().code() ==
        absl::StatusCode::kOutOfRange);
  auto a = s.Submit(Greedy({1, 2}, 14));
  auto b = s.Submit(Greedy({1, 2}, 2));
  REQUIRE((a.ok() && b.ok()));
  const absl::Status c = s.Submit(Greedy({1, 2}, 2)).status();
  CHECK(c.code() == absl::StatusCode::kResourceExhausted);
  CHECK(Collect(**a).final.completion_tokens == 14);
  CHECK(Collect(**b).final.completion_tokens == 2);
}

// Issue 28: a client that leaves while queued gave its place up only when a
// slot freed, so new clients got 503 meanwhile.
TEST_CASE("a request cancelled while queued leaves the queue at once") {
  Fixture f(1, 512);
  Scheduler s(*f.engine, *f.tok, {1, 256});
  auto a = s.Submit(Greedy({1, 2}, 500));  // the slot
  auto b = s.Submit(Greedy({3, 4}, 3));    // the one queue place
  REQUIRE((a.ok() && b.ok()));
  while ((*a)->Wait(absl::Seconds(30)).empty()) {}  // a holds the slot
  CHECK(s.Submit(Greedy({5}, 1)).status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(s.metrics().deferred == 1);
  (*b)->Cancel();
  CHECK(s.metrics().deferred == 0);
  auto c = s.Submit(Greedy({5, 6}, 2));  // b's place, while a still runs
  REQUIRE_MESSAGE(c.ok(), c.status().ToString());
  const Result rb = Collect(**b);
  CHECK(rb.final.error.code() == absl::StatusCode::kCancelled);
  CHECK(rb.final.completion_tokens == 0);
  CHECK(s.metrics().processing == 1);  // a never gave its slot up meanwhile
  (*a)->Cancel();
  CHECK(Collect(**c).final.completion_tokens == 2);
}

TEST_CASE("a cancelled request frees its slot; shutdown ends every stream") {
  Fixture f(1, 512);
  Scheduler s(*f.engine, *f.tok, {4, 256});
  auto a = s.Submit(Greedy({1, 2}, 500));
  auto b = s.Submit(Greedy({3, 4}, 3));
  REQUIRE((a.ok() && b.ok()));
  while ((*a)->Wait(absl::Seconds(30)).empty()) {}  // a is generating
  (*a)->Cancel();
  const Result rb = Collect(**b);  // b gets the slot
  CHECK(rb.final.error.ok());
  CHECK(rb.final.completion_tokens == 3);
  const Result ra = Collect(**a);
  CHECK(ra.final.error.code() == absl::StatusCode::kCancelled);
  CHECK(ra.final.completion_tokens < 500);

  auto c = s.Submit(Greedy({1, 2}, 500));
  auto d = s.Submit(Greedy({1, 2}, 500));  // queued behind c
  REQUIRE((c.ok() && d.ok()));
  while ((*c)->Wait(absl::Seconds(30)).empty()) {}
  s.Shutdown();
  CHECK(Collect(**c).final.error.code() == absl::StatusCode::kUnavailable);
  CHECK(Collect(**d).final.error.code() == absl::StatusCode::kUnavailable);
  CHECK(s.Submit(Greedy({1}, 1)).status().code() == absl::StatusCode::kUnavailable);
}

// Structured output (issue 32) on the tiny Qwen2 model with qwen2's real
// vocabulary and random weights: whatever the model prefers, the text
// follows the grammar.
struct VocabFixture : Fixture {
  explicit VocabFixture(int slots, const std::string& model = "tiny-qwen2-vocab-q4km") : Fixture(slots, 256, model) {}
};

// tiny-qwen2-vocab-q4km (qwen2's vocabulary, random weights) with one
// filler token ("[PAD151660]", user-defined) made the control token
// [TOOL_CALLS], as Mistral's vocabularies have it: written once per test
// binary, a GGUF of the same tensors. *id: the token's id.
std::string MistralMarkerModel(int32_t* id) {
  static int32_t marker = -1;
  const std::string path = testing::TempDir() + "/tiny-qwen2-vocab-tool-calls.gguf";
  if (marker >= 0) {
    *id = marker;
    return path;
  }
  auto f = formats::ModelFile::Open(testing::SharedDir() + "/oracle/tiny-qwen2-vocab-q4km.gguf");
  REQUIRE_MESSAGE(f.ok(), f.status().ToString());
  formats::Metadata meta = (*f)->metadata();
  const formats::MetaValue* texts = *meta.GetArray("tokenizer.ggml.tokens");
  const formats::MetaValue* types = *meta.GetArray("tokenizer.ggml.token_type");
  std::vector<std::string> t;
  std::vector<int32_t> ty;
  for (uint64_t i = 0; i < texts->count; ++i) {
    t.emplace_back(texts->StringAt(i));
    ty.push_back(static_cast<int32_t>(types->IntAt(i)));
    if (t.back() == "[PAD151660]") marker = static_cast<int32_t>(i);
  }
  REQUIRE(marker >= 0);
  t[static_cast<size_t>(marker)] = "[TOOL_CALLS]";
  ty[static_cast<size_t>(marker)] = static_cast<int32_t>(tokenizer::TokenType::kControl);
  meta.Set("tokenizer.ggml.tokens", formats::MetaValue::StringArray(t));
  meta.Set("tokenizer.ggml.token_type", formats::MetaValue::I32Array(ty));
  std::vector<formats::GgufTensorSpec> specs;
  for (const formats::TensorView& v : (*f)->tensors()) {
    specs.push_back({v.name, std::vector<uint64_t>(v.ne.begin(), v.ne.begin() + v.n_dims), v.type});
  }
  auto h = formats::BuildGgufHeader(meta, specs);
  REQUIRE_MESSAGE(h.ok(), h.status().ToString());
  std::string image = h->bytes;
  const size_t data = image.size();
  image.resize(data + h->data_bytes, '\0');
  for (size_t i = 0; i < specs.size(); ++i) {
    const formats::TensorView& v = (*f)->tensors()[i];
    REQUIRE(h->sizes[i] == v.n_bytes);
    std::copy_n(v.data, v.n_bytes, image.begin() + static_cast<std::ptrdiff_t>(data + h->offsets[i]));
  }
  std::ofstream out(path, std::ios::binary);
  out.write(image.data(), static_cast<std::streamsize>(image.size()));
  REQUIRE(out.good());
  *id = marker;
  return path;
}

std::shared_ptr<const grammar::Grammar> SchemaGrammar(const char* schema) {
  auto g = grammar::JsonSchemaToGrammar(nlohmann::ordered_json::parse(schema));
  REQUIRE_MESSAGE(g.ok(), g.status().ToString());
  return std::make_shared<const grammar::Grammar>(*std::move(g));
}

TEST_CASE("a JSON schema: the answer parses, with its required keys and types, and ends by itself") {
  VocabFixture f(2);
  Scheduler s(*f.engine, *f.tok, {});
  // No strings: every value is bounded, so the grammar completes within a
  // few dozen tokens, and then only the end of generation may follow.
  auto schema = SchemaGrammar(R"({"type": "object", "properties": {
      "n": {"type": "integer"}, "ok": {"type": "boolean"}, "c": {"enum": ["red", "green"]},
      "xs": {"type": "array", "items": {"type": "number"}, "maxItems": 3}},
      "required": ["n", "ok", "c"]})");
  const std::vector<int32_t> prompt = {9707, 11, 1879, 0};
  const Result plain = Collect(**s.Submit(Greedy(prompt, 12)));
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (uint64_t seed : {1, 2, 3}) {
    GenerationRequest r = Sampled(prompt, 200, seed);
    r.grammar = schema;
    auto st = s.Submit(std::move(r));
    REQUIRE(st.ok());
    streams.push_back(*st);
  }
  for (auto& st : streams) {
    const Result got = Collect(*st);
    INFO(got.text);
    REQUIRE(got.final.error.ok());
    CHECK(got.final.finish == FinishReason::kStop);
    const nlohmann::json j = nlohmann::json::parse(got.text, nullptr, false);
    REQUIRE(j.is_object());
    CHECK(j.at("n").is_number_integer());
    CHECK(j.at("ok").is_boolean());
    CHECK((j.at("c") == "red" || j.at("c") == "green"));
    if (j.contains("xs")) CHECK(j.at("xs").is_array());
    for (auto it = j.begin(); it != j.end(); ++it) {
      CHECK((it.key() == "n" || it.key() == "ok" || it.key() == "c" || it.key() == "xs"));
    }
  }
  // The slots' grammars ended with their requests: free text again.
  GenerationRequest again = Greedy(prompt, 12);
  again.cache_prompt = false;
  CHECK(Collect(**s.Submit(again)).text == plain.text);
}

TEST_CASE("a grammar cut by max_tokens: a prefix the grammar accepts") {
  VocabFixture f(1);
  Scheduler s(*f.engine, *f.tok, {});
  auto schema = SchemaGrammar(R"({"type": "object", "properties": {
      "name": {"type": "string"}, "age": {"type": "integer"}}, "required": ["name", "age"]})");
  auto any = grammar::Grammar::Parse(grammar::JsonObjectGbnf());
  REQUIRE(any.ok());
  auto object = std::make_shared<const grammar::Grammar>(*std::move(any));
  for (const auto& g : {schema, object}) {
    GenerationRequest r = Sampled({9707, 11}, 10, 5);
    r.grammar = g;
    const Result got = Collect(**s.Submit(std::move(r)));
    INFO(got.text);
    REQUIRE(got.final.error.ok());
    if (got.final.finish == FinishReason::kLength) CHECK(got.final.completion_tokens == 10);
    grammar::Matcher m(g);
    CHECK(m.Accept(got.text).ok());
    CHECK(got.text.rfind("{", 0) == 0);
  }
  // A GBNF grammar: exactly one of three words.
  auto words = grammar::Grammar::Parse("root ::= \"yes\" | \"no\" | \"maybe\"");
  REQUIRE(words.ok());
  GenerationRequest r = Sampled({9707}, 20, 11);
  r.grammar = std::make_shared<const grammar::Grammar>(*std::move(words));
  const Result got = Collect(**s.Submit(std::move(r)));
  CHECK((got.text == "yes" || got.text == "no" || got.text == "maybe"));
  CHECK(got.final.finish == FinishReason::kStop);
}

// tool_choice "required" and a named function (issue 32): the grammar of
// calls that openai_api's EnforceToolChoice builds, in each tool-call
// format. Whatever the model prefers, the answer parses back into one call
// (parallel_tool_calls false) of an offered tool, whose arguments have the
// schema's required keys and types, and nothing else; it ends by itself (the
// API then says finish_reason "tool_calls"). No strings in the schemas:
// every value is bounded.
void CheckArguments(const ParsedToolCall& call) {
  INFO(call.arguments);
  const nlohmann::json args = nlohmann::json::parse(call.arguments, nullptr, false);
  REQUIRE(args.is_object());
  if (call.name == "get_time") {
    CHECK(args.size() == 1);
    CHECK(args.at("utc").is_boolean());
    return;
  }
  REQUIRE(call.name == "set_light");
  CHECK(args.at("on").is_boolean());
  CHECK((args.at("color") == "red" || args.at("color") == "green"));
  if (args.contains("level")) CHECK(args.at("level").is_number_integer());
  CHECK(args.size() == (args.contains("level") ? 3u : 2u));
}

TEST_CASE("tool_choice required or named: the answer is one call of an offered tool, its arguments valid") {
  VocabFixture qwen(2);
  // Mistral's calls on a vocabulary whose [TOOL_CALLS] is a control token,
  // as Mistral's are: the answer starts with that one token (the grammar's
  // token literal), which the text renders for the parser.
  int32_t marker = -1;
  VocabFixture mistral(2, MistralMarkerModel(&marker));
  REQUIRE(mistral.tok->token_type(marker) == tokenizer::TokenType::kControl);
  REQUIRE(mistral.tok->TokenToPiece(marker) == "[TOOL_CALLS]");
  Scheduler on_qwen(*qwen.engine, *qwen.tok, {});
  Scheduler on_mistral(*mistral.engine, *mistral.tok, {});
  const std::string body = R"({"messages": [{"role": "user", "content": "x"}], "parallel_tool_calls": false,
      "tools": [{"type": "function", "function": {"name": "set_light", "parameters": {"type": "object",
                   "properties": {"on": {"type": "boolean"}, "level": {"type": "integer"},
                                  "color": {"enum": ["red", "green"]}}, "required": ["on", "color"]}}},
                {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object",
                   "properties": {"utc": {"type": "boolean"}}, "required": ["utc"]}}}], )";
  using tokenizer::ToolCallFormat;
  for (ToolCallFormat format : {ToolCallFormat::kHermes, ToolCallFormat::kLlama3, ToolCallFormat::kMistral}) {
    for (const char* choice : {R"("tool_choice": "required"})",
                               R"("tool_choice": {"type": "function", "function": {"name": "get_time"}}})"}) {
      absl::StatusOr<ChatRequest> r = ParseChatRequest(body + choice);
      REQUIRE_MESSAGE(r.ok(), r.status().ToString());
      REQUIRE(EnforceToolChoice(format, &*r).ok());
      Scheduler& s = format == ToolCallFormat::kMistral ? on_mistral : on_qwen;
      const tokenizer::Tokenizer& tok = *(format == ToolCallFormat::kMistral ? mistral : qwen).tok;
      std::vector<std::shared_ptr<RequestStream>> streams;
      for (uint64_t seed : {1, 2}) {
        GenerationRequest g = Sampled({9707, 11, 1879, 0}, 240, seed);
        g.grammar = r->params.grammar;
        g.logprobs = 0;  // the tokens drawn
        streams.push_back(*s.Submit(std::move(g)));
      }
      for (auto& st : streams) {
        const Result got = Collect(*st);
        INFO(tokenizer::ToolCallFormatName(format), " ", std::string(choice), ": ", got.text);
        REQUIRE(got.final.error.ok());
        CHECK(got.final.finish == FinishReason::kStop);
        REQUIRE_FALSE(got.logprobs.empty());
        if (format == ToolCallFormat::kMistral) {
          // The control token first, and only there.
          CHECK(got.logprobs[0].chosen.token == marker);
          CHECK(got.text.rfind("[TOOL_CALLS][{\"name\": ", 0) == 0);
          for (size_t i = 1; i < got.logprobs.size(); ++i) CHECK(got.logprobs[i].chosen.token != marker);
        }
        for (size_t i = format == ToolCallFormat::kMistral ? 1 : 0; i < got.logprobs.size(); ++i) {
          CHECK(tok.token_type(got.logprobs[i].chosen.token) != tokenizer::TokenType::kControl);
        }
        const ParsedAnswer a = ParseToolCalls(got.text, format);
        CHECK(a.content.empty());
        REQUIRE(a.calls.size() == 1);
        if (r->one_call && r->forced_tools.size() == 1) CHECK(a.calls[0].name == "get_time");
        CheckArguments(a.calls[0]);
      }
    }
  }
}

// An engine without structured output (the CUDA engine's case): the
// default SetGrammar, refused at Submit, before anything streams.
class NoGrammarEngine : public BatchEngine {
 public:
  explicit NoGrammarEngine(BatchEngine& e) : e_(e) {}
  int n_slots() const override { return e_.n_slots(); }
  int64_t n_ctx() const override { return e_.n_ctx(); }
  int32_t n_vocab() const override { return e_.n_vocab(); }
  absl::StatusOr<int32_t> Prefill(int slot, absl::Span<const int32_t> tokens, bool last,
                                  const SamplerParams& params) override {
    return e_.Prefill(slot, tokens, last, params);
  }
  absl::Status Step(absl::Span<const int> slots, absl::Span<int32_t> next) override { return e_.Step(slots, next); }
  int64_t n_past(int slot) const override { return e_.n_past(slot); }
  absl::Status KeepPrefix(int slot, absl::Span<const int32_t> kept) override { return e_.KeepPrefix(slot, kept); }
  absl::Status CopyPrefix(int slot, int from, absl::Span<const int32_t> kept) override {
    return e_.CopyPrefix(slot, from, kept);
  }
  void Release(int slot) override { e_.Release(slot); }

 private:
  BatchEngine& e_;
};

TEST_CASE("grammar refusals: an engine without them, a model without a vocabulary") {
  auto g = grammar::Grammar::Parse("root ::= \"a\"");
  REQUIRE(g.ok());
  auto shared = std::make_shared<const grammar::Grammar>(*std::move(g));
  Fixture f(1);  // ids only: no token has text
  NoGrammarEngine no(*f.engine);
  CHECK(no.SetGrammar(0, nullptr).ok());
  CHECK(no.SetGrammar(0, shared).code() == absl::StatusCode::kFailedPrecondition);
  {
    Scheduler s(no, *f.tok, {});
    GenerationRequest r = Greedy({1, 2}, 4);
    r.grammar = shared;
    const absl::Status refused = s.Submit(r).status();
    CHECK(refused.code() == absl::StatusCode::kFailedPrecondition);
    CHECK(std::string(refused.message()).find("response_format") != std::string::npos);
  }
  Scheduler s(*f.engine, *f.tok, {});
  GenerationRequest r = Greedy({1, 2}, 4);
  r.grammar = shared;
  auto st = s.Submit(r);
  REQUIRE(st.ok());
  const Result got = Collect(**st);
  CHECK(got.final.error.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(got.text.empty());
}

TEST_CASE("logprobs refused by an engine without them, before anything streams") {
  Fixture f(1);
  NoGrammarEngine no(*f.engine);
  CHECK(no.SetLogprobs(0, -1, false).ok());
  CHECK(no.SetLogprobs(0, 0, false).code() == absl::StatusCode::kFailedPrecondition);
  Scheduler s(no, *f.tok, {});
  GenerationRequest r = Greedy({1, 2}, 4);
  r.logprobs = 0;
  const absl::Status refused = s.Submit(r).status();
  CHECK(refused.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(std::string(refused.message()).find("logprobs") != std::string::npos);
  Scheduler cpu(*f.engine, *f.tok, {});
  r.logprobs = generate::kMaxTopLogprobs + 1;
  CHECK(cpu.Submit(r).status().code() == absl::StatusCode::kInvalidArgument);
  r.logprobs = -1;
  r.prompt_logprobs = true;
  CHECK(cpu.Submit(r).status().code() == absl::StatusCode::kInvalidArgument);
}

// Issue 32 through the scheduler on the random-weight model: the prompt
// scored across chunks and never from a cached start, one entry per
// generated token, and echo's max_tokens 0 scoring the prompt alone.
TEST_CASE("logprobs: prompt scoring in chunks, per generated token, max_tokens 0") {
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5};
  // The engine's own scoring of the whole prompt in one call.
  std::vector<generate::TokenLogprobs> want;
  {
    Fixture f(1);
    REQUIRE(f.engine->SetLogprobs(0, 2, true).ok());
    REQUIRE(f.engine->Prefill(0, prompt, true, SamplerParams{}).ok());
    auto lp = f.engine->TakeLogprobs(0);
    REQUIRE(lp.ok());
    want = lp->prompt;
  }
  REQUIRE(want.size() == prompt.size() - 1);
  Fixture f(1);
  SchedulerOptions o;
  o.prefill_chunk = 2;  // the prompt in three chunks
  Scheduler s(*f.engine, *f.tok, o);
  GenerationRequest r = Greedy(prompt, 4);
  r.logprobs = 2;
  r.prompt_logprobs = true;
  for (int round = 0; round < 2; ++round) {  // the second finds the prompt cached, and runs it anyway
    auto st = s.Submit(r);
    REQUIRE(st.ok());
    const Result got = Collect(**st);
    REQUIRE(got.final.error.ok());
    CHECK(got.final.cached_tokens == 0);
    CHECK(got.prompt_events == 1);
    REQUIRE(got.prompt_logprobs.size() == want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      CHECK(got.prompt_logprobs[i].chosen.token == prompt[i + 1]);
      CHECK(got.prompt_logprobs[i].chosen.logprob == want[i].chosen.logprob);
      REQUIRE(got.prompt_logprobs[i].top.size() == 2);
      CHECK(got.prompt_logprobs[i].top[0].token == want[i].top[0].token);
    }
    REQUIRE(got.logprobs.size() == static_cast<size_t>(got.final.completion_tokens));
    CHECK(got.final.completion_tokens == 4);
    for (const auto& t : got.logprobs) {
      REQUIRE(t.top.size() == 2);
      CHECK(t.top[0].token == t.chosen.token);  // greedy, no penalty: the most probable
      CHECK(t.top[0].logprob == t.chosen.logprob);
      CHECK(t.top[0].logprob >= t.top[1].logprob);
    }
  }
  GenerationRequest zero = r;
  zero.max_tokens = 0;
  auto st = s.Submit(zero);
  REQUIRE(st.ok());
  const Result got = Collect(**st);
  REQUIRE(got.final.error.ok());
  CHECK(got.final.finish == FinishReason::kLength);
  CHECK(got.final.completion_tokens == 0);
  CHECK(got.logprobs.empty());
  REQUIRE(got.prompt_logprobs.size() == want.size());
  CHECK(got.prompt_logprobs.back().chosen.logprob == want.back().chosen.logprob);
  // Without logprobs nothing is reported.
  auto plain = s.Submit(Greedy(prompt, 2));
  REQUIRE(plain.ok());
  const Result none = Collect(**plain);
  CHECK((none.logprobs.empty() && none.prompt_logprobs.empty() && none.prompt_events == 0));
}

// Issue 32: logit_bias reaches the slot's sampler for its request only. A
// ban of the greedy answer's first token changes the first token and keeps
// that token out of the whole answer; +100 on a token makes it every draw;
// the next request on the same slot (its cached start kept) samples as
// before; Submit checks the ids against the vocabulary.
TEST_CASE("logit_bias: a banned greedy token never comes; the next request is unbiased") {
  Fixture f(1);
  Scheduler s(*f.engine, *f.tok, {});
  auto run = [&s](const GenerationRequest& r) {
    auto st = s.Submit(r);
    REQUIRE_MESSAGE(st.ok(), st.status().ToString());
    return Ids(Collect(**st).text);
  };
  const std::vector<int32_t> base = run(Greedy({1, 2, 3}, 6));
  REQUIRE(base.size() == 6);
  GenerationRequest banned = Greedy({1, 2, 3}, 6);
  banned.logit_bias = {{base[0], -INFINITY}};
  const std::vector<int32_t> other = run(banned);
  REQUIRE(other.size() == 6);
  CHECK(other[0] != base[0]);
  CHECK(std::find(other.begin(), other.end(), base[0]) == other.end());
  CHECK(run(Greedy({1, 2, 3}, 6)) == base);  // the slot's next request: no bias left

  // A sampled request too (penalties on): the ban holds every draw.
  GenerationRequest sampled = Greedy({1, 2, 3}, 12);
  sampled.sampling.temperature = 1.5f;
  sampled.sampling.top_k = 0;
  sampled.sampling.top_p = 1.0f;
  sampled.sampling.min_p = 0.0f;
  sampled.sampling.repeat_penalty = 1.3f;
  sampled.sampling.seed = 7;
  const int32_t also = (base[0] + 1) % f.engine->n_vocab();
  sampled.logit_bias = {{base[0], -INFINITY}, {also, -INFINITY}};
  for (int32_t t : run(sampled)) CHECK((t != base[0] && t != also));

  GenerationRequest pushed = Greedy({1, 2, 3}, 5);
  const int32_t favored = base[0] == 7 ? 8 : 7;
  pushed.logit_bias = {{favored, 100.0f}};
  CHECK(run(pushed) == std::vector<int32_t>(5, favored));

  GenerationRequest bad = Greedy({1, 2}, 2);
  bad.logit_bias = {{f.engine->n_vocab(), -1.0f}};
  const absl::Status outside = s.Submit(bad).status();
  CHECK(outside.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(outside.message()).find("'logit_bias' token id") != std::string::npos);
  CHECK(std::string(outside.message()).find("outside the vocabulary") != std::string::npos);
  bad.logit_bias = {{3, -1.0f}, {3, 2.0f}};
  CHECK(s.Submit(bad).status().code() == absl::StatusCode::kInvalidArgument);
  bad.logit_bias = {{3, 250.0f}};
  CHECK(s.Submit(bad).status().code() == absl::StatusCode::kInvalidArgument);

  NoGrammarEngine no(*f.engine);  // the default BatchEngine: no logit biases
  CHECK(no.SetLogitBias(0, {}).ok());
  Scheduler without(no, *f.tok, {});
  GenerationRequest r = Greedy({1, 2}, 2);
  r.logit_bias = {{3, -1.0f}};
  const absl::Status refused = without.Submit(r).status();
  CHECK(refused.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(std::string(refused.message()).find("logit_bias") != std::string::npos);
}

}  // namespace
}  // namespace dpl::server

namespace dpl::server {
namespace {

// Issue 30's KV block pool as the scheduler's authority on positions.
SchedulerOptions PoolOptions(int64_t pool_positions, int block_size, int prefill_chunk = 256) {
  SchedulerOptions o{4, prefill_chunk};
  o.kv_block_size = block_size;
  o.kv_pool_positions = pool_positions;
  return o;
}

// The sizes of the tables a slot was given, in order.
std::vector<size_t> TableSizes(RecordingEngine& rec, int slot) {
  std::vector<size_t> sizes;
  for (const auto& [s, t] : rec.tables()) {
    if (s == slot) sizes.push_back(t.size());
  }
  return sizes;
}

TEST_CASE("KV blocks: a slot's table grows with its positions; the default pool never waits") {
  Fixture f(2);  // 64 positions a slot
  RecordingEngine rec(*f.engine);
  Scheduler s(rec, *f.tok, PoolOptions(0, 4));
  const GenerationRequest r = Greedy({1, 2, 3, 4, 5}, 6);
  const Result got = Collect(**s.Submit(r));
  CHECK(got.text == RunAlone(r).text);
  // 5 prompt positions: 2 blocks; the decode steps run tokens at 5..9: a
  // third block from position 8 on.
  CHECK(TableSizes(rec, 0) == std::vector<size_t>{2, 3});
  const SchedulerMetrics m = s.metrics();
  CHECK(m.kv_block_size == 4);
  CHECK(m.kv_blocks_total == 2 * 16);  // each slot's whole context
  CHECK(m.kv_positions_total == 2 * 64);
  CHECK(m.kv_blocks_used == 3);  // the finished request's cache, kept for the next turn
  CHECK(m.preemptions_total == 0);
}

TEST_CASE("KV blocks: a request waits in the queue while the pool is full, then runs") {
  Fixture f(2);
  RecordingEngine rec(*f.engine);
  Scheduler s(rec, *f.tok, PoolOptions(48, 4));  // 12 blocks
  std::vector<int32_t> long_prompt;
  for (int32_t i = 0; i < 30; ++i) long_prompt.push_back(100 + i);
  const GenerationRequest a = Greedy(long_prompt, 10), b = Greedy({7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19,
                                                                      20, 21, 22}, 3);
  auto sa = s.Submit(a);
  REQUIRE(sa.ok());
  Result ra;
  for (bool first = true; first;) {  // a has run its prompt: 8 blocks of the 12
    for (StreamEvent& e : (*sa)->Wait(absl::Seconds(30))) {
      ra.text += e.text;
      first = false;
      REQUIRE(!e.final);
    }
  }
  auto sb = s.Submit(b);  // its 16 tokens and a first one need 5: it waits for a
  REQUIRE(sb.ok());
  const Result rest = Collect(**sa);
  ra.text += rest.text;
  const Result rb = Collect(**sb);
  CHECK(rest.final.error.ok());
  CHECK(rb.final.error.ok());
  CHECK(ra.text == RunAlone(a).text);
  CHECK(rb.text == RunAlone(b).text);
  CHECK(rb.final.completion_tokens == 3);
  // b's prompt went in after a's 9 steps: it never ran beside a.
  const std::vector<std::pair<int, int>> calls = rec.calls();
  int steps_before_b = 0, steps = 0;
  bool b_started = false;
  for (const auto& [slot, n] : calls) {
    b_started |= slot == 1;
    if (slot != -1) continue;
    CHECK(n == 1);  // one row a step
    ++steps;
    steps_before_b += !b_started;
  }
  CHECK(steps_before_b == 9);
  CHECK(steps == 9 + 2);
  CHECK(s.metrics().preemptions_total == 0);
  // b took the blocks of a's kept cache: a's next turn finds nothing cached
  // and gives the same text.
  const Result again = Collect(**s.Submit(a));
  CHECK(again.final.cached_tokens == 0);
  CHECK(again.text == ra.text);
}

TEST_CASE("KV blocks: the newest request is preempted when an older one cannot grow, and completes") {
  const GenerationRequest a = Greedy({1, 2, 3, 4}, 24), b = Greedy({9, 8, 7, 6}, 20);
  const Result alone_a = RunAlone(a), alone_b = RunAlone(b);
  for (const bool mixed : {false, true}) {
    CAPTURE(mixed);
    Fixture f(2);
    RecordingEngine rec(*f.engine);
    SchedulerOptions o = PoolOptions(32, 4);  // 8 blocks; a needs 7, b 6
    o.mixed_steps = mixed;
    Scheduler s(rec, *f.tok, o);
    const std::vector<std::shared_ptr<RequestStream>> streams = SubmitAll(s, {a, b});
    const Result ra = Collect(*streams[0]), rb = Collect(*streams[1]);
    CHECK(ra.final.error.ok());
    CHECK(rb.final.error.ok());
    CHECK(ra.text == alone_a.text);
    CHECK(rb.text == alone_b.text);  // nothing repeated, nothing lost
    CHECK(rb.final.completion_tokens == 20);
    CHECK(rb.final.finish == FinishReason::kLength);
    CHECK(rb.final.prompt_tokens == 4);
    const SchedulerMetrics m = s.metrics();
    CHECK(m.preemptions_total >= 1);
    CHECK(m.recomputed_tokens_total > 4);  // b's prompt and the tokens it had sampled
    CHECK(m.generated_tokens_total == 24 + 20);
    CHECK(m.prompt_tokens_total == 8);
    CHECK(m.processing == 0);
    CHECK(m.deferred == 0);
    for (const auto& [slot, table] : rec.tables()) CHECK(table.size() <= 8);
  }
}

TEST_CASE("KV blocks: a request the pool can never hold is refused; one alone ends when it is full") {
  Fixture f(1);  // 64 positions
  Scheduler s(*f.engine, *f.tok, PoolOptions(32, 4));
  CHECK(s.Submit(Greedy(std::vector<int32_t>(40, 1), -1)).status().code() == absl::StatusCode::kOutOfRange);
  CHECK(s.Submit(Greedy(std::vector<int32_t>(20, 1), 20)).status().code() == absl::StatusCode::kOutOfRange);
  const Result got = Collect(**s.Submit(Greedy({1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, -1)));
  CHECK(got.final.error.ok());
  CHECK(got.final.finish == FinishReason::kLength);
  CHECK(got.final.completion_tokens == 32 - 10 + 1);  // as at a full context
  CHECK(s.metrics().preemptions_total == 0);
}

TEST_CASE("KV blocks: a start copied from another slot shares its full blocks") {
  Fixture f(2);
  RecordingEngine rec(*f.engine);
  SchedulerOptions o = PoolOptions(0, 4);
  o.defer_for_shared_start = 4;
  Scheduler s(rec, *f.tok, o);
  const std::vector<int32_t> system = {21, 22, 23, 24, 25, 26, 27, 28, 29, 30};  // 2 full blocks and 2
  const GenerationRequest a = Greedy(Concat(system, {31, 32}), 4), b = Greedy(Concat(system, {40}), 3);
  const std::vector<std::shared_ptr<RequestStream>> streams = SubmitAll(s, {a, b});
  const Result ra = Collect(*streams[0]), rb = Collect(*streams[1]);
  CHECK(rb.final.cached_tokens == 10);
  CHECK(ra.text == RunAlone(a).text);
  CHECK(rb.text == RunAlone(b).text);
  REQUIRE(rec.copies().size() == 1);
  // b's first table: a's first two blocks, then blocks of its own.
  std::vector<int> a_table, b_first;
  for (const auto& [slot, table] : rec.tables()) {
    if (slot == 0 && a_table.empty() && table.size() >= 3) a_table = table;
    if (slot == 1 && b_first.empty()) b_first = table;
  }
  REQUIRE(a_table.size() >= 3);
  REQUIRE(b_first.size() == 3);  // 11 positions
  CHECK(b_first[0] == a_table[0]);
  CHECK(b_first[1] == a_table[1]);
  CHECK(b_first[2] != a_table[2]);  // the partial block: its own copy
  // Both caches kept: a's 12 + 3 positions (4 blocks), b's 11 + 2 (4
  // blocks), two of them shared.
  CHECK(s.metrics().kv_blocks_used == 4 + 4 - 2);
}

// Many requests on a pool far smaller than the slots' contexts, prompts in
// chunks, with and without mixed steps: requests wait, take idle caches'
// blocks, are preempted (more than once) and run again; every one
// completes with the text it gives alone, logprobs once per token, and a
// sampled one with all its tokens.
TEST_CASE("KV blocks: a pool that keeps running out; every request completes as alone") {
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 7; ++i) {
    std::vector<int32_t> prompt;
    for (int k = 0; k < 3 + 5 * (i % 3); ++k) prompt.push_back(10 + 7 * i + k);
    reqs.push_back(Greedy(prompt, 8 + 3 * (i % 4)));
  }
  reqs[2].logprobs = 1;
  reqs[4].prompt = Concat(reqs[1].prompt, {77, 78});  // a start a slot may hold
  GenerationRequest sampled = Sampled({5, 6, 7, 8, 9}, 12, 3);
  std::vector<Result> alone;
  for (const auto& r : reqs) alone.push_back(RunAlone(r));
  for (const bool mixed : {false, true}) {
    CAPTURE(mixed);
    Fixture f(4);
    SchedulerOptions o = PoolOptions(40, 4, 6);  // 10 blocks for 4 slots of 64
    o.mixed_steps = mixed;
    Scheduler s(*f.engine, *f.tok, o);
    std::vector<GenerationRequest> all = reqs;
    all.push_back(sampled);
    const std::vector<std::shared_ptr<RequestStream>> streams = SubmitAll(s, all);
    for (size_t i = 0; i < all.size(); ++i) {
      CAPTURE(i);
      const Result got = Collect(*streams[i]);
      REQUIRE_MESSAGE(got.final.error.ok(), got.final.error.ToString());
      CHECK(got.final.completion_tokens == all[i].max_tokens);
      if (i < reqs.size()) CHECK(got.text == alone[i].text);
      if (all[i].logprobs >= 0) CHECK(static_cast<int64_t>(got.logprobs.size()) == got.final.completion_tokens);
    }
    const SchedulerMetrics m = s.metrics();
    CHECK(m.preemptions_total >= 1);
    CHECK(m.processing == 0);
    CHECK(m.deferred == 0);
    CHECK(m.kv_blocks_used <= 10);
  }
}

// A request with a grammar that has sampled cannot be run again (its
// matcher is the engine's): it is never preempted. An older request that
// cannot grow beside it waits, or is preempted itself when nothing else
// can run; both complete.
TEST_CASE("KV blocks: a grammar's request is not preempted; the other completes as alone") {
  auto any = grammar::Grammar::Parse(grammar::JsonObjectGbnf());
  REQUIRE(any.ok());
  auto object = std::make_shared<const grammar::Grammar>(*std::move(any));
  const GenerationRequest a = Greedy({1, 2, 3}, 30);
  GenerationRequest g = Sampled({9707, 11}, 30, 5);
  g.grammar = object;
  Result alone_a;
  {
    VocabFixture f(1);
    Scheduler s(*f.engine, *f.tok, {});
    alone_a = Collect(**s.Submit(a));
  }
  VocabFixture f(2);
  Scheduler s(*f.engine, *f.tok, PoolOptions(48, 4));  // 12 blocks; a needs 9, g up to 8
  const std::vector<std::shared_ptr<RequestStream>> streams = SubmitAll(s, {a, g});
  const Result ra = Collect(*streams[0]), rg = Collect(*streams[1]);
  REQUIRE(ra.final.error.ok());
  REQUIRE(rg.final.error.ok());
  CHECK(ra.text == alone_a.text);
  CHECK(ra.final.completion_tokens == 30);
  INFO(rg.text);
  grammar::Matcher m(object);
  CHECK(m.Accept(rg.text).ok());  // one matcher's walk: never restarted
  CHECK(rg.text.rfind("{", 0) == 0);
  // g (seed 5) draws all 30 tokens: the two did not fit together, and a
  // was the one preempted.
  if (rg.final.completion_tokens == 30) CHECK(s.metrics().preemptions_total >= 1);
}

}  // namespace
}  // namespace dpl::server

namespace dpl::server {
namespace {

// An engine whose KV cache is a pool of blocks as the CUDA engine's is
// (kv::SeqTables for each slot's table and the copies a changed table
// implies: a copied start's partial block, copy on write), holding token
// ids instead of keys and values: a position's "row" is the token run
// there. Its next token is a hash of every row its table reaches
// (positions 0 .. n_past - 1), so a wrong table, a missed copy or a shared
// block written twice gives another token than the request alone gets.
// Whatever the scheduler does (waiting, preempting, copying and keeping
// starts), a greedy request's text must be its text alone. With `adopt`,
// it takes the block cache's blocks as a slot's start (AdoptPrefix), as
// the paged CUDA engine does. It records as an error any write into a
// block that another slot's table holds (a block handed out twice) and an
// adopted block whose rows are not the adopted tokens.
class PagedTokenEngine : public BatchEngine {
 public:
  PagedTokenEngine(int slots, int64_t n_ctx, int blocks, int block, bool adopt = false)
      : n_ctx_(n_ctx),
        blocks_(blocks),
        block_(block),
        adopt_(adopt),
        tables_(slots, block, blocks, static_cast<int>((n_ctx + block - 1) / block)),
        rows_(static_cast<size_t>(blocks) * block, -1),
        past_(static_cast<size_t>(slots), 0),
        pending_(static_cast<size_t>(slots), -1) {}
  int n_slots() const override { return static_cast<int>(past_.size()); }
  int64_t n_ctx() const override { return n_ctx_; }
  int32_t n_vocab() const override { return 151936; }
  int kv_pool_blocks() const override { return blocks_; }
  int kv_block_size() const override { return block_; }

  absl::StatusOr<int32_t> Prefill(int slot, absl::Span<const int32_t> tokens, bool last,
                                  const SamplerParams&) override {
    {
      absl::MutexLock lock(&mu_);
      fed_.push_back({slot, static_cast<int>(tokens.size())});
      steps_at_prefill_ = steps_;
    }
    for (int32_t t : tokens) DPL_RETURN_IF_ERROR(Write(slot, t));
    pending_[static_cast<size_t>(slot)] = last ? Next(slot) : -1;
    return pending_[static_cast<size_t>(slot)];
  }
  absl::Status Step(absl::Span<const int> slots, absl::Span<int32_t> next) override {
    {
      // A step the test asked to hold: it waits here, on the engine thread,
      // until Resume.
      absl::MutexLock lock(&mu_);
      ++steps_;
      if (pause_in_ > 0 && --pause_in_ == 0) {
        paused_ = true;
        mu_.Await(absl::Condition(+[](bool* p) { return !*p; }, &paused_));
      }
    }
    for (size_t i = 0; i < slots.size(); ++i) {
      const size_t s = static_cast<size_t>(slots[i]);
      if (pending_[s] < 0) return absl::FailedPreconditionError("a step before the prompt's last chunk");
      DPL_RETURN_IF_ERROR(Write(slots[i], pending_[s]));
      next[i] = pending_[s] = Next(slots[i]);
    }
    return absl::OkStatus();
  }
  int64_t n_past(int slot) const override { return past_[static_cast<size_t>(slot)]; }
  absl::Status KeepPrefix(int slot, absl::Span<const int32_t> kept) override {
    past_[static_cast<size_t>(slot)] = static_cast<int64_t>(kept.size());
    pending_[static_cast<size_t>(slot)] = -1;
    tables_.Keep(slot, static_cast<int64_t>(kept.size()));
    return absl::OkStatus();
  }
  absl::Status CopyPrefix(int slot, int from, absl::Span<const int32_t> kept) override {
    tables_.Share(slot, from, static_cast<int64_t>(kept.size()));
    past_[static_cast<size_t>(slot)] = static_cast<int64_t>(kept.size());
    pending_[static_cast<size_t>(slot)] = -1;
    return absl::OkStatus();
  }
  void Release(int slot) override { (void)KeepPrefix(slot, {}); }
  bool supports_block_adoption() const override { return adopt_; }
  absl::Status AdoptPrefix(int slot, absl::Span<const int32_t> kept) override {
    if (!adopt_) return BatchEngine::AdoptPrefix(slot, kept);
    const int64_t n = static_cast<int64_t>(kept.size());
    DPL_RETURN_IF_ERROR(tables_.Adopt(slot, n));
    const absl::Span<const int> table = tables_.table(slot);
    for (int64_t p = 0; p < n; ++p) {
      const int blk = table[static_cast<size_t>(p / block_)];
      if (rows_[static_cast<size_t>(blk) * block_ + static_cast<size_t>(p % block_)] != kept[static_cast<size_t>(p)]) {
        const std::string e = absl::StrCat("slot ", slot, " adopted block ", blk, " whose row ", p % block_,
                                           " is not token ", kept[static_cast<size_t>(p)]);
        absl::MutexLock lock(&mu_);
        errors_.push_back(e);
        return absl::InternalError(e);
      }
    }
    past_[static_cast<size_t>(slot)] = n;
    pending_[static_cast<size_t>(slot)] = -1;
    absl::MutexLock lock(&mu_);
    adoptions_.push_back({slot, std::vector<int32_t>(kept.begin(), kept.end())});
    return absl::OkStatus();
  }
  // Every AdoptPrefix: (slot, the tokens adopted).
  std::vector<std::pair<int, std::vector<int32_t>>> adoptions() {
    absl::MutexLock lock(&mu_);
    return adoptions_;
  }
  // Every Prefill: (slot, its tokens).
  std::vector<std::pair<int, int>> fed() {
    absl::MutexLock lock(&mu_);
    return fed_;
  }
  // Step calls before the latest Prefill.
  int steps_before_last_prefill() {
    absl::MutexLock lock(&mu_);
    return steps_at_prefill_;
  }
  // The k-th Step from now (k >= 1) waits until Resume; WaitPaused returns
  // once it does (false after 30 s without).
  void PauseAtStep(int k) {
    absl::MutexLock lock(&mu_);
    pause_in_ = k;
  }
  bool WaitPaused() {
    absl::MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(absl::Condition(&paused_), absl::Seconds(30));
  }
  void Resume() {
    absl::MutexLock lock(&mu_);
    paused_ = false;
  }
  void SetBlockTable(int slot, absl::Span<const int> blocks) override {
    absl::StatusOr<std::vector<kv::BlockCopy>> copies = tables_.Set(slot, blocks, past_[static_cast<size_t>(slot)]);
    if (!copies.ok()) {
      absl::MutexLock lock(&mu_);
      errors_.push_back(copies.status().ToString());
      return;
    }
    for (const kv::BlockCopy& c : *copies) {
      std::copy_n(rows_.begin() + static_cast<ptrdiff_t>(c.src) * block_, c.rows,
                  rows_.begin() + static_cast<ptrdiff_t>(c.dst) * block_);
    }
  }
  std::vector<std::string> errors() {
    absl::MutexLock lock(&mu_);
    return errors_;
  }

 private:
  // Row n_past of the slot, through its table.
  absl::Status Write(int slot, int32_t token) {
    int64_t& p = past_[static_cast<size_t>(slot)];
    DPL_RETURN_IF_ERROR(tables_.CheckRun(slot, p + 1));
    const int blk = tables_.table(slot)[static_cast<size_t>(p / block_)];
    // A block one slot writes is in no other slot's table: shared blocks
    // (copied and adopted starts) are full, never written again.
    for (int other = 0; other < n_slots(); ++other) {
      const absl::Span<const int> t = tables_.table(other);
      if (other != slot && std::find(t.begin(), t.end(), blk) != t.end()) {
        absl::MutexLock lock(&mu_);
        errors_.push_back(absl::StrCat("slot ", slot, " writes block ", blk, ", which slot ", other, " holds"));
      }
    }
    rows_[static_cast<size_t>(blk) * block_ + static_cast<size_t>(p % block_)] = token;
    ++p;
    return absl::OkStatus();
  }
  // 100 + (a hash of rows 0 .. n_past - 1 read through the table) % 1000.
  int32_t Next(int slot) const {
    uint64_t h = 1469598103934665603ull;
    const absl::Span<const int> table = tables_.table(slot);
    for (int64_t p = 0; p < past_[static_cast<size_t>(slot)]; ++p) {
      const int blk = table[static_cast<size_t>(p / block_)];
      h = (h ^ static_cast<uint64_t>(rows_[static_cast<size_t>(blk) * block_ + static_cast<size_t>(p % block_)] + 7)) *
          1099511628211ull;
    }
    return static_cast<int32_t>(100 + h % 1000);
  }

  int64_t n_ctx_;
  int blocks_, block_;
  bool adopt_;
  kv::SeqTables tables_;
  std::vector<int32_t> rows_;  // (blocks, block) the token run at each pool row
  std::vector<int64_t> past_;
  std::vector<int32_t> pending_;
  absl::Mutex mu_;
  std::vector<std::string> errors_;
  std::vector<std::pair<int, std::vector<int32_t>>> adoptions_;
  std::vector<std::pair<int, int>> fed_;
  int pause_in_ = 0;
  bool paused_ = false;
  int steps_ = 0, steps_at_prefill_ = 0;
};

TEST_CASE("a paged engine under the scheduler: waits, preemption, copied and kept starts give each request its text alone") {
  Fixture f(1);  // the tokenizer
  // Requests sharing a 20-token start (copied between slots, kept by a
  // slot for the next), with their own tails and lengths.
  std::vector<GenerationRequest> reqs;
  std::vector<int32_t> system;
  for (int32_t i = 0; i < 20; ++i) system.push_back(300 + 7 * i);
  for (int i = 0; i < 10; ++i) {
    std::vector<int32_t> p = system;
    for (int j = 0; j <= i % 4; ++j) p.push_back(50 + 13 * i + j);
    if (i % 3 == 2) p.resize(12);  // a start shorter than the shared one: a partial block
    reqs.push_back(Greedy(p, 10 + 3 * (i % 5)));
  }
  std::vector<std::string> alone;
  for (const GenerationRequest& r : reqs) {
    PagedTokenEngine one(1, 256, 64, 4);
    Scheduler s(one, *f.tok, {4, 256});
    auto st = s.Submit(r);
    REQUIRE(st.ok());
    const Result got = Collect(**st);
    REQUIRE(got.final.error.ok());
    alone.push_back(got.text);
    CHECK(one.errors().empty());
  }
  for (const auto [prefill_chunk, adopt] : {std::pair{256, false}, {5, false}, {256, true}, {5, true}}) {
    CAPTURE(prefill_chunk);
    CAPTURE(adopt);
    // 4 slots sharing 22 blocks of 4 (88 positions): ~40 a request, so
    // they wait for blocks and the newest running ones are preempted;
    // with the block cache, cached blocks shared by running requests and
    // evictable ones are taken and given back all the while.
    PagedTokenEngine e(4, 256, 22, 4, adopt);
    Scheduler s(e, *f.tok, {16, prefill_chunk});
    std::vector<std::shared_ptr<RequestStream>> streams = SubmitAll(s, reqs);
    for (size_t i = 0; i < reqs.size(); ++i) {
      CAPTURE(i);
      const Result got = Collect(*streams[i]);
      CHECK(got.final.error.ok());
      CHECK(got.text == alone[i]);
    }
    CHECK(e.errors().empty());
    const SchedulerMetrics m = s.metrics();
    CHECK(m.kv_blocks_total == 22);
    CHECK(m.kv_block_size == 4);
    if (!adopt) {
      CHECK(e.adoptions().empty());
      CHECK(m.prompt_tokens_adopted_total == 0);
      CHECK(m.kv_blocks_cached == 0);
    }
    MESSAGE("prefill chunk " << prefill_chunk << std::string(adopt ? ", block cache" : "") << ": "
                             << m.preemptions_total << " preemptions, " << m.prompt_tokens_cached_total
                             << " prompt tokens from caches (" << m.prompt_tokens_adopted_total << " adopted)");
  }
}

// Issue 30's prefix cache on a paged engine that adopts blocks.

// The text a greedy request gives alone on a fresh paged engine.
std::string AloneOnPaged(const tokenizer::Tokenizer& tok, const GenerationRequest& r) {
  PagedTokenEngine one(1, 256, 64, 4);
  Scheduler s(one, tok, {4, 256});
  auto st = s.Submit(r);
  REQUIRE(st.ok());
  const Result got = Collect(**st);
  REQUIRE_MESSAGE(got.final.error.ok(), got.final.error.ToString());
  CHECK(one.errors().empty());
  return got.text;
}

Result Run(Scheduler& s, const GenerationRequest& r) {
  auto st = s.Submit(r);
  REQUIRE_MESSAGE(st.ok(), st.status().ToString());
  Result got = Collect(**st);
  REQUIRE_MESSAGE(got.final.error.ok(), got.final.error.ToString());
  return got;
}

// n ids from `first` on.
std::vector<int32_t> Range(int32_t first, int n) {
  std::vector<int32_t> ids;
  for (int i = 0; i < n; ++i) ids.push_back(first + i);
  return ids;
}

// More chats than slots: a chat's second turn finds its slot taken by
// another chat, but the full blocks its first turn wrote stay in the
// pool's cache. It adopts them (cached_tokens counts them, the engine is
// told their tokens) and prefills only the rest, giving the text it gives
// alone. Without adoption (cache_prompt false, or an engine that cannot)
// it runs the whole prompt; so does the CPU engine, whose cache is per
// slot: no block cache at all there.
TEST_CASE("prefix cache: a chat's next turn adopts its blocks after its slot was taken") {
  Fixture f(2);  // the tokenizer, and a CPU engine of 2 slots
  std::vector<GenerationRequest> turn1;
  for (int32_t c = 0; c < 4; ++c) turn1.push_back(Greedy(Range(200 + 10 * c, 10), 6));
  struct Outcome {
    GenerationRequest next;  // chat 0's second turn
    Result got;
    SchedulerMetrics m;
    std::vector<int> fed;  // the second turn's Prefill calls
  };
  auto chat = [&](BatchEngine& engine, PagedTokenEngine* paged, bool cache_prompt, bool block_cache = true) {
    SchedulerOptions so{4, 256};
    so.block_cache = block_cache;
    Scheduler s(engine, *f.tok, so);
    // One after another on 2 slots: chats 2 and 3 take chats 0's and 1's.
    std::vector<Result> first;
    for (const GenerationRequest& r : turn1) first.push_back(Run(s, r));
    Outcome o;
    // Its prompt, the answer (the slot ran 10 + 5 positions: 3 full
    // blocks) and 2 new tokens.
    o.next = Greedy(Concat(Concat(turn1[0].prompt, Ids(first[0].text)), {77, 78}), 5);
    REQUIRE(o.next.prompt.size() == 18);
    o.next.cache_prompt = cache_prompt;
    const size_t fed_before = paged != nullptr ? paged->fed().size() : 0;
    o.got = Run(s, o.next);
    o.m = s.metrics();
    if (paged != nullptr) {
      const std::vector<std::pair<int, int>> fed = paged->fed();
      for (size_t i = fed_before; i < fed.size(); ++i) o.fed.push_back(fed[i].second);
      CHECK(paged->errors().empty());
    }
    return o;
  };
  {
    PagedTokenEngine e(2, 256, 64, 4, /*adopt=*/true);
    const Outcome o = chat(e, &e, true);
    CHECK(o.got.final.cached_tokens == 12);
    const std::vector<std::pair<int, std::vector<int32_t>>> adopted = e.adoptions();
    REQUIRE(adopted.size() == 1);
    CHECK(adopted[0].first == 0);  // chat 2's slot, free longest
    CHECK(adopted[0].second == std::vector<int32_t>(o.next.prompt.begin(), o.next.prompt.begin() + 12));
    CHECK(o.fed == std::vector<int>{18 - 12});
    CHECK(o.got.text == AloneOnPaged(*f.tok, o.next));
    CHECK(o.m.prompt_tokens_cached_total == 12);
    CHECK(o.m.prompt_tokens_adopted_total == 12);
    CHECK(o.m.prompt_tokens_copied_total == 0);
    CHECK(o.m.prompt_tokens_total == 4 * 10 + 6);
    // Every full block that ran: each first turn's 3 (15 positions), the
    // second turn's 2 beyond the 3 it adopted (22 positions).
    CHECK(o.m.kv_blocks_cached == 4 * 3 + 2);
  }
  {
    PagedTokenEngine e(2, 256, 64, 4, true);
    const Outcome o = chat(e, &e, /*cache_prompt=*/false);
    CHECK(o.got.final.cached_tokens == 0);
    CHECK(e.adoptions().empty());
    CHECK(o.fed == std::vector<int>{18});
    CHECK(o.got.text == AloneOnPaged(*f.tok, o.next));
    CHECK(o.m.prompt_tokens_adopted_total == 0);
  }
  {
    // The block cache turned off (SchedulerOptions::block_cache, dpl-server's
    // DPL_BLOCK_CACHE=0): an engine that could adopt is never asked to.
    PagedTokenEngine e(2, 256, 64, 4, /*adopt=*/true);
    const Outcome o = chat(e, &e, true, /*block_cache=*/false);
    CHECK(o.got.final.cached_tokens == 0);
    CHECK(e.adoptions().empty());
    CHECK(o.fed == std::vector<int>{18});
    CHECK(o.got.text == AloneOnPaged(*f.tok, o.next));
    CHECK(o.m.prompt_tokens_adopted_total == 0);
    CHECK(o.m.kv_blocks_cached == 0);  // nothing registered
  }
  {
    PagedTokenEngine e(2, 256, 64, 4, /*adopt=*/false);  // pages, but cannot adopt
    const Outcome o = chat(e, &e, true);
    CHECK(o.got.final.cached_tokens == 0);
    CHECK(e.adoptions().empty());
    CHECK(o.fed == std::vector<int>{18});
    CHECK(o.got.text == AloneOnPaged(*f.tok, o.next));
    CHECK(o.m.kv_blocks_cached == 0);  // nothing registered
  }
  {
    CHECK(!f.engine->supports_block_adoption());
    CHECK(!f.engine->AdoptPrefix(0, {1, 2}).ok());
    const Outcome o = chat(*f.engine, nullptr, true);
    CHECK(o.got.final.cached_tokens == 0);
    CHECK(o.got.text == RunAlone(o.next).text);
    CHECK(o.m.prompt_tokens_adopted_total == 0);
    CHECK(o.m.kv_blocks_cached == 0);
  }
}

// A pool of 8 blocks of 4 on one slot: a (12 tokens), b (12), then c (16)
// leave a's and b's blocks cached, unused; c needs 4 blocks, takes the 2
// free ones and evicts 2 of a's, released first, its tail first. So a's
// next prompt adopts only a's first block (and, taking 3 blocks, evicts
// b's, released before c's); c's adopts all 4 of c's; b's finds nothing. A
// pool of 64 evicts nothing: each adopts all it can.
TEST_CASE("prefix cache: eviction takes the least recently released blocks first, tails before heads") {
  Fixture f(1);
  const GenerationRequest a = Greedy(Range(300, 12), 1), b = Greedy(Range(400, 12), 1), c = Greedy(Range(500, 16), 1);
  const GenerationRequest a2 = Greedy(Concat(a.prompt, {31, 32, 33, 34}), 1);
  const GenerationRequest c2 = Greedy(Concat(c.prompt, {35}), 1);
  const GenerationRequest b2 = Greedy(Concat(b.prompt, {36, 37, 38, 39}), 1);
  for (const int blocks : {8, 64}) {
    CAPTURE(blocks);
    PagedTokenEngine e(1, 64, blocks, 4, true);
    Scheduler s(e, *f.tok, {4, 256});
    for (const GenerationRequest& r : {a, b, c}) CHECK(Run(s, r).final.cached_tokens == 0);
    const Result ra2 = Run(s, a2), rc2 = Run(s, c2), rb2 = Run(s, b2);
    CHECK(ra2.text == AloneOnPaged(*f.tok, a2));
    CHECK(rc2.text == AloneOnPaged(*f.tok, c2));
    CHECK(rb2.text == AloneOnPaged(*f.tok, b2));
    const std::vector<std::pair<int, std::vector<int32_t>>> adopted = e.adoptions();
    if (blocks == 8) {
      CHECK(ra2.final.cached_tokens == 4);
      CHECK(rc2.final.cached_tokens == 16);
      CHECK(rb2.final.cached_tokens == 0);
      REQUIRE(adopted.size() == 2);
      CHECK(adopted[0].second == std::vector<int32_t>(a.prompt.begin(), a.prompt.begin() + 4));
      CHECK(adopted[1].second == c.prompt);
    } else {
      CHECK(ra2.final.cached_tokens == 12);
      CHECK(rc2.final.cached_tokens == 16);
      CHECK(rb2.final.cached_tokens == 12);
      CHECK(adopted.size() == 3);
    }
    CHECK(e.errors().empty());
    CHECK(s.metrics().preemptions_total == 0);
  }
}

// Chats in waves on a pool that runs out: 6 chats on 3 slots, each turn
// the last one's prompt, its answer and 2 new tokens, all 6 at once, a
// system prompt shared by all, prompts in chunks of 6. Starts come from
// slots' caches, copies and the block cache, with cached blocks in use by
// running requests while others are evicted, requests wait and are
// preempted: every answer is its text alone, no block is written while
// another slot holds it, every adopted block holds its tokens.
TEST_CASE("prefix cache: chats in waves on a pool that runs out; every answer as alone") {
  Fixture f(1);
  const std::vector<int32_t> system = Range(3000, 8);
  std::vector<GenerationRequest> first;
  for (int32_t c = 0; c < 6; ++c) first.push_back(Greedy(Concat(system, Range(3100 + 10 * c, 3)), 6 + c % 3));
  for (const int blocks : {16, 20, 24}) {
    CAPTURE(blocks);
    std::vector<GenerationRequest> turn = first;
    PagedTokenEngine e(3, 128, blocks, 4, true);
    Scheduler s(e, *f.tok, {16, 6});
    for (int wave = 0; wave < 3; ++wave) {
      CAPTURE(wave);
      const std::vector<std::shared_ptr<RequestStream>> streams = SubmitAll(s, turn);
      for (size_t c = 0; c < turn.size(); ++c) {
        CAPTURE(c);
        const Result got = Collect(*streams[c]);
        REQUIRE_MESSAGE(got.final.error.ok(), got.final.error.ToString());
        CHECK(got.final.completion_tokens == turn[c].max_tokens);
        CHECK(got.text == AloneOnPaged(*f.tok, turn[c]));
        turn[c].prompt = Concat(Concat(turn[c].prompt, Ids(got.text)), {static_cast<int32_t>(3200 + c), 3300});
      }
    }
    CHECK(e.errors().empty());
    const SchedulerMetrics m = s.metrics();
    CHECK(m.kv_blocks_used <= blocks);
    MESSAGE(blocks << " blocks: " << m.preemptions_total << " preemptions, " << m.prompt_tokens_cached_total
                   << " prompt tokens cached (" << m.prompt_tokens_adopted_total << " adopted, "
                   << m.prompt_tokens_copied_total << " copied)");
  }
}

// Adopting cached blocks that no one uses takes them from the blocks the
// pool counts as available: a start is claimed only when the pool has
// them AND the fresh blocks for the rest. A pool of 8 on 2 slots: a's
// cache (3 cached blocks and a partial one) is taken back by r, which
// decodes into 5 blocks, leaving a's 3 cached blocks alone available. a2
// (a's first 8 tokens and 3 more) is admitted then (3 blocks), but r, older,
// takes one of them (a's tail) for its next token in that iteration: a2's
// 2 cached blocks and 1 fresh one are more than the 2 left, so a2 waits
// until r ends, then adopts them.
TEST_CASE("prefix cache: adopted blocks count against the pool; a start waits until it has them all") {
  Fixture f(1);
  const GenerationRequest a = Greedy(Range(400, 12), 2), r = Greedy(Range(500, 4), 20);
  const GenerationRequest a2 = Greedy(Concat(Range(400, 8), {41, 42, 43}), 1);
  PagedTokenEngine e(2, 64, 8, 4, true);
  Scheduler s(e, *f.tok, {4, 256});
  CHECK(Run(s, a).final.cached_tokens == 0);  // slot 0: 13 positions, blocks 0-2 cached
  // r (slot 1) runs position 16 + k at step 13 + k: its 5th block at step
  // 13 (a's cache reclaimed), its 6th at step 17.
  e.PauseAtStep(16);
  auto sr = s.Submit(r);
  REQUIRE(sr.ok());
  REQUIRE(e.WaitPaused());
  auto sa = s.Submit(a2);
  REQUIRE(sa.ok());
  e.Resume();
  const Result rr = Collect(**sr), ra = Collect(**sa);
  REQUIRE_MESSAGE(rr.final.error.ok(), rr.final.error.ToString());
  REQUIRE_MESSAGE(ra.final.error.ok(), ra.final.error.ToString());
  CHECK(rr.text == AloneOnPaged(*f.tok, r));
  CHECK(ra.text == AloneOnPaged(*f.tok, a2));
  CHECK(ra.final.cached_tokens == 8);
  REQUIRE(e.adoptions().size() == 1);
  CHECK(e.adoptions()[0].second == Range(400, 8));
  // a2's prompt ran after r's last step: a's 1 step and r's 19 before it.
  const std::vector<std::pair<int, int>> fed = e.fed();
  REQUIRE(fed.size() == 3);
  CHECK(fed[2] == std::pair{0, 3});
  CHECK(e.steps_before_last_prefill() == 1 + 19);
  CHECK(e.errors().empty());
  CHECK(s.metrics().preemptions_total == 0);
}

// A slot kept to a start that ends inside a block the block cache holds
// (the previous request filled it) writes the rest into a copy: the cached
// block keeps its tokens, and a later prompt with them adopts it intact
// (the engine checks an adopted block's rows).
TEST_CASE("prefix cache: a kept start never writes into a cached block") {
  Fixture f(1);
  const GenerationRequest a = Greedy(Range(1000, 8), 1);  // 2 full blocks, cached
  const GenerationRequest b = Greedy(Concat(Range(1000, 6), {50, 51, 52}), 1);
  const GenerationRequest a2 = Greedy(Concat(a.prompt, {60}), 1);
  PagedTokenEngine e(1, 64, 16, 4, true);
  Scheduler s(e, *f.tok, {4, 256});
  CHECK(Run(s, a).final.cached_tokens == 0);
  CHECK(Run(s, b).final.cached_tokens == 6);  // the slot's cache, kept
  const Result r = Run(s, a2);
  CHECK(r.final.cached_tokens == 8);  // a's 2 blocks, more than the 6 the slot holds
  CHECK(r.text == AloneOnPaged(*f.tok, a2));
  REQUIRE(e.adoptions().size() == 1);
  CHECK(e.adoptions()[0].second == a.prompt);
  CHECK(e.errors().empty());
}

// Blocks that a running request adopted are cached and in use at once:
// however short the pool runs, they are never handed to another request.
// x's 3 cached blocks (its slot since taken) are adopted by x2, which
// decodes 30 tokens (11 of the 12 blocks); v arrives while it runs and
// needs 6: the pool runs out, evictable blocks are taken and v (the newer)
// is preempted and runs again. The engine records any write into a block
// another slot holds, and both texts are the texts alone.
TEST_CASE("prefix cache: blocks a running request adopted are never handed out again when the pool runs out") {
  Fixture f(1);
  const GenerationRequest x = Greedy(Range(600, 12), 1), y = Greedy(Range(700, 12), 1), w = Greedy(Range(800, 12), 1);
  const GenerationRequest x2 = Greedy(Concat(x.prompt, {41, 42}), 30), v = Greedy(Range(900, 12), 10);
  PagedTokenEngine e(2, 64, 12, 4, true);
  Scheduler s(e, *f.tok, {4, 256});
  // x on slot 0, y on slot 1, w on slot 0 again: x's blocks cached, unused.
  for (const GenerationRequest& r : {x, y, w}) Run(s, r);
  e.PauseAtStep(3);
  auto sx = s.Submit(x2);
  REQUIRE(sx.ok());
  REQUIRE(e.WaitPaused());  // x2 adopted x's blocks and decodes
  auto sv = s.Submit(v);    // queued while the engine thread waits
  REQUIRE(sv.ok());
  e.Resume();
  const Result rx = Collect(**sx), rv = Collect(**sv);
  REQUIRE(rx.final.error.ok());
  REQUIRE(rv.final.error.ok());
  CHECK(rx.final.cached_tokens == 12);
  CHECK(rx.final.completion_tokens == 30);
  CHECK(rv.final.completion_tokens == 10);
  CHECK(rx.text == AloneOnPaged(*f.tok, x2));
  CHECK(rv.text == AloneOnPaged(*f.tok, v));
  const std::vector<std::pair<int, std::vector<int32_t>>> adopted = e.adoptions();
  REQUIRE(!adopted.empty());
  CHECK(adopted[0].first == 1);
  CHECK(adopted[0].second == x.prompt);
  CHECK(e.errors().empty());
  const SchedulerMetrics m = s.metrics();
  CHECK(m.preemptions_total >= 1);
  CHECK(m.kv_blocks_used <= 12);
}

}  // namespace
}  // namespace dpl::server
