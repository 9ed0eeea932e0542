#include "runtime/server/cuda_engine.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "runtime/generate/generate.h"
#include "runtime/generate/logprobs.h"

namespace dpl::server {

absl::StatusOr<std::unique_ptr<CudaEngine>> CudaEngine::Load(
    const std::string& path, const runtime::CudaDecoderOptions& options) {
  DPL_ASSIGN_OR_RETURN(std::unique_ptr<runtime::CudaDecoder> d,
                       runtime::CudaDecoder::Create(path, options));
  return std::unique_ptr<CudaEngine>(new CudaEngine(std::move(d)));
}

CudaEngine::CudaEngine(std::unique_ptr<runtime::CudaDecoder> d)
    : decoder_(std::move(d)),
      prompts_(decoder_->n_seq()),
      grammars_(decoder_->file(), decoder_->n_seq(), decoder_->n_vocab()),
      biased_(decoder_->n_seq(), false),
      scoring_(decoder_->n_seq()),
      table_error_(decoder_->n_seq()) {}

void CudaEngine::SetBlockTable(int slot, absl::Span<const int> blocks) {
  if (!decoder_->paged() || !CheckSlot(slot).ok()) return;
  // A refused table (a scheduler bug) must not leave the slot running on
  // its old blocks, which the pool may have handed to another slot: its
  // next pass fails with the reason instead.
  table_error_[slot] = Annotate(decoder_->SetBlockTable(slot, blocks), absl::StrCat("slot ", slot));
}

absl::Status CudaEngine::CheckTable(int slot) const {
  DPL_RETURN_IF_ERROR(CheckSlot(slot));
  return table_error_[slot];
}

absl::Status CudaEngine::SetGrammar(int slot, std::shared_ptr<const grammar::Grammar> grammar) {
  DPL_RETURN_IF_ERROR(CheckSlot(slot));
  if (grammar == nullptr) return DropGrammar(slot);
  return grammars_.Set(slot, std::move(grammar));
}

absl::Status CudaEngine::SetLogitBias(int slot, absl::Span<const LogitBias> bias) {
  DPL_RETURN_IF_ERROR(CheckSlot(slot));
  if (bias.empty()) {
    if (biased_[slot]) DPL_RETURN_IF_ERROR(decoder_->ClearLogitBias(slot));
  } else {
    DPL_RETURN_IF_ERROR(decoder_->SetLogitBias(slot, bias));  // checks the list
  }
  biased_[slot] = !bias.empty();
  return absl::OkStatus();
}

absl::Status CudaEngine::SetLogprobs(int slot, int top_n, bool prompt) {
  DPL_RETURN_IF_ERROR(CheckSlot(slot));
  if (top_n > generate::kMaxTopLogprobs) {
    return absl::InvalidArgumentError(
        absl::StrCat("SetLogprobs: top_n ", top_n, " is more than ", generate::kMaxTopLogprobs));
  }
  if (top_n >= 0 && prompt && decoder_->n_past(slot) != 0) {
    return absl::FailedPreconditionError(absl::StrCat("SetLogprobs: prompt scoring needs an empty slot; slot ", slot,
                                                      " holds ", decoder_->n_past(slot), " positions"));
  }
  DPL_RETURN_IF_ERROR(decoder_->KeepDrawLogits(slot, top_n >= 0));
  Scoring& sc = scoring_[slot];
  sc = Scoring{};
  sc.top = top_n < 0 ? -1 : top_n;
  sc.prompt = top_n >= 0 && prompt;
  return absl::OkStatus();
}

absl::StatusOr<SlotLogprobs> CudaEngine::TakeLogprobs(int slot) {
  DPL_RETURN_IF_ERROR(CheckSlot(slot));
  return std::exchange(scoring_[slot].recorded, SlotLogprobs{});
}

absl::Status CudaEngine::StopScoring(int slot) {
  if (scoring_[slot].top < 0) return absl::OkStatus();
  scoring_[slot] = Scoring{};
  return decoder_->KeepDrawLogits(slot, false);
}

absl::Status CudaEngine::RunScored(int slot, absl::Span<const int32_t> tokens, std::vector<float>* last) {
  Scoring& sc = scoring_[slot];
  const size_t V = static_cast<size_t>(n_vocab());
  std::vector<float> all;
  for (size_t at = 0; at < tokens.size(); at += kScoreRows) {
    const absl::Span<const int32_t> part = tokens.subspan(at, std::min(kScoreRows, tokens.size() - at));
    const int64_t pos0 = decoder_->n_past(slot);
    // EvalSeq checks the ids and the room left in the slot's context.
    DPL_RETURN_IF_ERROR(decoder_->EvalSeq(slot, part, nullptr, &all));
    const absl::Span<const float> rows(all);
    for (size_t j = 0; j < part.size(); ++j) {
      // Token j under the logits before it: the previous pass's last row for the first.
      const absl::Span<const float> before = j > 0 ? rows.subspan((j - 1) * V, V) : absl::MakeConstSpan(sc.prev);
      if (!before.empty()) {
        DPL_ASSIGN_OR_RETURN(generate::TokenLogprobs lp, generate::ScoreToken(before, part[j], sc.top));
        sc.recorded.prompt.push_back(std::move(lp));
      }
      DPL_RETURN_IF_ERROR(generate::CheckFinite(rows.subspan(j * V, V), pos0 + static_cast<int64_t>(j)));
    }
    sc.prev.assign(all.end() - static_cast<std::ptrdiff_t>(V), all.end());
  }
  if (last != nullptr) *last = sc.prev;
  return absl::OkStatus();
}

absl::Status CudaEngine::ScoreDraws(absl::Span<const int> slots, absl::Span<const int32_t> tokens) {
  for (size_t i = 0; i < slots.size(); ++i) {
    Scoring& sc = scoring_[slots[i]];
    if (sc.top < 0) continue;
    absl::StatusOr<absl::Span<const float>> logits = decoder_->DrawLogits(slots[i]);
    if (!logits.ok()) return Annotate(logits.status(), absl::StrCat("slot ", slots[i], ": logprobs"));
    absl::StatusOr<generate::TokenLogprobs> lp = generate::ScoreToken(*logits, tokens[i], sc.top);
    if (!lp.ok()) return Annotate(lp.status(), absl::StrCat("slot ", slots[i], ": logprobs"));
    sc.recorded.draw = *std::move(lp);
  }
  return absl::OkStatus();
}

absl::Status CudaEngine::EndRequest(int slot) {
  DPL_RETURN_IF_ERROR(StopScoring(slot));
  if (biased_[slot]) {
    DPL_RETURN_IF_ERROR(decoder_->ClearLogitBias(slot));
    biased_[slot] = false;
  }
  return DropGrammar(slot);
}

absl::Status CudaEngine::DropGrammar(int slot) {
  if (!grammars_.active(slot)) return absl::OkStatus();
  grammars_.Clear(slot);
  return decoder_->ClearAllowedTokens(slot);
}

absl::Status CudaEngine::MaskDraws(absl::Span<const int> slots) {
  for (int slot : slots) {
    DPL_RETURN_IF_ERROR(CheckTable(slot));
    if (!grammars_.active(slot)) continue;
    absl::StatusOr<absl::Span<const uint32_t>> allowed = grammars_.Allowed(slot);
    if (!allowed.ok()) return Annotate(allowed.status(), absl::StrCat("slot ", slot));
    DPL_RETURN_IF_ERROR(decoder_->SetAllowedTokens(slot, *allowed));
  }
  return absl::OkStatus();
}

absl::Status CudaEngine::AcceptDraws(absl::Span<const int> slots, absl::Span<const int32_t> tokens) {
  for (size_t i = 0; i < slots.size(); ++i) {
    if (!grammars_.active(slots[i])) continue;
    absl::Status st = grammars_.Accept(slots[i], tokens[i]);
    if (!st.ok()) return Annotate(st, absl::StrCat("slot ", slots[i], ": the device drew a token the grammar refuses"));
  }
  return absl::OkStatus();
}

absl::Status CudaEngine::CheckSlot(int slot) const {
  if (slot < 0 || slot >= n_slots()) {
    return absl::InvalidArgumentError(
        absl::StrCat("slot ", slot, " is outside [0, ", n_slots(), ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<int32_t> CudaEngine::Prefill(int slot, absl::Span<const int32_t> tokens, bool last,
                                            const SamplerParams& params) {
  DPL_RETURN_IF_ERROR(CheckTable(slot));
  if (tokens.empty()) return absl::InvalidArgumentError("Prefill: no tokens");
  if (scores_prompt(slot)) {
    DPL_RETURN_IF_ERROR(RunScored(slot, tokens, last ? &logits_ : nullptr));
  } else {
    // EvalSeq checks the ids and the room left in the slot's context.
    DPL_RETURN_IF_ERROR(decoder_->EvalSeq(slot, tokens, last ? &logits_ : nullptr, nullptr));
  }
  std::vector<int32_t>& prompt = prompts_[slot];
  prompt.insert(prompt.end(), tokens.begin(), tokens.end());
  if (!last) return -1;
  return BeginSampling(slot, logits_, params);
}

absl::StatusOr<int32_t> CudaEngine::BeginSampling(int slot, absl::Span<const float> logits,
                                                  const SamplerParams& params) {
  DPL_RETURN_IF_ERROR(generate::CheckFinite(logits, decoder_->n_past(slot) - 1));
  const int one[1] = {slot};
  DPL_RETURN_IF_ERROR(MaskDraws(one));
  DPL_ASSIGN_OR_RETURN(const int32_t t, decoder_->BeginSampling(slot, params, prompts_[slot]));
  const int32_t got[1] = {t};
  DPL_RETURN_IF_ERROR(ScoreDraws(one, got));
  DPL_RETURN_IF_ERROR(AcceptDraws(one, got));
  return t;
}

absl::Status CudaEngine::CheckParts(absl::Span<const PrefillPart> parts, absl::Span<int32_t> first) const {
  if (parts.size() != first.size()) return absl::InvalidArgumentError("prompt parts: one output per part");
  for (const PrefillPart& p : parts) {
    DPL_RETURN_IF_ERROR(CheckTable(p.slot));
    if (p.last && p.params == nullptr) return absl::InvalidArgumentError("prompt parts: a last chunk without params");
  }
  return absl::OkStatus();
}

absl::Status CudaEngine::PrefillBatch(absl::Span<const PrefillPart> parts, absl::Span<int32_t> first) {
  DPL_RETURN_IF_ERROR(CheckParts(parts, first));
  // Passes of consecutive parts, each at most max_batch tokens (a longer
  // part alone: EvalSeq splits it); a scored prompt's part alone (RunScored).
  for (size_t at = 0; at < parts.size();) {
    if (scores_prompt(parts[at].slot)) {
      DPL_RETURN_IF_ERROR(RunScored(parts[at].slot, parts[at].tokens, parts[at].last ? &logits_ : nullptr));
      DPL_RETURN_IF_ERROR(AfterParts(parts.subspan(at, 1), first.subspan(at, 1)));
      ++at;
      continue;
    }
    size_t end = at, tokens = 0;
    std::vector<runtime::CudaDecoder::SeqChunk> chunks;
    bool any_last = false;
    while (end < parts.size() && !scores_prompt(parts[end].slot) &&
           (end == at || tokens + parts[end].tokens.size() <= static_cast<size_t>(decoder_->max_batch()))) {
      tokens += parts[end].tokens.size();
      chunks.push_back({parts[end].slot, parts[end].tokens});
      any_last = any_last || parts[end].last;
      ++end;
    }
    DPL_RETURN_IF_ERROR(decoder_->EvalSeqs(chunks, any_last ? &logits_ : nullptr));
    DPL_RETURN_IF_ERROR(AfterParts(parts.subspan(at, end - at), first.subspan(at, end - at)));
    at = end;
  }
  return absl::OkStatus();
}

absl::Status CudaEngine::AfterParts(absl::Span<const PrefillPart> parts, absl::Span<int32_t> first) {
  const size_t V = static_cast<size_t>(n_vocab());
  for (size_t i = 0; i < parts.size(); ++i) {
    std::vector<int32_t>& prompt = prompts_[parts[i].slot];
    prompt.insert(prompt.end(), parts[i].tokens.begin(), parts[i].tokens.end());
    first[i] = -1;
  }
  for (size_t i = 0; i < parts.size(); ++i) {
    if (!parts[i].last) continue;
    DPL_ASSIGN_OR_RETURN(first[i], BeginSampling(parts[i].slot, absl::MakeConstSpan(logits_).subspan(i * V, V),
                                                 *parts[i].params));
  }
  return absl::OkStatus();
}

absl::Status CudaEngine::StepWithPrefill(absl::Span<const PrefillPart> parts, absl::Span<int32_t> first,
                                         absl::Span<const int> slots, absl::Span<int32_t> next) {
  size_t rows = slots.size();
  bool scored = false;  // a scored prompt's part runs alone (PrefillBatch)
  for (const PrefillPart& p : parts) {
    rows += p.tokens.size();
    scored = scored || (CheckSlot(p.slot).ok() && scores_prompt(p.slot));
  }
  if (parts.empty() || slots.empty() || scored || rows > static_cast<size_t>(decoder_->max_batch())) {
    return BatchEngine::StepWithPrefill(parts, first, slots, next);
  }
  DPL_RETURN_IF_ERROR(CheckParts(parts, first));  // StepWithChunks checks the slots and next
  std::vector<runtime::CudaDecoder::SeqChunk> chunks;
  bool any_last = false;
  for (const PrefillPart& p : parts) {
    chunks.push_back({p.slot, p.tokens});
    any_last = any_last || p.last;
  }
  DPL_RETURN_IF_ERROR(MaskDraws(slots));
  DPL_RETURN_IF_ERROR(decoder_->StepWithChunks(slots, next, chunks, any_last ? &logits_ : nullptr));
  DPL_RETURN_IF_ERROR(ScoreDraws(slots, next));
  DPL_RETURN_IF_ERROR(AcceptDraws(slots, next));
  return AfterParts(parts, first);
}

absl::Status CudaEngine::Step(absl::Span<const int> slots, absl::Span<int32_t> next) {
  if (slots.size() != next.size()) {
    return absl::InvalidArgumentError(absl::StrCat("Step: ", slots.size(), " slots but ",
                                                   next.size(), " outputs"));
  }
  if (slots.empty()) return absl::OkStatus();
  // StepSeqs checks the slots: in range, distinct, each with a pending token
  // and a free position.
  DPL_RETURN_IF_ERROR(MaskDraws(slots));
  DPL_RETURN_IF_ERROR(decoder_->StepSeqs(slots, next));
  DPL_RETURN_IF_ERROR(ScoreDraws(slots, next));
  return AcceptDraws(slots, next);
}

int64_t CudaEngine::n_past(int slot) const {
  return CheckSlot(slot).ok() ? decoder_->n_past(slot) : 0;
}

absl::Status CudaEngine::KeepPrefix(int slot, absl::Span<const int32_t> kept) {
  DPL_RETURN_IF_ERROR(CheckSlot(slot));
  // RewindSeq checks kept.size() <= n_past and drops the pending token.
  DPL_RETURN_IF_ERROR(decoder_->RewindSeq(slot, static_cast<int64_t>(kept.size())));
  prompts_[slot].assign(kept.begin(), kept.end());
  return EndRequest(slot);
}

absl::Status CudaEngine::CopyPrefix(int slot, int from, absl::Span<const int32_t> kept) {
  DPL_RETURN_IF_ERROR(CheckSlot(slot));
  DPL_RETURN_IF_ERROR(CheckSlot(from));
  // CopySeqPrefix checks from != slot and kept.size() <= n_past(from).
  DPL_RETURN_IF_ERROR(decoder_->CopySeqPrefix(slot, from, static_cast<int64_t>(kept.size())));
  prompts_[slot].assign(kept.begin(), kept.end());
  return EndRequest(slot);
}

absl::Status CudaEngine::AdoptPrefix(int slot, absl::Span<const int32_t> kept) {
  if (!decoder_->paged()) return BatchEngine::AdoptPrefix(slot, kept);
  // The table holding the adopted blocks must have been taken.
  DPL_RETURN_IF_ERROR(CheckTable(slot));
  DPL_RETURN_IF_ERROR(Annotate(decoder_->AdoptSeqPrefix(slot, static_cast<int64_t>(kept.size())),
                               absl::StrCat("slot ", slot)));
  prompts_[slot].assign(kept.begin(), kept.end());
  return EndRequest(slot);
}

void CudaEngine::Release(int slot) {
  if (!CheckSlot(slot).ok()) return;
  decoder_->RewindSeq(slot, 0).IgnoreError();  // 0 <= n_past always
  prompts_[slot].clear();
  EndRequest(slot).IgnoreError();  // a failed device call fails the next step too
}

}  // namespace dpl::server
