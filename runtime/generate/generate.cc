#include "runtime/generate/generate.h"

#include <chrono>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace dpl::generate {

absl::Status CheckFinite(absl::Span<const float> logits, int64_t position) {
  for (size_t i = 0; i < logits.size(); ++i) {
    if (!std::isfinite(logits[i])) {
      return absl::DataLossError(absl::StrCat(
          "the model produced a non-finite logit (", logits[i], " for token ", i,
          ") at position ", position, ": its weights or inputs hold NaN or Inf"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> Generate(Decoder& decoder, const tokenizer::Tokenizer& tok,
                                              Sampler& sampler, const GenerateRequest& req,
                                              const std::function<void(absl::string_view)>& on_text,
                                              Timings* timings) {
  using Clock = std::chrono::steady_clock;
  if (req.prompt.empty()) return absl::InvalidArgumentError("the prompt is empty");
  if (decoder.n_past() + static_cast<int64_t>(req.prompt.size()) > decoder.n_ctx()) {
    return absl::OutOfRangeError(absl::StrCat("the prompt (", req.prompt.size(),
                                              " tokens) is longer than the context left (",
                                              decoder.n_ctx() - decoder.n_past(),
                                              " of ", decoder.n_ctx(), "); use -c"));
  }
  std::vector<float> logits;
  const auto t0 = Clock::now();
  DPL_RETURN_IF_ERROR(decoder.Eval(req.prompt, &logits, nullptr));
  DPL_RETURN_IF_ERROR(CheckFinite(logits, decoder.n_past() - 1));
  for (int32_t t : req.prompt) sampler.Accept(t);
  const auto t1 = Clock::now();
  timings->n_prompt += req.prompt.size();
  timings->prompt_seconds += std::chrono::duration<double>(t1 - t0).count();

  tokenizer::TokenStreamDecoder text(tok);
  std::vector<int32_t> out;
  // Takes one sampled token; false when it ends the generation.
  auto take = [&](int32_t next) {
    if (req.stop.contains(next)) return false;
    out.push_back(next);
    sampler.Accept(next);
    on_text(text.Push(next));
    return true;
  };
  if (decoder.samples_on_device()) {
    // The GPU samples and feeds tokens back itself; the host only streams.
    DPL_RETURN_IF_ERROR(
        decoder.SampleLoop(sampler.params(), sampler.recent(), req.n_predict, take));
  } else {
    while (req.n_predict < 0 || static_cast<int32_t>(out.size()) < req.n_predict) {
      if (!take(sampler.Sample(logits))) break;
      if (decoder.n_past() >= decoder.n_ctx()) break;  // context full
      const int32_t one[1] = {out.back()};
      DPL_RETURN_IF_ERROR(decoder.Eval(one, &logits, nullptr));
      DPL_RETURN_IF_ERROR(CheckFinite(logits, decoder.n_past() - 1));
    }
  }
  on_text(text.Flush());
  timings->n_generated += out.size();
  timings->generate_seconds += std::chrono::duration<double>(Clock::now() - t1).count();
  return out;
}

}  // namespace dpl::generate
