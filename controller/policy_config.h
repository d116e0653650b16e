// PolicyConfig: an operator's policy file, parsed (see policy_loader.h and
// policies/policy.schema.json for the YAML form; field names match the YAML keys).
//
// Defaults here are the defaults of a file that omits a field. A PolicyConfig returned by
// LoadPolicy* has passed every range and cross-field check; one built in code should be passed
// through ValidatePolicyConfig() before use. Plain value type.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace pacer {

struct DetectionConfig {
  double straggler_threshold = 0.8;  // relative speed below → straggler
  double leader_threshold = 1.2;     // relative speed above → leader
  double window_s = 10;              // monitor window
  int64_t persistent_windows = 3;    // K: flagged in K of the last W windows → persistent
  int64_t history_windows = 5;       // W
  double min_confidence = 0.5;       // ignore classifications less sure than this
  // A window without a finished step of a worker whose running step (its heartbeat's) has run
  // longer than its last speed allows gets that bound as its speed (MonitorOptions).
  bool running_step_bound = false;
};

struct AdjustBatchConfig {
  bool enabled = true;
  bool accumulation = false;    // allow m_i × k_i when a memory cap is below a worker's share
  double hysteresis = 0.15;     // replan only when some worker's speed share drifted this much
  // ... and the new plan's predicted gain over the plan in force (on the same speeds) is at
  // least this: a plan that would change little is not worth a switch (no flip-flopping).
  double min_replan_gain = 0.05;
  // A worker of the plan in force that went quiet (not alive: no report for a while) keeps its
  // place this long before a plan is made without it: a pause (GC, checkpoint, a slow report
  // path, the end of the data on some ranks first) does not shrink a synchronous job's plan.
  double member_grace_s = 30;
  int64_t min_local_batch = 1;  // no live worker gets fewer samples per step
  int64_t lead_heartbeats = 3;  // effective step ≥ this many heartbeat intervals ahead
  int64_t min_steps_ahead = 2;  // and at least this many steps ahead
  bool use_last_window = false;  // plan from last_window_speed instead of the prediction (LB-BSP)
  // The AntDT presets (ProposeBatchPlan with detection): a worker is planned at its own speed
  // only when the mean of its recent steps differs from the job's median by more than this many
  // standard errors of that mean (controller/step_statistics.h); otherwise at the typical speed
  // moved by its steps' difference shrunk by how much of the job's spread is more than noise.
  // 0 = off (every unflagged worker at its own windowed speed, as before). Without step
  // timings nothing changes.
  double speed_significance = 3;
};

struct ReallocateConfig {
  bool enabled = true;
  bool tail_backups = true;           // turn tail backups on near the end of an epoch
  double tail_backup_progress = 0.9;  // "near the end" = this fraction of the epoch consumed
  double hysteresis = 0.15;           // reweight only when a weight drifted this much
};

struct RestartConfig {
  bool enabled = true;
  bool migrate = true;                  // may relaunch on another node
  double margin = 0.2;                  // time saved must exceed cost × (1 + margin)
  double migrate_cost_factor = 1.5;     // migrate cost = restart cost × this when not measured
  int64_t bad_node_threshold = 2;       // straggler incidents before a node is avoided
  double bad_node_ttl_s = 3600;         // a bad node is forgotten after this long
  bool restart_deterministic = false;   // also relaunch hardware-bound stragglers in place
};

struct ServerConfig {
  bool enabled = true;
  double hot_threshold = 1.5;  // relative latency above which a server is hot
  bool restart = true;         // restart a hot server (else only relieve: move its keys)
};

struct BackupWorkersConfig {
  int64_t count = 1;  // b in N+b: gradients of the slowest b are not waited for
};

// Sync jobs: a step does not wait for a worker caught in a short burst (policies with the
// burst rule: non-dedicated; see ProposeBurstExclusions in policies/action_rules.h).
struct BurstExclusionConfig {
  int64_t max_workers = 0;  // at most this many workers not waited for at once; 0 = off
  // ... or this share of the job's workers, when that is more (a 4 096-worker job has ~50
  // workers in a burst where a 128-worker one has 1 or 2: a count sized for one is wrong for
  // the other). 0: max_workers alone. BurstExclusionCap.
  double max_fraction = 0;
  // The step rule (controller/burst_detector.h), when per-step timings reach the controller
  // (Controller::ObserveSteps): a worker whose newest step took more than step_factor × the
  // median worker's step is not waited for, and is waited for again once its newest step (its
  // probe) is within rejoin_factor × the median. 0 = the window rule only (last window's
  // speeds, straggler_threshold), which also runs while no step timings arrive.
  double step_factor = 0;
  double rejoin_factor = 1.5;
  // The step rule's per-worker cooldown (instead of safety.cooldown_s): a worker is not
  // excluded again this soon after its last exclusion. 0 by default: the rule limits itself
  // (a worker is excluded only on a training step ≥ step_factor × the median and waited for
  // again only on a probe, one every ~2 s), and a burst it may not act on holds the whole job
  // at the burst's speed — a worker in a shared cluster is hit again within minutes.
  double cooldown_s = 0;
};

// The most workers the burst rules leave out at once in a job of `workers`: max_workers, or
// max_fraction of the workers when that is more; 0 (off) when max_workers is 0.
inline int64_t BurstExclusionCap(const BurstExclusionConfig& c, size_t workers) {
  if (c.max_workers <= 0) return 0;
  const double share = c.max_fraction * static_cast<double>(workers);
  return share > static_cast<double>(c.max_workers) ? static_cast<int64_t>(share) : c.max_workers;
}

struct TimeoutRelaunchConfig {
  double factor = 3.0;  // relaunch when a shard takes more than factor × typical
};

struct RollbackConfig {
  bool enabled = true;
  double evaluate_after_s = 30;           // measure the gain this long after acting ...
  int64_t evaluate_after_steps = 10;      // ... and (ADJUST_BS) once the plan ran this many steps
  double min_fraction_of_predicted = 0.5;  // roll back below this share of the predicted gain
};

struct SafetyConfig {
  double min_gain = 0.05;              // act only for a predicted gain ≥ this (fraction)
  double cooldown_s = 60;              // per (action kind, target)
  double adjust_batch_cooldown_s = 10;  // between two batch plans
  double window_s = 300;
  int64_t max_actions_per_window = 6;
  int64_t max_restarts_per_window = 2;  // worker relaunches per window; server restarts apart
  int64_t min_live_workers = 1;         // never take the job below this
  RollbackConfig rollback;
};

struct AuditConfig {
  int64_t max_records = 1000;  // oldest records are dropped beyond this
};

struct PolicyConfig {
  int64_t version = 1;              // format version; only 1 exists
  std::string name = "unnamed";     // free text shown in audits
  std::string policy = "none";      // decision function (see policies/policy_registry.h)
  bool dry_run = false;             // decide and audit, change nothing
  DetectionConfig detection;
  AdjustBatchConfig adjust_batch;
  ReallocateConfig reallocate;
  RestartConfig restart;
  ServerConfig server;
  BackupWorkersConfig backup_workers;
  BurstExclusionConfig burst_exclusion;
  TimeoutRelaunchConfig timeout_relaunch;
  SafetyConfig safety;
  AuditConfig audit;
};

// Checks ranges and cross-field rules (the same checks the loader runs). INVALID_ARGUMENT
// naming the field on failure.
absl::Status ValidatePolicyConfig(const PolicyConfig& config);

// The same check, giving the dotted path of the offending field apart (the loader turns it
// into a file line). `path` is empty when the config is valid.
struct PolicyConfigError {
  std::string path;
  absl::Status status;
};
PolicyConfigError FindPolicyConfigError(const PolicyConfig& config);

}  // namespace pacer
