// ControllerMetrics: what the controller decided and what it achieved, as Prometheus series,
// declared once in PACER_CONTROLLER_METRICS (common/metrics.h; docs/metrics.md is generated
// from the list).
//
// Publish() reads the reconciler's public views -- the newest kMaxAuditScanned audit records,
// the plan in force, the exclusion, the run -- and updates the series; pacerd calls it on its
// housekeeping tick, after reconciling. A record is counted once in actions_total{kind,outcome}
// (its folded repeats -- identical vetoes, dry-runs -- too, as they grow); more than
// kMaxAuditScanned new records between two ticks would go uncounted (the rate limits of every
// policy keep it far below). Thread-compatible: one caller (the housekeeping thread).
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "common/metrics.h"
#include "controller/reconciler.h"
#include "controller/sources.h"

#define PACER_CONTROLLER_METRICS(X)                                                              \
  X(actions, Counter, "pacer_controller_actions_total",                                          \
    "Controller decisions by kind (ADJUST_BS, REALLOCATE, RESTART, MIGRATE, RESTART_SERVER, "   \
    "RELIEVE_SERVER, EXCLUDE_WORKERS, POLICY) and outcome (executed, dry-run, vetoed, policy)", \
    "kind", "outcome")                                                                          \
  X(rollbacks, Counter, "pacer_controller_rollbacks_total",                                      \
    "Executed actions rolled back because their measured gain fell short", "kind")             \
  X(plan_version, Gauge, "pacer_controller_plan_version",                                        \
    "Version of the batch plan in force (0: none)")                                             \
  X(plan_batch, Gauge, "pacer_controller_plan_worker_batch_samples",                             \
    "Local batch the plan in force gives each worker (only workers of a plan)", "worker")      \
  X(predicted_gain, Gauge, "pacer_controller_last_predicted_gain_ratio",                         \
    "Predicted gain (fraction of job throughput) of the newest measured executed action")      \
  X(measured_gain, Gauge, "pacer_controller_last_measured_gain_ratio",                           \
    "Measured gain (fraction of job throughput) of the newest measured executed action")       \
  X(excluded_workers, Gauge, "pacer_controller_excluded_workers",                                \
    "Workers whose gradients the job does not wait for (EXCLUDE_WORKERS in force)")             \
  X(exclusion_version, Gauge, "pacer_controller_exclusion_version",                              \
    "Audit id of the decision that set the exclusion in force (0: never)")                      \
  X(dry_run, Gauge, "pacer_controller_dry_run", "1 while the policy only records what it would do") \
  X(run_generation, Gauge, "pacer_controller_run_generation",                                    \
    "The job's current run (1, 2, ...; 0 before any worker)")                                   \
  X(job_step, Gauge, "pacer_controller_job_step", "The job's training step in the current run")

namespace pacer {

PACER_DECLARE_METRICS(ControllerMetricSeries, PACER_CONTROLLER_METRICS);

class ControllerMetrics {
 public:
  static constexpr uint32_t kMaxAuditScanned = 256;

  explicit ControllerMetrics(MetricsRegistry* registry);
  void Publish(const Reconciler& reconciler, SpeedSource& speeds);

 private:
  ControllerMetricSeries m_;
  std::map<uint64_t, int64_t> counted_;  // audit id -> occurrences counted (1 + repeats)
  std::map<uint64_t, bool> rolled_back_;  // audit id -> rollback counted
  std::map<std::string, bool> planned_;  // workers with a plan_batch series -> in the plan now
};

}  // namespace pacer
