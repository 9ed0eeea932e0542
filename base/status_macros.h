// The project's one pair of absl::Status propagation macros. Every function
// that returns absl::Status or absl::StatusOr<T> uses these instead of
// writing `if (!s.ok()) return s;` by hand.
//
//   DPL_RETURN_IF_ERROR(Parse(bytes));                 // returns the error, if any
//   DPL_ASSIGN_OR_RETURN(const Header h, ReadHeader()); // h = *statusor, or return
//   return dpl::Annotate(Load(path), "tensor 'x'");    // context in front of a message
#pragma once

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace dpl {

// The status of an absl::Status or absl::StatusOr<T>.
inline const absl::Status& StatusOf(const absl::Status& s) { return s; }
template <typename T>
const absl::Status& StatusOf(const absl::StatusOr<T>& s) {
  return s.status();
}

// The same error with `context` in front of its message ("context: message");
// OK stays OK.
inline absl::Status Annotate(const absl::Status& s, absl::string_view context) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(context, ": ", s.message()));
}

}  // namespace dpl

#define DPL_STATUS_CONCAT_INNER_(a, b) a##b
#define DPL_STATUS_CONCAT_(a, b) DPL_STATUS_CONCAT_INNER_(a, b)

// Evaluates `expr` (an absl::Status or absl::StatusOr<T>) once; returns its
// status from the enclosing function when it is not OK.
#define DPL_RETURN_IF_ERROR(expr)                                          \
  do {                                                                     \
    const auto& dpl_status_or_ = (expr);                                   \
    if (!::dpl::StatusOf(dpl_status_or_).ok()) {                           \
      return ::dpl::StatusOf(dpl_status_or_);                              \
    }                                                                      \
  } while (0)

// `lhs` is a declaration or an lvalue; `rexpr` an absl::StatusOr<T>. On OK,
// moves the value into lhs; otherwise returns the status.
#define DPL_ASSIGN_OR_RETURN(lhs, rexpr) \
  DPL_ASSIGN_OR_RETURN_IMPL_(DPL_STATUS_CONCAT_(dpl_statusor_, __LINE__), lhs, rexpr)

#define DPL_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                               \
  if (!statusor.ok()) return std::move(statusor).status(); \
  lhs = std::move(statusor).value()
