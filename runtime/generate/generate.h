// The generation loop: feed a prompt, then sample and stream tokens until the
// model ends its turn, the token budget is spent or the context is full.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "runtime/generate/decoder.h"
#include "runtime/generate/sampler.h"
#include "runtime/tokenizer/tokenizer.h"

namespace dpl::generate {

struct Timings {
  int64_t n_prompt = 0;
  double prompt_seconds = 0;
  int64_t n_generated = 0;
  double generate_seconds = 0;
};

struct GenerateRequest {
  absl::Span<const int32_t> prompt;   // appended after the decoder's cached positions
  int32_t n_predict = -1;             // -1: until end of generation or a full context
  absl::flat_hash_set<int32_t> stop;  // end-of-generation ids (not printed)
};

// OK when every logit is finite; else DataLoss naming the first bad one and
// the position. (Weights holding NaN or Inf show here: the CUDA device
// samples on the GPU, so its prompt's logits are where the host can see them.)
absl::Status CheckFinite(absl::Span<const float> logits, int64_t position);

// Returns the generated ids (stop token excluded). `on_text` receives the
// text as it is generated, never splitting a UTF-8 character.
absl::StatusOr<std::vector<int32_t>> Generate(Decoder& decoder, const tokenizer::Tokenizer& tok,
                                              Sampler& sampler, const GenerateRequest& request,
                                              const std::function<void(absl::string_view)>& on_text,
                                              Timings* timings);

}  // namespace dpl::generate
