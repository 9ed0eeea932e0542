#include "runtime/generate/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace dpl::generate {

double Sampler::NextUniform() {
  return kernels::UniformFromCounter(p_.seed, draws_++);  // the device sampler's draws
}

void Sampler::Accept(int32_t token) {
  if (p_.repeat_last_n <= 0) return;
  recent_.push_back(token);
  while (static_cast<int32_t>(recent_.size()) > p_.repeat_last_n) recent_.pop_front();
}

absl::Span<const float> Sampler::Penalized(absl::Span<const float> logits) {
  std::vector<float>& out = penalized_;
  out.assign(logits.begin(), logits.end());
  const int32_t n = static_cast<int32_t>(out.size());
  // The biases first (llama.cpp's logit-bias sampler heads its chain): the
  // penalties below see the biased logits, as the device's PrepareKernel.
  for (const LogitBias& b : bias_) {
    if (b.token >= 0 && b.token < n) out[b.token] += b.bias;
  }
  // Penalties (llama.cpp's penalties sampler): each distinct recent token
  // once, the repetition penalty, then frequency x its count + presence.
  const bool additive = p_.presence_penalty != 0.0f || p_.frequency_penalty != 0.0f;
  if ((p_.repeat_penalty != 1.0f || additive) && !recent_.empty()) {
    std::vector<int32_t> seen(recent_.begin(), recent_.end());
    std::sort(seen.begin(), seen.end());
    for (size_t i = 0; i < seen.size();) {
      size_t j = i;
      while (j < seen.size() && seen[j] == seen[i]) ++j;
      const int32_t t = seen[i];
      const float count = static_cast<float>(j - i);
      i = j;
      if (t < 0 || t >= n) continue;
      float& l = out[t];
      l = l > 0 ? l / p_.repeat_penalty : l * p_.repeat_penalty;
      if (additive) l -= count * p_.frequency_penalty + p_.presence_penalty;
    }
  }
  return out;
}

void Sampler::Fill(absl::Span<const float> logits) {
  const absl::Span<const float> penalized = Penalized(logits);
  const int32_t n = static_cast<int32_t>(penalized.size());
  candidates_.resize(n);
  for (int32_t i = 0; i < n; ++i) candidates_[i] = {penalized[i], i};
}

int32_t Sampler::Sample(absl::Span<const float> logits) {
  Fill(logits);
  return Draw();
}

absl::StatusOr<int32_t> Sampler::SampleAllowed(absl::Span<const float> logits, absl::Span<const uint32_t> allowed) {
  const size_t words = (logits.size() + 31) / 32;
  if (allowed.size() != words) {
    return absl::InvalidArgumentError(absl::StrCat("the allowed-token mask has ", allowed.size(),
                                                   " words; ", logits.size(), " tokens need ", words));
  }
  Fill(logits);
  auto masked = [allowed](const std::pair<float, int32_t>& c) {
    return ((allowed[static_cast<size_t>(c.second) / 32] >> (c.second % 32)) & 1u) == 0;
  };
  candidates_.erase(std::remove_if(candidates_.begin(), candidates_.end(), masked), candidates_.end());
  if (candidates_.empty()) return absl::FailedPreconditionError("the allowed-token mask allows no token");
  return Draw();
}

int32_t Sampler::Draw() {
  const int32_t n = static_cast<int32_t>(candidates_.size());
  auto by_logit = [](const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  };
  if (p_.temperature <= 0.0f) {
    return std::min_element(candidates_.begin(), candidates_.end(), by_logit)->second;
  }

  // top-k: keep the k largest (sorted, descending).
  int32_t keep = n;
  if (p_.top_k > 0 && p_.top_k < n) keep = p_.top_k;
  std::partial_sort(candidates_.begin(), candidates_.begin() + keep, candidates_.end(), by_logit);
  candidates_.resize(keep);

  // top-p on softmax(logits): the smallest prefix with cumulative mass >= p.
  if (p_.top_p < 1.0f) {
    const double max_l = candidates_[0].first;
    double total = 0;
    for (const auto& c : candidates_) total += std::exp(c.first - max_l);
    double cum = 0;
    size_t cut = candidates_.size();
    for (size_t i = 0; i < candidates_.size(); ++i) {
      cum += std::exp(candidates_[i].first - max_l) / total;
      if (cum >= p_.top_p) {
        cut = i + 1;
        break;
      }
    }
    candidates_.resize(std::max<size_t>(cut, 1));
  }

  // min-p: keep p_i >= min_p * p_max, i.e. logit >= max_logit + log(min_p).
  if (p_.min_p > 0.0f) {
    const float threshold = candidates_[0].first + std::log(p_.min_p);
    size_t cut = 1;
    while (cut < candidates_.size() && candidates_[cut].first >= threshold) ++cut;
    candidates_.resize(cut);
  }

  // Never a -inf token (a logit_bias ban): the sorted tail of -inf is cut,
  // at least one kept, so not even the draw's rounding fallback below
  // (the last candidate) can pick one. The device's FinalKernel does the same.
  while (candidates_.size() > 1 && candidates_.back().first == -std::numeric_limits<float>::infinity()) {
    candidates_.pop_back();
  }

  // Temperature, softmax, draw.
  const double max_l = candidates_[0].first / p_.temperature;
  std::vector<double> probs(candidates_.size());
  double total = 0;
  for (size_t i = 0; i < candidates_.size(); ++i) {
    probs[i] = std::exp(candidates_[i].first / p_.temperature - max_l);
    total += probs[i];
  }
  const double u = NextUniform() * total;
  double cum = 0;
  for (size_t i = 0; i < candidates_.size(); ++i) {
    cum += probs[i];
    if (u < cum) return candidates_[i].second;
  }
  return candidates_.back().second;
}

}  // namespace dpl::generate
