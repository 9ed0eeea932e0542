// A model instance on one device, as the generation loop sees it: feed tokens
// at positions, get logits. The CPU device wraps the reference forward pass;
// the CUDA device (issue 4) replays a captured graph.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "runtime/generate/sampler.h"

namespace dpl::generate {

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual int32_t n_vocab() const = 0;
  virtual int64_t n_ctx() const = 0;
  // Positions already in the KV cache.
  virtual int64_t n_past() const = 0;

  // Runs `tokens` at positions n_past() .. n_past() + size - 1 and appends
  // them to the cache. Writes the logits of the last token into `last`
  // (n_vocab), and when `all` is non-null every token's row into `all`
  // ((tokens.size(), n_vocab), row-major).
  virtual absl::Status Eval(absl::Span<const int32_t> tokens, std::vector<float>* last,
                            std::vector<float>* all) = 0;
  // Drops cached positions >= n (n <= n_past()).
  virtual absl::Status Rewind(int64_t n) = 0;
  // One line for the user about what loading took (sizes, speed); may be empty.
  virtual std::string LoadReport() const { return ""; }
  // Where loading's time went, stage by stage (name, seconds), for the
  // timing block; empty when the device does not break it down.
  virtual std::vector<std::pair<std::string, double>> LoadStages() const { return {}; }

  // Devices that sample on the device (the CUDA runtime) return true and
  // implement SampleLoop; the others get a host Sampler over Eval's logits.
  virtual bool samples_on_device() const { return false; }
  // After Eval() of a prompt: samples from the last logits, feeds each token
  // back and keeps going, calling on_token(id) for every sampled token in
  // order until it returns false, `max_tokens` (-1: no limit) tokens were
  // sampled or the context is full. `history` (the ids so far, oldest first)
  // seeds the repetition penalty. Tokens handed to on_token are in the
  // cache, except the one on which on_token returned false.
  virtual absl::Status SampleLoop(const SamplerParams& params, absl::Span<const int32_t> history,
                                  int32_t max_tokens,
                                  const std::function<bool(int32_t)>& on_token) {
    return absl::UnimplementedError("this device does not sample on the device");
  }
};

}  // namespace dpl::generate
