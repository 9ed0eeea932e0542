// The transport in process: body decoding (gzip and deflate decoded, bombs
// stopped at the limit, bodies that are not what they claim refused, other
// encodings named); handlers that throw answer 500 and the server goes on;
// a streamed response arrives whole; CORS preflights and headers; a client
// that leaves fires OnDisconnect while its handler waits. (Every hostile-client case runs end
// to end in tests/server_hostile_test.)
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <arpa/inet.h>
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zlib.h>

#include <atomic>
#include <stdexcept>
#include <string>
#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "runtime/server/http_transport.h"

namespace dpl::server {
namespace {

// `text` compressed; gzip adds 16 to zlib's window bits.
std::string Compress(const std::string& text, bool gzip) {
  z_stream z{};
  REQUIRE(deflateInit2(&z, Z_BEST_COMPRESSION, Z_DEFLATED, 15 + (gzip ? 16 : 0), 8, Z_DEFAULT_STRATEGY) == Z_OK);
  std::string out(deflateBound(&z, text.size()), '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(text.data()));
  z.avail_in = static_cast<uInt>(text.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  REQUIRE(deflate(&z, Z_FINISH) == Z_STREAM_END);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

TEST_CASE("gzip and deflate bodies decode; identity passes") {
  const std::string text = R"({"content": "Hello world"})";
  for (const char* enc : {"gzip", "x-gzip", " GZIP "}) {
    std::string body = Compress(text, true);
    REQUIRE(DecodeBody(enc, 1 << 20, &body).ok());
    CHECK(body == text);
  }
  std::string body = Compress(text, false);
  REQUIRE(DecodeBody("deflate", 1 << 20, &body).ok());
  CHECK(body == text);
  for (const char* enc : {"", "identity"}) {
    body = text;
    REQUIRE(DecodeBody(enc, 1 << 20, &body).ok());
    CHECK(body == text);
  }
}

TEST_CASE("bombs, lies and unknown encodings") {
  std::string bomb = Compress(std::string(32 << 20, ' '), true);
  CHECK(bomb.size() < (64 << 10));
  const absl::Status big = DecodeBody("gzip", 16 << 20, &bomb);
  CHECK(big.code() == absl::StatusCode::kResourceExhausted);
  CHECK(big.message() == "the body decodes to more than 16 MiB");

  std::string plain = R"({"content": "x"})";
  CHECK(DecodeBody("gzip", 1 << 20, &plain).message() == "the body is not valid gzip data");
  CHECK(plain == R"({"content": "x"})");  // untouched
  std::string cut = Compress(std::string(4096, 'a') + "tail", true);
  cut.resize(cut.size() / 2);
  CHECK(DecodeBody("gzip", 1 << 20, &cut).code() == absl::StatusCode::kInvalidArgument);
  std::string trailing = Compress("x", true) + "junk";
  CHECK(DecodeBody("gzip", 1 << 20, &trailing).code() == absl::StatusCode::kInvalidArgument);

  std::string any = "x";
  const absl::Status br = DecodeBody("br", 1 << 20, &any);
  CHECK(br.code() == absl::StatusCode::kUnimplemented);
  CHECK(br.message() == "Content-Encoding 'br' is not supported (gzip, deflate or identity)");
}

// A connected client socket to 127.0.0.1:port.
int Connect(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  return fd;
}

// Sends `request` with Connection: close and returns all that comes back.
std::string RoundTrip(int port, const std::string& request) {
  const int fd = Connect(port);
  REQUIRE(send(fd, request.data(), request.size(), 0) == static_cast<ssize_t>(request.size()));
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = recv(fd, buf, sizeof(buf), 0)) > 0;) out.append(buf, n);
  close(fd);
  return out;
}

// A transport on a free loopback port, serving on its own thread.
struct Served {
  HttpTransport http;
  std::thread thread;
  explicit Served(const std::function<void(HttpTransport&)>& routes, HttpLimits limits = {}) : http(limits) {
    http.SetErrorBody([](const HttpError& e) { return "{\"error\":\"" + e.message + "\"}"; });
    routes(http);
    REQUIRE(http.Bind("127.0.0.1", 0).ok());
    thread = std::thread([this] { http.Serve(); });
  }
  ~Served() {
    http.Stop(absl::Seconds(1));
    thread.join();
  }
  int port() const { return http.port(); }
};

TEST_CASE("a handler that throws answers 500; the server goes on") {
  Served s([](HttpTransport& h) {
    h.Route("GET", "/inline", HandlerMode::kInline,
            [](const HttpRequest&, HttpResponder&) { throw std::runtime_error("inline boom"); });
    h.Route("POST", "/pooled", HandlerMode::kPooled,
            [](const HttpRequest&, HttpResponder&) { throw std::runtime_error("pooled boom"); });
    h.Route("GET", "/ok", HandlerMode::kInline,
            [](const HttpRequest&, HttpResponder& r) { r.Send({200, "text/plain", {}, "fine"}); });
  });
  std::string got = RoundTrip(s.port(), "GET /inline HTTP/1.1\r\nConnection: close\r\n\r\n");
  CHECK(got.rfind("HTTP/1.1 500", 0) == 0);
  CHECK(got.find("{\"error\":\"internal error: inline boom\"}") != std::string::npos);
  got = RoundTrip(s.port(), "POST /pooled HTTP/1.1\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}");
  CHECK(got.rfind("HTTP/1.1 500", 0) == 0);
  CHECK(got.find("internal error: pooled boom") != std::string::npos);
  got = RoundTrip(s.port(), "GET /ok HTTP/1.1\r\nConnection: close\r\n\r\n");
  CHECK(got.rfind("HTTP/1.1 200", 0) == 0);
  CHECK(got.substr(got.size() - 4) == "fine");
}

// CORS: with "*", every answer allows any origin (a streamed one and a
// refusal too) and OPTIONS on any path is a preflight answered before the
// authorizer; with a list, a listed origin is named back (Vary: Origin), an
// unlisted one gets no header and a 403 preflight; without CORS, OPTIONS is
// just another method (405 on a GET route) and no answer carries the header.
TEST_CASE("CORS: preflights pass the authorizer, answers carry the origin") {
  auto routes = [](bool cors) {
    return [cors](HttpTransport& h) {
      if (cors) h.SetCorsOrigins({"*"});
      h.SetAuthorizer([](const HttpRequest& req) -> std::optional<HttpError> {
        if (req.Header("Authorization") == "Bearer k") return std::nullopt;
        return HttpError{401, "no key"};
      });
      h.Route("GET", "/ok", HandlerMode::kInline,
              [](const HttpRequest&, HttpResponder& r) { r.Send({200, "text/plain", {}, "fine"}); });
      h.Route("POST", "/stream", HandlerMode::kPooled, [](const HttpRequest&, HttpResponder& r) {
        REQUIRE(r.StartStream({200, "text/event-stream", {}, ""}));
        CHECK(r.Write("x"));
        r.EndStream();
      });
    };
  };
  {
    Served s(routes(true));
    std::string got = RoundTrip(s.port(),
                                "OPTIONS /v1/anything HTTP/1.1\r\nOrigin: http://ui.example\r\n"
                                "Access-Control-Request-Method: POST\r\n"
                                "Access-Control-Request-Headers: authorization, content-type\r\n"
                                "Connection: close\r\n\r\n");
    CHECK(got.rfind("HTTP/1.1 204", 0) == 0);
    CHECK(got.find("Access-Control-Allow-Origin: *") != std::string::npos);
    CHECK(got.find("Access-Control-Allow-Methods: GET, POST, OPTIONS") != std::string::npos);
    CHECK(got.find("Access-Control-Allow-Headers: authorization, content-type") != std::string::npos);
    got = RoundTrip(s.port(), "GET /ok HTTP/1.1\r\nAuthorization: Bearer k\r\nConnection: close\r\n\r\n");
    CHECK(got.rfind("HTTP/1.1 200", 0) == 0);
    CHECK(got.find("Access-Control-Allow-Origin: *") != std::string::npos);
    got = RoundTrip(s.port(), "GET /ok HTTP/1.1\r\nConnection: close\r\n\r\n");  // refusals too
    CHECK(got.rfind("HTTP/1.1 401", 0) == 0);
    CHECK(got.find("Access-Control-Allow-Origin: *") != std::string::npos);
    got = RoundTrip(s.port(), "POST /stream HTTP/1.1\r\nAuthorization: Bearer k\r\nContent-Length: 0\r\n"
                              "Connection: close\r\n\r\n");
    CHECK(got.rfind("HTTP/1.1 200", 0) == 0);
    CHECK(got.find("Access-Control-Allow-Origin: *") != std::string::npos);
  }
  {
    Served s([](HttpTransport& h) {
      h.SetCorsOrigins({"http://a.example"});
      h.Route("GET", "/ok", HandlerMode::kInline,
              [](const HttpRequest&, HttpResponder& r) { r.Send({200, "text/plain", {}, "fine"}); });
    });
    std::string got = RoundTrip(s.port(), "GET /ok HTTP/1.1\r\nOrigin: http://a.example\r\nConnection: close\r\n\r\n");
    CHECK(got.find("Access-Control-Allow-Origin: http://a.example") != std::string::npos);
    CHECK(got.find("Vary: Origin") != std::string::npos);
    got = RoundTrip(s.port(), "GET /ok HTTP/1.1\r\nOrigin: http://b.example\r\nConnection: close\r\n\r\n");
    CHECK(got.rfind("HTTP/1.1 200", 0) == 0);
    CHECK(got.find("Access-Control-Allow-Origin") == std::string::npos);
    got = RoundTrip(s.port(), "OPTIONS /ok HTTP/1.1\r\nOrigin: http://b.example\r\nConnection: close\r\n\r\n");
    CHECK(got.rfind("HTTP/1.1 403", 0) == 0);
  }
  {  // A "/prefix/*" route takes one more segment, no less, no more.
    Served s([](HttpTransport& h) {
      h.Route("GET", "/p/*", HandlerMode::kInline,
              [](const HttpRequest& req, HttpResponder& r) { r.Send({200, "text/plain", {}, req.path}); });
    });
    std::string got = RoundTrip(s.port(), "GET /p/x HTTP/1.1\r\nConnection: close\r\n\r\n");
    CHECK(got.rfind("HTTP/1.1 200", 0) == 0);
    CHECK(got.substr(got.size() - 4) == "/p/x");
    CHECK(RoundTrip(s.port(), "GET /p/ HTTP/1.1\r\nConnection: close\r\n\r\n").rfind("HTTP/1.1 404", 0) == 0);
    CHECK(RoundTrip(s.port(), "GET /p/x/y HTTP/1.1\r\nConnection: close\r\n\r\n").rfind("HTTP/1.1 404", 0) == 0);
    CHECK(RoundTrip(s.port(), "GET /p HTTP/1.1\r\nConnection: close\r\n\r\n").rfind("HTTP/1.1 404", 0) == 0);
  }
  {
    Served s(routes(false));
    std::string got = RoundTrip(s.port(), "OPTIONS /ok HTTP/1.1\r\nAuthorization: Bearer k\r\nConnection: close\r\n\r\n");
    CHECK(got.rfind("HTTP/1.1 405", 0) == 0);
    got = RoundTrip(s.port(), "GET /ok HTTP/1.1\r\nAuthorization: Bearer k\r\nConnection: close\r\n\r\n");
    CHECK(got.rfind("HTTP/1.1 200", 0) == 0);
    CHECK(got.find("Access-Control-Allow-Origin") == std::string::npos);
  }
}

TEST_CASE("a streamed response arrives whole, chunked; a handler with no answer is a 500") {
  Served s([](HttpTransport& h) {
    h.Route("POST", "/stream", HandlerMode::kPooled, [](const HttpRequest& req, HttpResponder& r) {
      REQUIRE(r.StartStream({200, "text/event-stream", {{"Cache-Control", "no-cache"}}, ""}));
      for (const char* piece : {"a", "", "bc", "def"}) CHECK(r.Write(piece));
      CHECK(r.Write(req.body));
      r.EndStream();
    });
    h.Route("POST", "/silent", HandlerMode::kPooled, [](const HttpRequest&, HttpResponder&) {});
  });
  const std::string got =
      RoundTrip(s.port(), "POST /stream HTTP/1.1\r\nContent-Length: 3\r\nConnection: close\r\n\r\nxyz");
  CHECK(got.find("Transfer-Encoding: chunked") != std::string::npos);
  CHECK(got.find("Cache-Control: no-cache") != std::string::npos);
  CHECK(got.substr(got.find("\r\n\r\n") + 4) == "1\r\na\r\n2\r\nbc\r\n3\r\ndef\r\n3\r\nxyz\r\n0\r\n\r\n");
  const std::string silent =
      RoundTrip(s.port(), "POST /silent HTTP/1.1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
  CHECK(silent.rfind("HTTP/1.1 500", 0) == 0);
}

// The body budget counts each body once as it grows: a 6 MiB body fits an
// 8 MiB budget (it briefly counted the old and the new reservation: 11 MiB
// near its end, a 503), a 10 MiB one does not.
TEST_CASE("the body budget holds a body once, and refuses past it") {
  HttpLimits limits;
  limits.body_budget_bytes = 8u << 20;
  Served s(
      [](HttpTransport& h) {
        h.Route("POST", "/size", HandlerMode::kPooled, [](const HttpRequest& req, HttpResponder& r) {
          r.Send({200, "text/plain", {}, std::to_string(req.body.size())});
        });
      },
      limits);
  auto post = [&s](size_t n) {
    return RoundTrip(s.port(), "POST /size HTTP/1.1\r\nConnection: close\r\nContent-Length: " + std::to_string(n) +
                                   "\r\n\r\n" + std::string(n, 'x'));
  };
  const std::string six = post(6u << 20);
  CHECK(six.rfind("HTTP/1.1 200", 0) == 0);
  CHECK(six.substr(six.size() - 7) == std::to_string(6u << 20));
  const std::string ten = post(10u << 20);
  CHECK(ten.rfind("HTTP/1.1 503", 0) == 0);
  CHECK(ten.find("MiB of request bodies already") != std::string::npos);
  CHECK(post(6u << 20).rfind("HTTP/1.1 200", 0) == 0);  // the refused one gave its part back
}

// Two bodies of declared length arriving interleaved against a budget that
// holds one: the first takes all it needs at once and is answered, the
// second is refused at once. (Taken a MiB at a time as they came, both held
// half the budget midway and both were refused.)
TEST_CASE("a body of declared length takes its whole share of the budget at once") {
  HttpLimits limits;
  limits.body_budget_bytes = 4u << 20;
  Served s(
      [](HttpTransport& h) {
        h.Route("POST", "/size", HandlerMode::kPooled, [](const HttpRequest& req, HttpResponder& r) {
          r.Send({200, "text/plain", {}, std::to_string(req.body.size())});
        });
      },
      limits);
  constexpr size_t kBody = 3u << 20, kPart = 3u << 19;  // each part 1.5 MiB
  const std::string head =
      "POST /size HTTP/1.1\r\nConnection: close\r\nContent-Length: " + std::to_string(kBody) + "\r\n\r\n";
  const std::string part(kPart, 'x');
  const int a = Connect(s.port()), b = Connect(s.port());
  auto send_all = [](int fd, const std::string& bytes) {  // a refused client's socket may be closed: no SIGPIPE
    size_t at = 0;
    for (ssize_t n; at < bytes.size() && (n = send(fd, bytes.data() + at, bytes.size() - at, MSG_NOSIGNAL)) > 0;) at += n;
  };
  auto settle = [] { absl::SleepFor(absl::Milliseconds(200)); };
  send_all(a, head + part);
  settle();
  send_all(b, head + part);
  settle();
  send_all(a, part);
  send_all(b, part);
  auto read_all = [](int fd) {
    std::string out;
    char buf[4096];
    for (ssize_t n; (n = recv(fd, buf, sizeof(buf), 0)) > 0;) out.append(buf, n);
    close(fd);
    return out;
  };
  const std::string got_a = read_all(a), got_b = read_all(b);
  CHECK_MESSAGE(got_a.rfind("HTTP/1.1 200", 0) == 0, got_a.substr(0, 200));
  CHECK(got_a.substr(got_a.size() - 7) == std::to_string(kBody));
  CHECK_MESSAGE(got_b.rfind("HTTP/1.1 503", 0) == 0, got_b.substr(0, 200));
}

TEST_CASE("a client that leaves fires OnDisconnect while its handler waits") {
  absl::Notification started, gone;
  std::atomic<bool> timed_out{false};
  Served s([&](HttpTransport& h) {
    h.Route("POST", "/wait", HandlerMode::kPooled, [&](const HttpRequest&, HttpResponder& r) {
      r.OnDisconnect([&gone] { gone.Notify(); });
      started.Notify();
      if (!gone.WaitForNotificationWithTimeout(absl::Seconds(10))) timed_out = true;
      r.Send({200, "text/plain", {}, "too late"});
    });
  });
  const int fd = Connect(s.port());
  const std::string req = "POST /wait HTTP/1.1\r\nContent-Length: 0\r\n\r\n";
  REQUIRE(send(fd, req.data(), req.size(), 0) == static_cast<ssize_t>(req.size()));
  REQUIRE(started.WaitForNotificationWithTimeout(absl::Seconds(10)));
  const absl::Time t0 = absl::Now();
  close(fd);
  CHECK(gone.WaitForNotificationWithTimeout(absl::Seconds(5)));
  CHECK(absl::Now() - t0 < absl::Seconds(1));
  CHECK(!timed_out);
}

}  // namespace
}  // namespace dpl::server
