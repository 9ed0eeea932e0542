// The model as the server's scheduler sees it: n_slots() independent
// sequences, each with its own KV cache region of n_ctx() positions, all
// active ones decoded together in ONE step.
//
// Sampling happens inside the engine, and the engine feeds each slot's last
// sampled token back itself, so a GPU engine can sample on the device, keep
// the pending tokens there and launch one captured graph per step: the host
// reads back only the sampled ids. Today's implementation is the CPU
// reference (cpu_engine.h), which loops over the slots; the GPU engine
// (issue 12's batched step: every weight read once per step for all slots)
// implements this same interface.
//
// A slot's life: Prefill(slot, chunk, false) ... Prefill(slot, chunk, true)
// -> first token (or its chunks in PrefillBatch calls beside other slots');
// then Step({..., slot, ...}) -> one token per call; then KeepPrefix(slot,
// ...) for the next request on the slot (its prompt's cached start), or
// CopyPrefix(slot, other, ...) when another slot holds a longer start (a
// shared system prompt), or AdoptPrefix(slot, ...) when the scheduler's
// prefix cache holds a longer one in blocks (a paged engine), or
// Release(slot). Calls come from one thread (the scheduler's), in order: a
// copy sees every call before it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "base/status_macros.h"
#include "kernels/sampling/sampling_util.h"
#include "runtime/generate/logprobs.h"
#include "runtime/grammar/grammar.h"

namespace dpl::server {

using SamplerParams = kernels::SamplingParams;
using LogitBias = kernels::LogitBias;

// The refusal of an engine without structured output (BatchEngine::SetGrammar).
inline absl::Status GrammarUnsupported() {
  return absl::FailedPreconditionError(
      "response_format, grammar and json_schema are not supported by this engine");
}

// The refusal of an engine without logit biases (BatchEngine::SetLogitBias).
inline absl::Status LogitBiasUnsupported() {
  return absl::FailedPreconditionError("logit_bias is not supported by this engine");
}

// The refusal of an engine without logprobs (BatchEngine::SetLogprobs).
inline absl::Status LogprobsUnsupported() {
  return absl::FailedPreconditionError("logprobs, top_logprobs and echo scoring are not supported by this engine");
}

// What a slot recorded since its last BatchEngine::TakeLogprobs.
struct SlotLogprobs {
  // With prompt scoring: one entry per prompt token the slot ran at a
  // position p >= 1, in order: token p under the model's raw logits at p - 1.
  std::vector<generate::TokenLogprobs> prompt;
  // The slot's latest draw (Prefill's first token or Step's): the
  // log-softmax of the logits it was drawn from, after the penalties and the
  // grammar's mask, before temperature and the top-k/top-p/min-p filters.
  std::optional<generate::TokenLogprobs> draw;
};

class BatchEngine {
 public:
  virtual ~BatchEngine() = default;
  virtual int n_slots() const = 0;
  virtual int64_t n_ctx() const = 0;  // positions per slot
  virtual int32_t n_vocab() const = 0;

  // Starts (or continues) a slot's prompt: runs `tokens` into the slot's
  // cache at its next positions. When `last` is true, samples the first
  // generated token with `params` (the slot's whole prompt is the history of
  // the repetition penalty), keeps it pending for the next Step and returns
  // it; otherwise returns -1. The scheduler splits long prompts into chunks so
  // that other slots' decode steps are not stalled for long. Errors: a slot
  // out of range, a token outside the vocabulary, a full cache, non-finite
  // logits.
  virtual absl::StatusOr<int32_t> Prefill(int slot, absl::Span<const int32_t> tokens, bool last,
                                          const SamplerParams& params) = 0;

  // Prompt chunks of several slots (distinct), each as Prefill(part.slot,
  // part.tokens, part.last, *part.params) would run it, first[i] the first
  // token of part i when it is its prompt's last chunk, else -1
  // (first.size() == parts.size()). An engine that can runs them in one
  // forward pass (every weight read once for all of them); this default
  // calls Prefill for each. An error fails every part (a chunk that ran
  // before it stays in its slot's cache).
  struct PrefillPart {
    int slot = 0;
    absl::Span<const int32_t> tokens;
    bool last = false;
    const SamplerParams* params = nullptr;  // with `last`
  };
  virtual absl::Status PrefillBatch(absl::Span<const PrefillPart> parts, absl::Span<int32_t> first) {
    if (parts.size() != first.size()) return absl::InvalidArgumentError("PrefillBatch: one output per part");
    for (size_t i = 0; i < parts.size(); ++i) {
      static const SamplerParams kNone;
      absl::StatusOr<int32_t> t = Prefill(parts[i].slot, parts[i].tokens, parts[i].last,
                                          parts[i].params != nullptr ? *parts[i].params : kNone);
      if (!t.ok()) return t.status();
      first[i] = *t;
    }
    return absl::OkStatus();
  }

  // One scheduler iteration: the prompt `parts` (as PrefillBatch, first[i]
  // for part i) and a decode step for `slots` (as Step, next[i] for slot i;
  // slots already decoding, none of them a part's). Either may be empty. An
  // engine that can runs both in one forward pass (the decode rows ride
  // along the prompt rows); this default runs PrefillBatch, then Step. An
  // error fails both.
  virtual absl::Status StepWithPrefill(absl::Span<const PrefillPart> parts, absl::Span<int32_t> first,
                                       absl::Span<const int> slots, absl::Span<int32_t> next) {
    if (!parts.empty()) DPL_RETURN_IF_ERROR(PrefillBatch(parts, first));
    if (!slots.empty()) return Step(slots, next);
    return absl::OkStatus();
  }

  // One decode step for `slots` (distinct; each has a sampled token pending
  // and a free position): runs every slot's pending token, samples the next
  // one with the slot's params and writes it to next[i] (next.size() ==
  // slots.size()), where it stays pending. An error fails the whole step.
  virtual absl::Status Step(absl::Span<const int> slots, absl::Span<int32_t> next) = 0;

  // Positions the slot's cache holds (prompt plus the tokens Step has run).
  virtual int64_t n_past(int slot) const = 0;

  // The slot's cache keeps its first kept.size() positions and drops the
  // rest, and has no token pending: the next Prefill continues at
  // kept.size(). `kept` are the tokens the caller ran at those positions (its
  // record; the engine takes them as the start of the repetition penalty's
  // history, as if Prefill had run them). Errors: a slot out of range,
  // kept.size() > n_past(slot).
  virtual absl::Status KeepPrefix(int slot, absl::Span<const int32_t> kept) = 0;

  // The slot's cache becomes the first kept.size() positions of slot
  // `from`'s, which is left as it is (it may be running), with no token
  // pending, as KeepPrefix leaves it: a copy of keys and values instead of
  // recomputing a start that another slot holds. `kept` are the tokens
  // `from` ran there. Errors: a slot out of range, from == slot,
  // kept.size() > n_past(from).
  virtual absl::Status CopyPrefix(int slot, int from, absl::Span<const int32_t> kept) = 0;

  // The slot's cache becomes empty; its next Prefill starts a new sequence.
  virtual void Release(int slot) = 0;

  // Paged KV (issue 30): the blocks of the scheduler's pool
  // (SchedulerOptions::kv_block_size positions each, ids below
  // kv_pool_blocks) that hold the slot's positions, block i positions
  // [i * block_size, (i + 1) * block_size). Called whenever the slot's table
  // changes, before the engine call that writes the new positions, and
  // after KeepPrefix / CopyPrefix (a kept or copied start's full blocks may
  // be another slot's, shared: never written again; a partial last block is
  // always the slot's own). An engine that keeps each slot's KV in a region
  // of its own (the CPU engine; the CUDA engine without kv_block) ignores
  // it: this default does.
  virtual void SetBlockTable(int slot, absl::Span<const int> blocks) {
    (void)slot;
    (void)blocks;
  }
  // An engine whose cache is a pool of blocks (the CUDA engine with
  // CudaDecoderOptions::kv_block): its size and block, which the
  // scheduler's pool then is (SchedulerOptions' pool ignored). 0: the
  // engine keeps regions; the scheduler sizes its pool from its options.
  virtual int kv_pool_blocks() const { return 0; }
  virtual int kv_block_size() const { return 0; }

  // The scheduler's prefix cache (issue 30): full blocks that a request
  // wrote stay in the pool after its slot is reused, and a later prompt
  // that starts with their tokens takes them instead of running them. The
  // slot's cache becomes kept.size() positions (whole blocks) whose keys
  // and values are already in the first kept.size() / kv_block_size()
  // blocks of its table (written by any slot, maybe long ago), with no
  // token pending, as KeepPrefix leaves it (grammar, biases and logprobs
  // cleared). `kept` are the tokens at those positions (the repetition
  // penalty's history). The scheduler calls it on an emptied slot
  // (KeepPrefix(slot, {})) after SetBlockTable(slot, table); only where
  // supports_block_adoption() and kv_pool_blocks() > 0 (the CUDA engine
  // with a paged cache). An engine that keeps a region per slot cannot:
  // this default refuses (FailedPrecondition).
  virtual bool supports_block_adoption() const { return false; }
  virtual absl::Status AdoptPrefix(int slot, absl::Span<const int32_t> kept) {
    (void)kept;
    return absl::FailedPreconditionError(
        absl::StrCat("slot ", slot, ": this engine cannot adopt cached KV blocks (its cache is not paged)"));
  }

  // Structured output (response_format, grammar, json_schema): the tokens
  // the slot samples from its next Prefill's first token on, for the
  // request it now serves, are those `grammar` allows (a matcher per slot,
  // a token mask per draw; end-of-generation only once the grammar is
  // complete). Called after KeepPrefix / CopyPrefix, before the prompt's
  // last chunk; null clears it. KeepPrefix, CopyPrefix and Release clear
  // it too (the request ended). supports_grammar() says whether the engine
  // can (the CPU and CUDA engines: SlotGrammars); this default cannot and
  // refuses a grammar with FailedPrecondition.
  virtual bool supports_grammar() const { return false; }
  virtual absl::Status SetGrammar(int slot, std::shared_ptr<const grammar::Grammar> grammar) {
    (void)slot;
    return grammar == nullptr ? absl::OkStatus() : GrammarUnsupported();
  }

  // OpenAI's logit_bias: each draw of the slot, from its next Prefill's
  // first token on, for the request it now serves, adds each entry's bias
  // to its token's logit before the penalties and every filter (-inf: never
  // drawn). `bias` must pass kernels::CheckLogitBias (at most kMaxLogitBias
  // distinct tokens in the vocabulary; InvalidArgument otherwise); empty
  // clears it. Called where SetGrammar is; KeepPrefix, CopyPrefix and
  // Release clear it. supports_logit_bias() says whether the engine can
  // (the CPU and CUDA engines); this default cannot and refuses a list
  // with FailedPrecondition.
  virtual bool supports_logit_bias() const { return false; }
  virtual absl::Status SetLogitBias(int slot, absl::Span<const LogitBias> bias) {
    (void)slot;
    return bias.empty() ? absl::OkStatus() : LogitBiasUnsupported();
  }

  // Logprobs (the API's logprobs / top_logprobs, and echo's prompt
  // scoring): for the request the slot now serves, from its next Prefill on,
  // each draw records its token's logprob and the top_n (0..
  // generate::kMaxTopLogprobs) most probable; with `prompt`, each prompt
  // token run at a position p >= 1 records its own from position p - 1's
  // logits (so a scored prompt must not start from a kept cache, whose
  // logits are gone: the scheduler runs it whole). top_n < 0 turns it off.
  // Called where SetGrammar is; KeepPrefix, CopyPrefix and Release turn it
  // off. TakeLogprobs returns what was recorded since the last take and
  // forgets it (the scheduler takes after every engine call that ran the
  // slot). supports_logprobs() says whether the engine can (the CPU and
  // CUDA engines); this default cannot and refuses with FailedPrecondition.
  virtual bool supports_logprobs() const { return false; }
  virtual absl::Status SetLogprobs(int slot, int top_n, bool prompt) {
    (void)slot;
    (void)prompt;
    return top_n < 0 ? absl::OkStatus() : LogprobsUnsupported();
  }
  virtual absl::StatusOr<SlotLogprobs> TakeLogprobs(int slot) {
    (void)slot;
    return SlotLogprobs{};
  }
};

}  // namespace dpl::server
