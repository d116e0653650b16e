#include "common/identity_rules.h"

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace pacer {
namespace {

// absl::StrCat takes absl::string_view, which is not std::string_view in every absl build.
absl::string_view A(std::string_view v) { return absl::string_view(v.data(), v.size()); }

}  // namespace

absl::Status CheckNodeClaim(const Principal& caller, const WorkerDirectory& directory,
                            std::string_view worker_id, std::string_view node, std::string_view what) {
  if (caller.unrestricted() || node.empty()) return absl::OkStatus();
  const std::optional<std::string> agent = directory.AgentNode(worker_id);
  if (!agent || *agent == node) return absl::OkStatus();
  // UNAVAILABLE, not PERMISSION_DENIED: the SDK retries it. A worker restarted on another node
  // while the agent of its old node is still thought alive (it crashed: lost after its timeout,
  // or it is leaving) is let through once that agent is lost or leaves, instead of exiting.
  return absl::UnavailableError(absl::StrCat(A(what), ": ", caller.Describe(), " cannot register worker '",
                                             A(worker_id), "' on node '", A(node), "': its agent runs on node '",
                                             *agent, "' (retry: a worker that moved is let through once that agent "
                                             "is lost or leaves)"));
}

std::optional<int32_t> ConventionalRank(std::string_view worker_id) {
  if (worker_id.size() < 2 || worker_id.size() > 11 || worker_id[0] != 'w') return std::nullopt;
  const std::string_view digits = worker_id.substr(1);
  if (digits.size() > 1 && digits[0] == '0') return std::nullopt;
  int64_t n = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return std::nullopt;
    n = n * 10 + (c - '0');
  }
  if (n > INT32_MAX) return std::nullopt;
  return static_cast<int32_t>(n);
}

absl::StatusOr<int32_t> CheckJoin(const Principal& caller, const WorkerDirectory& directory,
                                  std::string_view worker_id, int32_t rank, uint64_t incarnation) {
  if (caller.unrestricted()) return rank;
  if (const std::optional<int32_t> own = ConventionalRank(worker_id)) {
    if (rank != -1 && rank != *own) {
      return absl::PermissionDeniedError(absl::StrCat(
          "rendezvous join: ", caller.Describe(), " cannot take rank ", rank, ": a credential for '",
          A(worker_id), "' takes rank ", *own, " (pacer-agent names each worker w<RANK>)"));
    }
    rank = *own;
  }
  const std::optional<WorkerDirectory::Registration> registered = directory.Registered(worker_id);
  if (!registered) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rendezvous join: worker '", A(worker_id),
        "' is not registered: a Join carries the incarnation of the worker's sharding registration, "
        "register first"));
  }
  if (registered->incarnation != incarnation) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rendezvous join: the incarnation given is not that of worker '", A(worker_id),
        "''s current sharding registration (a replaced process?): register again, then join"));
  }
  return rank;
}

}  // namespace pacer
