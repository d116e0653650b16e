// Authentication, identities and roles for every Pacer RPC (docs/security.md).
//
// A job has two secrets: the job token (held by launchers: pacer-agent, a launch script, pacer-ps)
// and the admin token (pacerctl and the controller's operators). The job token also *mints*
// per-process credentials — `pacer-cred-v1:<kind>:<id>:<mac>`, mac = HMAC-SHA256 under the job
// token of the kind and id — which pacer-agent hands to each worker it launches instead of the job
// token. A credential binds its holder to one id: a worker credential acts only as its worker, an
// agent credential speaks only for its node, and only a chief credential (global rank 0), the job
// token or the admin token may save or restore checkpoints or open the rendezvous group. Clients
// send `authorization: Bearer <token or credential>` metadata; servers map it to a Principal.
// Secrets and MACs are compared in constant time.
#pragma once

#include <grpcpp/grpcpp.h>

#include <map>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace pacer {

enum class Role { kWorker = 1, kAdmin = 2 };

const char* RoleName(Role role);

// What a credential may be minted for.
enum class CredentialKind { kWorker, kChief, kAgent, kServer };

const char* CredentialKindName(CredentialKind kind);
absl::StatusOr<CredentialKind> ParseCredentialKind(std::string_view name);

// `pacer-cred-v1:<kind>:<id>:<64 hex digits>`. INVALID_ARGUMENT when the job token or id is empty
// or the id holds a newline.
absl::StatusOr<std::string> MintCredential(const std::string& job_token, CredentialKind kind,
                                           const std::string& id);
// True when `token` has the credential form (whatever its MAC).
bool IsCredential(std::string_view token);

// Who is calling, as established by the call's token.
struct Principal {
  enum class Kind { kAdmin, kLauncher, kWorker, kChief, kAgent, kServer };
  Kind kind = Kind::kWorker;
  std::string id;  // the credential's id; empty for the admin and the job token (launcher)

  bool admin() const { return kind == Kind::kAdmin; }
  // Admin and launcher may act for any worker, node or server.
  bool unrestricted() const { return kind == Kind::kAdmin || kind == Kind::kLauncher; }
  bool MayActAsWorker(std::string_view worker_id) const;
  bool MaySpeakForNode(std::string_view node) const;
  // Save / restore checkpoints, open the rendezvous group (fix its world size).
  bool chief() const { return unrestricted() || kind == Kind::kChief; }
  // The calls of a training process that name no worker (register a dataset, the list calls,
  // the rendezvous store): a worker or chief credential, or a token. An agent credential only
  // speaks for its node, and a server credential calls nothing on pacerd (pacer-ps needs no
  // pacerd call).
  bool worker_side() const { return unrestricted() || kind == Kind::kWorker || kind == Kind::kChief; }
  std::string Describe() const;  // "worker credential for 'w1'", "the job token", ...
};

class Authenticator {
 public:
  Authenticator(std::string job_token, std::string admin_token);

  using Metadata = std::multimap<grpc::string_ref, grpc::string_ref>;

  // Maps the call's metadata to a role; UNAUTHENTICATED when the token is missing or wrong.
  // Every credential maps to kWorker (pacer-ps, which only tells the job's callers from others;
  // pacerd's services use the Require* calls below, which tell the kinds apart).
  absl::StatusOr<Role> Authenticate(const Metadata& metadata) const;
  // Maps the call's metadata to a principal; UNAUTHENTICATED when the token or credential is
  // missing, malformed or not minted under this job's token.
  absl::StatusOr<Principal> Identify(const Metadata& metadata) const;
  absl::StatusOr<Principal> IdentifyToken(std::string_view token) const;

  // OK when the caller may act as `worker_id`; PERMISSION_DENIED naming both ids otherwise.
  // `what` names the call in the message ("fetch shard").
  absl::Status RequireWorker(const Metadata& metadata, std::string_view worker_id,
                             std::string_view what) const;
  // OK when the caller may speak for `node` (an agent credential for it, the job or admin token).
  absl::Status RequireNode(const Metadata& metadata, std::string_view node,
                           std::string_view what) const;
  // OK for a chief credential, the job token or the admin token.
  absl::Status RequireChief(const Metadata& metadata, std::string_view what) const;
  // OK for a worker or chief credential (Principal::worker_side), the job token or the admin
  // token; PERMISSION_DENIED naming the credential otherwise.
  absl::Status RequireWorkerSide(const Metadata& metadata, std::string_view what) const;
  // OK for the job token or the admin token (a launcher or an operator), not a credential.
  absl::Status RequireToken(const Metadata& metadata, std::string_view what) const;

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
