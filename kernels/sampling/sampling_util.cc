#include "kernels/sampling/sampling_util.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace dpl::kernels {

RecentRing MakeRecentRing(absl::Span<const int32_t> history, int32_t repeat_last_n) {
  RecentRing ring;
  if (repeat_last_n <= 0) return ring;
  ring.tokens.assign(repeat_last_n, -1);
  for (int32_t t : history) {
    ring.tokens[ring.head] = t;
    ring.head = (ring.head + 1) % repeat_last_n;
    if (ring.count < repeat_last_n) ++ring.count;
  }
  return ring;
}

absl::Status CheckLogitBias(absl::Span<const LogitBias> bias, int64_t n_vocab) {
  if (bias.size() > static_cast<size_t>(kMaxLogitBias)) {
    return absl::InvalidArgumentError(
        absl::StrCat("logit bias: ", bias.size(), " entries, at most ", kMaxLogitBias));
  }
  std::vector<int32_t> tokens;
  tokens.reserve(bias.size());
  for (const LogitBias& b : bias) {
    if (b.token < 0 || b.token >= n_vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat("logit bias: token id ", b.token, " is outside the vocabulary [0, ", n_vocab, ")"));
    }
    if (!(b.bias == -INFINITY || (b.bias >= -100.0f && b.bias <= 100.0f))) {
      return absl::InvalidArgumentError(absl::StrCat("logit bias: token ", b.token, "'s bias ", b.bias,
                                                     " is not in [-100, 100] (nor -inf)"));
    }
    tokens.push_back(b.token);
  }
  std::sort(tokens.begin(), tokens.end());
  const auto twice = std::adjacent_find(tokens.begin(), tokens.end());
  if (twice != tokens.end()) {
    return absl::InvalidArgumentError(absl::StrCat("logit bias: token ", *twice, " is listed twice"));
  }
  // Distinct and in the vocabulary: as many bans as tokens is every token.
  const auto banned = std::count_if(bias.begin(), bias.end(), [](const LogitBias& b) { return b.bias == -INFINITY; });
  if (banned > 0 && banned >= n_vocab) {
    return absl::InvalidArgumentError(absl::StrCat("logit bias: bans every token of the vocabulary (", n_vocab, ")"));
  }
  return absl::OkStatus();
}

}  // namespace dpl::kernels
