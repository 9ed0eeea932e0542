// dpl-server's API: the OpenAI endpoints (/v1/chat/completions,
// /v1/completions, /v1/models) and llama-server's (/health, /tokenize,
// /detokenize, /metrics) over a Scheduler, carried by the HTTP transport
// (http_transport.h: connections, limits, deadlines).
//
// It listens before the model is loaded: Bind, StartLoading (a background
// thread), Serve. Until the model is in, /health and every other endpoint
// answer 503 "Loading model". Stop (from a signal-watching thread, never a
// handler) stops accepting, ends every open stream and makes Serve return.
//
// Work per request is bounded before it is done: a body's JSON by
// kMaxJsonDepth / kMaxJsonValues (openai_api.h), /tokenize by
// kMaxTokenizeBytes, /detokenize by kMaxDetokenizeIds and the text it would
// answer by kMaxDetokenizeBytes; parsing and tokenizing run at most
// ServerOptions::cpu_jobs at a time, so a burst of large requests queues
// instead of taking every core and its memory at once.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "runtime/server/batch_engine.h"
#include "runtime/server/http_transport.h"
#include "runtime/server/scheduler.h"
#include "runtime/tokenizer/chat_template.h"
#include "runtime/tokenizer/tokenizer.h"

namespace dpl::server {

inline constexpr size_t kMaxTokenizeBytes = 1 << 20;   // /tokenize text (413 beyond)
inline constexpr size_t kMaxDetokenizeIds = 1000000;   // /detokenize ids (413 beyond; under kMaxJsonValues)
inline constexpr size_t kMaxDetokenizeBytes = 16 << 20;  // the text /detokenize answers (413 beyond)

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;               // 0: any free port (port() says which)
  std::string api_key;           // non-empty: every endpoint but /health needs "Authorization: Bearer KEY"
  // What /v1/models and every answer's "model" report. A request may name any
  // model (or none): one process serves one model, and clients send their
  // own defaults ("gpt-4o-mini", "default"), as llama-server accepts them.
  std::string model_id;
  std::string model_path;  // what /props reports
  // Non-empty (--strict-model): the "model" values accepted (besides none);
  // any other is 404.
  std::vector<std::string> strict_model_names;
  // Origins browsers may call from (CORS; "*": any, the default as in
  // llama-server); empty (--no-cors): no CORS headers.
  std::vector<std::string> cors_origins = {"*"};
  int n_slots = 1;                // with scheduler.max_queue: the requests that may wait on tokens
  int cpu_jobs = 0;               // requests parsing or tokenizing at once (0: the cores, 2 to 4)
  bool content_specials = false;  // control-token texts in chat content act as tokens (ChatOptions)
  SchedulerOptions scheduler;
  HttpLimits http;                // workers: set by Bind from the above
};

// What loading produces.
struct ServedModel {
  std::unique_ptr<tokenizer::Tokenizer> tokenizer;
  std::optional<tokenizer::ChatTemplate> chat_template;  // absent: no vocabulary
  std::unique_ptr<BatchEngine> engine;
};

class HttpServer {
 public:
  explicit HttpServer(ServerOptions options);
  ~HttpServer();  // Stop(), then waits for the loader

  // Binds host:port. Errors: the address cannot be bound.
  absl::Status Bind();
  int port() const { return http_->port(); }
  // Runs `load` on a background thread; the model serves once it returns.
  // A failed load stops the server: Serve returns the error.
  void StartLoading(std::function<absl::StatusOr<ServedModel>()> load);
  // Serves until Stop() or a failed load.
  absl::Status Serve();
  void Stop();

 private:
  struct Handlers;
  std::shared_ptr<Scheduler> scheduler() const;

  const ServerOptions options_;
  std::unique_ptr<HttpTransport> http_;
  std::thread loader_;

  mutable absl::Mutex mu_;
  ServedModel model_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<Scheduler> scheduler_ ABSL_GUARDED_BY(mu_);  // set once loaded
  absl::Status load_error_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace dpl::server
