#include "runtime/server/cuda_engine.h"

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "runtime/generate/generate.h"

namespace dpl::server {
namespace {

absl::Status CheckSlot(int slot) {
  if (slot != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("slot ", slot, " is outside [0, 1) (the GPU engine has one slot)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaEngine>> CudaEngine::Load(
    const std::string& path, const runtime::CudaDecoderOptions& options) {
  DPL_ASSIGN_OR_RETURN(std::unique_ptr<runtime::CudaDecoder> d,
                       runtime::CudaDecoder::Create(path, options));
  return std::unique_ptr<CudaEngine>(new CudaEngine(std::move(d)));
}

absl::StatusOr<int32_t> CudaEngine::Prefill(int slot, absl::Span<const int32_t> tokens, bool last,
                                            const SamplerParams& params) {
  DPL_RETURN_IF_ERROR(CheckSlot(slot));
  if (tokens.empty()) return absl::InvalidArgumentError("Prefill: no tokens");
  // Eval checks the ids and the room left in the context.
  DPL_RETURN_IF_ERROR(decoder_->Eval(tokens, last ? &logits_ : nullptr, nullptr));
  prompt_.insert(prompt_.end(), tokens.begin(), tokens.end());
  if (!last) return -1;
  DPL_RETURN_IF_ERROR(generate::CheckFinite(logits_, decoder_->n_past() - 1));
  DPL_ASSIGN_OR_RETURN(const int32_t first, decoder_->BeginSampling(params, prompt_));
  pending_ = true;
  return first;
}

absl::Status CudaEngine::Step(absl::Span<const int> slots, absl::Span<int32_t> next) {
  if (slots.size() != next.size()) {
    return absl::InvalidArgumentError(absl::StrCat("Step: ", slots.size(), " slots but ",
                                                   next.size(), " outputs"));
  }
  if (slots.empty()) return absl::OkStatus();
  if (slots.size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat("Step: ", slots.size(), " slots, the GPU engine has one"));
  }
  DPL_RETURN_IF_ERROR(CheckSlot(slots[0]));
  if (!pending_) return absl::FailedPreconditionError("Step: slot 0 has no pending token");
  DPL_ASSIGN_OR_RETURN(next[0], decoder_->NextToken());
  return absl::OkStatus();
}

void CudaEngine::Release(int slot) {
  if (!CheckSlot(slot).ok()) return;
  decoder_->Rewind(0).IgnoreError();  // 0 <= n_past always
  prompt_.clear();
  pending_ = false;
}

}  // namespace dpl::server
