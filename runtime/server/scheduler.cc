#include "runtime/server/scheduler.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"

namespace dpl::server {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// How many of the prompt's first tokens `held` (a slot's cache) holds, at
// most all but the prompt's last token (that one runs for the first logits).
size_t SharedStart(const std::vector<int32_t>& held, const std::vector<int32_t>& prompt) {
  const size_t limit = std::min(held.size(), prompt.size() - 1);
  size_t n = 0;
  while (n < limit && held[n] == prompt[n]) ++n;
  return n;
}

}  // namespace

void Histogram::Observe(double v) {
  ++counts[static_cast<size_t>(std::lower_bound(bounds.begin(), bounds.end(), v) - bounds.begin())];
  sum += v;
  ++count;
}

const char* FinishReasonName(FinishReason reason) {
  return reason == FinishReason::kLength ? "length" : reason == FinishReason::kToolCalls ? "tool_calls" : "stop";
}

std::vector<StreamEvent> RequestStream::Wait(absl::Duration timeout) {
  std::vector<StreamEvent> out;
  mu_.LockWhenWithTimeout(absl::Condition(this, &RequestStream::HasEvents), timeout);
  while (!events_.empty()) {
    out.push_back(std::move(events_.front()));
    events_.pop_front();
  }
  mu_.Unlock();
  return out;
}

void RequestStream::Push(StreamEvent e) {
  absl::MutexLock lock(&mu_);
  events_.push_back(std::move(e));
}

// A request that holds a slot (engine thread only).
struct Scheduler::Active {
  GenerationRequest request;
  std::shared_ptr<RequestStream> stream;
  int slot = -1;
  uint64_t group = 0;       // Queued::group
  int sample = 0;           // Queued::sample
  size_t prefilled = 0;     // prompt tokens in the slot's cache
  size_t cached = 0;        // of them, found in a cache (its slot's, kept, or another's, copied)
  bool started = false;     // Start made the slot's cache the prompt's first `cached` tokens
  bool decoding = false;    // the prompt is in; a sampled token is pending
  std::vector<int32_t> sampled;  // every token sampled (the slot's cache runs all but the last)
  std::vector<generate::TokenLogprobs> prompt_logprobs;  // scored so far (prompt_logprobs)
  int64_t completion = 0;   // tokens generated (stop tokens excluded)
  TextStream text;
  bool done = false;
  std::chrono::steady_clock::time_point submitted, first_token;
  // Preemption (KV blocks): requeue, set with done, sends it back to the
  // queue; preempted: it was, at least once; replay: what it runs again (its
  // prompt and every token it sampled) when it had sampled, else empty.
  bool requeue = false;
  bool preempted = false;
  std::vector<int32_t> replay;

  Active(Queued q, int slot_id, const tokenizer::Tokenizer& tok)
      : request(std::move(q.request)), stream(std::move(q.stream)), slot(slot_id), group(q.group),
        sample(q.sample), text(tok, request.stop), submitted(q.submitted) {}

  // Counted in the metrics' prompt tokens: a group's first sample alone,
  // not run again after a preemption.
  bool counts_prompt() const { return sample == 0 && !preempted; }
  // The tokens its prefill runs: the prompt, or after a preemption the
  // prompt and the tokens sampled (the last one's draw is the next token).
  const std::vector<int32_t>& feed() const { return replay.empty() ? request.prompt : replay; }
  // Whether its prefill continues a generation (a preempted request that
  // had sampled): no first-token events, no prompt scoring.
  bool resuming() const { return !replay.empty(); }
  // A grammar's matcher cannot be replayed over sampled tokens.
  bool preemptible() const { return request.grammar == nullptr || sampled.empty(); }
};

Scheduler::Scheduler(BatchEngine& engine, const tokenizer::Tokenizer& tokenizer,
                     SchedulerOptions options)
    : engine_(engine), tokenizer_(tokenizer), options_(options) {
  for (int s = 0; s < engine.n_slots(); ++s) free_slots_.push_back(s);
  slot_tokens_.resize(static_cast<size_t>(engine.n_slots()));
  slot_group_.resize(static_cast<size_t>(engine.n_slots()), 0);
  slot_blocks_.resize(static_cast<size_t>(engine.n_slots()));
  // An engine that pages its cache brings its pool; the scheduler hands
  // out exactly those blocks.
  const bool engine_pool = engine.kv_pool_blocks() > 0;
  const int block_size = engine_pool ? engine.kv_block_size() : std::max(1, options_.kv_block_size);
  const int64_t per_slot = (engine.n_ctx() + block_size - 1) / block_size;
  int64_t blocks = engine_pool                         ? engine.kv_pool_blocks()
                   : options_.kv_pool_positions > 0 ? (options_.kv_pool_positions + block_size - 1) / block_size
                                                    : per_slot * engine.n_slots();
  blocks = std::clamp<int64_t>(blocks, 1, 1 << 30);
  pool_ = *kv::BlockPool::Create(static_cast<int>(blocks), block_size);
  pool_positions_ = blocks * block_size;
  metrics_.kv_positions_total = std::min(static_cast<int64_t>(engine.n_slots()) * engine.n_ctx(), pool_positions_);
  metrics_.kv_block_size = block_size;
  metrics_.kv_blocks_total = blocks;
  // Blocks outlive slots only where the engine can take a cached block as
  // a slot's start: a paged engine whose pool this is. An engine of
  // regions (the CPU engine) keeps each slot's rows in the slot.
  block_cache_ = options_.block_cache && engine_pool && engine.supports_block_adoption();
  slot_cached_.resize(static_cast<size_t>(engine.n_slots()), 0);
  trace_start_ = trace_last_ = std::chrono::steady_clock::now();
  if (options_.trace) *options_.trace << "t_ms\tgap_ms\tengine_ms\tdecode_rows\tprompt_parts\tprompt_tokens\tactive\tqueued\n";
  thread_ = std::thread([this] { Loop(); });
}

Scheduler::~Scheduler() { Shutdown(); }

void Scheduler::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    shutdown_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

std::vector<bool> Scheduler::SlotsBusy() const {
  std::vector<bool> busy(static_cast<size_t>(engine_.n_slots()), true);
  absl::MutexLock lock(&mu_);
  for (int s : free_slots_) busy[static_cast<size_t>(s)] = false;
  return busy;
}

SchedulerMetrics Scheduler::metrics() const {
  absl::MutexLock lock(&mu_);
  SchedulerMetrics m = metrics_;
  m.processing = running_;
  m.deferred = static_cast<int>(std::count_if(queue_.begin(), queue_.end(),
                                              [](const Queued& q) { return !q.stream->cancelled(); }));
  return m;
}

void Scheduler::DropCancelledLocked() {
  for (auto it = queue_.begin(); it != queue_.end();) {
    if (!it->stream->cancelled()) {
      ++it;
      continue;
    }
    StreamEvent e;
    e.final = true;
    e.error = absl::CancelledError("client gone");
    e.prompt_tokens = static_cast<int64_t>((it->resume ? it->resume->request : it->request).prompt.size());
    if (it->resume) e.completion_tokens = it->resume->completion;
    it->stream->Push(std::move(e));
    it = queue_.erase(it);
  }
}

absl::Status Scheduler::Check(GenerationRequest& r) const {
  const int64_t n_ctx = engine_.n_ctx();
  const int64_t n_prompt = static_cast<int64_t>(r.prompt.size());
  if (r.prompt.empty()) return absl::InvalidArgumentError("the prompt is empty");
  for (int32_t id : r.prompt) {
    if (id < 0 || id >= engine_.n_vocab()) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", id, " is outside the vocabulary [0, ",
                                                     engine_.n_vocab(), ")"));
    }
  }
  if (r.grammar != nullptr) {
    if (!engine_.supports_grammar()) return GrammarUnsupported();
    // The grammar allows the end-of-generation tokens once it is complete
    // (and only them once nothing can follow): they end the request, even
    // with ignore_eos.
    for (int32_t id : tokenizer_.end_of_generation_ids()) r.stop_tokens.insert(id);
  }
  if (r.logprobs < -1 || r.logprobs > generate::kMaxTopLogprobs) {
    return absl::InvalidArgumentError(
        absl::StrCat("logprobs ", r.logprobs, " is outside [0, ", generate::kMaxTopLogprobs, "]"));
  }
  if (r.prompt_logprobs && r.logprobs < 0) {
    return absl::InvalidArgumentError("prompt logprobs need logprobs (the number of alternatives, 0 or more)");
  }
  if (r.logprobs >= 0 && !engine_.supports_logprobs()) return LogprobsUnsupported();
  if (!r.logit_bias.empty()) {
    // The API checks what it can without the model (ids, ranges, count);
    // the vocabulary is known here.
    if (!engine_.supports_logit_bias()) return LogitBiasUnsupported();
    for (const LogitBias& b : r.logit_bias) {
      if (b.token < 0 || b.token >= engine_.n_vocab()) {
        return absl::InvalidArgumentError(absl::StrCat("'logit_bias' token id ", b.token,
                                                       " is outside the vocabulary [0, ", engine_.n_vocab(), ")"));
      }
    }
    const absl::Status usable = kernels::CheckLogitBias(r.logit_bias, engine_.n_vocab());
    if (!usable.ok()) return absl::InvalidArgumentError(absl::StrCat("'logit_bias': ", usable.message()));
  }
  if (r.max_tokens < -1) {
    return absl::InvalidArgumentError(absl::StrCat("max_tokens ", r.max_tokens, " is negative"));
  }
  if (n_prompt > n_ctx) {
    return absl::OutOfRangeError(absl::StrCat("the prompt (", n_prompt,
                                              " tokens) is longer than the context of a slot (",
                                              n_ctx, " tokens; -c sets it)"));
  }
  if (r.max_tokens > 0 && n_prompt + r.max_tokens > n_ctx) {
    return absl::OutOfRangeError(absl::StrCat(
        "the prompt (", n_prompt, " tokens) and max_tokens (", r.max_tokens, ") need ",
        n_prompt + r.max_tokens, " positions; the context of a slot has ", n_ctx, " (-c sets it)"));
  }
  // The KV pool (when smaller than the slots' contexts): a request that it
  // could never hold, even alone.
  const int64_t need = n_prompt + std::max<int64_t>(r.max_tokens, 0);
  if (need > pool_positions_) {
    return absl::OutOfRangeError(absl::StrCat("the prompt (", n_prompt, " tokens)",
                                              r.max_tokens > 0 ? absl::StrCat(" and max_tokens (", r.max_tokens, ")") : "",
                                              " need ", need, " positions; the KV pool has ", pool_positions_));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<RequestStream>> Scheduler::Submit(GenerationRequest r) {
  std::vector<GenerationRequest> one;
  one.push_back(std::move(r));
  DPL_ASSIGN_OR_RETURN(std::vector<std::shared_ptr<RequestStream>> streams, SubmitSamples(std::move(one)));
  return std::move(streams.front());
}

absl::StatusOr<std::vector<std::shared_ptr<RequestStream>>> Scheduler::SubmitSamples(
    std::vector<GenerationRequest> samples) {
  if (samples.empty()) return absl::InvalidArgumentError("no samples");
  for (size_t j = 0; j < samples.size(); ++j) {
    if (j > 0 && samples[j].prompt != samples[0].prompt) {
      return absl::InvalidArgumentError(absl::StrCat("sample ", j, "'s prompt is not sample 0's"));
    }
    DPL_RETURN_IF_ERROR(Check(samples[j]));
  }
  const int64_t k = static_cast<int64_t>(samples.size());
  std::vector<std::shared_ptr<RequestStream>> streams;
  absl::MutexLock lock(&mu_);
  if (shutdown_) return absl::UnavailableError("the server is shutting down");
  DropCancelledLocked();  // a client gone while queued gives its place up at once
  // Requests the free slots do not take wait; at most max_queue of them. A
  // group of samples that finds nothing waiting goes in whole (it runs as
  // slots free up: an idle server takes any n).
  if (static_cast<int64_t>(queue_.size()) + k > static_cast<int64_t>(free_slots_.size()) + options_.max_queue &&
      !(k > 1 && queue_.empty())) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the server is busy: all ", engine_.n_slots(), " slots are in use and ", options_.max_queue,
        " requests are waiting (-np and --queue set these)", k > 1 ? absl::StrCat("; this request needs ", k) : ""));
  }
  const uint64_t group = k > 1 ? ++groups_ : 0;
  const auto now = std::chrono::steady_clock::now();
  for (size_t j = 0; j < samples.size(); ++j) {
    streams.push_back(std::make_shared<RequestStream>());
    queue_.push_back({std::move(samples[j]), streams.back(), now, group, static_cast<int>(j)});
  }
  metrics_.requests_total += k;
  return streams;
}

bool Scheduler::Admit(std::vector<std::unique_ptr<Active>>& active) {
  auto has_work = [this, &active]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return shutdown_ || !active.empty() || (!queue_.empty() && !free_slots_.empty());
  };
  absl::MutexLock lock(&mu_);
  // Wakes on Submit and Shutdown (their mutations of the guarded state);
  // the timeout is only a safety net.
  mu_.AwaitWithTimeout(absl::Condition(&has_work), absl::Seconds(1));
  if (shutdown_) return false;
  DropCancelledLocked();
  // KV blocks the admitted may take: the pool's, and the free slots' caches,
  // which Iterate may take back.
  int64_t room = pool_->num_available();
  for (int s : free_slots_) room += static_cast<int64_t>(slot_blocks_[static_cast<size_t>(s)].size());
  while (!queue_.empty() && !free_slots_.empty()) {
    Queued& q = queue_.front();
    const GenerationRequest& req = q.resume ? q.resume->request : q.request;
    // The free slot whose whole cache is the longest start of the prompt
    // (the next turn of a chat: nothing of that cache is lost), else the one
    // free longest. Start() then takes the prompt's longest cached start
    // from any slot.
    const std::vector<int32_t>& prompt = q.resume ? q.resume->feed() : req.prompt;
    // KV blocks: the pool must have room for the prompt and its first
    // generated token (capped at a slot's context and the pool) besides
    // what the requests admitted before it take; else it waits, and so do
    // the requests behind it (FIFO).
    {
      const int64_t need = std::min<int64_t>({BlocksFor(static_cast<int64_t>(prompt.size()) + 1),
                                              BlocksFor(engine_.n_ctx()), pool_->num_blocks()});
      if (need > room) break;
      room -= need;
    }
    size_t best = 0, best_len = 0;
    if (req.cache_prompt) {
      for (size_t i = 0; i < free_slots_.size(); ++i) {
        const std::vector<int32_t>& held = slot_tokens_[static_cast<size_t>(free_slots_[i])];
        const size_t n = SharedStart(held, prompt);
        if (n > best_len && n + 1 >= held.size()) {
          best = i;
          best_len = n;
        }
      }
    }
    const int slot = free_slots_[best];
    free_slots_.erase(free_slots_.begin() + static_cast<std::ptrdiff_t>(best));
    std::unique_ptr<Active> a;
    if (q.resume) {
      // A preempted request: back where its submission time puts it among
      // the running (older than those admitted after it), to run its
      // prompt and tokens again.
      std::shared_ptr<Active> r = std::move(q.resume);
      a = std::make_unique<Active>(std::move(*r));
      a->slot = slot;
      a->done = a->requeue = a->started = a->decoding = false;
      a->prefilled = 0;
      auto at = std::find_if(active.begin(), active.end(),
                             [&a](const std::unique_ptr<Active>& b) { return b->submitted > a->submitted; });
      active.insert(at, std::move(a));
    } else {
      active.push_back(std::make_unique<Active>(std::move(q), slot, tokenizer_));
    }
    queue_.pop_front();
    ++running_;
  }
  return true;
}

void Scheduler::Finish(Active& a, FinishReason reason, absl::Status error) {
  StreamEvent e;
  if (error.ok()) e.text = a.text.Flush();
  e.final = true;
  e.finish = reason;
  e.error = std::move(error);
  e.prompt_tokens = static_cast<int64_t>(a.request.prompt.size());
  e.completion_tokens = a.completion;
  e.cached_tokens = a.started ? static_cast<int64_t>(a.cached) : 0;
  // The slot keeps its cache for the next request: the prompt and the
  // sampled tokens it ran (all but the last, still pending). After an
  // error its contents are not known: emptied. A request that never
  // started left the slot as it was.
  if (a.started) {
    std::vector<int32_t>& kept = slot_tokens_[static_cast<size_t>(a.slot)];
    kept.clear();
    if (e.error.ok()) {
      const size_t n = static_cast<size_t>(engine_.n_past(a.slot));
      kept.assign(a.request.prompt.begin(),
                  a.request.prompt.begin() + static_cast<std::ptrdiff_t>(std::min(n, a.request.prompt.size())));
      for (size_t i = 0; kept.size() < n && i < a.sampled.size(); ++i) kept.push_back(a.sampled[i]);
      if (kept.size() != n) kept.clear();  // not what the slot holds: nothing to match
    }
    if (kept.empty()) {
      DropSlotCache(a.slot);
    } else {
      // The kept cache holds its blocks (free slots' caches are taken back
      // when the pool runs out).
      std::vector<int>& table = slot_blocks_[static_cast<size_t>(a.slot)];
      const size_t keep = static_cast<size_t>(BlocksFor(static_cast<int64_t>(kept.size())));
      if (table.size() > keep) {
        (void)pool_->Release(absl::MakeConstSpan(table).subspan(keep));
        table.resize(keep);
        engine_.SetBlockTable(a.slot, table);
      }
    }
  }
  a.done = true;
  {
    absl::MutexLock lock(&mu_);
    free_slots_.push_back(a.slot);
    --running_;
    metrics_.generated_tokens_total += std::exchange(generated_unflushed_, 0);
    if (e.error.ok()) {
      metrics_.request_latency.Observe(SecondsSince(a.submitted));
      if (a.completion >= 2) {
        metrics_.time_per_output_token.Observe(SecondsSince(a.first_token) / static_cast<double>(a.completion - 1));
      }
    }
  }
  a.stream->Push(std::move(e));  // last: the metrics show the slot free when the client hears
}

std::optional<SlotLogprobs> Scheduler::TakeLogprobs(Active& a) {
  if (a.request.logprobs < 0) return SlotLogprobs{};
  absl::StatusOr<SlotLogprobs> lp = engine_.TakeLogprobs(a.slot);
  if (!lp.ok()) {
    Finish(a, FinishReason::kStop, Annotate(lp.status(), "logprobs"));
    return std::nullopt;
  }
  return *std::move(lp);
}

bool Scheduler::Take(Active& a, int32_t token, std::optional<generate::TokenLogprobs> logprobs) {
  a.sampled.push_back(token);
  if ((!a.request.ignore_eos || a.request.grammar != nullptr) && a.request.stop_tokens.contains(token)) {
    Finish(a, FinishReason::kStop, absl::OkStatus());
    return true;
  }
  ++a.completion;
  ++generated_unflushed_;  // what usage.completion_tokens counts
  bool stopped = false;
  std::string piece = a.text.Push(token, &stopped);
  if (!piece.empty() || logprobs.has_value()) {
    StreamEvent e;
    e.text = std::move(piece);
    if (logprobs.has_value()) e.logprobs.push_back(*std::move(logprobs));
    a.stream->Push(std::move(e));
  }
  if (stopped) {
    Finish(a, FinishReason::kStop, absl::OkStatus());
  } else if ((a.request.max_tokens >= 0 && a.completion >= a.request.max_tokens) ||
             engine_.n_past(a.slot) >= engine_.n_ctx()) {
    // The pending token has no position left to run at: the context is full.
    Finish(a, FinishReason::kLength, absl::OkStatus());
  }
  return a.done;
}

std::pair<int, size_t> Scheduler::LongestStart(const Active& a) const {
  // The prompt's longest start that a slot's cache holds: the slot's own
  // (kept in place), or another's, free or running, when it holds more (a
  // system prompt that another request ran: its keys and values copied).
  // Requests start oldest first, so one admitted together with the request
  // that runs their shared start finds it here. A scored prompt runs whole:
  // a cached start has no logits to score it. Without cache_prompt, a
  // sample of a group takes only what its group ran.
  const std::vector<int32_t>& prompt = a.feed();
  if ((a.request.prompt_logprobs && !a.resuming()) || (!a.request.cache_prompt && a.group == 0)) return {a.slot, 0};
  auto usable = [this, &a](int s) {
    return a.request.cache_prompt || slot_group_[static_cast<size_t>(s)] == a.group;
  };
  int from = a.slot;
  size_t n = usable(a.slot) ? SharedStart(slot_tokens_[static_cast<size_t>(a.slot)], prompt) : 0;
  for (int s = 0; s < static_cast<int>(slot_tokens_.size()); ++s) {
    if (s == a.slot || !usable(s)) continue;
    const size_t m = SharedStart(slot_tokens_[static_cast<size_t>(s)], prompt);
    if (m > n) {
      from = s;
      n = m;
    }
  }
  return {from, n};
}

void Scheduler::Start(Active& a, StartAt start_at) {
  const std::vector<int32_t>& prompt = a.feed();
  std::vector<int32_t>& held = slot_tokens_[static_cast<size_t>(a.slot)];
  const size_t n = start_at.n;
  const int from = start_at.adopted || start_at.from == a.slot ? -1 : start_at.from;
  a.started = true;
  slot_group_[static_cast<size_t>(a.slot)] = a.group;
  const absl::Span<const int32_t> start = absl::MakeConstSpan(prompt).subspan(0, n);
  absl::Status kept;
  if (start_at.adopted) {
    // The rows the slot holds are not the start: it is emptied, takes the
    // table whose first blocks hold the start (ClaimStart's), and is told
    // they do.
    kept = engine_.KeepPrefix(a.slot, {});
    if (kept.ok()) {
      engine_.SetBlockTable(a.slot, slot_blocks_[static_cast<size_t>(a.slot)]);
      kept = engine_.AdoptPrefix(a.slot, start);
    }
  } else {
    kept = from >= 0 ? engine_.CopyPrefix(a.slot, from, start) : engine_.KeepPrefix(a.slot, start);
  }
  // The request's grammar (if any) from its first sampled token on; the
  // start above cleared the previous request's.
  if (kept.ok() && a.request.grammar != nullptr) kept = engine_.SetGrammar(a.slot, a.request.grammar);
  if (kept.ok() && !a.request.logit_bias.empty()) kept = engine_.SetLogitBias(a.slot, a.request.logit_bias);
  if (kept.ok() && a.request.logprobs >= 0) {
    kept = engine_.SetLogprobs(a.slot, a.request.logprobs, a.request.prompt_logprobs && !a.resuming());
  }
  if (kept.ok()) engine_.SetBlockTable(a.slot, slot_blocks_[static_cast<size_t>(a.slot)]);
  held.assign(start.begin(), start.end());
  if (!kept.ok()) {
    held.clear();
    Finish(a, FinishReason::kStop, kept);
    return;
  }
  a.prefilled = n;
  if (a.preempted) return;  // run again: its usage keeps what its first start found cached
  a.cached = n;
  if (!a.counts_prompt()) return;
  absl::MutexLock lock(&mu_);
  metrics_.prompt_tokens_cached_total += static_cast<int64_t>(n);
  if (from >= 0) metrics_.prompt_tokens_copied_total += static_cast<int64_t>(n);
  if (start_at.adopted) metrics_.prompt_tokens_adopted_total += static_cast<int64_t>(n);
}

std::vector<int> Scheduler::CachedChain(const Active& a) const {
  // As LongestStart: a scored prompt runs whole, cache_prompt false takes
  // nothing from the block cache (a sample of a group copies only from its
  // siblings' slots).
  if (!block_cache_ || !a.request.cache_prompt || (a.request.prompt_logprobs && !a.resuming())) return {};
  const std::vector<int32_t>& feed = a.feed();
  // Never the whole prompt: its last token runs for the first logits.
  return pool_->FindPrefix(feed, static_cast<int>((feed.size() - 1) / static_cast<size_t>(pool_->block_size())));
}

void Scheduler::CacheBlocks(int slot) {
  if (!block_cache_) return;
  const std::vector<int32_t>& tokens = slot_tokens_[static_cast<size_t>(slot)];
  const std::vector<int>& table = slot_blocks_[static_cast<size_t>(slot)];
  const size_t bs = static_cast<size_t>(pool_->block_size());
  // Full blocks whose every position the engine has written with a known
  // token: slot_tokens_ is what ran (a pending sampled token joins it only
  // when a step runs it).
  const size_t full = std::min(tokens.size() / bs, table.size());
  size_t& settled = slot_cached_[static_cast<size_t>(slot)];
  if (settled >= full) return;
  // Each block is cached as the child of the cached block holding the
  // tokens before it: the slot's own previous block, or, where that one
  // stayed private because another block caches the same tokens (two
  // requests ran one prompt at once), that other block (looked up again
  // from the first block: a block id kept from an earlier call may have
  // been evicted and reused since).
  size_t i = settled;
  if (i > 0 && !pool_->IsCached(table[i - 1])) i = 0;
  int parent = i > 0 ? table[i - 1] : -1;
  for (; i < full; ++i) {
    const absl::Span<const int32_t> part = absl::MakeConstSpan(tokens).subspan(i * bs, bs);
    // Already cached: a start shared with or adopted from another slot, or
    // registered by this slot before (a kept start).
    if (pool_->Cache(table[i], parent, part) || pool_->IsCached(table[i])) {
      parent = table[i];
      continue;
    }
    parent = pool_->CachedChild(parent, part);
    if (parent < 0) break;  // not reachable (a hash collision): the rest stays private
  }
  settled = full;
}

bool Scheduler::WaitsForSharedStart(const Active& a, absl::Span<const std::unique_ptr<Active>> older) const {
  const std::vector<int32_t>& prompt = a.request.prompt;
  if (a.preempted) return false;  // it runs again at once, from what a cache holds
  if (a.group != 0 && a.sample > 0 && !a.request.prompt_logprobs) {
    // A sample waits until a slot holds its prompt but the last token (the
    // most a start can be), while a sibling before it may still run it.
    if (LongestStart(a).second + 1 >= prompt.size()) return false;
    for (const auto& p : older) {
      if (p->group == a.group && !p->done) return true;
    }
    return false;  // its siblings ended without it: it runs the prompt itself
  }
  if (!a.request.cache_prompt) return false;
  // The longest start a cache holds now: a slot's, or the block cache's.
  size_t held = CachedChain(a).size() * static_cast<size_t>(pool_->block_size());
  for (const std::vector<int32_t>& t : slot_tokens_) held = std::max(held, SharedStart(t, prompt));
  for (const auto& p : older) {
    if (p->decoding || p->done || !p->request.cache_prompt) continue;
    if (SharedStart(p->request.prompt, prompt) >= held + static_cast<size_t>(options_.defer_for_shared_start)) {
      return true;
    }
  }
  return false;
}

int Scheduler::BlocksFor(int64_t positions) const {
  const int64_t bs = pool_->block_size();
  return static_cast<int>((positions + bs - 1) / bs);
}

void Scheduler::DropSlotCache(int slot) {
  std::vector<int>& table = slot_blocks_[static_cast<size_t>(slot)];
  slot_tokens_[static_cast<size_t>(slot)].clear();
  slot_cached_[static_cast<size_t>(slot)] = 0;
  engine_.Release(slot);
  if (table.empty()) return;
  (void)pool_->Release(table);
  table.clear();
  engine_.SetBlockTable(slot, table);
}

bool Scheduler::ReclaimIdle(std::vector<std::unique_ptr<Active>>& active, int keep, int keep2) {
  std::vector<int> idle;
  {
    absl::MutexLock lock(&mu_);
    idle = free_slots_;  // least recently freed first
  }
  for (const auto& a : active) {
    if (!a->done && !a->started) idle.push_back(a->slot);
  }
  for (int s : idle) {
    if (s == keep || s == keep2 || slot_blocks_[static_cast<size_t>(s)].empty()) continue;
    DropSlotCache(s);
    return true;
  }
  return false;
}

void Scheduler::Preempt(Active& a) {
  DropSlotCache(a.slot);
  if (!a.sampled.empty()) {
    a.replay = a.request.prompt;
    a.replay.insert(a.replay.end(), a.sampled.begin(), a.sampled.end());
  } else {
    a.prompt_logprobs.clear();  // its prompt is scored again
  }
  a.preempted = true;
  a.requeue = true;
  a.done = true;  // out of this iteration; Requeue sends it back
  absl::MutexLock lock(&mu_);
  free_slots_.push_back(a.slot);
  --running_;
  ++metrics_.preemptions_total;
}

bool Scheduler::PreemptNewer(std::vector<std::unique_ptr<Active>>& active, size_t i) {
  for (size_t j = active.size(); j-- > i + 1;) {
    Active& v = *active[j];
    if (v.done || slot_blocks_[static_cast<size_t>(v.slot)].empty()) continue;
    if (!v.started) {
      DropSlotCache(v.slot);  // an idle cache, not a preemption
      return true;
    }
    if (!v.preemptible()) continue;
    Preempt(v);
    return true;
  }
  return false;
}

bool Scheduler::Grow(std::vector<std::unique_ptr<Active>>& active, size_t i, int64_t positions) {
  Active& a = *active[i];
  std::vector<int>& table = slot_blocks_[static_cast<size_t>(a.slot)];
  const int need = BlocksFor(positions) - static_cast<int>(table.size());
  if (need <= 0) return true;
  while (need > pool_->num_available()) {
    if (!ReclaimIdle(active, a.slot, -1) && !PreemptNewer(active, i)) return false;
  }
  for (int k = 0; k < need; ++k) table.push_back(*pool_->Allocate());
  engine_.SetBlockTable(a.slot, table);
  return true;
}

bool Scheduler::ClaimStart(std::vector<std::unique_ptr<Active>>& active, size_t i, StartAt& start,
                           size_t budget) {
  Active& a = *active[i];
  std::vector<int>& table = slot_blocks_[static_cast<size_t>(a.slot)];
  const int bs = pool_->block_size();
  // A kept start's partial last block is written from its end on: a copy
  // of it when another slot shares it, or when the block cache holds it (a
  // full block of the previous request, whose cached tokens the writes
  // would contradict).
  auto copies_on_write = [&](size_t n, size_t keep) {
    return n % static_cast<size_t>(bs) != 0 && keep > 0 && keep <= table.size() &&
           (pool_->RefCount(table[keep - 1]) > 1 || pool_->IsCached(table[keep - 1]));
  };
  for (;;) {
    // The longest start: a slot's cache, or the block cache when its chain
    // of whole blocks is longer.
    const auto [from, n] = LongestStart(a);
    const std::vector<int> chain = CachedChain(a);
    const size_t chained = chain.size() * static_cast<size_t>(bs);
    start = chained > n ? StartAt{a.slot, chained, true} : StartAt{from, n, false};
    const int64_t target = static_cast<int64_t>(start.n + std::min(a.feed().size() - start.n, budget));
    // Blocks it takes from those available now (free, or cached without
    // users: evictable), and those its slot gives back (the ones it alone
    // holds; a cached one becomes evictable, available all the same).
    int need = 0, freed = 0;
    if (start.adopted) {
      // The chain's blocks with no users leave the evictable ones.
      need = BlocksFor(target) - static_cast<int>(chain.size());
      for (int b : chain) need += pool_->RefCount(b) == 0;
      for (int b : table) {
        freed += pool_->RefCount(b) == 1 && std::find(chain.begin(), chain.end(), b) == chain.end();
      }
    } else {
      // Kept in place: its first blocks stay (a partial last one copied on
      // write); copied: the other slot's full blocks are shared, the rest
      // new.
      const size_t keep = from == a.slot ? static_cast<size_t>(BlocksFor(static_cast<int64_t>(n)))
                                         : static_cast<size_t>(n / static_cast<size_t>(bs));
      const bool cow = from == a.slot && copies_on_write(n, keep);
      for (size_t k = from == a.slot ? keep : 0; k < table.size(); ++k) freed += pool_->RefCount(table[k]) == 1;
      if (cow) freed += pool_->RefCount(table[keep - 1]) == 1;  // cached, no other user: evictable once replaced
      need = BlocksFor(target) - static_cast<int>(keep) + (cow ? 1 : 0);
    }
    if (need <= pool_->num_available() + freed) break;
    if (!ReclaimIdle(active, a.slot, start.adopted ? -1 : from) && !PreemptNewer(active, i)) return false;
  }
  const int64_t target = static_cast<int64_t>(start.n + std::min(a.feed().size() - start.n, budget));
  if (start.adopted) {
    // The chain found above (nothing changed the pool since), each block
    // now with one more user: taken before the slot's blocks go back and
    // before anything is allocated, so none of it is evicted.
    std::vector<int> chain = pool_->MatchPrefix(a.feed(), static_cast<int>(start.n / static_cast<size_t>(bs)));
    (void)pool_->Release(table);
    table = std::move(chain);
    slot_cached_[static_cast<size_t>(a.slot)] = 0;
  } else if (start.from == a.slot) {
    const size_t n = start.n;
    const size_t keep = std::min(table.size(), static_cast<size_t>(BlocksFor(static_cast<int64_t>(n))));
    const bool cow = copies_on_write(n, keep);
    (void)pool_->Release(absl::MakeConstSpan(table).subspan(keep));
    table.resize(keep);
    if (cow) {
      // The slot writes its own copy of the partial block (a paging
      // engine copies its keys and values when the table comes).
      (void)pool_->Release(absl::MakeConstSpan(&table[keep - 1], 1));
      table[keep - 1] = *pool_->Allocate();
    }
    size_t& settled = slot_cached_[static_cast<size_t>(a.slot)];
    settled = std::min(settled, n / static_cast<size_t>(bs));
  } else {
    const std::vector<int>& theirs = slot_blocks_[static_cast<size_t>(start.from)];
    std::vector<int> shared(theirs.begin(),
                            theirs.begin() + static_cast<std::ptrdiff_t>(start.n / static_cast<size_t>(bs)));
    for (int b : shared) (void)pool_->Ref(b);
    (void)pool_->Release(table);
    table = std::move(shared);
    slot_cached_[static_cast<size_t>(a.slot)] = 0;
  }
  while (static_cast<int>(table.size()) < BlocksFor(target)) table.push_back(*pool_->Allocate());
  return true;
}

void Scheduler::Requeue(std::vector<std::unique_ptr<Active>>& active) {
  std::vector<std::unique_ptr<Active>> back;
  for (auto& a : active) {
    if (a->requeue) back.push_back(std::move(a));
  }
  if (back.empty()) return;
  active.erase(std::remove(active.begin(), active.end(), nullptr), active.end());
  absl::MutexLock lock(&mu_);
  // The front of the queue, oldest first.
  for (auto it = back.rbegin(); it != back.rend(); ++it) {
    Queued q;
    q.stream = (*it)->stream;
    q.submitted = (*it)->submitted;
    q.group = (*it)->group;
    q.sample = (*it)->sample;
    q.resume = std::shared_ptr<Active>(std::move(*it));
    queue_.push_front(std::move(q));
  }
}

// Mixed steps: the decode rows ride in the prompt tokens' pass, so they
// count against the pass's budget of prefill_chunk rows; at least half of
// it stays the prompts', or many decoding streams would starve arrivals.
// Why: a budget of prompt tokens alone made every pass of a burst with
// decode rows one row past prefill_chunk (the engine's max_batch), so the
// CUDA engine ran it as a prompt pass and then a step (the 64-stream
// burst's passes: 26-28 ms against 22.5 for a 512-token pass, H100).
int Scheduler::PromptBudget(const std::vector<std::unique_ptr<Active>>& active) const {
  const int all = options_.prefill_chunk;
  if (!(options_.mixed_steps && options_.batch_prefill)) return all;
  int rows = 0;
  for (const auto& a : active) rows += !a->done && a->decoding ? 1 : 0;
  return std::max(all - rows, (all + 1) / 2);
}

void Scheduler::Iterate(std::vector<std::unique_ptr<Active>>& active) {
  // Oldest request first, each taking the KV blocks its new positions need
  // (from the pool, idle caches, or by preempting newer requests): the
  // decode rows (every request with a token pending before this
  // iteration's prompts run) and the prompt parts, up to one budget's
  // worth of tokens in all; each request starts (Start) when its turn
  // comes, after the prompts before it have run, so it can find what they
  // ran. A request that cannot have its blocks now waits.
  std::vector<int> slots;
  std::vector<Active*> decoders;
  std::vector<Active*> prompts;
  std::vector<BatchEngine::PrefillPart> parts;
  std::vector<size_t> waiting;  // for blocks
  int budget = PromptBudget(active);
  for (size_t i = 0; i < active.size(); ++i) {
    Active& a = *active[i];
    if (a.done) continue;
    if (a.decoding) {
      if (!Grow(active, i, engine_.n_past(a.slot) + 1)) {
        waiting.push_back(i);
        continue;
      }
      slots.push_back(a.slot);
      decoders.push_back(&a);
      continue;
    }
    if (budget <= 0) continue;
    if (!a.started) {
      if (WaitsForSharedStart(a, absl::MakeConstSpan(active).subspan(0, i))) continue;
      StartAt start;
      if (!ClaimStart(active, i, start, static_cast<size_t>(budget))) {
        waiting.push_back(i);
        continue;
      }
      Start(a, start);
      if (a.done) continue;
    }
    const std::vector<int32_t>& prompt = a.feed();
    const size_t n = std::min(prompt.size() - a.prefilled, static_cast<size_t>(budget));
    if (!Grow(active, i, static_cast<int64_t>(a.prefilled + n))) {
      waiting.push_back(i);
      continue;
    }
    const bool last = a.prefilled + n == prompt.size();
    parts.push_back({a.slot, absl::MakeConstSpan(prompt).subspan(a.prefilled, n), last, &a.request.sampling});
    prompts.push_back(&a);
    budget -= static_cast<int>(n);
  }
  if (parts.empty() && slots.empty()) {
    if (waiting.empty()) return;
    // Nothing can run: every request that would is waiting for blocks that
    // only requests it cannot preempt hold (a grammar's that has sampled,
    // whose matcher cannot be replayed), or one is alone and the pool is
    // full. The newest waiting request that holds blocks and can be
    // preempted is, while another holds blocks too; else the newest
    // waiting one that holds blocks ends, decoding, as at a full context
    // ("length").
    auto holds = [this](const Active& b) { return !b.done && !slot_blocks_[static_cast<size_t>(b.slot)].empty(); };
    for (size_t k = waiting.size(); k-- > 0;) {
      Active& w = *active[waiting[k]];
      if (!holds(w) || !w.preemptible()) continue;
      bool others = false;
      for (const auto& b : active) others |= b.get() != &w && holds(*b);
      if (!others) continue;
      Preempt(w);
      return;
    }
    for (size_t k = waiting.size(); k-- > 0;) {
      Active& w = *active[waiting[k]];
      if (!holds(w)) continue;
      if (w.decoding) {
        Finish(w, FinishReason::kLength, absl::OkStatus());
      } else {
        Finish(w, FinishReason::kStop, absl::ResourceExhaustedError("the KV pool cannot hold this request's prompt"));
      }
      return;
    }
    return;
  }
  int64_t prompt_tokens = 0, counted = 0, recomputed = 0;  // all the parts' tokens; those the metrics count
  for (size_t i = 0; i < parts.size(); ++i) {
    prompt_tokens += static_cast<int64_t>(parts[i].tokens.size());
    if (prompts[i]->counts_prompt()) counted += static_cast<int64_t>(parts[i].tokens.size());
    if (prompts[i]->preempted) recomputed += static_cast<int64_t>(parts[i].tokens.size());
  }
  // Each decode row runs its pending token into the slot's cache (an error
  // fails the request, whose Finish empties the record).
  for (Active* a : decoders) slot_tokens_[static_cast<size_t>(a->slot)].push_back(a->sampled.back());

  std::vector<int32_t> first(parts.size(), -1), next(slots.size(), -1);
  const auto t0 = std::chrono::steady_clock::now();
  absl::Status prompt_status, step_status;
  if (options_.mixed_steps && options_.batch_prefill) {
    prompt_status = step_status = engine_.StepWithPrefill(parts, absl::MakeSpan(first), slots, absl::MakeSpan(next));
  } else {
    if (options_.batch_prefill) {
      if (!parts.empty()) prompt_status = engine_.PrefillBatch(parts, absl::MakeSpan(first));
    } else {
      for (size_t i = 0; i < parts.size() && prompt_status.ok(); ++i) {
        prompt_status =
            engine_.PrefillBatch(absl::MakeConstSpan(parts).subspan(i, 1), absl::MakeSpan(first).subspan(i, 1));
      }
    }
    if (!slots.empty()) step_status = engine_.Step(slots, absl::MakeSpan(next));
  }
  const auto done = std::chrono::steady_clock::now();
  {
    // A mixed call's time goes to prompts and decoding by their rows.
    const double sec = std::chrono::duration<double>(done - t0).count();
    const double prompt_share =
        static_cast<double>(prompt_tokens) / static_cast<double>(prompt_tokens + static_cast<int64_t>(slots.size()));
    absl::MutexLock lock(&mu_);
    metrics_.prompt_seconds += sec * prompt_share;
    metrics_.decode_seconds += sec * (1 - prompt_share);
    if (prompt_status.ok()) {
      metrics_.prompt_tokens_total += counted;
      metrics_.recomputed_tokens_total += recomputed;
    }
    if (step_status.ok()) metrics_.decode_tokens += static_cast<int64_t>(slots.size());
  }
  if (options_.trace) TraceCall(t0, done, slots.size(), parts.size(), prompt_tokens, active.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    Active& a = *prompts[i];
    if (!prompt_status.ok()) {
      // What ran of the batch is not known: the slot's record is emptied
      // (Finish releases the slot).
      Finish(a, FinishReason::kStop, prompt_status);
      continue;
    }
    const size_t n = parts[i].tokens.size();
    a.prefilled += n;
    std::vector<int32_t>& held = slot_tokens_[static_cast<size_t>(a.slot)];
    held.insert(held.end(), parts[i].tokens.begin(), parts[i].tokens.end());
    CacheBlocks(a.slot);
    std::optional<SlotLogprobs> lp = TakeLogprobs(a);
    if (!lp.has_value()) continue;
    for (generate::TokenLogprobs& t : lp->prompt) a.prompt_logprobs.push_back(std::move(t));
    if (!parts[i].last) continue;
    if (a.resuming()) {
      // A preempted request's prompt and tokens are back: its draw is the
      // token after its last one, and it decodes on.
      a.decoding = true;
      Take(a, first[i], std::move(lp->draw));
      continue;
    }
    if (a.request.prompt_logprobs) {
      StreamEvent e;
      e.prompt_logprobs = std::move(a.prompt_logprobs);
      e.prompt_scored = true;
      a.stream->Push(std::move(e));
    }
    a.decoding = true;
    a.first_token = done;
    {
      absl::MutexLock lock(&mu_);
      metrics_.time_to_first_token.Observe(std::chrono::duration<double>(a.first_token - a.submitted).count());
    }
    if (a.request.max_tokens == 0) {
      Finish(a, FinishReason::kLength, absl::OkStatus());
      continue;
    }
    Take(a, first[i], std::move(lp->draw));
  }
  for (size_t i = 0; i < decoders.size(); ++i) {
    if (!step_status.ok()) {
      Finish(*decoders[i], FinishReason::kStop, step_status);
      continue;
    }
    CacheBlocks(decoders[i]->slot);  // its pending token is in the cache now
    if (std::optional<SlotLogprobs> lp = TakeLogprobs(*decoders[i])) {
      Take(*decoders[i], next[i], std::move(lp->draw));
    }
  }
}

void Scheduler::TraceCall(std::chrono::steady_clock::time_point t0, std::chrono::steady_clock::time_point done,
                          size_t decode_rows, size_t prompt_parts, int64_t prompt_tokens, size_t active) {
  auto ms = [](auto d) { return std::chrono::duration<double, std::milli>(d).count(); };
  size_t queued = 0;
  {
    absl::MutexLock lock(&mu_);
    queued = queue_.size();
  }
  *options_.trace << absl::StrFormat("%.3f\t%.3f\t%.3f\t%d\t%d\t%d\t%d\t%d\n", ms(t0 - trace_start_),
                                     ms(t0 - trace_last_), ms(done - t0), decode_rows, prompt_parts, prompt_tokens,
                                     active, queued);
  trace_last_ = done;
}

void Scheduler::Loop() {
  std::vector<std::unique_ptr<Active>> active;  // in admission order
  auto sweep = [&active] {
    active.erase(std::remove_if(active.begin(), active.end(),
                                [](const std::unique_ptr<Active>& a) { return a->done; }),
                 active.end());
  };
  while (Admit(active)) {
    for (auto& a : active) {
      if (a->stream->cancelled()) Finish(*a, FinishReason::kStop, absl::CancelledError("client gone"));
    }
    sweep();
    Iterate(active);
    Requeue(active);
    sweep();
    int64_t kv = 0;
    for (const auto& a : active) kv += engine_.n_past(a->slot);
    absl::MutexLock lock(&mu_);
    metrics_.kv_positions_used = kv;
    metrics_.kv_blocks_used = pool_->num_blocks() - pool_->num_available();
    metrics_.kv_blocks_cached = pool_->num_cached();
    metrics_.generated_tokens_total += std::exchange(generated_unflushed_, 0);
  }
  if (options_.trace) options_.trace->flush();
  // Shutting down: every stream ends now.
  const absl::Status bye = absl::UnavailableError("the server is shutting down");
  for (auto& a : active) Finish(*a, FinishReason::kStop, bye);
  std::deque<Queued> queued;
  {
    absl::MutexLock lock(&mu_);
    queued.swap(queue_);
  }
  for (Queued& q : queued) {
    StreamEvent e;
    e.final = true;
    e.error = bye;
    e.prompt_tokens = static_cast<int64_t>((q.resume ? q.resume->request : q.request).prompt.size());
    q.stream->Push(std::move(e));
  }
}

}  // namespace dpl::server
