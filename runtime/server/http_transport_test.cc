// The transport's body decoding: gzip and deflate (zlib) bodies decoded,
// bombs stopped at the limit, bodies that are not what they claim refused,
// other encodings named. (The transport's connections are tested end to end
// by tests/server_hostile_test.)
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
#include <zlib.h>

#include <string>

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

}  // namespace
}  // namespace dpl::server
