// dpl-server's HTTP/1.1 transport: connections, their limits and deadlines,
// request bodies and responses (whole or streamed), knowing nothing of the
// API it carries (http_server.cc wires the OpenAI endpoints onto it).
//
// Built on Boost.Beast (parsing, serialization) over Asio, event-driven: ONE
// I/O thread owns every socket, so a connection that is slow to send its
// request costs a few kilobytes and a timer, never a thread (cpp-httplib's
// thread per connection let 76 trickling clients starve /health; issue 28,
// docs/PERF.md "The server under hostile clients"). A complete request runs
// its handler either on the I/O thread (kInline: quick, never blocking:
// /health, /metrics) or on a fixed pool of worker threads (kPooled: parsing,
// tokenizing, waiting for tokens), where a handler may block, e.g. on a
// streamed write until the client has taken the bytes.
//
// What a request goes through, in order, each refusal a JSON error body
// (SetErrorBody) and, where the request is not read whole, a closed
// connection:
//   headers: within header_timeout of their first byte (408), at most
//     max_header_bytes and max_header_fields (431), parseable (400);
//   Authorizer (e.g. 401), route (404; wrong method 405), Expect other than
//     100-continue (417), multipart or an unknown Content-Encoding (415), a
//     POST without a length (411), a declared length over max_body_bytes
//     (413, before any "100 Continue");
//   body: within body_timeout of the headers (408), at most max_body_bytes
//     (413), valid chunking (400); bodies over kFreeBodyBytes draw on
//     body_budget_bytes, shared by all connections (503 when it is spent;
//     a declared length is taken whole once a body passes kFreeBodyBytes,
//     a chunked body as it grows);
//   pooled: a free worker (503 when all are busy), then the body decoded
//     (gzip, deflate: 400 when it is not what it claims, 413 past
//     max_body_bytes) and the handler.
// Responses go out in request order (pipelined requests wait their turn);
// HTTP/1.0 clients get streams delimited by the connection's close. While a
// handler runs, the socket is watched: a client that goes away fires
// HttpResponder::OnDisconnect at once.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace dpl::server {

// The defaults and why: OpenAI clients send a dozen headers in well under
// 2 KiB (64 KiB and 100 fields leave room for proxies' additions; nginx
// allows 4 x 8 KiB); a prompt must fit a slot's context, which no sane one
// fills with 16 MiB of text; 64 MiB of large bodies at once, with the CPU
// gate's parses, kept the hostile probe's peak at +103-114 MiB of resident
// memory (128 MiB: +171; docs/PERF.md).
struct HttpLimits {
  size_t max_header_bytes = 64 << 10;   // request line and header fields
  int max_header_fields = 100;
  size_t max_body_bytes = 16 << 20;     // as sent, and again as decoded
  size_t body_budget_bytes = 64u << 20;  // body bytes held at once past each one's kFreeBodyBytes
  absl::Duration header_timeout = absl::Seconds(10);  // from the request's first byte
  absl::Duration body_timeout = absl::Seconds(30);    // from the end of its headers
  absl::Duration idle_timeout = absl::Seconds(5);     // keep-alive: for a next request's first byte
  absl::Duration write_timeout = absl::Seconds(30);   // one write to a client that does not read
  // At the limit a new connection closes the one that has waited longest
  // for a request's headers or body (a slow client); with none, it is closed.
  int max_connections = 1024;
  int workers = 8;                      // threads for kPooled handlers
};

// A body up to this size needs none of HttpLimits::body_budget_bytes, so
// ordinary requests go through even while large ones have spent it.
inline constexpr size_t kFreeBodyBytes = 64 << 10;

struct HttpRequest {
  std::string method;
  std::string target;  // as sent
  std::string path;    // the target without its query
  int version = 11;    // 10 for HTTP/1.0
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;    // decoded (kPooled handlers only)

  // The first field of that name (case-insensitive), "" when absent.
  std::string Header(absl::string_view name) const;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;  // whole responses only
};

// A refusal: the status and what the client is told (through the error body).
struct HttpError {
  int status;
  std::string message;
};

class HttpTransport;

// A handler's way back to its client. Thread-safe. kInline handlers may only
// Send; kPooled ones may stream: StartStream, Write..., EndStream, each
// write blocking until the client has the bytes or is gone.
class HttpResponder {
 public:
  ~HttpResponder();
  HttpResponder(const HttpResponder&) = delete;
  HttpResponder& operator=(const HttpResponder&) = delete;

  void Send(HttpResponse response);
  // False when the client is gone (or stopped reading for write_timeout, or
  // the server is stopping); the stream then ends there.
  bool StartStream(HttpResponse head);
  bool Write(std::string data);
  void EndStream();
  // `f` runs once, on the I/O thread, when the client disconnects before the
  // response is complete; at once if it already has. It must not block.
  void OnDisconnect(std::function<void()> f);

  struct Exchange;  // shared with the connection (http_transport.cc)
  explicit HttpResponder(std::shared_ptr<Exchange> exchange);

 private:
  std::shared_ptr<Exchange> ex_;
};

enum class HandlerMode { kInline, kPooled };
using HttpHandler = std::function<void(const HttpRequest&, HttpResponder&)>;

class HttpTransport {
 public:
  explicit HttpTransport(HttpLimits limits);
  ~HttpTransport();  // Stop(), if Serve ran

  // Before Bind. The JSON body of every refusal the transport makes itself.
  void SetErrorBody(std::function<std::string(const HttpError&)> f);
  // Before Bind. Runs on the I/O thread with the request's headers (no body
  // read yet); an error is answered and the connection closed. Unset: all pass.
  void SetAuthorizer(std::function<std::optional<HttpError>(const HttpRequest&)> f);
  // Before Bind. Non-empty: cross-origin requests from browsers (CORS) from
  // these origins ("*": any). A response to an allowed Origin carries
  // Access-Control-Allow-Origin ("*", or the origin itself with Vary:
  // Origin), and OPTIONS on any path is a preflight: 204 with the methods and
  // the headers asked for when the origin is allowed, 403 when not, before
  // the authorizer (a browser sends no Authorization with it).
  void SetCorsOrigins(std::vector<std::string> origins);
  // Before Bind. `path` exact, or ending in "/*": every path under that
  // prefix with one more non-empty segment (/v1/models/* takes
  // /v1/models/ID; the handler reads ID from HttpRequest::path).
  void Route(absl::string_view method, absl::string_view path, HandlerMode mode, HttpHandler handler);

  // Errors: the address cannot be bound. port 0: any free port.
  absl::Status Bind(const std::string& host, int port);
  int port() const;
  // Runs the I/O thread's loop on the calling thread until Stop.
  void Serve();
  // No new connections; connections between requests or still sending one
  // are closed; running handlers go on. Returns at once; idempotent.
  void StopAccepting();
  // StopAccepting, then waits up to `grace` for running handlers to finish,
  // closes every connection (a handler still writing sees its client gone),
  // waits for the handlers and ends Serve. Idempotent.
  void Stop(absl::Duration grace);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// The body as sent with Content-Encoding `encoding` ("", identity, gzip,
// x-gzip, deflate), decoded. Errors: InvalidArgument (not that encoding),
// ResourceExhausted (more than max_bytes decoded), Unimplemented (another
// encoding). Exposed for tests.
absl::Status DecodeBody(absl::string_view encoding, size_t max_bytes, std::string* body);

}  // namespace dpl::server
