// The CUDA device as a BatchEngine with ONE slot: the runtime's captured
// decode step (runtime/cuda), one token per Step, sampling on the GPU. The
// batched step of issue 12 (every weight read once per step for many
// sequences, one graph per batch size) is not built yet; until it is, the
// server runs -np 1 on the GPU and queues the other requests.
//
// Known cost: the generation graph is captured for each new set of sampling
// parameters (temperature, seed, ...), ~10 ms on the first token of a
// request whose parameters differ from the previous request's.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/cuda/cuda_decoder.h"
#include "runtime/server/batch_engine.h"

namespace dpl::server {

class CudaEngine : public BatchEngine {
 public:
  static absl::StatusOr<std::unique_ptr<CudaEngine>> Load(const std::string& path,
                                                          const runtime::CudaDecoderOptions& options);

  int n_slots() const override { return 1; }
  int64_t n_ctx() const override { return decoder_->n_ctx(); }
  int32_t n_vocab() const override { return decoder_->n_vocab(); }
  absl::StatusOr<int32_t> Prefill(int slot, absl::Span<const int32_t> tokens, bool last,
                                  const SamplerParams& params) override;
  absl::Status Step(absl::Span<const int> slots, absl::Span<int32_t> next) override;
  int64_t n_past(int slot) const override { return slot == 0 ? decoder_->n_past() : 0; }
  void Release(int slot) override;

  const runtime::CudaDecoder& decoder() const { return *decoder_; }

 private:
  explicit CudaEngine(std::unique_ptr<runtime::CudaDecoder> d) : decoder_(std::move(d)) {}

  std::unique_ptr<runtime::CudaDecoder> decoder_;
  std::vector<int32_t> prompt_;  // the history for the repetition penalty
  std::vector<float> logits_;    // the prompt's last logits (checked finite)
  bool pending_ = false;         // a sampled token waits for the next Step
};

}  // namespace dpl::server
