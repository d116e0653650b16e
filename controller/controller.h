// Controller: runs the operator's policy on a ClusterView, passes every proposal through the
// safety layer, audits every decision and returns the actions to dispatch.
//
// One Reconcile(view), in order:
//  1. validate the view;
//  2. measure: for each executed action older than rollback.evaluate_after_s without a
//     measurement (a batch plan also only once the job ran rollback.evaluate_after_steps steps
//     past its effective step: before that the throughput is the old plan's), measured gain = job throughput now / throughput when it acted − 1; when a
//     reversible action (ADJUST_BS, EXCLUDE_WORKERS) fell short of
//     min_fraction_of_predicted × its predicted gain and is still in force, issue its rollback
//     (restores the plan / exclusion in force before it). REALLOCATE's gain is the epoch tail,
//     which an async job's throughput does not show: it is measured but never rolled back on
//     that (JudgedByThroughput in controller.cc); the policy's hysteresis keeps it current;
//  3. run the policy (a pure function, policies/policy.h) on (view, history, config);
//  4. review each proposal with the SafetyGate (safety_gate.h); before it, a batch plan that
//     leaves out a worker of the plan in force which only went quiet (not alive, not
//     restarting) less than adjust_batch.member_grace_s ago is vetoed — such a plan is
//     "mandatory" (membership changed) and the gate would wave it through, yet a synchronous
//     job whose worker paused (or whose ranks reach the end of the data one after another)
//     still has that worker in its collective: this is how a "3 → 1 workers" plan was made
//     at the end of a run;
//  5. audit every proposal — executed, dry-run or vetoed (identical repeats fold into one
//     record) — and, for executed ones, update the history (plan / allocation in force, node
//     incidents for bad-node memory);
//  6. return the executed actions, with their audit ids, for the caller to dispatch.
// In dry_run nothing but the audit log changes: no plan, allocation, cooldown or incident.
//
// The caller owns dispatch: ADJUST_BS plans go to workers in heartbeat replies (switch at
// plan.effective_step), REALLOCATE to the sharding service's allocation, RESTART / MIGRATE /
// server actions to node agents. The caller also owns time: view.now_ms is the clock.
//
// Owns its PolicyConfig and History. Thread-compatible: pacerd calls it from one reconcile
// thread (or under its mutex); it does no I/O and never blocks.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "controller/action.h"
#include "controller/cluster_view.h"
#include "controller/history.h"
#include "controller/policies/policy.h"
#include "controller/policy_config.h"
#include "controller/safety_gate.h"

namespace pacer {

struct ReconcileResult {
  std::vector<Action> dispatch;  // executed actions (rollbacks first), Action::id set
  std::vector<uint64_t> audit_ids;  // records written or folded into by this reconcile
};

class Controller {
 public:
  // INVALID_ARGUMENT when `config` fails ValidatePolicyConfig, NOT_FOUND for an unknown policy.
  static absl::StatusOr<std::unique_ptr<Controller>> Create(const PolicyConfig& config);

  // INVALID_ARGUMENT when the view is malformed (nothing changes then).
  absl::StatusOr<ReconcileResult> Reconcile(const ClusterView& view);

  // Hot reload: validates `config` first; on error the running policy stays in force.
  // Audited as a kPolicy record at `now_ms`.
  absl::Status ApplyPolicy(const PolicyConfig& config, int64_t now_ms);

  const PolicyConfig& policy() const { return config_; }
  const History& history() const { return history_; }
  // Durability only (pacerd's ControllerStore): restoring after a restart, taking the changes.
  History* mutable_history() { return &history_; }

 private:
  Controller(const PolicyConfig& config, DecideFn decide) : config_(config), decide_(decide) {}

  void MeasureAndRollBack(const ClusterView& view, const std::string& inputs,
                          ReconcileResult& result);
  void Execute(Action action, const ClusterView& view, const std::string& inputs,
               ReconcileResult& result);
  // Step 4's membership check (member_grace_s); quiet_since_ms_ is updated first.
  void NoteQuietWorkers(const ClusterView& view);
  SafetyVerdict KeepsQuietMembers(const Action& action, const ClusterView& view) const;

  PolicyConfig config_;
  DecideFn decide_;
  History history_;
  // Worker id → when it was first seen quiet (in the view, not alive, not restarting). Not
  // durable: after a restart of pacerd the grace counts from the first view it sees, which
  // only delays a plan without the worker.
  std::map<std::string, int64_t> quiet_since_ms_;
};

// One line summarising what a decision saw (live workers, B, throughput, flagged workers).
std::string SummarizeView(const ClusterView& view);

}  // namespace pacer
