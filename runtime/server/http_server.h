// dpl-server's HTTP front-end (cpp-httplib): the OpenAI endpoints
// (/v1/chat/completions, /v1/completions, /v1/models) and llama-server's
// (/health, /tokenize, /detokenize, /metrics) over a Scheduler.
//
// It listens before the model is loaded: Bind, StartLoading (a background
// thread), Serve. Until the model is in, /health and every other endpoint
// answer 503 "Loading model". Stop (from a signal-watching thread, never a
// handler) stops accepting, ends every open stream and makes Serve return.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "runtime/server/batch_engine.h"
#include "runtime/server/scheduler.h"
#include "runtime/tokenizer/chat_template.h"
#include "runtime/tokenizer/tokenizer.h"

namespace httplib {
class Server;
}

namespace dpl::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;               // 0: any free port (port() says which)
  std::string api_key;           // non-empty: every endpoint but /health needs "Authorization: Bearer KEY"
  std::string model_id;          // what /v1/models reports
  std::vector<std::string> model_names;  // the "model" values accepted (besides none)
  int n_slots = 1;                // for the connection thread count
  SchedulerOptions scheduler;
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
  int port() const { return port_; }
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
  std::unique_ptr<httplib::Server> http_;
  int port_ = 0;
  std::thread loader_;

  mutable absl::Mutex mu_;
  ServedModel model_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<Scheduler> scheduler_ ABSL_GUARDED_BY(mu_);  // set once loaded
  absl::Status load_error_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Streaming responses not yet released by httplib: Stop waits for them to
  // write their end ([DONE]) before it stops httplib, which ends chunked
  // writes at once.
  std::atomic<int> open_streams_{0};
};

}  // namespace dpl::server
