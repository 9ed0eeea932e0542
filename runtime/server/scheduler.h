// Continuous batching over a BatchEngine. One engine thread owns the engine;
// HTTP handlers Submit requests and read their streams.
//
// Each iteration of the engine thread, between two steps:
//   1. admit: queued requests take free slots (FIFO), each the free slot
//      whose whole cache is the longest start of its prompt (llama-server's
//      prompt cache: a finished request's slot keeps its prompt and answer,
//      so the next turn of a chat processes only what is new), else the
//      slot free longest;
//   2. leave: requests whose client went away (RequestStream::Cancel) free
//      their slot;
//   3. prompts: a request's first prefill starts from the longest start
//      of its prompt that any slot's cache holds: its own slot's kept in
//      place, or another slot's (free or running: a shared system prompt)
//      copied (BatchEngine::CopyPrefix), or, on a paged engine, the block
//      cache's (below) when its whole blocks hold more (adopted:
//      BatchEngine::AdoptPrefix); prompts start oldest first, and a
//      request that shares a long start with an older prompt still running
//      waits for it (SchedulerOptions::defer_for_shared_start), so a burst
//      of requests with one system prompt runs it once. At most
//      SchedulerOptions::prefill_chunk prompt tokens go in all (with
//      mixed steps, less the decode rows that share their pass, down to
//      half of it), oldest request first: one chunk of a long prompt, or
//      several short prompts until the budget is spent (llama-server's
//      n_batch). Samples of one
//      prompt (SubmitSamples, the API's n) run it once: the first runs it,
//      the others wait for it and copy all of it but its last token, which
//      each runs for its own first draw;
//   4. the engine: those prompt tokens in one BatchEngine::PrefillBatch
//      (the CUDA engine packs them into one forward pass, every weight read
//      once for all of them), then a decode step for every slot that had a
//      token pending; with SchedulerOptions::mixed_steps both in one
//      BatchEngine::StepWithPrefill (the CUDA engine: ONE forward pass, so
//      the running streams never wait a step of their own for a burst). A
//      long prompt delays their next token by one chunk at most.
// A request leaves when its turn ends (an end-of-generation token, unless
// ignore_eos), a stop string completes, max_tokens are generated, or its
// slot's context is full. Requests beyond the slots wait in a bounded queue.
//
// KV blocks (issue 30): the scheduler owns a kv::BlockPool, the authority on
// KV positions. Each slot has a block table covering the positions its cache
// holds (a copied start's full blocks shared with the slot it came from,
// reference-counted). Before each engine call a request takes the blocks its
// new positions need, oldest request first; when the pool is out, it takes
// them from idle caches (free slots', least recently freed first, and those
// of admitted requests not started yet), then by preempting the newest
// running request newer than itself (its blocks freed, it goes back to the
// front of the queue with its prompt and the tokens it sampled, which it
// runs again when admitted, then goes on generating: its stream continues
// where it was, nothing repeated or lost). A request with nothing newer to
// preempt waits a step (the newest is the one that would be preempted). A
// queued request is admitted only when the pool has blocks for its prompt
// (FIFO: the ones behind it wait too). A request the pool could never hold
// is refused at Submit. SchedulerOptions::kv_pool_positions sizes the pool;
// by default it is n_slots x n_ctx, so nothing ever waits for blocks or is
// preempted. The engine sees the tables through BatchEngine::SetBlockTable
// (the CPU engine and the CUDA engine of regions ignore them: their KV is
// per slot; the paged CUDA engine brings its pool and runs on them).
//
// The block cache (issue 30's prefix reuse; only where the engine pages its
// cache with the scheduler's pool and can adopt blocks,
// BatchEngine::supports_block_adoption: the paged CUDA engine, not the CPU
// engine, whose behaviour is unchanged). After every engine call, each
// full block of a slot whose every position holds a token that ran (the
// prompt, and sampled tokens once a step has run them: the last sampled
// token is pending, not in the cache) is registered in the pool's prefix
// cache (kv::BlockPool::Cache) under the hash of every token up to its end,
// in order, each the child of the block before it (where another block
// already caches the same tokens, two requests having run one prompt at
// once, the chain goes on from that one). Blocks that leave a slot (a
// request's end beyond its kept cache, an idle cache taken back, a
// preemption, a slot reused for another prompt) go back through
// BlockPool::Release: a cached one stays cached with no users, evictable,
// least recently released first and a sequence's tail before its head,
// and is evicted only when the pool hands a block out. A request's first
// prefill also looks up the longest chain of cached blocks holding its
// prompt's start (never all of it: its last token runs for the first
// logits) and, when it covers more tokens than any slot's cache gives,
// adopts it: its slot is emptied, its table becomes the chain (each block
// taken with one more reference: shared with the running requests that
// use it, never evicted while held) plus fresh blocks for the rest, and
// the engine is told the table's first blocks hold the start
// (AdoptPrefix). So a chat whose slot went to other requests, or a
// preempted request coming back, finds the blocks it wrote while they
// last. cached_tokens and the metrics count an adopted start as cached
// (prompt_tokens_adopted_total beside the copied ones). cache_prompt false
// adopts nothing (its own blocks are registered all the same: they serve
// later requests), nor does a scored prompt (prompt_logprobs: it runs
// whole; its blocks are registered too, their keys and values being the
// same). Blocks a start takes count against the pool: an unused cached
// block it adopts is one fewer available, and a kept start whose partial
// last block is cached writes a copy of it (copy on write), so a cached
// block is never written. Admission's estimate counts evictable blocks as
// room, as they are.
//
// What a preempted request's client sees: a pause, then the stream goes on
// where it stopped (the request keeps its TextStream: held-back UTF-8 and
// stop-string prefixes, and its counts; nothing is sent twice or lost), and
// it completes as it would have: usage counts its prompt once, every token
// it generated, and as cached what its first start found cached. Greedy
// requests give the tokens they give alone (the recomputed keys and values
// are the same; tested on the CPU engine). A sampled request's draws after
// the preemption come from its seed's stream started again (the engine's
// sampler is made at a prompt's last chunk), so its text is a valid sample
// but not the one an undisturbed run draws. Logprobs go on one per token
// (prompt logprobs are not sent again). A request with a grammar that has
// sampled is never preempted (its matcher cannot be replayed through
// BatchEngine); when only such requests hold the pool and none can grow,
// the newest ends with "length", as at a full context. So does a request
// alone that has filled the whole pool. A request preempted before its first
// token starts again from scratch (its prompt logprobs too).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "runtime/grammar/grammar.h"
#include "runtime/kv/block_pool.h"
#include "runtime/server/batch_engine.h"
#include "runtime/server/text_stream.h"
#include "runtime/tokenizer/tokenizer.h"

namespace dpl::server {

struct GenerationRequest {
  std::vector<int32_t> prompt;
  SamplerParams sampling;
  int32_t max_tokens = -1;                   // -1: until a stop or a full context
  std::vector<std::string> stop;             // stop strings (not part of the text)
  absl::flat_hash_set<int32_t> stop_tokens;  // end-of-generation ids (not part of the text)
  bool ignore_eos = false;                   // llama-server's: stop_tokens do not end it
  bool cache_prompt = true;                  // llama-server's: reuse a cached start (a slot's, the block cache's)
  // Structured output: the generated text follows this grammar (the engine
  // masks each draw; BatchEngine::SetGrammar). Submit refuses it on an
  // engine without (FailedPrecondition, before anything is streamed).
  std::shared_ptr<const grammar::Grammar> grammar;
  // Logprobs (BatchEngine::SetLogprobs): each generated token's, with the
  // `logprobs` most probable (0..generate::kMaxTopLogprobs; -1: none), and
  // with prompt_logprobs also the prompt tokens' (echo): the prompt then
  // runs whole, not from a cached start. Submit refuses them on an engine
  // without (FailedPrecondition, before anything is streamed).
  int logprobs = -1;
  bool prompt_logprobs = false;
  // OpenAI's logit_bias (BatchEngine::SetLogitBias): added to these tokens'
  // logits before every other sampling step; distinct tokens, -inf bans.
  // Submit checks the list against the model's vocabulary (InvalidArgument
  // naming 'logit_bias') and refuses it on an engine without
  // (FailedPrecondition).
  std::vector<LogitBias> logit_bias;
};

// OpenAI's "stop" and "length"; "tool_calls" only the API layer gives (an
// answer that was function calls).
enum class FinishReason { kStop, kLength, kToolCalls };
const char* FinishReasonName(FinishReason reason);

// What a request's stream delivers, in order: pieces of text, then one final
// event.
struct StreamEvent {
  std::string text;
  // With GenerationRequest::logprobs: the generated tokens this event
  // reports, in order (a token's text may come in a later event: the text
  // waits for whole UTF-8 characters and for what may begin a stop string);
  // an end-of-generation token is not reported, nor is its text. A stop
  // string's tokens are, though their text is cut.
  std::vector<generate::TokenLogprobs> logprobs;
  // With prompt_logprobs, one event before any generated token's
  // (prompt_scored): the prompt tokens' from the second on (prompt.size() - 1
  // entries).
  std::vector<generate::TokenLogprobs> prompt_logprobs;
  bool prompt_scored = false;
  bool final = false;
  // Final only:
  FinishReason finish = FinishReason::kStop;
  absl::Status error;  // not OK: the generation failed (engine error, shutdown)
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;  // of prompt_tokens, taken from a cache (a slot's or cached blocks; not run)
};

// One request's channel from the engine thread to its HTTP handler.
class RequestStream {
 public:
  // The events ready now, waiting up to `timeout` for the first; empty on
  // timeout.
  std::vector<StreamEvent> Wait(absl::Duration timeout);
  // The client is gone: a queued request leaves the queue at the next
  // Submit or step (and no longer counts against --queue or as deferred),
  // a running one frees its slot before the next step.
  void Cancel() { cancelled_ = true; }
  bool cancelled() const { return cancelled_; }

 private:
  friend class Scheduler;
  void Push(StreamEvent e);
  bool HasEvents() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !events_.empty(); }

  absl::Mutex mu_;
  std::deque<StreamEvent> events_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> cancelled_{false};
};

struct SchedulerOptions {
  int max_queue = 64;        // requests waiting for a slot; one more is refused
  int prefill_chunk = 256;   // prompt tokens fed between two decode steps (all calls together)
  // A request whose prompt shares at least this many more tokens with an
  // older request's prompt that is still being prefilled than any cache
  // holds now waits for that prompt to run, then copies its start (16
  // requests with one system prompt, arriving together: one runs it, the
  // others copy). Below it, running the shared tokens again in the same
  // packed pass costs less than the wait (a decode step and more).
  int defer_for_shared_start = 256;
  // false: each prompt's chunk its own engine call, as before packed passes
  // (dpl-server's DPL_PREFILL_BATCH=0, an A/B).
  bool batch_prefill = true;
  // With batch_prefill, the prompt tokens and the decode step in ONE engine
  // call (BatchEngine::StepWithPrefill; the CUDA engine runs them as one
  // forward pass), the decode rows counted in the pass's budget
  // (PromptBudget); false: a PrefillBatch, then a Step (dpl-server's
  // DPL_MIXED_STEPS=0). On since the seventeenth session (H100, 7B, -ub
  // 512, docs/PERF.md): the 64-stream burst's first tokens median 254 ->
  // 235 ms, slowest 462 -> 473, aggregate 6,336 -> 6,317 t/s; the 16-stream
  // shared start's median 49.0 -> 44.9 ms, slowest 104 -> 88. (An earlier
  // A/B found no gain because the budget then counted prompt tokens only:
  // every burst pass was one row past max_batch and ran as two.)
  bool mixed_steps = true;
  // Full KV blocks stay cached in the pool after their request (and slot)
  // moves on, and a prompt adopts the longest cached chain (where the
  // engine pages its cache and can adopt: the CUDA engine). false: only
  // what slots hold is reused (dpl-server's DPL_BLOCK_CACHE=0, an A/B).
  bool block_cache = true;
  // The KV block pool (issue 30): positions a block, and positions in all
  // (rounded up to whole blocks); 0: n_slots x n_ctx (each slot's whole
  // context, rounded up per slot: nothing waits or is preempted, today's
  // behaviour). Smaller: llama-server's -c with --kv-unified, one pool the
  // slots share; requests wait for blocks and the newest is preempted. Not
  // a dpl-server flag yet (DPL_KV_POOL / DPL_KV_BLOCK set them, for
  // development): the engines still reserve n_ctx positions a slot (the
  // GPU engine reading block tables is issue 30's next part).
  int kv_block_size = 16;
  int64_t kv_pool_positions = 0;
  // Where one line per engine call goes (dpl-server's DPL_TRACE_STEPS=FILE,
  // for measuring where a load's time goes; tools/perf/step_trace.py sums
  // it): null, none. Columns, tab-separated after a header line:
  //   t_ms     the call's start, ms since the scheduler started
  //   gap_ms   since the previous call returned: the scheduler's own work
  //            (tokens handed to streams, admission, block bookkeeping),
  //            and any idle wait for requests
  //   engine_ms  the call (prompts and the decode step; the engine syncs)
  //   decode_rows, prompt_parts, prompt_tokens  what it ran
  //   active, queued  requests holding slots, and waiting for one, after it
  std::shared_ptr<std::ostream> trace;
};

// A Prometheus histogram: observations counted under ascending upper bounds
// (and +Inf), with their sum.
struct Histogram {
  explicit Histogram(std::vector<double> upper_bounds)
      : bounds(std::move(upper_bounds)), counts(bounds.size() + 1, 0) {}
  void Observe(double v);
  std::vector<double> bounds;
  std::vector<int64_t> counts;  // per bucket, not cumulative; the last is +Inf
  double sum = 0;
  int64_t count = 0;
};

// Counters since start, for /metrics.
struct SchedulerMetrics {
  int64_t requests_total = 0;        // accepted (each sample of SubmitSamples one)
  // A group of samples counts its prompt once, its first sample's tokens (as
  // the API's usage does): prompt_tokens_total + prompt_tokens_cached_total
  // is the sum of the answers' usage.prompt_tokens.
  int64_t prompt_tokens_total = 0;   // prefilled
  int64_t prompt_tokens_cached_total = 0;  // taken from a cache instead (a slot's or the block cache)
  int64_t prompt_tokens_copied_total = 0;  // of those, copied from another slot's cache
  int64_t prompt_tokens_adopted_total = 0;  // of those, adopted from the KV pool's cached blocks
  int64_t generated_tokens_total = 0;  // the sum of the requests' completion_tokens
  double prompt_seconds = 0;         // engine time in Prefill
  double decode_seconds = 0;         // engine time in Step
  int64_t decode_tokens = 0;         // tokens those steps produced
  int processing = 0;                // requests holding a slot
  int deferred = 0;                  // requests waiting in the queue
  int64_t kv_positions_used = 0;     // KV positions the running requests hold, all slots
  int64_t kv_positions_total = 0;    // slots x positions a slot, or the pool's if smaller
  // The KV block pool (SchedulerOptions::kv_pool_positions).
  int64_t kv_block_size = 0;
  int64_t kv_blocks_total = 0;
  int64_t kv_blocks_used = 0;        // held by slots' tables (running or kept caches)
  int64_t kv_blocks_cached = 0;      // in the prefix cache, held or evictable (block cache only)
  int64_t preemptions_total = 0;     // running requests sent back to the queue for blocks
  // Tokens run again by preempted requests (prompt and generated tokens),
  // counted in neither prompt_tokens_total nor prompt_tokens_cached_total.
  int64_t recomputed_tokens_total = 0;
  // Seconds, per request (vLLM's buckets): submitted -> first token sampled;
  // between its tokens, (last - first) / (tokens - 1) for two or more;
  // submitted -> final event.
  Histogram time_to_first_token{{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                                 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}};
  Histogram time_per_output_token{{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
                                   2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0}};
  Histogram request_latency{{0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                             50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}};
};

class Scheduler {
 public:
  // `engine` and `tokenizer` outlive the scheduler. Starts the engine thread.
  Scheduler(BatchEngine& engine, const tokenizer::Tokenizer& tokenizer, SchedulerOptions options);
  ~Scheduler();  // Shutdown()

  // Checks and queues a request. Errors: InvalidArgument (an empty prompt, an
  // id outside the vocabulary, max_tokens < -1), OutOfRange (the prompt plus
  // max_tokens do not fit a slot's context, or the KV pool), ResourceExhausted (the queue is
  // full), Unavailable (shutting down), FailedPrecondition (a grammar on an
  // engine without structured output, logprobs on one without them);
  // InvalidArgument also for logprobs outside [-1, 20], prompt_logprobs
  // without logprobs, a logit_bias token outside the vocabulary (or a list
  // kernels::CheckLogitBias refuses).
  absl::StatusOr<std::shared_ptr<RequestStream>> Submit(GenerationRequest request);

  // Samples of one prompt (the API's n): requests with the same prompt,
  // usually differing in their sampling seed, each its own slot and stream
  // (streams[j] is samples[j]'s). The prompt runs once: sample 0 runs it
  // (from the longest start a cache holds, as any request), and the others,
  // admitted as slots free up, wait until a slot holds all of it but its
  // last token and copy that (BatchEngine::CopyPrefix, or KeepPrefix when
  // their own slot holds it), then run that last token for their own first
  // draw: sample j's answer is the answer samples[j] gets alone. They
  // share even with cache_prompt false (only each other's caches then);
  // with prompt_logprobs each runs the prompt whole. The metrics count the
  // prompt once, as the API's usage does: sample 0's tokens prefilled and
  // cached, none of the others'. Checks each request as Submit does, and
  // that the prompts are equal (InvalidArgument); all are queued or none
  // (ResourceExhausted, as Submit), and a group that finds the queue empty
  // is queued whatever --queue says, so an idle server never refuses an n.
  absl::StatusOr<std::vector<std::shared_ptr<RequestStream>>> SubmitSamples(
      std::vector<GenerationRequest> samples);

  // Refuses new requests, ends every queued and running one (its final event
  // carries Unavailable) and joins the engine thread. Idempotent.
  void Shutdown();

  SchedulerMetrics metrics() const;
  // Per slot: whether a request holds it.
  std::vector<bool> SlotsBusy() const;
  const BatchEngine& engine() const { return engine_; }

 private:
  struct Active;
  struct Queued {
    GenerationRequest request;
    std::shared_ptr<RequestStream> stream;
    std::chrono::steady_clock::time_point submitted;
    uint64_t group = 0;  // SubmitSamples' samples of one prompt share one (0: alone)
    int sample = 0;      // the request's place in its group
    // A preempted request going back in (request and stream are in it):
    // admitted, it runs its prompt and sampled tokens again and goes on.
    std::shared_ptr<Active> resume;
  };

  // Submit's checks (and its additions: a grammar's stop tokens).
  absl::Status Check(GenerationRequest& r) const;
  // The longest start of a's prompt that a slot's cache may give it (its
  // own slot's first, then the others'; see Start) and that slot.
  std::pair<int, size_t> LongestStart(const Active& a) const;
  // Where a request's first prefill starts: its first n prompt tokens kept
  // in its slot (from == its slot), copied from slot `from`, or adopted
  // from the block cache (its table then starts with the cached blocks).
  struct StartAt {
    int from = -1;
    size_t n = 0;
    bool adopted = false;
  };
  // The block cache's longest chain of full blocks holding the start of
  // a's prompt (never all of it: the last token runs), taken by no one;
  // empty without the block cache, with cache_prompt false, or for a
  // scored prompt.
  std::vector<int> CachedChain(const Active& a) const;
  // Registers the slot's full blocks that its cache holds with known tokens
  // (slot_tokens_) in the block cache, in order, after an engine call ran
  // them.
  void CacheBlocks(int slot);

  void Loop();
  // One line of SchedulerOptions::trace for the engine call [t0, done).
  void TraceCall(std::chrono::steady_clock::time_point t0, std::chrono::steady_clock::time_point done,
                 size_t decode_rows, size_t prompt_parts, int64_t prompt_tokens, size_t active);
  // Ends the queued requests whose client is gone (their final event:
  // Cancelled).
  void DropCancelledLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One iteration's admit step; false when shutting down.
  bool Admit(std::vector<std::unique_ptr<Active>>& active);
  // A request's first prefill: its slot's cache becomes the start
  // ClaimStart chose (kept, copied or adopted); Finish on error.
  void Start(Active& a, StartAt start);
  // KV blocks (engine thread). Blocks covering `positions`.
  int BlocksFor(int64_t positions) const;
  // The slot's cache is emptied and its blocks go back to the pool.
  void DropSlotCache(int slot);
  // Frees one idle cache's blocks (a free slot's, least recently freed
  // first, or a slot whose request has not started), neither `keep` nor
  // `keep2`; false when none holds blocks.
  bool ReclaimIdle(std::vector<std::unique_ptr<Active>>& active, int keep, int keep2);
  // Preempts the newest request after active[i] that holds blocks and can be
  // run again (a request with a grammar that has sampled cannot: its
  // matcher cannot be replayed); false when none.
  bool PreemptNewer(std::vector<std::unique_ptr<Active>>& active, size_t i);
  void Preempt(Active& a);
  // The blocks for active[i] (started) to hold `positions`: taken from the
  // pool, idle caches, or newer requests; false when they cannot be had now.
  bool Grow(std::vector<std::unique_ptr<Active>>& active, size_t i, int64_t positions);
  // The blocks for active[i] (not started) to start from the longest start
  // a slot's cache or the block cache holds (`start`, chosen again if
  // freeing blocks changes it) and prefill up to `budget` tokens; false
  // when they cannot be had now (nothing changed for it).
  bool ClaimStart(std::vector<std::unique_ptr<Active>>& active, size_t i, StartAt& start, size_t budget);
  // Preempted requests (Active::requeue) go back to the front of the queue.
  void Requeue(std::vector<std::unique_ptr<Active>>& active);
  // Prompt tokens this iteration may feed: prefill_chunk, less the decode
  // rows that share the pass with mixed steps (at least half of it).
  int PromptBudget(const std::vector<std::unique_ptr<Active>>& active) const;
  // One iteration's engine work: prompt tokens, up to prefill_chunk in all,
  // oldest prompt first (each Started when its turn comes; a prompt's last
  // chunk gives its first token), and a decode step for every request that
  // had a token pending, in one BatchEngine::StepWithPrefill.
  void Iterate(std::vector<std::unique_ptr<Active>>& active);
  // Whether `a` (not started) waits for an `older` request's prompt to run
  // (SchedulerOptions::defer_for_shared_start; a sample of a group, other
  // than the first, for a sibling to run the prompt).
  bool WaitsForSharedStart(const Active& a, absl::Span<const std::unique_ptr<Active>> older) const;
  // Takes a sampled token (and its logprobs, with the request's); true when
  // the request is finished.
  bool Take(Active& a, int32_t token, std::optional<generate::TokenLogprobs> logprobs = std::nullopt);
  // The slot's logprobs since the engine's last call (none unless the
  // request asked); Finish on error.
  std::optional<SlotLogprobs> TakeLogprobs(Active& a);
  void Finish(Active& a, FinishReason reason, absl::Status error);

  BatchEngine& engine_;
  const tokenizer::Tokenizer& tokenizer_;
  const SchedulerOptions options_;

  mutable absl::Mutex mu_;
  std::deque<Queued> queue_ ABSL_GUARDED_BY(mu_);
  std::vector<int> free_slots_ ABSL_GUARDED_BY(mu_);  // least recently freed first
  // Per slot, free or running: the tokens whose keys and values its cache
  // holds (positions 0 .. n_past), what a new prompt's start is matched
  // against. Engine thread only (Admit reads it under mu_, on the engine
  // thread).
  std::vector<std::vector<int32_t>> slot_tokens_;
  // Per slot: the group (Queued::group) of the request that last started on
  // it, whose samples with cache_prompt false may still copy from it.
  // Engine thread only.
  std::vector<uint64_t> slot_group_;
  // The KV block pool and per slot its block table (the blocks holding
  // slot_tokens_'s positions). Engine thread only (Admit reads them under
  // mu_, on the engine thread).
  std::optional<kv::BlockPool> pool_;
  std::vector<std::vector<int>> slot_blocks_;
  // The block cache (the pool's prefix cache): on where the engine can
  // adopt blocks and its pool is the scheduler's (a paged engine). Per
  // slot, how many of its table's first blocks CacheBlocks has settled
  // (cached, or left to the block that caches the same tokens).
  bool block_cache_ = false;
  std::vector<size_t> slot_cached_;
  int64_t pool_positions_ = 0;  // the pool's positions, for Check
  // SchedulerOptions::trace's clock: the scheduler's start and the last
  // engine call's return (engine thread only).
  std::chrono::steady_clock::time_point trace_start_, trace_last_;
  uint64_t groups_ ABSL_GUARDED_BY(mu_) = 0;  // groups given so far
  int running_ ABSL_GUARDED_BY(mu_) = 0;  // requests that hold a slot
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  SchedulerMetrics metrics_ ABSL_GUARDED_BY(mu_);
  // Tokens Take has counted since the last flush into metrics_ (engine thread
  // only): flushed under the locks Finish and each iteration take anyway, so
  // a token costs no lock, and a request's tokens are in the counter before
  // its final event goes out.
  int64_t generated_unflushed_ = 0;
  std::thread thread_;
};

}  // namespace dpl::server
