// Authentication and roles for every Pacer RPC (docs/design.md §8).
//
// A job has two secrets: the job token (workers and agents) and the admin token (pacerctl and
// the controller's operators). Clients send `authorization: Bearer <token>` metadata; servers
// map it to a Role and refuse calls above it. Tokens are compared in constant time.
#pragma once

#include <grpcpp/grpcpp.h>

#include <map>
#include <string>

#include "absl/status/statusor.h"

namespace pacer {

enum class Role { kWorker = 1, kAdmin = 2 };

const char* RoleName(Role role);

class Authenticator {
 public:
  Authenticator(std::string job_token, std::string admin_token);

  // Maps the call's metadata to a role; UNAUTHENTICATED when the token is missing or wrong.
  absl::StatusOr<Role> Authenticate(
      const std::multimap<grpc::string_ref, grpc::string_ref>& metadata) const;

  // OK when the call carries a token of at least `required`; else UNAUTHENTICATED or
  // PERMISSION_DENIED with a message naming the role needed.
  absl::Status Require(const std::multimap<grpc::string_ref, grpc::string_ref>& metadata,
                       Role required) const;

 private:
  std::string job_token_;
  std::string admin_token_;
};

// Adds the bearer token to an outgoing call.
void AttachToken(grpc::ClientContext* context, const std::string& token);

// 32 random bytes as hex, from /dev/urandom.
std::string GenerateToken();

// Reads a token file (one line, trimmed); creates it with a fresh token and mode 0600 when
// it does not exist and `create` is true.
absl::StatusOr<std::string> LoadToken(const std::string& path, bool create);

}  // namespace pacer
