// Reconciler: pacerd's control loop around the pure Controller.
//
// Owns the Controller (policy, history, audit), the run tracker and the controller store. Each
// ReconcileNow() is four named steps:
//  1. GatherInputs   (outside the lock) the monitor's statuses, the sharding service's dataset
//                    progress and lease facts, the workers' heartbeat reports (WorkerSessions),
//                    which workers the agents are restarting;
//  2. BuildClusterView (controller/view_builder.h, the same code the simulator runs) with the
//                    run's job facts;
//  3. Decide         Controller::Reconcile (policy -> safety gate -> audit): the History's
//                    ControllerUpdates are journaled under the lock (queued) and waited for
//                    outside it -- durable before anything is carried out, so a restarted
//                    pacerd knows every decision, and no heartbeat waits for an fsync;
//  4. CarryOut       (outside the lock) each executed action through the ActionSink, in order;
//                    its note goes in the audit trail (pacerd: cmd/pacerd/pacerd_action_sink.h).
// It runs every `interval` and early after a monitor classification event.
//
// Heartbeats: OnHeartbeat() only tracks the run's step (controller/run_tracker.h); the commands
// a reply carries are assembled by WorkerSessions (controller/worker_sessions.h).
//
// Thread-safe: one mutex, never held while calling the sharding service, the agents or the sink,
// nor while waiting for the journal.
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
#include "controller/action_sink.h"
#include "controller/run_tracker.h"
#include "controller/view_builder.h"
#include "controller/worker_sessions.h"
#include "controller/sources.h"
#include "proto/pacer/controller.pb.h"
#include "proto/pacer/sharding.pb.h"

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

// What the Reconciler reads (controller/sources.h; pacerd's adapters are in
// cmd/pacerd/reconciler_sources.h) and writes. `restarts` may be null (no node agents: nobody is
// ever restarting); all must outlive the Reconciler.
struct ReconcilerParts {
  SpeedSource* speeds = nullptr;
  LeaseSource* leases = nullptr;
  RestartSource* restarts = nullptr;
  WorkerSessions* sessions = nullptr;
  ActionSink* sink = nullptr;
};

class Reconciler {
 public:
  Reconciler(std::unique_ptr<Controller> controller, ReconcilerParts parts, const Clock* clock,
             ReconcilerOptions options);

  // A heartbeat arrived (before its reply's commands are assembled): records the worker's step;
  // a new run begins when it shows one (the plan in force is withdrawn). Returns whether the
  // worker's process is known to belong to the current run (RunTracker::InRun): the reply
  // carries the run's batch plan only then.
  // Then OnHeartbeatSteps(req).
  bool OnHeartbeat(const HeartbeatRequest& req);
  // The step timings a heartbeat carries (HeartbeatRequest.step_timings) go to the burst rule;
  // when they are news it acts on (Controller::ObserveHeartbeatSteps: the worker's step,
  // finished or still running, is past the entry line, or an excluded worker's probe is back
  // within the rejoin line) the rule decides here, and what it decides is journaled (waited
  // for outside the lock) and carried out before this returns, so this heartbeat's reply
  // carries the exclusion. `decide` false: the timings are only observed (the housekeeping
  // round decides; the differential test's pacerd plane, which decides on the model's grid).
  // Returns whether it decided.
  bool OnHeartbeatSteps(const HeartbeatRequest& req, bool decide = true);
  // The step line for the reply to `worker_id`'s heartbeat (HeartbeatResponse.step_line_s;
  // Controller::StepLineS): after OnHeartbeat, so that a worker that heartbeat excluded gets 0.
  double StepLineS(const std::string& worker_id) const;
  // A worker process registered (pacerd's worker-session service, after the sharding part). When it
  // begins a new run of the job (controller/run_tracker.h) the plan in force is withdrawn: no
  // command of the old run is sent again, the job's step is counted anew, the next plan gets a
  // higher version and an effective step in the new run; the audit trail says so. The monitor
  // forgets the last run's speeds (ForgetLastRunsSpeeds).
  void OnRegister(const RegisterWorkerRequest& req);
  // The current run: generation (1, 2, ...; 0 before any worker) and the job's step in it.
  std::pair<uint64_t, int64_t> Run() const;
  // The monitor's accepted step reports (pacerd: MonitorServiceImpl's step observer): each
  // becomes a StepTiming for the controller's per-step burst rule (controller/burst_detector.h),
  // stamped with its arrival time; a step of a worker excluded now is its probe.
  void OnAcceptedSteps(const std::vector<StepReport>& steps);
  // The burst rule's decision, once per heartbeat interval (housekeeping calls it every round):
  // an exclusion to make or end is carried out like any action (the next heartbeat replies
  // carry it). Returns whether it decided.
  bool MaybeDecideBursts();
  // The reconciler's clock (when a heartbeat reply leaves: WorkerSessions::ProbeStep).
  int64_t NowMs() const { return clock_->NowMs(); }
  // Asks for an early reconcile (monitor events).
  void Poke() { poked_ = true; }
  // Reconciles when the interval passed or it was poked. Returns whether it ran.
  bool MaybeReconcile();
  // Reconciles now: the four steps above.
  absl::Status ReconcileNow();
  // The view the controller would see now (pacerctl, tests): steps 1 and 2 only.
  absl::StatusOr<ClusterView> CurrentView();

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
  // The controller journal's totals and health (pacerd's journal metrics); nullopt without a
  // store.
  std::optional<std::pair<JournalStats, absl::Status>> JournalState() const {
    absl::MutexLock l(&mu_);
    if (!store_) return std::nullopt;
    return std::make_pair(store_->stats(), store_->health());
  }
  // A copy of the policy in force (pacerctl policy show).
  PolicyConfig Policy() const {
    absl::MutexLock l(&mu_);
    return controller_->policy();
  }
  // The command a worker would get now (tests).
  std::optional<BatchPlanCommand> PlanFor(const std::string& worker) const {
    return parts_.sessions->PlanFor(worker);
  }
  // The exclusion in force: version (the audit id that set it; 0: never) and who (tests).
  std::pair<uint64_t, std::vector<std::string>> Exclusion() const {
    return parts_.sessions->Exclusion();
  }

 private:
  // A StepReport's or a heartbeat step timing's StepTiming, stamped on arrival (reconciler.cc).
  template <typename Step>
  StepTiming ArrivedTiming(const std::string& worker, const Step& s, int64_t arrived_ms,
                           int64_t ended_ms) const;
  // Step 1: what the view is built from, besides the run's job facts.
  absl::StatusOr<ViewInputs> GatherInputs();
  // Step 4 for a batch of executed actions, in order, outside mu_; notes into the audit.
  void CarryOut(const std::vector<std::pair<Action, CarryContext>>& actions) ABSL_LOCKS_EXCLUDED(mu_);
  // Step 2's job facts (the run, plan versions, costs).
  void FillJobFactsLocked(ViewInputs* in) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A new run began (`why`): withdraws the plan in force and its commands.
  void StartRunLocked(const std::string& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // After a new run began (outside mu_): the monitor forgets the last run's speed windows and
  // classifications (MonitorState::ForgetWorkerHistories), so the first plan of the new run is
  // made on its own steps, not on the last run's straggler.
  void ForgetLastRunsSpeeds() ABSL_LOCKS_EXCLUDED(mu_);
  void RecordOperatorEventLocked(const std::string& what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void NoteDispatchLocked(uint64_t id, const std::string& note) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status ValidateAndNotify(const PolicyConfig& config) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Journaling (controller_store.h): what the History emitted and the outbox hold is appended
  // under mu_ (queued, no I/O) and waited for outside it, before anything is carried out.
  struct Pending {
    ControllerStore* store = nullptr;  // null: no store, nothing to wait for
    uint64_t seq = 0;
    absl::Status status;  // the append's failure
  };
  Pending AppendLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // OK once durable; the failure otherwise (logged, naming `what`).
  absl::Status WaitDurable(const Pending& pending, const char* what) ABSL_LOCKS_EXCLUDED(mu_);
  // After a failed journal write: the History, dispatch notes and outbox rebuilt from what the
  // journal holds (what was decided but not durable was never carried out). UNAVAILABLE when
  // the journal does not recover.
  absl::Status RecoverLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Clock* clock_;
  const ReconcilerParts parts_;
  const ReconcilerOptions options_;
  std::atomic<bool> poked_{false};

  mutable absl::Mutex mu_;
  std::unique_ptr<Controller> controller_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, std::string> dispatch_notes_ ABSL_GUARDED_BY(mu_);
  RunTracker runs_ ABSL_GUARDED_BY(mu_);
  uint64_t last_plan_version_ ABSL_GUARDED_BY(mu_) = 0;  // newest plan version ever dispatched
  int64_t last_reconcile_ms_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t last_burst_decision_ms_ ABSL_GUARDED_BY(mu_) = 0;
  std::unique_ptr<ControllerStore> store_ ABSL_GUARDED_BY(mu_);
  std::vector<ControllerUpdate> outbox_ ABSL_GUARDED_BY(mu_);  // dispatch notes, policies
  std::string base_policy_digest_ ABSL_GUARDED_BY(mu_);
  std::function<absl::Status(const PolicyConfig&)> on_policy_ ABSL_GUARDED_BY(mu_);
};

// Digest of a policy file's text (which --policy a stored applied policy replaced).
std::string PolicyDigest(const std::string& yaml);
// An action's payload in words (the plan, allocations, nodes): `pacerctl actions`' detail, and
// what the simulator's decisions are compared on (sim/control_plane.h).
std::string DescribeAction(const Action& a);

}  // namespace pacer
