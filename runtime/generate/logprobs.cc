#include "runtime/generate/logprobs.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace dpl::generate {

absl::StatusOr<TokenLogprobs> ScoreToken(absl::Span<const float> logits, int32_t token, int top_n,
                                         absl::Span<const uint32_t> allowed) {
  const size_t n = logits.size();
  if (top_n < 0 || top_n > kMaxTopLogprobs) {
    return absl::InvalidArgumentError(absl::StrCat("top_n ", top_n, " is outside [0, ", kMaxTopLogprobs, "]"));
  }
  if (token < 0 || static_cast<size_t>(token) >= n) {
    return absl::InvalidArgumentError(absl::StrCat("token id ", token, " is outside the vocabulary [0, ", n, ")"));
  }
  if (!allowed.empty() && allowed.size() != (n + 31) / 32) {
    return absl::InvalidArgumentError(absl::StrCat("the allowed-token mask has ", allowed.size(), " words; ", n,
                                                   " tokens need ", (n + 31) / 32));
  }
  // A logit of -inf (a `false` logit bias, or a mask the device sampler
  // wrote into its logits) is a token that cannot be drawn: out as a masked one.
  auto ok = [allowed, logits](size_t id) {
    return logits[id] != -std::numeric_limits<float>::infinity() &&
           (allowed.empty() || ((allowed[id / 32] >> (id % 32)) & 1u) != 0);
  };
  double max_l = -std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < n; ++i) {
    if (!ok(i)) continue;
    if (!std::isfinite(logits[i])) {
      return absl::InvalidArgumentError(absl::StrCat("logit of token ", i, " is ", logits[i]));
    }
    max_l = std::max(max_l, static_cast<double>(logits[i]));
  }
  double total = 0;
  for (size_t i = 0; i < n; ++i) {
    if (ok(i)) total += std::exp(static_cast<double>(logits[i]) - max_l);
  }
  // With no allowed token total is 0 and every logprob -inf.
  const double log_z = max_l + std::log(total);
  auto logprob = [&](size_t id) {
    return ok(id) ? static_cast<float>(static_cast<double>(logits[id]) - log_z)
                  : -std::numeric_limits<float>::infinity();
  };
  TokenLogprobs out;
  out.chosen = {token, logprob(static_cast<size_t>(token))};
  // The top_n largest allowed logits: a bounded pass, no copy of the vocabulary.
  auto before = [&logits](int32_t a, int32_t b) { return logits[a] != logits[b] ? logits[a] > logits[b] : a < b; };
  std::vector<int32_t> best;
  for (size_t i = 0; i < n && top_n > 0; ++i) {
    if (!ok(i)) continue;
    const int32_t id = static_cast<int32_t>(i);
    if (static_cast<int>(best.size()) == top_n && !before(id, best.back())) continue;
    best.insert(std::upper_bound(best.begin(), best.end(), id, before), id);
    if (static_cast<int>(best.size()) > top_n) best.pop_back();
  }
  for (int32_t id : best) out.top.push_back({id, logprob(static_cast<size_t>(id))});
  return out;
}

}  // namespace dpl::generate
