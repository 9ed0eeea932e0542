// Log-probabilities of tokens under a position's logits, for the API's
// logprobs / top_logprobs and for scoring a prompt (echo). Host code, shared
// by the engines: a device engine copies the (penalized, masked) logits of a
// draw back only when its slot asked for logprobs.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace dpl::generate {

// The most alternatives a token's top list may hold (OpenAI's chat allows
// 20; llama.cpp's n_probs as many).
inline constexpr int kMaxTopLogprobs = 20;

struct TokenLogprob {
  int32_t token = -1;
  float logprob = 0;  // natural log
};

// One position's: the token taken there and the `top_n` most probable.
struct TokenLogprobs {
  TokenLogprob chosen;
  std::vector<TokenLogprob> top;  // descending logprob, ties to the lower id
};

// log_softmax(logits)[token] and the top_n largest entries, in float64.
// `allowed` (a grammar's mask: bit id % 32 of word id / 32; empty: every
// token) leaves the others out of the softmax: they are -inf and never
// listed, so the top list may hold fewer than top_n. A logit of -inf (a
// `false` logit bias; the device sampler's mask, written into its logits)
// is left out the same way, so a device's masked logits need no mask here.
// Errors (InvalidArgument): top_n outside [0, kMaxTopLogprobs], `token`
// outside the vocabulary, a mask of the wrong size, a NaN or +inf logit of
// an allowed token.
absl::StatusOr<TokenLogprobs> ScoreToken(absl::Span<const float> logits, int32_t token, int top_n,
                                         absl::Span<const uint32_t> allowed = {});

}  // namespace dpl::generate
