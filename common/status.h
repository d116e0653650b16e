// Status helpers on absl::Status, shared by every Pacer module.
//
// Pacer reports errors as absl::Status / absl::StatusOr across module boundaries, never as
// exceptions (see docs/style.md §3). Codes carry meaning:
//   UNAVAILABLE          transient; the caller retries with backoff
//   FAILED_PRECONDITION  stale fencing token, lease ended, wrong state; retrying the same call is useless
//   INVALID_ARGUMENT     malformed input; names the field
//   NOT_FOUND            unknown dataset / worker / lease / checkpoint
//   DATA_LOSS            corrupt journal or snapshot
//   UNAUTHENTICATED / PERMISSION_DENIED  missing token / wrong role
#pragma once

#include <grpcpp/support/status.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define PACER_CONCAT_INNER_(a, b) a##b
#define PACER_CONCAT_(a, b) PACER_CONCAT_INNER_(a, b)

// Returns from the enclosing function if `expr` (an absl::Status) is not OK.
#define RETURN_IF_ERROR(expr)                         \
  do {                                                \
    ::absl::Status pacer_status_ = (expr);            \
    if (!pacer_status_.ok()) return pacer_status_;    \
  } while (0)

// ASSIGN_OR_RETURN(lhs, expr): evaluates an absl::StatusOr<T>; returns its status on error,
// otherwise moves the value into `lhs` (which may be a declaration).
#define ASSIGN_OR_RETURN(lhs, expr) \
  PACER_ASSIGN_OR_RETURN_IMPL_(PACER_CONCAT_(pacer_statusor_, __LINE__), lhs, expr)
#define PACER_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return tmp.status();                \
  lhs = std::move(tmp).value()

namespace pacer {

// absl::StatusCode and grpc::StatusCode share their numeric values (both follow
// google.rpc.Code), so conversion keeps the code and the message.
inline grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

inline absl::Status FromGrpcStatus(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

// Prefixes the message of a non-OK status with context ("journal: ..."), keeping its code.
inline absl::Status Annotate(const absl::Status& s, std::string_view context) {
  if (s.ok()) return s;
  return absl::Status(s.code(), std::string(context) + ": " + std::string(s.message()));
}

}  // namespace pacer
