#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include "base/status_macros.h"

#include <memory>
#include <string>

#include "doctest/doctest.h"

namespace dpl {
namespace {

int calls = 0;

absl::Status Fail(absl::string_view why) {
  ++calls;
  return absl::InvalidArgumentError(why);
}

absl::StatusOr<std::unique_ptr<int>> MakeInt(int v) {
  ++calls;
  if (v < 0) return absl::OutOfRangeError("negative");
  return std::make_unique<int>(v);
}

absl::Status Propagate(bool fail) {
  DPL_RETURN_IF_ERROR(fail ? Fail("first") : absl::OkStatus());
  return absl::NotFoundError("reached the end");
}

absl::StatusOr<int> Twice(int v) {
  DPL_ASSIGN_OR_RETURN(std::unique_ptr<int> p, MakeInt(v));  // a declaration, move-only
  std::unique_ptr<int> q;
  DPL_ASSIGN_OR_RETURN(q, MakeInt(2 * *p));  // an existing lvalue
  return *q;
}

absl::Status ReturnsStatusOrError() {
  DPL_RETURN_IF_ERROR(MakeInt(-5));
  return absl::OkStatus();
}

TEST_CASE("DPL_RETURN_IF_ERROR returns the first error and evaluates once") {
  calls = 0;
  const absl::Status s = Propagate(true);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(s.message() == "first");
  CHECK(calls == 1);
  CHECK(Propagate(false).code() == absl::StatusCode::kNotFound);
  CHECK(ReturnsStatusOrError().code() == absl::StatusCode::kOutOfRange);
}

TEST_CASE("DPL_ASSIGN_OR_RETURN moves the value out or returns the status") {
  const absl::StatusOr<int> ok = Twice(21);
  REQUIRE(ok.ok());
  CHECK(*ok == 42);
  const absl::StatusOr<int> bad = Twice(-1);
  CHECK(bad.status().code() == absl::StatusCode::kOutOfRange);
}

TEST_CASE("Annotate prefixes the message and keeps the code") {
  CHECK(Annotate(absl::OkStatus(), "ctx").ok());
  const absl::Status s = Annotate(absl::DataLossError("bad block"), "tensor 'x'");
  CHECK(s.code() == absl::StatusCode::kDataLoss);
  CHECK(s.message() == "tensor 'x': bad block");
}

}  // namespace
}  // namespace dpl
