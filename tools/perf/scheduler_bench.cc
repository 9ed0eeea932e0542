// The scheduler's host cost a step, without a GPU: 64 streams (or -n) of a
// 128-token prompt and 128 generated tokens through server::Scheduler on an
// engine that answers at once (a fixed token a slot and step from the text
// range of the vocabulary), each stream read by its own thread as an HTTP
// worker reads it. Prints the wall time, the steps and the microseconds a
// step: what the server adds to each GPU step at that many streams.
//
//   bazel run -c opt //tools/perf:scheduler_bench -- VOCAB.gguf [streams] [gen]
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <thread>
#include <vector>

#include "formats/model_file.h"
#include "runtime/server/batch_engine.h"
#include "runtime/server/scheduler.h"
#include "runtime/tokenizer/tokenizer.h"

namespace {

using dpl::server::BatchEngine;

// n slots, every call instant; token (slot * 7919 + step * 104729) % 20000 + 100.
class InstantEngine : public BatchEngine {
 public:
  InstantEngine(int n_slots, int64_t n_ctx) : past_(static_cast<size_t>(n_slots), 0), n_ctx_(n_ctx) {}
  int n_slots() const override { return static_cast<int>(past_.size()); }
  int64_t n_ctx() const override { return n_ctx_; }
  int32_t n_vocab() const override { return 151936; }
  absl::StatusOr<int32_t> Prefill(int slot, absl::Span<const int32_t> tokens, bool last,
                                  const dpl::server::SamplerParams&) override {
    past_[static_cast<size_t>(slot)] += static_cast<int64_t>(tokens.size());
    return last ? Token(slot) : -1;
  }
  absl::Status Step(absl::Span<const int> slots, absl::Span<int32_t> next) override {
    ++steps;
    for (size_t i = 0; i < slots.size(); ++i) {
      ++past_[static_cast<size_t>(slots[i])];
      next[i] = Token(slots[i]);
    }
    return absl::OkStatus();
  }
  int64_t n_past(int slot) const override { return past_[static_cast<size_t>(slot)]; }
  absl::Status KeepPrefix(int slot, absl::Span<const int32_t> kept) override {
    past_[static_cast<size_t>(slot)] = static_cast<int64_t>(kept.size());
    return absl::OkStatus();
  }
  absl::Status CopyPrefix(int slot, int, absl::Span<const int32_t> kept) override { return KeepPrefix(slot, kept); }
  void Release(int slot) override { past_[static_cast<size_t>(slot)] = 0; }
  std::atomic<int64_t> steps{0};

 private:
  int32_t Token(int slot) const {
    return static_cast<int32_t>((int64_t{slot} * 7919 + past_[static_cast<size_t>(slot)] * 104729) % 20000 + 100);
  }
  std::vector<int64_t> past_;
  int64_t n_ctx_;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: scheduler_bench VOCAB.gguf [streams] [gen]\n");
    return 1;
  }
  const int n = argc > 2 ? std::atoi(argv[2]) : 64, gen = argc > 3 ? std::atoi(argv[3]) : 128;
  auto file = dpl::formats::ModelFile::Open(argv[1]);
  if (!file.ok()) return std::fprintf(stderr, "%s\n", file.status().ToString().c_str()), 1;
  auto tok = dpl::tokenizer::Tokenizer::FromMetadata((*file)->metadata());
  if (!tok.ok()) return std::fprintf(stderr, "%s\n", tok.status().ToString().c_str()), 1;
  InstantEngine engine(n, 4096);
  for (int round = 0; round < 3; ++round) {
    dpl::server::Scheduler s(engine, *tok, {});
    const int64_t steps0 = engine.steps;
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> readers;
    for (int i = 0; i < n; ++i) {
      dpl::server::GenerationRequest r;
      for (int j = 0; j < 128; ++j) r.prompt.push_back(100 + (i * 7919 + j * 104729) % 20000);
      r.max_tokens = gen;
      r.ignore_eos = true;
      r.sampling.temperature = 0;
      auto st = s.Submit(std::move(r));
      if (!st.ok()) return std::fprintf(stderr, "%s\n", st.status().ToString().c_str()), 1;
      readers.emplace_back([stream = *st] {
        for (bool done = false; !done;) {
          for (const dpl::server::StreamEvent& e : stream->Wait(absl::Seconds(30))) done = done || e.final;
        }
      });
    }
    for (std::thread& t : readers) t.join();
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const int64_t steps = engine.steps - steps0;
    std::printf("%d streams x %d tokens: %.3f s, %lld steps, %.1f us a step (host only)\n", n, gen, sec,
                static_cast<long long>(steps), sec * 1e6 / static_cast<double>(steps));
  }
  return 0;
}
