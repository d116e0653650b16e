// What binds the ids in a request to the caller, beyond the credential's own id (docs/security.md,
// "A credential vouches for every id in a request").
//
// common/auth.h says who is calling: a worker, chief, agent or server credential for one id, or a
// token. A request often names more than that id — the node a worker registers on, the rank a
// worker joins the collective with, the incarnation it joins under — and a credential must vouch
// for those too. The rules below decide them from what pacerd knows of the job's workers
// (WorkerDirectory: their sharding registrations, which live agent lists them). The job and admin
// tokens act for any id and are not bound by them.
//
// Rules (each refusal names the credential and the id, never an incarnation or a fencing token):
//  1. Node claims: a worker that a live agent lists registers on that agent's node (or names no
//     node); UNAVAILABLE otherwise, which the SDK retries, so a worker restarted elsewhere while
//     its old agent is still thought alive gets through once that agent is lost or leaves. A
//     worker no live agent lists (launched by torchrun or a script) may name any node; the
//     monitor holds at most one node row of such a worker's making at a time (MonitorState), so
//     no worker can fill the node table.
//  2. Ranks: a worker or chief credential for `w<N>` (the w<RANK> ids pacer-agent gives its
//     workers) joins the rendezvous group at rank N only (PERMISSION_DENIED); rank -1 means N.
//     Other ids take any free rank, as before.
//  3. Incarnations: a worker credential joins the rendezvous group under its current sharding
//     registration's incarnation (FAILED_PRECONDITION), so it cannot move the generation on
//     (regroup everyone) by joining again under a made-up incarnation, and a replaced process
//     cannot join at all.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "common/auth.h"

namespace pacer {

// What pacerd knows of a worker that the rules need. pacerd implements it over its sharding
// service and agent registry (cmd/pacerd/pacerd_worker_directory.h). Thread-safe.
class WorkerDirectory {
 public:
  virtual ~WorkerDirectory() = default;

  struct Registration {
    uint64_t incarnation = 0;
    std::string node;  // as the worker registered it; may be empty
  };
  // The worker's current registration with the sharding service; nullopt when it has none.
  virtual std::optional<Registration> Registered(std::string_view worker_id) const = 0;
  // The node of the live agent (heard from within its timeout, not leaving) whose last heartbeat
  // lists the worker; nullopt when no live agent does.
  virtual std::optional<std::string> AgentNode(std::string_view worker_id) const = 0;
};

// Rule 1: OK when `caller` may register `worker_id` on `node`. `what` names the call.
absl::Status CheckNodeClaim(const Principal& caller, const WorkerDirectory& directory,
                            std::string_view worker_id, std::string_view node, std::string_view what);

// The N of a worker id `w<N>` (decimal, no leading zero, below 2^31); nullopt for other ids.
std::optional<int32_t> ConventionalRank(std::string_view worker_id);

// Rules 2 and 3 for a rendezvous Join of `worker_id` asking `rank` under `incarnation`: the rank
// the Join takes (the asked one, or N for `w<N>`), or why it is refused.
absl::StatusOr<int32_t> CheckJoin(const Principal& caller, const WorkerDirectory& directory,
                                  std::string_view worker_id, int32_t rank, uint64_t incarnation);

}  // namespace pacer
