// Action: one thing the controller decided to do, as a value.
//
// Policies return actions; the safety layer (SafetyGate) admits or vetoes them; the Controller
// records every one in the audit log and hands the admitted ones to whoever dispatches them
// (pacerd: ADJUST_BS → worker heartbeat replies, REALLOCATE → ShardingService allocation,
// RESTART / MIGRATE / server actions → node agents). Plain value type.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "controller/batch_plan.h"

namespace pacer {

enum class ActionKind {
  kAdjustBatch,     // ADJUST_BS: new per-worker batch plan (sync)
  kReallocate,      // REALLOCATE: per-worker shard weights / sizes, tail backups (async)
  kRestart,         // kill and relaunch a worker in place
  kMigrate,         // kill and relaunch a worker on another node
  kRestartServer,   // restart a hot parameter server
  kRelieveServer,   // move keys off a hot parameter server
  kExcludeWorkers,  // backup-workers baseline: do not wait for these workers' gradients
};

const char* ActionKindName(ActionKind kind);
// Inverse of ActionKindName; false for an unknown name.
bool ParseActionKind(const std::string& name, ActionKind* kind);

// Whether the action takes a worker or server offline for a while.
inline bool IsDisruptive(ActionKind kind) {
  return kind == ActionKind::kRestart || kind == ActionKind::kMigrate ||
         kind == ActionKind::kRestartServer;
}

struct WorkerAllocation {
  std::string worker_id;
  double weight = 1;       // share of the data relative to the mean worker (mean 1)
  double shard_scale = 1;  // fraction of the dataset's shard size this worker fetches (≤ 1)
};

struct Action {
  uint64_t id = 0;  // audit record id, set by the Controller when it records the action
  ActionKind kind = ActionKind::kAdjustBatch;
  std::string target;  // worker or server id; empty for job-wide actions
  std::string reason;  // one line, for the audit log
  double predicted_gain = 0;  // predicted fractional job throughput gain (0.1 = +10 %)
  bool mandatory = false;     // must happen whatever the gain (membership change, rollback)
  uint64_t rollback_of = 0;   // audit id of the action this one undoes; 0 = none

  std::optional<BatchPlan> plan;              // kAdjustBatch
  std::vector<WorkerAllocation> allocations;  // kReallocate
  std::optional<bool> tail_backups;           // kReallocate
  std::string node;                           // kRestart / kMigrate: the worker's node now
  std::vector<std::string> avoid_nodes;       // kMigrate: do not place it on these
  std::vector<std::string> excluded_workers;  // kExcludeWorkers (empty = wait for everyone)
  double cost_s = 0;   // cost model: job time a relaunch costs
  double saved_s = 0;  // cost model: job time it is expected to save
  // kRestart / kMigrate: the worker's speed relative to the median when decided (0: unknown).
  double relative_speed_before = 0;
};

}  // namespace pacer
