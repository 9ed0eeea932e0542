#include "runtime/server/cpu_engine.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "runtime/generate/generate.h"
#include "runtime/generate/logprobs.h"

namespace dpl::server {

absl::StatusOr<std::unique_ptr<CpuEngine>> CpuEngine::Load(std::shared_ptr<formats::ModelFile> file,
                                                           const CpuEngineOptions& options) {
  if (options.n_slots < 1) {
    return absl::InvalidArgumentError(absl::StrCat("n_slots ", options.n_slots, ": need at least 1"));
  }
  std::unique_ptr<CpuEngine> e(new CpuEngine());
  reference::ReferenceOptions ro;
  ro.threads = options.threads;
  ro.n_ctx = options.n_ctx;
  ro.max_resident_bytes = options.max_resident_bytes / options.n_slots;
  e->slots_.resize(options.n_slots);
  for (int i = 0; i < options.n_slots; ++i) {
    auto model = reference::ReferenceModel::Load(file, ro);
    if (!model.ok()) return Annotate(model.status(), absl::StrCat("slot ", i));
    e->slots_[i].model = *std::move(model);
  }
  e->n_ctx_ = e->slots_[0].model->n_ctx();
  e->n_vocab_ = e->slots_[0].model->n_vocab();
  e->grammars_ = std::make_unique<SlotGrammars>(file, options.n_slots, e->n_vocab_);
  e->file_ = std::move(file);
  return e;
}

absl::Status CpuEngine::CheckSlot(int slot) const {
  if (slot < 0 || slot >= n_slots()) {
    return absl::InvalidArgumentError(absl::StrCat("slot ", slot, " is outside [0, ", n_slots(), ")"));
  }
  return absl::OkStatus();
}

int64_t CpuEngine::n_past(int slot) const {
  return CheckSlot(slot).ok() ? slots_[slot].model->n_past() : 0;
}

absl::StatusOr<std::vector<float>> CpuEngine::Run(Slot& s, int32_t token) {
  const int64_t pos = s.model->n_past();
  if (pos >= n_ctx_) {
    return absl::OutOfRangeError(absl::StrCat("the slot's context of ", n_ctx_, " positions is full"));
  }
  if (token < 0 || token >= n_vocab_) {
    return absl::InvalidArgumentError(
        absl::StrCat("token id ", token, " is outside the vocabulary [0, ", n_vocab_, ")"));
  }
  DPL_ASSIGN_OR_RETURN(std::vector<float> logits, s.model->Forward(token, pos));
  DPL_RETURN_IF_ERROR(generate::CheckFinite(logits, pos));
  return logits;
}

absl::StatusOr<int32_t> CpuEngine::Prefill(int slot, absl::Span<const int32_t> tokens, bool last,
                                           const SamplerParams& params) {
  DPL_RETURN_IF_ERROR(CheckSlot(slot));
  Slot& s = slots_[slot];
  if (tokens.empty()) return absl::InvalidArgumentError("Prefill: no tokens");
  if (s.model->n_past() + static_cast<int64_t>(tokens.size()) > n_ctx_) {
    return absl::OutOfRangeError(absl::StrCat(s.model->n_past() + tokens.size(),
                                              " positions do not fit the slot's context of ", n_ctx_));
  }
  std::vector<float> logits;
  for (int32_t t : tokens) {
    if (s.score_prompt && !s.prev_logits.empty()) {
      DPL_ASSIGN_OR_RETURN(generate::TokenLogprobs lp, generate::ScoreToken(s.prev_logits, t, s.logprobs_top));
      s.recorded.prompt.push_back(std::move(lp));
    }
    DPL_ASSIGN_OR_RETURN(logits, Run(s, t));
    if (s.score_prompt) s.prev_logits = logits;
    s.prompt.push_back(t);
  }
  if (!last) return -1;
  s.sampler = std::make_unique<generate::Sampler>(params, s.bias);
  for (int32_t t : s.prompt) s.sampler->Accept(t);
  DPL_ASSIGN_OR_RETURN(s.pending, SampleNext(slot, logits));
  return s.pending;
}

absl::StatusOr<int32_t> CpuEngine::SampleNext(int slot, absl::Span<const float> logits) {
  Slot& s = slots_[slot];
  absl::Span<const uint32_t> allowed;  // empty: no grammar
  if (grammars_->active(slot)) {
    DPL_ASSIGN_OR_RETURN(allowed, grammars_->Allowed(slot));
  }
  // Scored from what the chain starts from, before this draw joins the
  // penalty's history.
  std::vector<float> penalized;
  if (s.logprobs_top >= 0) {
    const absl::Span<const float> p = s.sampler->Penalized(logits);  // the draw below reuses its buffer
    penalized.assign(p.begin(), p.end());
  }
  int32_t t;
  if (allowed.empty()) {
    t = s.sampler->Sample(logits);
  } else {
    DPL_ASSIGN_OR_RETURN(t, s.sampler->SampleAllowed(logits, allowed));
  }
  if (s.logprobs_top >= 0) {
    DPL_ASSIGN_OR_RETURN(s.recorded.draw, generate::ScoreToken(penalized, t, s.logprobs_top, allowed));
  }
  if (!allowed.empty()) DPL_RETURN_IF_ERROR(grammars_->Accept(slot, t));
  s.sampler->Accept(t);
  return t;
}

absl::Status CpuEngine::SetGrammar(int slot, std::shared_ptr<const grammar::Grammar> grammar) {
  DPL_RETURN_IF_ERROR(CheckSlot(slot));
  return grammars_->Set(slot, std::move(grammar));
}

absl::Status CpuEngine::SetLogitBias(int slot, absl::Span<const LogitBias> bias) {
  DPL_RETURN_IF_ERROR(CheckSlot(slot));
  DPL_RETURN_IF_ERROR(kernels::CheckLogitBias(bias, n_vocab_));
  slots_[slot].bias.assign(bias.begin(), bias.end());
  return absl::OkStatus();
}

void CpuEngine::ClearLogprobs(Slot& s) {
  s.logprobs_top = -1;
  s.score_prompt = false;
  s.prev_logits.clear();
  s.recorded = SlotLogprobs{};
}

absl::Status CpuEngine::SetLogprobs(int slot, int top_n, bool prompt) {
  DPL_RETURN_IF_ERROR(CheckSlot(slot));
  Slot& s = slots_[slot];
  if (top_n > generate::kMaxTopLogprobs) {
    return absl::InvalidArgumentError(
        absl::StrCat("SetLogprobs: top_n ", top_n, " is more than ", generate::kMaxTopLogprobs));
  }
  if (top_n >= 0 && prompt && s.model->n_past() != 0) {
    return absl::FailedPreconditionError(absl::StrCat("SetLogprobs: prompt scoring needs an empty slot; slot ", slot,
                                                      " holds ", s.model->n_past(), " positions"));
  }
  ClearLogprobs(s);
  s.logprobs_top = top_n < 0 ? -1 : top_n;
  s.score_prompt = top_n >= 0 && prompt;
  return absl::OkStatus();
}

absl::StatusOr<SlotLogprobs> CpuEngine::TakeLogprobs(int slot) {
  DPL_RETURN_IF_ERROR(CheckSlot(slot));
  return std::exchange(slots_[slot].recorded, SlotLogprobs{});
}

absl::Status CpuEngine::Step(absl::Span<const int> slots, absl::Span<int32_t> next) {
  if (slots.size() != next.size()) {
    return absl::InvalidArgumentError(absl::StrCat("Step: ", slots.size(), " slots but ",
                                                   next.size(), " outputs"));
  }
  for (size_t i = 0; i < slots.size(); ++i) {
    DPL_RETURN_IF_ERROR(CheckSlot(slots[i]));
    Slot& s = slots_[slots[i]];
    if (s.pending < 0 || s.sampler == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat("Step: slot ", slots[i], " has no pending token"));
    }
    absl::StatusOr<std::vector<float>> logits = Run(s, s.pending);
    if (!logits.ok()) return Annotate(logits.status(), absl::StrCat("slot ", slots[i]));
    absl::StatusOr<int32_t> t = SampleNext(slots[i], *logits);
    if (!t.ok()) return Annotate(t.status(), absl::StrCat("slot ", slots[i]));
    s.pending = *t;
    next[i] = s.pending;
  }
  return absl::OkStatus();
}

absl::Status CpuEngine::KeepPrefix(int slot, absl::Span<const int32_t> kept) {
  DPL_RETURN_IF_ERROR(CheckSlot(slot));
  Slot& s = slots_[slot];
  const int64_t n = static_cast<int64_t>(kept.size());
  if (n > s.model->n_past()) {
    return absl::InvalidArgumentError(absl::StrCat("KeepPrefix: ", n, " positions, the slot holds ",
                                                   s.model->n_past()));
  }
  s.model->Truncate(n);
  s.sampler.reset();
  grammars_->Clear(slot);
  ClearLogprobs(s);
  s.bias.clear();
  s.prompt.assign(kept.begin(), kept.end());
  s.pending = -1;
  return absl::OkStatus();
}

absl::Status CpuEngine::CopyPrefix(int slot, int from, absl::Span<const int32_t> kept) {
  DPL_RETURN_IF_ERROR(CheckSlot(slot));
  DPL_RETURN_IF_ERROR(CheckSlot(from));
  if (from == slot) return absl::InvalidArgumentError(absl::StrCat("CopyPrefix: slot ", slot, " onto itself"));
  Slot& s = slots_[slot];
  DPL_RETURN_IF_ERROR(s.model->CopyPrefix(*slots_[from].model, static_cast<int64_t>(kept.size())));
  s.sampler.reset();
  grammars_->Clear(slot);
  ClearLogprobs(s);
  s.bias.clear();
  s.prompt.assign(kept.begin(), kept.end());
  s.pending = -1;
  return absl::OkStatus();
}

void CpuEngine::Release(int slot) {
  if (!CheckSlot(slot).ok()) return;
  Slot& s = slots_[slot];
  s.model->Reset();
  s.sampler.reset();
  grammars_->Clear(slot);
  ClearLogprobs(s);
  s.bias.clear();
  s.prompt.clear();
  s.pending = -1;
}

}  // namespace dpl::server
