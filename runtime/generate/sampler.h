// Host-side token sampling with llama.cpp's default chain and flag semantics:
//   logit bias -> repetition penalty -> top-k -> top-p -> min-p -> temperature -> draw
// Used by the CPU device; the CUDA device samples on the GPU with the same
// chain (kernels/sampling).
#pragma once

#include <cstdint>
#include <deque>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/sampling/sampling_util.h"

namespace dpl::generate {

using SamplerParams = kernels::SamplingParams;
using LogitBias = kernels::LogitBias;

class Sampler {
 public:
  // `bias` (OpenAI's logit_bias): added to each listed token's logit before
  // the penalties, every draw; an entry outside the vocabulary is skipped.
  // Tokens should be distinct (kernels::CheckLogitBias: the device's rule);
  // here a token listed twice gets both.
  explicit Sampler(const SamplerParams& params, std::vector<LogitBias> bias = {})
      : p_(params), bias_(std::move(bias)) {}
  const SamplerParams& params() const { return p_; }
  absl::Span<const LogitBias> logit_bias() const { return bias_; }
  // Tokens remembered for the repetition penalty, oldest first.
  std::vector<int32_t> recent() const { return {recent_.begin(), recent_.end()}; }

  // Chooses the next token from `logits` (n_vocab). Ties in greedy mode go
  // to the lowest id. Deterministic for a given seed and call sequence.
  int32_t Sample(absl::Span<const float> logits);
  // The same draw among the allowed tokens only: bit (id % 32) of
  // allowed[id / 32] set (a grammar's mask, grammar::Matcher::FillMask;
  // (n_vocab + 31) / 32 words). A token whose bit is clear is never chosen,
  // whatever the filters and the rounding of the draw; the chain (penalties,
  // top-k, top-p, min-p) runs over the allowed tokens. Errors: a mask of the
  // wrong size (InvalidArgument), no token allowed (FailedPrecondition).
  absl::StatusOr<int32_t> SampleAllowed(absl::Span<const float> logits, absl::Span<const uint32_t> allowed);
  // `logits` with the biases added, then the penalties applied (repetition,
  // presence, frequency over the recent tokens): what the next draw's chain starts from, and
  // what a draw's logprobs are computed from (before any Accept of it).
  // Valid until the next Penalized, Sample or SampleAllowed (one buffer,
  // reused: no allocation a draw).
  absl::Span<const float> Penalized(absl::Span<const float> logits);
  // Remembers a token for the repetition penalty (prompt and generated).
  void Accept(int32_t token);

 private:
  // Uniform in [0, 1) from (seed, draw counter): splitmix64 of both.
  double NextUniform();
  // The chain over candidates_ (ids already in it, penalties applied).
  int32_t Draw();
  // candidates_ = every token with its logit, biases and penalties applied.
  void Fill(absl::Span<const float> logits);

  SamplerParams p_;
  std::vector<LogitBias> bias_;
  uint64_t draws_ = 0;
  std::deque<int32_t> recent_;
  std::vector<std::pair<float, int32_t>> candidates_;  // reused buffer
  std::vector<float> penalized_;                       // Penalized's, reused
};

}  // namespace dpl::generate
