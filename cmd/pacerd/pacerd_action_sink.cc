#include "cmd/pacerd/pacerd_action_sink.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"

namespace pacer {

absl::StatusOr<std::string> DispatchAgentAction(AgentRegistry& agents, const Action& a) {
  switch (a.kind) {
    case ActionKind::kRestart: {
      ASSIGN_OR_RETURN(std::string id, agents.RestartWorker(a.target));
      return "restart sent to the agent (command " + id + ")";
    }
    case ActionKind::kMigrate: {
      ASSIGN_OR_RETURN(std::string id, agents.Migrate(a.node, a.reason));
      return "the agent on " + a.node + " told to leave the node (command " + id + ")";
    }
    case ActionKind::kRestartServer: {
      // A parameter server runs under a pacer-agent like a worker (its process id is the server
      // id the workers report latency for); with --state-dir it keeps its rows across the restart.
      if (!agents.Worker(a.target).ok()) {
        return absl::NotFoundError("no agent supervises server " + a.target +
                                   " (run pacer-ps under pacer-agent --worker-id-prefix ps)");
      }
      ASSIGN_OR_RETURN(std::string id, agents.RestartWorker(a.target));
      return "server restart sent to the agent (command " + id + ")";
    }
    case ActionKind::kRelieveServer:
      return absl::FailedPreconditionError(
          "cannot relieve server " + a.target +
          ": pacer-ps has no re-sharding (keys cannot move between servers); use server.restart: true");
    default:
      return absl::UnimplementedError(std::string("no agent action for ") + ActionKindName(a.kind));
  }
}

absl::StatusOr<std::string> PacerdActionSink::Carry(const Action& a, const CarryContext& context) {
  absl::StatusOr<std::string> note = CarryHere(a, context);
  if (!then_ || !note.ok()) return note;
  absl::StatusOr<std::string> then = then_->Carry(a, context);
  if (!then.ok()) return then.status();
  return absl::StrCat(*note, "; ", *then);
}

absl::StatusOr<std::string> PacerdActionSink::CarryHere(const Action& a, const CarryContext& context) {
  switch (a.kind) {
    case ActionKind::kAdjustBatch:
      if (!a.plan) return std::string("no plan in the action: nothing sent");
      sessions_->SetPlan(*a.plan, a.reason);
      return std::string("plan sent in heartbeat replies");
    case ActionKind::kExcludeWorkers: {
      std::set<std::string> excluded(a.excluded_workers.begin(), a.excluded_workers.end());
      sessions_->SetExclusion(a.id, excluded, a.reason);
      return excluded.empty() ? std::string("sent in heartbeat replies: every worker counted")
                              : absl::StrCat("sent in heartbeat replies: excluded ",
                                             absl::StrJoin(excluded, ","));
    }
    case ActionKind::kReallocate:
      return Reallocate(a, context);
    default: {
      if (!agents_) return std::string("not dispatched: no agent registry");
      auto r = DispatchAgentAction(*agents_, a);
      return r.ok() ? *r : absl::StrCat("agent dispatch failed: ", r.status().message());
    }
  }
}

std::string PacerdActionSink::Reallocate(const Action& a, const CarryContext& context) {
  int failed = 0;
  for (const auto& al : a.allocations) {
    SetAllocationRequest req;
    req.mutable_allocation()->set_worker_id(al.worker_id);
    req.mutable_allocation()->set_weight(std::clamp(al.shard_scale, 0.01, 1000.0));
    SetAllocationResponse resp;
    if (!CallAndWait(*sharding_, &ShardingServiceImpl::SetAllocation, req, &resp).ok()) ++failed;
  }
  // A worker the previous allocation had and this one leaves out (a rollback to "no
  // allocation", a worker no longer live) goes back to the default (SetAllocationUpdate: weight
  // 1, no absolute shard size, no lease limit); one the sharding service no longer knows has
  // nothing to reset.
  for (const auto& before : context.allocation_before) {
    const bool kept = std::any_of(a.allocations.begin(), a.allocations.end(),
                                  [&](const WorkerAllocation& al) { return al.worker_id == before.worker_id; });
    if (kept) continue;
    SetAllocationRequest req;
    req.mutable_allocation()->set_worker_id(before.worker_id);
    req.mutable_allocation()->set_weight(1.0);
    SetAllocationResponse resp;
    absl::Status s = CallAndWait(*sharding_, &ShardingServiceImpl::SetAllocation, req, &resp);
    if (!s.ok() && !absl::IsNotFound(s)) ++failed;
  }
  if (a.tail_backups) {
    ListDatasetsResponse datasets;
    if (!CallAndWait(*sharding_, &ShardingServiceImpl::ListDatasets, ListDatasetsRequest(), &datasets).ok()) {
      ++failed;
    }
    for (const auto& d : datasets.datasets()) {
      SetTailBackupRequest req;
      req.set_dataset(d.spec().name());
      req.set_enabled(*a.tail_backups);
      SetTailBackupResponse resp;
      if (!CallAndWait(*sharding_, &ShardingServiceImpl::SetTailBackup, req, &resp).ok()) ++failed;
    }
  }
  return failed ? absl::StrCat("sharding allocation: ", failed, " calls failed")
                : "applied to the sharding service";
}

}  // namespace pacer
