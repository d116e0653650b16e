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

#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "controller/action.h"
#include "controller/burst_detector.h"
#include "controller/cluster_view.h"
#include "controller/history.h"
#include "controller/policies/policy.h"
#include "controller/policy_config.h"
#include "controller/safety_gate.h"
#include "controller/step_statistics.h"

namespace pacer {

struct ReconcileResult {
  std::vector<Action> dispatch;  // executed actions (rollbacks first), Action::id set
  std::vector<uint64_t> audit_ids;  // records written or folded into by this reconcile
};

// Whether a controller running `config` reads per-step timings (Controller::ObserveSteps): the
// burst rule (non-dedicated with burst_exclusion.step_factor), or batch plans checked against
// step statistics (the AntDT presets with adjust_batch.speed_significance > 0). A driver that
// has to produce the timings (the simulator) asks this.
bool UsesStepTimings(const PolicyConfig& config);

class Controller {
 public:
  // INVALID_ARGUMENT when `config` fails ValidatePolicyConfig, NOT_FOUND for an unknown policy.
  static absl::StatusOr<std::unique_ptr<Controller>> Create(const PolicyConfig& config);

  // INVALID_ARGUMENT when the view is malformed (nothing changes then).
  absl::StatusOr<ReconcileResult> Reconcile(const ClusterView& view);

  // The step path of the burst rule (controller/burst_detector.h), between reconciles.
  // ObserveSteps: every per-step timing a worker's heartbeat carries (steps it finished since
  // its last heartbeat; an excluded worker's probes marked as such). Cheap: one map update per
  // timing. DecideBursts: once per heartbeat interval (~1 s), after that interval's timings;
  // returns the EXCLUDE_WORKERS actions to dispatch in the next heartbeat replies — a rejoin
  // (mandatory) and/or a new exclusion (through the SafetyGate, audited like any action).
  // It acts only while StepRuleActive(now): the policy manages exclusions (non-dedicated) with
  // burst_exclusion.step_factor > 0, the last reconciled view is a sync job whose workers can
  // carry exclusion out, and timings are fresh. While it is active, Reconcile() leaves
  // exclusions to it (the window rule proposes none, and exclusions are not judged by the
  // job's throughput: each one is re-judged per step by the rule itself). Until timings
  // arrive (a pacerd that does not feed them), the window rule runs as before. The same
  // timings feed the step statistics batch plans are checked against
  // (adjust_batch.speed_significance; UsesStepTimings above).
  void ObserveSteps(const std::vector<StepTiming>& timings);
  absl::StatusOr<ReconcileResult> DecideBursts(int64_t now_ms);
  // The timings one worker's heartbeat carries (HeartbeatRequest.step_timings: its newest
  // finished step and the step it is computing, with the time so far): to the burst rule only
  // (finished steps reach the step statistics once, through the monitor's step reports).
  // Returns whether they are news the rule acts on, so that pacerd decides (DecideBursts)
  // inside that heartbeat and its reply carries the decision: while StepRuleActive, the
  // worker's step is past step_factor × the median of the rule's last decision and it is
  // counted now, or it is excluded and back within the rejoin line. Cheap (no scan).
  bool ObserveHeartbeatSteps(const std::vector<StepTiming>& timings, int64_t now_ms);
  bool StepRuleActive(int64_t now_ms) const;
  // The step rule's entry line in compute seconds (step_factor × the median step of its last
  // decision; 0 before one): a step past it is a burst's. What a trainer-kept step deadline
  // is handed (StepLineS; the simulator: sim.trainer_deadline).
  double BurstStepLineS() const {
    return burst_median_s_ > 0 ? config_.burst_exclusion.step_factor * burst_median_s_ : 0;
  }
  // The line handed to `worker_id` in a heartbeat reply (HeartbeatResponse.step_line_s):
  // BurstStepLineS() while the rule acts on this worker -- the job is sync, its workers can be
  // excluded, the rule has decided once, the worker's own timing is fresh and it is not
  // excluded; 0 otherwise. O(excluded workers) plus one lookup: asked at every heartbeat.
  double StepLineS(const std::string& worker_id, int64_t now_ms) const;
  // A pacerd restart restored an exclusion in force (controller_store.h keeps who, the deciding
  // audit id, why and which rule). What it was decided on went with the old process -- the
  // workers' heartbeat facts (who honours exclusion), the monitor's windows, the step rule's
  // timings -- and comes back within a few heartbeats. Until then, for
  // max(BurstDetector::kMinFreshS, 2 detection windows) after `now_ms`, Reconcile proposes no
  // change to exclusions and judges none by throughput; the step rule, once it has fresh timings
  // and a view, decides as always. (Found when the first reconcile after a restart let a worker
  // still in its burst back in -- "a live worker cannot carry out an exclusion": no worker had
  // heartbeated the new process yet -- and the step rule excluded it again a moment later.)
  void HoldRestoredExclusion(int64_t now_ms);

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
  // Steps 4–6 of Reconcile for `proposals` (check_members: step 4's membership check).
  void ReviewAndExecute(std::vector<Action>& proposals, const ClusterView& view,
                        const std::string& inputs, bool check_members,
                        const SafetyConfig& safety, ReconcileResult& result);
  void Execute(Action action, const ClusterView& view, const std::string& inputs,
               ReconcileResult& result);
  // Step 4's membership check (member_grace_s); quiet_since_ms_ is updated first.
  void NoteQuietWorkers(const ClusterView& view);
  SafetyVerdict KeepsQuietMembers(const Action& action, const ClusterView& view) const;

  bool StepRuleConfigured() const;
  bool StepStatisticsConfigured() const;
  // Reconcile leaves exclusions alone: the step rule manages them (StepRuleActive), or a
  // restored one is held (HoldRestoredExclusion).
  bool ExclusionsLeftAlone(int64_t now_ms) const;
  int64_t restored_exclusion_held_until_ms_ = 0;

  PolicyConfig config_;
  DecideFn decide_;
  History history_;
  // The step path's inputs: the newest timing per worker, and what the last reconciled view
  // said about the job (mode, who is live, whether exclusion can be carried out). Not durable:
  // after a pacerd restart the rule waits for fresh timings and the next reconcile.
  BurstDetector bursts_;
  double burst_median_s_ = 0;  // the median step of the rule's last decision (0: none yet)
  // Per-worker step speed and its standard error (step_statistics.h), put in the view the
  // policy decides on (WorkerView::step_speed). Not durable: after a restart of pacerd a
  // worker's difference counts as shown only after two of its steps.
  StepStatistics step_stats_;
  // Sync jobs: (time, job step) at each reconcile, oldest first, at most kMaxStepSamples;
  // and the job step at which each executed action was decided. A gain is measured as the
  // step rate over at least rollback.evaluate_after_steps steps under the action against the
  // same number of steps before it (MeasuredGain). Not durable: after a pacerd restart the
  // actions decided before it are measured by the last window's throughput.
  struct StepSample {
    int64_t ms = 0;
    int64_t step = 0;
  };
  static constexpr size_t kMaxStepSamples = 8192;
  std::deque<StepSample> step_samples_;
  std::map<uint64_t, int64_t> decided_step_;
  bool RanLongEnough(const AuditRecord& r, const ClusterView& view) const;
  // A measured gain; with the job's step rates (steps per second) it compares when measured by
  // steps (0: measured by the last window's throughput).
  struct Measured {
    double gain = 0;
    double before_steps_per_s = 0, after_steps_per_s = 0;
  };
  std::optional<Measured> MeasuredGain(const AuditRecord& r, const ClusterView& view) const;
  bool last_view_ = false;
  ClusterView burst_view_;  // job facts and workers (id, alive, restarting) only
  absl::flat_hash_map<std::string, size_t> burst_index_;  // burst_view_.workers by id
  // Worker id → when it was first seen quiet (in the view, not alive, not restarting). Not
  // durable: after a restart of pacerd the grace counts from the first view it sees, which
  // only delays a plan without the worker.
  std::map<std::string, int64_t> quiet_since_ms_;
};

// One line summarising what a decision saw (live workers, B, throughput, flagged workers).
std::string SummarizeView(const ClusterView& view);

// The per-step burst rule's decisions (DecideBursts) are audited with inputs that start with
// this: the durable audit tells them apart from the window rule's (DecidedByStepRule).
inline constexpr char kStepRuleInputs[] = "step timings";
bool DecidedByStepRule(const AuditRecord& record);

}  // namespace pacer
