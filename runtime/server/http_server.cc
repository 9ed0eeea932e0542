#include "runtime/server/http_server.h"

#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <random>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "runtime/server/openai_api.h"

namespace dpl::server {
namespace {

using nlohmann::json;

// Request bodies larger than this are refused (413): a prompt must fit a
// slot's context, which no sane context fills with 16 MiB of text.
constexpr size_t kMaxBodyBytes = 16u << 20;

void Reply(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(Dump(body), "application/json");
}

void ReplyError(httplib::Response& res, const absl::Status& s) { Reply(res, HttpStatus(s), ErrorJson(s)); }

std::string RandomId(absl::string_view prefix) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  return absl::StrFormat("%s%016x", prefix, rng());
}

uint64_t RandomSeed() {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  return rng();
}

}  // namespace

// Everything a handler needs once the model is in.
struct Served {
  std::shared_ptr<Scheduler> scheduler;
  const tokenizer::Tokenizer* tok;
  const tokenizer::ChatTemplate* chat;  // null: no vocabulary
};

struct HttpServer::Handlers {
  HttpServer& s;

  // The model, or 503 while it loads.
  std::optional<Served> Model(httplib::Response& res) {
    absl::MutexLock lock(&s.mu_);
    if (s.scheduler_ == nullptr) {
      ReplyError(res, absl::UnavailableError(s.stopping_ ? "the server is shutting down" : "Loading model"));
      return std::nullopt;
    }
    return Served{s.scheduler_, s.model_.tokenizer.get(),
                  s.model_.chat_template ? &*s.model_.chat_template : nullptr};
  }

  absl::Status CheckModel(const std::string& name) const {
    if (name.empty()) return absl::OkStatus();
    const auto& names = s.options_.model_names;
    if (std::find(names.begin(), names.end(), name) != names.end()) return absl::OkStatus();
    return absl::NotFoundError(absl::StrCat("the model '", name, "' does not exist; this server serves '",
                                            s.options_.model_id, "'"));
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
    return g;
  }

  // Streams or collects the answer of a submitted request.
  void Answer(httplib::Response& res, std::shared_ptr<RequestStream> stream, const GenerationParams& p,
              bool chat) {
    ResponseHead head{RandomId(chat ? "chatcmpl-" : "cmpl-"), static_cast<int64_t>(std::time(nullptr)),
                      s.options_.model_id};
    if (!p.stream) {
      std::string text;
      for (;;) {
        for (StreamEvent& e : stream->Wait(absl::Seconds(1))) {
          text += e.text;
          if (!e.final) continue;
          if (!e.error.ok()) return ReplyError(res, e.error);
          return Reply(res, 200,
                       chat ? ChatCompletionJson(head, text, e.finish, e.prompt_tokens, e.completion_tokens)
                            : CompletionJson(head, text, e.finish, e.prompt_tokens, e.completion_tokens));
        }
      }
    }
    struct State {
      std::shared_ptr<RequestStream> stream;
      ResponseHead head;
      bool chat, include_usage, first = true;
      std::atomic<int>* open;  // HttpServer::open_streams_, released below
    };
    s.open_streams_.fetch_add(1);
    auto st = std::make_shared<State>(
        State{std::move(stream), std::move(head), chat, p.include_usage, true, &s.open_streams_});
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [st](size_t, httplib::DataSink& sink) {
          auto send = [&](const json& j) {
            const std::string line = absl::StrCat("data: ", Dump(j), "\n\n");
            return sink.write(line.data(), line.size());
          };
          bool ok = true;
          if (st->first && st->chat) ok = send(ChatChunkJson(st->head, true, "", nullptr));
          st->first = false;
          std::vector<StreamEvent> events = st->stream->Wait(absl::Milliseconds(500));
          // Nothing to say for a while (queued, a long prompt): a comment
          // line, whose failed write tells that the client is gone.
          if (events.empty()) ok = ok && sink.write(": ping\n\n", 8);
          for (StreamEvent& e : events) {
            if (!ok) break;
            if (!e.text.empty()) {
              ok = send(st->chat ? ChatChunkJson(st->head, false, e.text, nullptr)
                                 : CompletionChunkJson(st->head, e.text, nullptr));
            }
            if (!e.final || !ok) continue;
            if (!e.error.ok()) {
              ok = send(ErrorJson(e.error));
            } else {
              ok = send(st->chat ? ChatChunkJson(st->head, false, "", &e.finish)
                                 : CompletionChunkJson(st->head, "", &e.finish));
              if (ok && st->include_usage) {
                ok = send(UsageChunkJson(st->head, st->chat, e.prompt_tokens, e.completion_tokens));
              }
            }
            if (ok) ok = sink.write("data: [DONE]\n\n", 14);
            if (ok) sink.done();
            return ok;
          }
          if (!ok) st->stream->Cancel();  // the client is gone: free the slot
          return ok;
        },
        [st](bool) {  // ended, finished or not: nothing more to generate
          st->stream->Cancel();
          st->open->fetch_sub(1);
        });
  }

  void Chat(const std::string& body, httplib::Response& res) {
    std::optional<Served> m = Model(res);
    if (!m) return;
    absl::StatusOr<ChatRequest> r = ParseChatRequest(body);
    if (!r.ok()) return ReplyError(res, r.status());
    if (absl::Status st = CheckModel(r->params.model); !st.ok()) return ReplyError(res, st);
    if (m->chat == nullptr) {
      return ReplyError(res, absl::FailedPreconditionError(
                                 "this model has no vocabulary: use /v1/completions with token ids"));
    }
    size_t bytes = 0;
    for (const auto& msg : r->messages) bytes += msg.content.size();
    if (absl::Status st = CheckTextFits(*m, bytes); !st.ok()) return ReplyError(res, st);
    absl::StatusOr<std::vector<int32_t>> ids = tokenizer::EncodeChat(*m->tok, *m->chat, r->messages, true);
    if (!ids.ok()) return ReplyError(res, absl::InvalidArgumentError(ids.status().message()));
    GenerationRequest g = ToRequest(r->params, *std::move(ids));
    for (int32_t id : m->chat->StopTokens(*m->tok)) g.stop_tokens.insert(id);
    absl::StatusOr<std::shared_ptr<RequestStream>> stream = m->scheduler->Submit(std::move(g));
    if (!stream.ok()) return ReplyError(res, stream.status());
    Answer(res, *std::move(stream), r->params, true);
  }

  void Completion(const std::string& body, httplib::Response& res) {
    std::optional<Served> m = Model(res);
    if (!m) return;
    absl::StatusOr<CompletionRequest> r = ParseCompletionRequest(body);
    if (!r.ok()) return ReplyError(res, r.status());
    if (absl::Status st = CheckModel(r->params.model); !st.ok()) return ReplyError(res, st);
    std::vector<int32_t> ids = r->prompt_ids;
    if (!r->has_ids) {
      if (!m->tok->has_vocab()) {
        return ReplyError(res, absl::FailedPreconditionError(
                                   "this model has no vocabulary: give the prompt as token ids"));
      }
      if (absl::Status st = CheckTextFits(*m, r->prompt_text.size()); !st.ok()) return ReplyError(res, st);
      ids = m->tok->Encode(r->prompt_text, m->tok->adds_bos_by_default(), true);
    }
    GenerationRequest g = ToRequest(r->params, std::move(ids));
    for (int32_t id : m->tok->end_of_generation_ids()) g.stop_tokens.insert(id);
    absl::StatusOr<std::shared_ptr<RequestStream>> stream = m->scheduler->Submit(std::move(g));
    if (!stream.ok()) return ReplyError(res, stream.status());
    Answer(res, *std::move(stream), r->params, false);
  }

  void Models(httplib::Response& res) {
    std::optional<Served> m = Model(res);
    if (!m) return;
    const BatchEngine& e = m->scheduler->engine();
    Reply(res, 200,
          {{"object", "list"},
           {"data", json::array({{{"id", s.options_.model_id},
                                  {"object", "model"},
                                  {"created", static_cast<int64_t>(std::time(nullptr))},
                                  {"owned_by", "dpl"},
                                  {"meta", {{"n_vocab", e.n_vocab()}, {"n_ctx", e.n_ctx()},
                                            {"n_slots", e.n_slots()}}}}})}});
  }

  void Tokenize(const std::string& body, httplib::Response& res) {
    std::optional<Served> m = Model(res);
    if (!m) return;
    auto r = ParseTokenizeRequest(body);
    if (!r.ok()) return ReplyError(res, r.status());
    const std::vector<int32_t> ids =
        m->tok->Encode(r->first, r->second && m->tok->adds_bos_by_default(), true);
    Reply(res, 200, {{"tokens", ids}});
  }

  void Detokenize(const std::string& body, httplib::Response& res) {
    std::optional<Served> m = Model(res);
    if (!m) return;
    auto ids = ParseDetokenizeRequest(body);
    if (!ids.ok()) return ReplyError(res, ids.status());
    for (int32_t id : *ids) {
      if (id >= m->tok->n_vocab()) {
        return ReplyError(res, absl::InvalidArgumentError(absl::StrCat(
                                   "'tokens': id ", id, " is outside the vocabulary [0, ", m->tok->n_vocab(), ")")));
      }
    }
    Reply(res, 200, {{"content", m->tok->Decode(*ids)}});
  }

  void Health(httplib::Response& res) {
    if (Model(res)) Reply(res, 200, {{"status", "ok"}});
  }

  // Prometheus text, llama-server's metric names with "dpl:" for "llamacpp:".
  void Metrics(httplib::Response& res) {
    std::optional<Served> m = Model(res);
    if (!m) return;
    const SchedulerMetrics x = m->scheduler->metrics();
    std::string out;
    auto metric = [&out](const char* name, const char* type, const char* help, double v) {
      absl::StrAppend(&out, "# HELP dpl:", name, " ", help, "\n# TYPE dpl:", name, " ", type, "\ndpl:", name,
                      " ", v, "\n");
    };
    metric("prompt_tokens_total", "counter", "Prompt tokens processed.", x.prompt_tokens_total);
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
    res.set_content(out, "text/plain; version=0.0.4");
  }
};

HttpServer::HttpServer(ServerOptions options)
    : options_(std::move(options)), http_(std::make_unique<httplib::Server>()) {}

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
  // One thread per open connection: every slot, the queue, and a few more for
  // /health and /metrics while all of them stream.
  const size_t threads = std::min<size_t>(
      4096, static_cast<size_t>(options_.scheduler.max_queue) + options_.n_slots + 8);
  http_->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  http_->set_payload_max_length(kMaxBodyBytes);
  http_->set_keep_alive_timeout(2);  // an idle connection delays shutdown at most this long

  auto h = std::make_shared<Handlers>(Handlers{*this});
  http_->set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (options_.api_key.empty() || req.path == "/health") return httplib::Server::HandlerResponse::Unhandled;
    const std::string auth = req.get_header_value("Authorization");
    if (auth != "Bearer " + options_.api_key) {
      ReplyError(res, absl::UnauthenticatedError(auth.empty() ? "no API key: send Authorization: Bearer KEY"
                                                              : "invalid API key"));
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  http_->set_error_handler(httplib::Server::HandlerWithResponse([](const httplib::Request& req,
                                                                  httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;  // ours already
    const absl::Status s =
        res.status == 404   ? absl::NotFoundError(absl::StrCat("no endpoint ", req.method, " ", req.path))
        : res.status == 413 ? absl::InvalidArgumentError("the request body is too large")
                            : absl::InvalidArgumentError(absl::StrCat("HTTP ", res.status));
    json body = ErrorJson(s);
    body["error"]["code"] = res.status;
    const int status = res.status;
    res.set_content(Dump(body), "application/json");
    res.status = status;
    return httplib::Server::HandlerResponse::Handled;
  }));
  http_->set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    ReplyError(res, absl::InternalError(absl::StrCat("internal error: ", what)));
  });
  // POST handlers read their body themselves: httplib would parse a body
  // sent as application/x-www-form-urlencoded (curl -d's default) as a form
  // and refuse it beyond 8 KiB.
  auto post = [this](const char* path, std::function<void(const std::string&, httplib::Response&)> f) {
    http_->Post(path, [f](const httplib::Request&, httplib::Response& res, const httplib::ContentReader& read) {
      std::string body;
      if (!read([&body](const char* data, size_t n) {
            body.append(data, n);
            return body.size() <= kMaxBodyBytes;
          })) {
        res.status = 413;
        return;  // the error handler writes the body
      }
      f(body, res);
    });
  };
  for (const char* path : {"/v1/chat/completions", "/chat/completions"}) {
    post(path, [h](const std::string& b, httplib::Response& r) { h->Chat(b, r); });
  }
  for (const char* path : {"/v1/completions", "/completions"}) {
    post(path, [h](const std::string& b, httplib::Response& r) { h->Completion(b, r); });
  }
  post("/tokenize", [h](const std::string& b, httplib::Response& r) { h->Tokenize(b, r); });
  post("/detokenize", [h](const std::string& b, httplib::Response& r) { h->Detokenize(b, r); });
  http_->Get("/v1/models", [h](const httplib::Request&, httplib::Response& r) { h->Models(r); });
  http_->Get("/models", [h](const httplib::Request&, httplib::Response& r) { h->Models(r); });
  http_->Get("/health", [h](const httplib::Request&, httplib::Response& r) { h->Health(r); });
  http_->Get("/metrics", [h](const httplib::Request&, httplib::Response& r) { h->Metrics(r); });

  if (options_.port == 0) {
    port_ = http_->bind_to_any_port(options_.host);
    if (port_ <= 0) return absl::UnavailableError(absl::StrCat("cannot listen on ", options_.host));
  } else if (!http_->bind_to_port(options_.host, options_.port)) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", options_.host, ":", options_.port,
                                               " (in use, or not an address of this machine)"));
  } else {
    port_ = options_.port;
  }
  return absl::OkStatus();
}

void HttpServer::StartLoading(std::function<absl::StatusOr<ServedModel>()> load) {
  loader_ = std::thread([this, load = std::move(load)] {
    absl::StatusOr<ServedModel> m = load();
    absl::MutexLock lock(&mu_);
    if (!m.ok()) {
      load_error_ = m.status();
      stopping_ = true;
      http_->stop();
      return;
    }
    if (stopping_) return;
    model_ = *std::move(m);
    scheduler_ = std::make_shared<Scheduler>(*model_.engine, *model_.tokenizer, options_.scheduler);
  });
}

absl::Status HttpServer::Serve() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return load_error_;
  }
  http_->listen_after_bind();
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
  // Every open stream gets its end (an error chunk, then [DONE]) and writes
  // it before httplib stops: stop() ends chunked writes where they are.
  if (sched) sched->Shutdown();
  for (int i = 0; i < 200 && open_streams_.load() > 0; ++i) absl::SleepFor(absl::Milliseconds(10));
  http_->stop();  // no new connections; new requests meanwhile got 503
}

}  // namespace dpl::server
