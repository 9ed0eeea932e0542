#include "runtime/server/http_server.h"

#include <algorithm>
#include <ctime>
#include <random>
#include <thread>
#include <type_traits>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "runtime/server/chat_page.h"
#include "runtime/server/openai_api.h"

namespace dpl::server {
namespace {

using nlohmann::json;

void Reply(HttpResponder& res, int status, const json& body) { res.Send({status, "application/json", {}, Dump(body)}); }

void ReplyError(HttpResponder& res, const absl::Status& s) { Reply(res, HttpStatus(s), ErrorJson(s)); }

std::string RandomId(absl::string_view prefix) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  return absl::StrFormat("%s%016x", prefix, rng());
}

uint64_t RandomSeed() {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  return rng();
}

// At most n holders at once; the others wait their turn.
class CpuGate {
 public:
  explicit CpuGate(int n) : free_(n) {}
  class Pass {
   public:
    explicit Pass(CpuGate* g) : g_(g) {
      g_->mu_.LockWhen(absl::Condition(+[](int* f) { return *f > 0; }, &g_->free_));
      --g_->free_;
      g_->mu_.Unlock();
    }
    ~Pass() {
      absl::MutexLock lock(&g_->mu_);
      ++g_->free_;
    }
    Pass(const Pass&) = delete;
    Pass& operator=(const Pass&) = delete;

   private:
    CpuGate* g_;
  };

 private:
  absl::Mutex mu_;
  int free_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

// Everything a handler needs once the model is in.
struct Served {
  std::shared_ptr<Scheduler> scheduler;
  const tokenizer::Tokenizer* tok;
  const tokenizer::ChatTemplate* chat;  // null: no vocabulary
};

struct HttpServer::Handlers {
  Handlers(HttpServer& server, int cpu_jobs) : s(server), cpu(cpu_jobs) {}
  HttpServer& s;
  CpuGate cpu;

  // The model, or 503 while it loads.
  std::optional<Served> Model(HttpResponder& res) {
    absl::MutexLock lock(&s.mu_);
    if (s.scheduler_ == nullptr) {
      ReplyError(res, absl::UnavailableError(s.stopping_ ? "the server is shutting down" : "Loading model"));
      return std::nullopt;
    }
    return Served{s.scheduler_, s.model_.tokenizer.get(),
                  s.model_.chat_template ? &*s.model_.chat_template : nullptr};
  }

  // Any name is served unless --strict-model lists the accepted ones.
  absl::Status CheckModel(const std::string& name) const {
    const auto& names = s.options_.strict_model_names;
    if (names.empty() || name.empty() || std::find(names.begin(), names.end(), name) != names.end()) {
      return absl::OkStatus();
    }
    return absl::NotFoundError(absl::StrCat("the model '", name, "' does not exist; this server serves '",
                                            s.options_.model_id, "' (--strict-model)"));
  }

  // Text the context cannot hold is refused before it is tokenized.
  static absl::Status CheckTextFits(const Served& m, size_t bytes) {
    const int64_t at_least = m.tok->MinTokensFor(static_cast<int64_t>(bytes), false);
    if (at_least > m.scheduler->engine().n_ctx()) {
      return absl::OutOfRangeError(absl::StrCat("the prompt (", bytes, " bytes: at least ", at_least,
                                                " tokens) is longer than the context of a slot (",
                                                m.scheduler->engine().n_ctx(), " tokens; -c sets it)"));
    }
    return absl::OkStatus();
  }

  static GenerationRequest ToRequest(const GenerationParams& p, std::vector<int32_t> prompt) {
    GenerationRequest g;
    g.prompt = std::move(prompt);
    g.sampling = p.sampling;
    if (!p.seed_given) g.sampling.seed = RandomSeed();
    g.max_tokens = p.max_tokens;
    g.stop = p.stop;
    g.ignore_eos = p.ignore_eos;
    g.cache_prompt = p.cache_prompt;
    g.grammar = p.grammar;
    g.logprobs = p.logprobs;
    g.prompt_logprobs = p.echo && p.logprobs >= 0;
    g.logit_bias = p.logit_bias;
    return g;
  }

  // Submits, then streams or collects the answer. A client that goes away
  // cancels the request: out of the queue at once, out of its slot at the
  // next step.
  enum class Api { kChat, kResponses };

  // Choices of a chat or text completion: each its own request (its own
  // slot), choice i's chunks carrying index i; gs holds p.n samples of each
  // prompt in turn (AddSamples), submitted together so that the prompt runs
  // once (Scheduler::SubmitSamples). Usage: completion tokens summed over
  // all choices, a prompt's tokens (and cached tokens) counted once, its
  // first sample's, as OpenAI counts them. Any error ends the answer and
  // cancels the other choices. echo[i] (completions' echo): choice i's
  // prompt text, before its answer.
  void GenerateChoices(HttpResponder& res, const Served& m, std::vector<GenerationRequest> gs,
                       const GenerationParams& p, bool chat, const std::vector<std::string>& echo = {}) {
    const size_t samples = static_cast<size_t>(std::max(1, p.n));
    // An echoed prompt's first token is listed unscored (no logits before it).
    std::vector<int32_t> first_prompt_token;
    for (const GenerationRequest& g : gs) first_prompt_token.push_back(g.prompt.empty() ? -1 : g.prompt[0]);
    std::vector<std::shared_ptr<RequestStream>> streams;
    auto cancel_all = [&streams] {
      for (auto& st : streams) st->Cancel();
    };
    for (size_t i = 0; i < gs.size(); i += samples) {
      std::vector<GenerationRequest> group;
      for (size_t j = i; j < std::min(gs.size(), i + samples); ++j) group.push_back(std::move(gs[j]));
      absl::StatusOr<std::vector<std::shared_ptr<RequestStream>>> submitted =
          m.scheduler->SubmitSamples(std::move(group));
      if (!submitted.ok()) {
        cancel_all();
        return ReplyError(res, submitted.status());
      }
      streams.insert(streams.end(), submitted->begin(), submitted->end());
    }
    res.OnDisconnect([streams] {
      for (const auto& st : streams) st->Cancel();
    });
    const ResponseHead head{RandomId(chat ? "chatcmpl-" : "cmpl-"), static_cast<int64_t>(std::time(nullptr)),
                            s.options_.model_id};
    const size_t n = streams.size();
    std::vector<CompletionChoice> choices(n);
    std::vector<bool> final(n, false);
    // With tools, a streamed answer's text is held from where a call may
    // begin (the template's format: "<tool_call>", "[TOOL_CALLS]", Llama's
    // "{" or <|python_tag|>).
    std::vector<ToolCallHoldback> held(n, ToolCallHoldback(p.tool_format));
    // Logprobs: chat's generated entries (a whole answer's built at its end);
    // completions' text offsets, the answer's starting after an echo.
    std::vector<std::vector<generate::TokenLogprobs>> chat_logprobs(n);
    std::vector<size_t> offsets(n, 0);
    for (size_t i = 0; i < echo.size() && i < n; ++i) {
      offsets[i] = echo[i].size();
      if (!p.stream) choices[i].text = echo[i];
    }
    size_t finals = 0;
    int64_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
    auto send = [&res](const json& j) { return res.Write(absl::StrCat("data: ", Dump(j), "\n\n")); };
    auto chunk = [&](size_t i, bool first, const std::string& text, const FinishReason* finish,
                     const json& logprobs = nullptr) {
      return send(chat ? ChatChunkJson(head, static_cast<int>(i), first, text, finish, logprobs)
                       : CompletionChunkJson(head, static_cast<int>(i), text, finish, logprobs));
    };
    bool ok = !p.stream || res.StartStream({200, "text/event-stream", {{"Cache-Control", "no-cache"}}, ""});
    if (p.stream && chat) {
      for (size_t i = 0; i < n && ok; ++i) ok = chunk(i, true, "", nullptr);  // the role delta
    }
    // A streamed echo goes first; with logprobs, with the prompt's entries
    // when they come.
    if (p.stream && p.logprobs < 0) {
      for (size_t i = 0; i < echo.size() && ok; ++i) {
        if (!echo[i].empty()) ok = chunk(i, false, echo[i], nullptr);
      }
    }
    auto quiet_since = absl::Now();
    while (ok && finals < n) {
      bool heard = false;
      for (size_t i = 0; i < n && ok; ++i) {
        if (final[i]) continue;
        // One choice: wait on it; several: poll each.
        for (StreamEvent& e : streams[i]->Wait(n == 1 ? absl::Milliseconds(500) : absl::Milliseconds(5))) {
          heard = true;
          choices[i].text += e.text;
          // This event's logprobs: a stream's chunk carries them; a whole
          // answer collects them.
          json chunk_logprobs;
          json* into = p.stream ? &chunk_logprobs : &choices[i].logprobs;
          std::string text = e.text;
          if (e.prompt_scored) {
            size_t at = 0;  // the echo starts the text
            AppendCompletionLogprobs(*m.tok, first_prompt_token[i], e.prompt_logprobs, &at, into);
            if (p.stream && i < echo.size()) text = echo[i] + text;
          }
          if (!e.logprobs.empty() && chat) {
            chat_logprobs[i].insert(chat_logprobs[i].end(), e.logprobs.begin(), e.logprobs.end());
            if (p.stream) chunk_logprobs = ChatLogprobsJson(*m.tok, e.logprobs);
          } else if (!e.logprobs.empty()) {
            AppendCompletionLogprobs(*m.tok, -1, e.logprobs, &offsets[i], into);
          }
          if (p.stream && (!text.empty() || !chunk_logprobs.is_null())) {
            const std::string out = p.parse_tool_calls ? held[i].Push(text) : text;
            if (!out.empty() || !chunk_logprobs.is_null()) ok = chunk(i, false, out, nullptr, chunk_logprobs);
          }
          if (!e.final || !ok) continue;
          if (!e.error.ok()) {
            cancel_all();
            if (!p.stream) return ReplyError(res, e.error);
            if (send(ErrorJson(e.error)) && res.Write("data: [DONE]\n\n")) res.EndStream();
            return;
          }
          final[i] = true;
          ++finals;
          choices[i].finish = e.finish;
          if (!p.stream && p.logprobs >= 0) {
            if (chat) {
              choices[i].logprobs = ChatLogprobsJson(*m.tok, chat_logprobs[i]);
            } else if (choices[i].logprobs.is_null()) {  // nothing generated: empty lists
              AppendCompletionLogprobs(*m.tok, -1, {}, &offsets[i], &choices[i].logprobs);
            }
          }
          if (i % samples == 0) {
            prompt_tokens += e.prompt_tokens;
            cached_tokens += e.cached_tokens;
          }
          completion_tokens += e.completion_tokens;
          if (p.parse_tool_calls) {
            // Calls found: they are the answer (finish_reason "tool_calls").
            ParsedAnswer a = p.stream ? held[i].Finish() : ParseToolCalls(choices[i].text, p.tool_format);
            if (!a.calls.empty()) {
              choices[i].finish = FinishReason::kToolCalls;
              choices[i].tool_calls = a.calls;
              if (!p.stream) choices[i].text = a.content;
            }
            if (p.stream) {
              if (ok && !a.content.empty()) ok = chunk(i, false, a.content, nullptr);
              if (ok && !a.calls.empty()) ok = send(ToolCallsChunkJson(head, static_cast<int>(i), a.calls));
            }
          }
          if (p.stream && ok) ok = chunk(i, false, "", &choices[i].finish);
        }
      }
      // Nothing to say for a while (queued, a long prompt): a comment line
      // keeps proxies from timing the stream out.
      if (heard) {
        quiet_since = absl::Now();
      } else if (p.stream && absl::Now() - quiet_since >= absl::Milliseconds(500)) {
        ok = res.Write(": ping\n\n");
        quiet_since = absl::Now();
      }
    }
    if (!ok) return cancel_all();  // the client is gone: free the slots
    if (!p.stream) {
      return Reply(res, 200, chat ? ChatCompletionJson(head, choices, prompt_tokens, completion_tokens, cached_tokens)
                                  : CompletionJson(head, choices, prompt_tokens, completion_tokens, cached_tokens));
    }
    if (p.include_usage) ok = send(UsageChunkJson(head, chat, prompt_tokens, completion_tokens, cached_tokens));
    if (ok && res.Write("data: [DONE]\n\n")) res.EndStream();
  }

  // n samples of one prompt: seeds seed, seed + 1, ... when one is given
  // (sample j's answer is the answer of the request with seed + j alone),
  // else a random seed each.
  static void AddSamples(const GenerationParams& p, const GenerationRequest& g,
                         std::vector<GenerationRequest>* out) {
    for (int j = 0; j < p.n; ++j) {
      out->push_back(g);
      if (j > 0) out->back().sampling.seed = p.seed_given ? g.sampling.seed + static_cast<uint64_t>(j) : RandomSeed();
    }
  }

  // The Responses API's answer: one object, or named events (no [DONE]).
  void GenerateResponses(HttpResponder& res, const Served& m, GenerationRequest g, const GenerationParams& p) {
    absl::StatusOr<std::shared_ptr<RequestStream>> submitted = m.scheduler->Submit(std::move(g));
    if (!submitted.ok()) return ReplyError(res, submitted.status());
    std::shared_ptr<RequestStream> held = *std::move(submitted);
    res.OnDisconnect([held] { held->Cancel(); });
    RequestStream& stream = *held;
    ResponsesEvents events(
        {RandomId("resp_"), static_cast<int64_t>(std::time(nullptr)), s.options_.model_id});
    std::string text;
    if (!p.stream) {
      for (;;) {
        for (StreamEvent& e : stream.Wait(absl::Seconds(1))) {
          text += e.text;
          if (!e.final) continue;
          if (!e.error.ok()) return ReplyError(res, e.error);
          if (p.parse_tool_calls) {
            ParsedAnswer a = ParseToolCalls(text, p.tool_format);
            if (!a.calls.empty()) {
              text = a.content;
              events.SetCalls(a.calls, /*with_message=*/!text.empty());
            }
          }
          return Reply(res, 200, events.Response(text, e.finish, e.prompt_tokens, e.completion_tokens,
                                                 e.cached_tokens));
        }
      }
    }
    ToolCallHoldback holdback(p.tool_format);
    auto send = [&res](const json& j) {
      return res.Write(absl::StrCat("event: ", j["type"].get<std::string>(), "\ndata: ", Dump(j), "\n\n"));
    };
    bool ok = res.StartStream({200, "text/event-stream", {{"Cache-Control", "no-cache"}}, ""});
    for (const json& j : events.Open()) ok = ok && send(j);
    while (ok) {
      std::vector<StreamEvent> got = stream.Wait(absl::Milliseconds(500));
      if (got.empty()) ok = res.Write(": ping\n\n");
      for (StreamEvent& e : got) {
        if (!ok) break;
        if (!e.text.empty()) {
          const std::string out = p.parse_tool_calls ? holdback.Push(e.text) : e.text;
          text += out;
          if (!out.empty()) ok = send(events.Delta(out));
        }
        if (!e.final || !ok) continue;
        if (!e.error.ok()) {
          ok = send(events.Error(e.error));
        } else {
          if (p.parse_tool_calls) {
            const ParsedAnswer a = holdback.Finish();
            if (!a.content.empty()) {
              text += a.content;
              ok = send(events.Delta(a.content));
            }
            if (!a.calls.empty()) events.SetCalls(a.calls, /*with_message=*/true);
          }
          for (const json& j : events.Close(text, e.finish, e.prompt_tokens, e.completion_tokens, e.cached_tokens)) {
            ok = ok && send(j);
          }
        }
        if (ok) res.EndStream();
        return;
      }
    }
    stream.Cancel();  // the client is gone: free the slot
  }

  void Chat(const HttpRequest& req, HttpResponder& res) { Conversation(req, res, ParseChatRequest, Api::kChat); }
  void Responses(const HttpRequest& req, HttpResponder& res) {
    Conversation(req, res, ParseResponsesRequest, Api::kResponses);
  }

  // Messages through the chat template, answered as `api`.
  void Conversation(const HttpRequest& req, HttpResponder& res,
                    absl::StatusOr<ChatRequest> (*parse)(absl::string_view), Api api) {
    std::optional<Served> m = Model(res);
    if (!m) return;
    GenerationParams params;
    GenerationRequest g;
    {
      CpuGate::Pass pass(&cpu);
      absl::StatusOr<ChatRequest> r = parse(req.body);
      if (!r.ok()) return ReplyError(res, r.status());
      if (absl::Status st = CheckModel(r->params.model); !st.ok()) return ReplyError(res, st);
      if (m->chat == nullptr) {
        return ReplyError(res, absl::FailedPreconditionError(
                                   "this model has no vocabulary: use /v1/completions with token ids"));
      }
      // tool_choice "required" or named: a grammar of this model's calls.
      if (absl::Status st = EnforceToolChoice(m->chat->tool_call_format(), &*r, m->chat->mistral_args_calls()); !st.ok()) return ReplyError(res, st);
      size_t bytes = 0;
      for (const auto& msg : r->messages) {
        bytes += msg.content.size();
        for (const auto& c : msg.tool_calls) bytes += c.name.size() + c.arguments.size();
      }
      for (const std::string& t : r->tools) bytes += t.size();
      if (absl::Status st = CheckTextFits(*m, bytes); !st.ok()) return ReplyError(res, st);
      tokenizer::ChatOptions chat_options;
      chat_options.content_specials = s.options_.content_specials;
      chat_options.tools = r->tools;
      absl::StatusOr<std::vector<int32_t>> ids =
          tokenizer::EncodeChat(*m->tok, *m->chat, r->messages, true, chat_options);
      if (!ids.ok()) return ReplyError(res, absl::InvalidArgumentError(ids.status().message()));
      params = r->params;
      params.tool_format = m->chat->tool_call_format();  // how this model's calls look
      g = ToRequest(params, *std::move(ids));
    }
    for (int32_t id : m->chat->StopTokens(*m->tok)) g.stop_tokens.insert(id);
    if (api == Api::kResponses) return GenerateResponses(res, *m, std::move(g), params);
    std::vector<GenerationRequest> gs;
    AddSamples(params, g, &gs);
    GenerateChoices(res, *m, std::move(gs), params, true);
  }

  void Completion(const HttpRequest& req, HttpResponder& res) {
    std::optional<Served> m = Model(res);
    if (!m) return;
    GenerationParams params;
    std::vector<GenerationRequest> gs;
    std::vector<std::string> echo;  // per choice, with echo
    {
      CpuGate::Pass pass(&cpu);
      absl::StatusOr<CompletionRequest> r = ParseCompletionRequest(req.body);
      if (!r.ok()) return ReplyError(res, r.status());
      if (absl::Status st = CheckModel(r->params.model); !st.ok()) return ReplyError(res, st);
      params = r->params;
      for (CompletionPrompt& prompt : r->prompts) {
        std::vector<int32_t> ids = std::move(prompt.ids);
        if (!prompt.has_ids) {
          if (!m->tok->has_vocab()) {
            return ReplyError(res, absl::FailedPreconditionError(
                                       "this model has no vocabulary: give the prompt as token ids"));
          }
          if (absl::Status st = CheckTextFits(*m, prompt.text.size()); !st.ok()) return ReplyError(res, st);
          ids = m->tok->Encode(prompt.text, m->tok->adds_bos_by_default(), true);
        }
        if (params.echo) echo.resize(gs.size() + params.n, prompt.has_ids ? m->tok->Decode(ids) : prompt.text);
        GenerationRequest g = ToRequest(params, std::move(ids));
        for (int32_t id : m->tok->end_of_generation_ids()) g.stop_tokens.insert(id);
        AddSamples(params, g, &gs);
      }
    }
    GenerateChoices(res, *m, std::move(gs), params, false, echo);
  }

  json ModelObject(const BatchEngine& e) const {
    return {{"id", s.options_.model_id},
            {"object", "model"},
            {"created", static_cast<int64_t>(std::time(nullptr))},
            {"owned_by", "dpl"},
            {"meta", {{"n_vocab", e.n_vocab()}, {"n_ctx", e.n_ctx()}, {"n_slots", e.n_slots()}}}};
  }

  void Models(HttpResponder& res) {
    std::optional<Served> m = Model(res);
    if (!m) return;
    Reply(res, 200, {{"object", "list"}, {"data", json::array({ModelObject(m->scheduler->engine())})}});
  }

  // GET /v1/models/{id}: the served model under the id /v1/models lists.
  void ModelById(const HttpRequest& req, HttpResponder& res) {
    std::optional<Served> m = Model(res);
    if (!m) return;
    const std::string id = req.path.substr(req.path.rfind('/') + 1);
    if (id != s.options_.model_id) {
      return ReplyError(res, absl::NotFoundError(absl::StrCat("the model '", id, "' does not exist; this server serves '",
                                                              s.options_.model_id, "'")));
    }
    Reply(res, 200, ModelObject(m->scheduler->engine()));
  }

  // llama-server's /props, the fields front-ends read: the context, the
  // sampling defaults, the slots, the model file.
  void Props(HttpResponder& res) {
    std::optional<Served> m = Model(res);
    if (!m) return;
    const BatchEngine& e = m->scheduler->engine();
    const SamplerParams d;
    Reply(res, 200,
          {{"default_generation_settings",
            {{"n_ctx", e.n_ctx()},
             {"params", {{"temperature", d.temperature}, {"top_k", d.top_k}, {"top_p", d.top_p},
                         {"min_p", d.min_p}, {"repeat_penalty", d.repeat_penalty},
                         {"repeat_last_n", d.repeat_last_n}, {"presence_penalty", d.presence_penalty},
                         {"frequency_penalty", d.frequency_penalty}, {"n_predict", -1}}}}},
           {"total_slots", e.n_slots()},
           {"model_path", s.options_.model_path},
           {"modalities", {{"vision", false}, {"audio", false}}}});
  }

  // llama-server's /slots: each slot's context and whether a request holds it.
  void Slots(HttpResponder& res) {
    std::optional<Served> m = Model(res);
    if (!m) return;
    const std::vector<bool> busy = m->scheduler->SlotsBusy();
    json slots = json::array();
    for (size_t i = 0; i < busy.size(); ++i) {
      slots.push_back({{"id", i}, {"n_ctx", m->scheduler->engine().n_ctx()}, {"is_processing", bool(busy[i])}});
    }
    Reply(res, 200, slots);
  }

  void Tokenize(const HttpRequest& req, HttpResponder& res) {
    std::optional<Served> m = Model(res);
    if (!m) return;
    // JSON escapes a byte in at most 6 ("\u0000"): a larger body cannot
    // hold an acceptable text, and is refused before it is parsed.
    if (req.body.size() > 6 * kMaxTokenizeBytes + 4096) {
      return Reply(res, 413, ErrorJson(413, absl::StrCat("the body is ", req.body.size(), " bytes; /tokenize takes at most ",
                                                         kMaxTokenizeBytes >> 20, " MiB of text")));
    }
    CpuGate::Pass pass(&cpu);
    auto r = ParseTokenizeRequest(req.body);
    if (!r.ok()) return ReplyError(res, r.status());
    if (r->first.size() > kMaxTokenizeBytes) {
      return Reply(res, 413, ErrorJson(413, absl::StrCat("'content' is ", r->first.size(), " bytes; /tokenize takes at most ",
                                                         kMaxTokenizeBytes >> 20, " MiB")));
    }
    const std::vector<int32_t> ids =
        m->tok->Encode(r->first, r->second && m->tok->adds_bos_by_default(), true);
    Reply(res, 200, {{"tokens", ids}});
  }

  void Detokenize(const HttpRequest& req, HttpResponder& res) {
    std::optional<Served> m = Model(res);
    if (!m) return;
    CpuGate::Pass pass(&cpu);
    auto ids = ParseDetokenizeRequest(req.body);
    if (!ids.ok()) return ReplyError(res, ids.status());
    if (ids->size() > kMaxDetokenizeIds) {
      return Reply(res, 413, ErrorJson(413, absl::StrCat("'tokens' holds ", ids->size(), " ids; /detokenize takes at most ",
                                                         kMaxDetokenizeIds)));
    }
    size_t bytes = 0;
    for (int32_t id : *ids) {
      if (id >= m->tok->n_vocab()) {
        return ReplyError(res, absl::InvalidArgumentError(absl::StrCat(
                                   "'tokens': id ", id, " is outside the vocabulary [0, ", m->tok->n_vocab(), ")")));
      }
      bytes += m->tok->TokenToPiece(id).size();
    }
    if (bytes > kMaxDetokenizeBytes) {
      return Reply(res, 413, ErrorJson(413, absl::StrCat("the text of these tokens is ", bytes,
                                                         " bytes; /detokenize answers at most ",
                                                         kMaxDetokenizeBytes >> 20, " MiB")));
    }
    Reply(res, 200, {{"content", m->tok->Decode(*ids)}});
  }

  void Health(HttpResponder& res) {
    if (Model(res)) Reply(res, 200, {{"status", "ok"}});
  }

  // Prometheus text, llama-server's metric names with "dpl_" for "llamacpp:"
  // (a ':' is for recording rules: `promtool check metrics` refuses it in an
  // exporter's names; tests/server_e2e_test runs it).
  void Metrics(HttpResponder& res) {
    std::optional<Served> m = Model(res);
    if (!m) return;
    const SchedulerMetrics x = m->scheduler->metrics();
    std::string out;
    // Every digit: counters as integers, the rest as doubles that read back
    // exactly (StrCat's six significant digits made 1234567 1.23457e+06,
    // and a rate() over it stalled).
    auto metric = [&out](const char* name, const char* type, const char* help, auto v) {
      const std::string value = std::is_integral_v<decltype(v)> ? absl::StrCat(v) : absl::StrFormat("%.17g", v);
      absl::StrAppend(&out, "# HELP dpl_", name, " ", help, "\n# TYPE dpl_", name, " ", type, "\ndpl_", name,
                      " ", value, "\n");
    };
    metric("prompt_tokens_total", "counter", "Prompt tokens processed.", x.prompt_tokens_total);
    metric("prompt_tokens_cached_total", "counter",
           "Prompt tokens taken from a cache instead (a slot's, or the KV pool's cached blocks).",
           x.prompt_tokens_cached_total);
    metric("prompt_tokens_copied_total", "counter",
           "Of the cached prompt tokens, those copied from another slot's cache (a shared start).",
           x.prompt_tokens_copied_total);
    metric("prompt_tokens_adopted_total", "counter",
           "Of the cached prompt tokens, those whose KV blocks the KV pool's prefix cache kept (a paged engine).",
           x.prompt_tokens_adopted_total);
    metric("tokens_predicted_total", "counter", "Generated tokens.", x.generated_tokens_total);
    metric("requests_total", "counter", "Requests accepted.", x.requests_total);
    metric("prompt_seconds_total", "counter", "Engine seconds spent on prompts.", x.prompt_seconds);
    metric("tokens_predicted_seconds_total", "counter", "Engine seconds spent on decode steps.",
           x.decode_seconds);
    metric("prompt_tokens_seconds", "gauge", "Average prompt throughput in tokens/s.",
           x.prompt_seconds > 0 ? x.prompt_tokens_total / x.prompt_seconds : 0);
    metric("predicted_tokens_seconds", "gauge", "Average decode throughput in tokens/s (all slots).",
           x.decode_seconds > 0 ? x.decode_tokens / x.decode_seconds : 0);
    metric("requests_processing", "gauge", "Requests holding a slot.", x.processing);
    metric("requests_deferred", "gauge", "Requests waiting for a slot.", x.deferred);
    metric("kv_cache_usage_ratio", "gauge", "KV-cache positions the running requests hold, of all slots'.",
           x.kv_positions_total > 0 ? static_cast<double>(x.kv_positions_used) / x.kv_positions_total : 0.0);
    metric("kv_cache_tokens", "gauge", "KV-cache positions the running requests hold.", x.kv_positions_used);
    metric("kv_blocks_used", "gauge", "KV pool blocks that slots hold (running requests and kept caches).",
           x.kv_blocks_used);
    metric("kv_blocks_capacity", "gauge", "KV pool blocks.", x.kv_blocks_total);
    metric("kv_blocks_cached", "gauge",
           "KV pool blocks in the prefix cache, held or evictable (a paged engine; 0 otherwise).",
           x.kv_blocks_cached);
    metric("preemptions_total", "counter", "Running requests sent back to the queue for KV blocks.",
           x.preemptions_total);
    auto histogram = [&out](const char* name, const char* help, const Histogram& h) {
      absl::StrAppend(&out, "# HELP dpl_", name, " ", help, "\n# TYPE dpl_", name, " histogram\n");
      int64_t cumulative = 0;
      for (size_t i = 0; i <= h.bounds.size(); ++i) {
        cumulative += h.counts[i];
        const std::string le = i < h.bounds.size() ? absl::StrFormat("%.17g", h.bounds[i]) : "+Inf";
        absl::StrAppend(&out, "dpl_", name, "_bucket{le=\"", le, "\"} ", cumulative, "\n");
      }
      absl::StrAppend(&out, "dpl_", name, "_sum ", absl::StrFormat("%.17g", h.sum), "\ndpl_", name, "_count ",
                      h.count, "\n");
    };
    histogram("time_to_first_token_seconds", "Seconds from a request's arrival to its first token.",
              x.time_to_first_token);
    histogram("time_per_output_token_seconds", "Seconds between a request's tokens.", x.time_per_output_token);
    histogram("e2e_request_latency_seconds", "Seconds from a request's arrival to its end.", x.request_latency);
    res.Send({200, "text/plain; version=0.0.4", {}, std::move(out)});
  }
};

namespace {

// The transport's limits with its worker count: every request that may wait
// on tokens (slots and queue) plus the CPU jobs and a few more, so a
// generation never waits for a worker that parsing holds.
HttpLimits WithWorkers(const ServerOptions& o, int cpu_jobs) {
  HttpLimits l = o.http;
  l.workers = std::min(4096, o.scheduler.max_queue + o.n_slots + cpu_jobs + 8);
  return l;
}

// Each job holds up to ~3x its body (the body, its JSON tree, the text or
// ids taken out): 4 of 16 MiB stay well under the 256 MiB a burst of large
// requests may cost, and chat-sized requests take a millisecond each.
int CpuJobs(const ServerOptions& o) {
  return o.cpu_jobs > 0 ? o.cpu_jobs : std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 2, 4);
}

}  // namespace

HttpServer::HttpServer(ServerOptions options)
    : options_(std::move(options)), http_(std::make_unique<HttpTransport>(WithWorkers(options_, CpuJobs(options_)))) {}

HttpServer::~HttpServer() {
  Stop();
  if (loader_.joinable()) loader_.join();
  std::shared_ptr<Scheduler> sched = scheduler();
  if (sched) sched->Shutdown();
}

std::shared_ptr<Scheduler> HttpServer::scheduler() const {
  absl::MutexLock lock(&mu_);
  return scheduler_;
}

absl::Status HttpServer::Bind() {
  auto h = std::make_shared<Handlers>(*this, CpuJobs(options_));
  http_->SetErrorBody([](const HttpError& e) { return Dump(ErrorJson(e.status, e.message)); });
  // Browser front-ends on other origins may call the API (llama-server and
  // vLLM allow any origin by default; the API key, when set, still guards it).
  http_->SetCorsOrigins(options_.cors_origins);
  http_->SetAuthorizer([this](const HttpRequest& req) -> std::optional<HttpError> {
    // The page asks for the key itself; /health is for load balancers.
    if (options_.api_key.empty() || req.path == "/health" || req.path == "/") return std::nullopt;
    const std::string auth = req.Header("Authorization");
    // The scheme is case-insensitive (RFC 9110: "bearer KEY" is as good).
    const size_t sp = auth.find(' ');
    if (sp != std::string::npos && absl::EqualsIgnoreCase(auth.substr(0, sp), "Bearer") &&
        absl::StripLeadingAsciiWhitespace(absl::string_view(auth).substr(sp)) == options_.api_key) {
      return std::nullopt;
    }
    return HttpError{401, auth.empty() ? "no API key: send Authorization: Bearer KEY" : "invalid API key"};
  });
  using M = HandlerMode;
  auto post = [this](const char* path, void (Handlers::*f)(const HttpRequest&, HttpResponder&),
                     std::shared_ptr<Handlers> h) {
    http_->Route("POST", path, M::kPooled, [h, f](const HttpRequest& req, HttpResponder& res) { ((*h).*f)(req, res); });
  };
  for (const char* path : {"/v1/chat/completions", "/chat/completions"}) post(path, &Handlers::Chat, h);
  for (const char* path : {"/v1/completions", "/completions"}) post(path, &Handlers::Completion, h);
  for (const char* path : {"/v1/responses", "/responses"}) post(path, &Handlers::Responses, h);
  post("/tokenize", &Handlers::Tokenize, h);
  post("/detokenize", &Handlers::Detokenize, h);
  // Answered on the I/O thread: no body, no waiting.
  auto get = [this, h](const char* path, void (Handlers::*f)(HttpResponder&)) {
    http_->Route("GET", path, M::kInline, [h, f](const HttpRequest&, HttpResponder& res) { ((*h).*f)(res); });
  };
  get("/v1/models", &Handlers::Models);
  get("/models", &Handlers::Models);
  for (const char* path : {"/v1/models/*", "/models/*"}) {
    http_->Route("GET", path, M::kInline, [h](const HttpRequest& req, HttpResponder& res) { h->ModelById(req, res); });
  }
  get("/props", &Handlers::Props);
  http_->Route("GET", "/", M::kInline, [](const HttpRequest&, HttpResponder& res) {
    res.Send({200, "text/html; charset=utf-8", {{"Cache-Control", "no-cache"}}, std::string(ChatPage())});
  });
  get("/slots", &Handlers::Slots);
  get("/health", &Handlers::Health);
  get("/metrics", &Handlers::Metrics);
  return http_->Bind(options_.host, options_.port);
}

void HttpServer::StartLoading(std::function<absl::StatusOr<ServedModel>()> load) {
  loader_ = std::thread([this, load = std::move(load)] {
    absl::StatusOr<ServedModel> m = load();
    {
      absl::MutexLock lock(&mu_);
      if (m.ok()) {
        if (stopping_) return;
        model_ = *std::move(m);
        scheduler_ = std::make_shared<Scheduler>(*model_.engine, *model_.tokenizer, options_.scheduler);
        return;
      }
      load_error_ = m.status();
      stopping_ = true;
    }
    http_->Stop(absl::Seconds(1));  // Serve returns the error
  });
}

absl::Status HttpServer::Serve() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return load_error_;
  }
  http_->Serve();
  absl::MutexLock lock(&mu_);
  return load_error_;
}

void HttpServer::Stop() {
  std::shared_ptr<Scheduler> sched;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    sched = scheduler_;
  }
  // No new requests; then every open stream gets its end (an error chunk,
  // then [DONE]) and writes it before the connections close.
  http_->StopAccepting();
  if (sched) sched->Shutdown();
  http_->Stop(absl::Seconds(2));
}

}  // namespace dpl::server
