// Reconciler: pacerd's control loop around the pure Controller.
//
// Owns the Controller (policy, history, audit) and what pacerd needs to act on its decisions:
// the batch plan command each worker should receive, the newest training step reported, and
// how each executed action was dispatched. Each MaybeReconcile():
//  1. builds a ClusterView from the monitor (speeds, classes, step-time models), the sharding
//     service (remaining samples, epoch progress) and the heartbeats (current step);
//  2. runs Controller::Reconcile (policy -> safety gate -> audit);
//  3. dispatches: ADJUST_BS -> a BatchPlanCommand per worker, delivered in that worker's next
//     heartbeat reply until the worker reports the plan's version; EXCLUDE_WORKERS -> an
//     ExclusionCommand in the heartbeat replies of workers that honor it (the job's view says
//     it can exclude only while every live worker does); REALLOCATE -> the sharding
//     service's SetAllocation / SetTailBackup; RESTART / MIGRATE / server actions -> the agent
//     dispatcher (when no agent is connected the audit record says so).
// It runs every `interval` and early after a monitor classification event.
//
// Thread-safe: one mutex; the heartbeat hook only reads a map under it. Sharding and agent
// calls happen outside the mutex.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "controller/controller.h"
#include "controller/controller_store.h"
#include "controller/run_tracker.h"
#include "monitor/monitor_service.h"
#include "proto/pacer/controller.pb.h"
#include "proto/pacer/sharding.pb.h"
#include "sharding_service/sharding_service.h"

namespace pacer {

struct ReconcilerOptions {
  JobMode mode = JobMode::kSync;
  int64_t interval_ms = 2'000;        // reconcile at least this often
  double heartbeat_interval_s = 1.0;  // how often workers pick up commands
  double restart_cost_s = 60;         // until agents measure it
  double migrate_cost_s = 0;          // 0: restart cost × policy factor
  // A worker not heard from for this long is gone from the current run (RunTracker); 0: five
  // heartbeat intervals, at least 2 s.
  int64_t run_gap_ms = 0;
};

// MonitorOptions with the policy's detection settings applied.
MonitorOptions MonitorOptionsFromPolicy(const DetectionConfig& detection, MonitorOptions base);

class Reconciler {
 public:
  // Executes RESTART / MIGRATE / server actions; returns what happened (for the audit).
  using AgentDispatcher = std::function<absl::StatusOr<std::string>(const Action&)>;

  Reconciler(std::unique_ptr<Controller> controller, MonitorServiceImpl* monitor,
             ShardingServiceImpl* sharding, const Clock* clock, ReconcilerOptions options);

  // Heartbeat hook (ShardingServiceImpl::SetHeartbeatHook): records the worker's step and adds
  // its batch plan command when the worker does not hold the current version yet.
  void OnHeartbeat(const HeartbeatRequest& req, HeartbeatResponse* resp);
  // Register hook (ShardingServiceImpl::SetRegisterHook): a worker process started. When it
  // begins a new run of the job (controller/run_tracker.h) the plan in force is withdrawn: no
  // command of the old run is sent again, the job's step is counted anew, the next plan gets a
  // higher version and an effective step in the new run; the audit trail says so.
  void OnRegister(const RegisterWorkerRequest& req);
  // The current run: generation (1, 2, ...; 0 before any worker) and the job's step in it.
  std::pair<uint64_t, int64_t> Run() const;
  // Asks for an early reconcile (monitor events).
  void Poke() { poked_ = true; }
  // Reconciles when the interval passed or it was poked. Returns whether it ran.
  bool MaybeReconcile();
  // Reconciles now (tests, the simulator of the whole loop).
  absl::Status ReconcileNow();

  void SetAgentDispatcher(AgentDispatcher dispatcher);
  // Makes the controller durable (controller_store.h): restores what `store` holds -- audit,
  // plan (re-sent to the workers), allocations, node incidents, and the policy applied before
  // the restart when pacerd runs with the same --policy text (`base_policy_yaml`) -- and
  // saves every decision before it is dispatched from now on. Call before serving.
  absl::Status AttachStore(std::unique_ptr<ControllerStore> store, const std::string& base_policy_yaml);
  // Called (under the reconciler's lock) with every policy about to come into force after
  // start -- applied, or restored by AttachStore -- before it does; an error refuses the policy
  // (the running one stays). pacerd passes the detection settings to the monitor.
  void SetPolicyListener(std::function<absl::Status(const PolicyConfig&)> listener) {
    absl::MutexLock l(&mu_);
    on_policy_ = std::move(listener);
  }
  absl::Status ApplyPolicy(const std::string& yaml, const std::string& file_name,
                           ApplyPolicyResponse* resp);
  // Records an operator's act in the audit trail (and persists it), e.g. pacerd started with
  // --accept-data-loss: `pacerctl actions` lists it as a POLICY record of policy "operator".
  void RecordOperatorEvent(const std::string& what);
  void ListActions(const ListActionsRequest& req, ListActionsResponse* resp) const;
  // A copy of the policy in force (pacerctl policy show).
  PolicyConfig Policy() const {
    absl::MutexLock l(&mu_);
    return controller_->policy();
  }
  // The command a worker would get now (tests).
  std::optional<BatchPlanCommand> PlanFor(const std::string& worker) const;
  // The exclusion in force: version (the audit id that set it; 0: never) and who (tests).
  std::pair<uint64_t, std::vector<std::string>> Exclusion() const;

 private:
  ClusterView BuildView() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DispatchPlan(const BatchPlan& plan) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A new run began (`why`): withdraws the plan in force and its commands.
  void StartRunLocked(const std::string& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RecordOperatorEventLocked(const std::string& what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void NoteDispatchLocked(uint64_t id, const std::string& note) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status ValidateAndNotify(const PolicyConfig& config) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Saves what changed (no-op without a store); on failure keeps it for the next call.
  void PersistLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Clock* clock_;
  MonitorServiceImpl* monitor_;
  ShardingServiceImpl* sharding_;
  const ReconcilerOptions options_;
  std::atomic<bool> poked_{false};

  mutable absl::Mutex mu_;
  std::unique_ptr<Controller> controller_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, BatchPlanCommand> plan_commands_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, std::string> dispatch_notes_ ABSL_GUARDED_BY(mu_);
  // EXCLUDE_WORKERS: who is excluded, under which version (the deciding audit id, durable and
  // increasing, so a restarted pacerd never sends a version below one a worker holds), and
  // whether each worker's last heartbeat said its trainer honors exclusion.
  std::set<std::string> excluded_ ABSL_GUARDED_BY(mu_);
  uint64_t exclusion_version_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, bool> honors_exclusion_ ABSL_GUARDED_BY(mu_);
  RunTracker runs_ ABSL_GUARDED_BY(mu_);
  uint64_t last_plan_version_ ABSL_GUARDED_BY(mu_) = 0;  // newest plan version ever dispatched
  int64_t last_reconcile_ms_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_command_id_ ABSL_GUARDED_BY(mu_) = 1;
  AgentDispatcher agents_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<ControllerStore> store_ ABSL_GUARDED_BY(mu_);
  History::Changes unsaved_ ABSL_GUARDED_BY(mu_);
  std::string base_policy_digest_ ABSL_GUARDED_BY(mu_);
  std::function<absl::Status(const PolicyConfig&)> on_policy_ ABSL_GUARDED_BY(mu_);
};

// Digest of a policy file's text (which --policy a stored applied policy replaced).
std::string PolicyDigest(const std::string& yaml);

}  // namespace pacer
