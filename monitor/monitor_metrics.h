// MonitorMetrics: the monitor's Prometheus series, declared once in PACER_MONITOR_METRICS
// (common/metrics.h explains the scheme; docs/metrics.md's tables are generated from it).
//
// Enum gauges carry the proto enum's number (docs/metrics.md lists the values):
//   class: 0 unknown, 1 normal, 2 straggler, 3 leader; scope: 0 none, 1 worker, 2 node,
//   3 server; cause: 0 unknown, 1 deterministic, 2 contention.
// The job gauges compare what the job does with what it could do: throughput is the sync job's
// samples per second (the workers' local batches over the median step wall time, as the
// controller judges plans), the balanced bound is Σ v_i, the sum of the live workers' speeds
// (what a perfectly balanced batch plan would reach). Live: reported within 3 windows of the
// newest report.
//
// Per-entity series are created on first publish and kept (the monitor never forgets a
// worker); the `worker` and `server` labels are capped at 4096 values (common/metrics.h).
// Thread-compatible: the service calls it under its mutex; the series are atomic for the scraper.
#pragma once

#include <string>
#include <vector>

#include "common/metrics.h"
#include "monitor/report_validator.h"
#include "proto/pacer/monitor.pb.h"

#define PACER_MONITOR_METRICS(X)                                                                \
  X(accepted, Counter, "pacer_monitor_reports_accepted_total",                                  \
    "Step, server-latency and node reports used by the monitor")                               \
  X(rejected, Counter, "pacer_monitor_reports_rejected_total",                                  \
    "Reports refused (or repaired: the clamped_* reasons) by reason", "reason")                \
  X(windows, Counter, "pacer_monitor_windows_closed_total", "Estimation windows closed")        \
  X(events, Counter, "pacer_monitor_events_total", "Classification changes emitted")            \
  X(median, Gauge, "pacer_monitor_job_median_speed_samples_per_second",                         \
    "Median worker speed in the last closed window")                                           \
  X(throughput, Gauge, "pacer_monitor_job_throughput_samples_per_second",                       \
    "The job's measured throughput: live workers' local batches / median step wall time")      \
  X(bound, Gauge, "pacer_monitor_job_balanced_bound_samples_per_second",                        \
    "The balanced bound: the sum of the live workers' speeds")                                 \
  X(live_workers, Gauge, "pacer_monitor_job_live_workers",                                      \
    "Workers that reported within 3 windows of the newest report")                             \
  X(workers_by_class, Gauge, "pacer_monitor_workers", "Workers per class", "class")             \
  X(stragglers, Gauge, "pacer_monitor_stragglers",                                              \
    "Current stragglers by scope, cause and persistence", "scope", "cause", "persistence")     \
  X(speed, Gauge, "pacer_monitor_worker_speed_samples_per_second",                              \
    "Worker speed (samples per compute second), last closed window", "worker")                 \
  X(relative, Gauge, "pacer_monitor_worker_relative_speed", "Worker speed / job median speed",  \
    "worker")                                                                                  \
  X(worker_class, Gauge, "pacer_monitor_worker_class",                                          \
    "Worker class: 0 unknown, 1 normal, 2 straggler, 3 leader", "worker")                       \
  X(persistent, Gauge, "pacer_monitor_worker_persistent",                                       \
    "1 when the worker's class is persistent (K of the last W windows)", "worker")              \
  X(scope, Gauge, "pacer_monitor_worker_scope",                                                 \
    "A straggler's scope: 0 none, 1 worker, 2 node, 3 server", "worker")                        \
  X(cause, Gauge, "pacer_monitor_worker_cause",                                                 \
    "A straggler's cause: 0 unknown, 1 deterministic, 2 contention", "worker")                  \
  X(local_batch, Gauge, "pacer_monitor_worker_local_batch_samples",                             \
    "The worker's local batch, last reported (the batch plan in force)", "worker")             \
  X(step, Gauge, "pacer_monitor_worker_step_seconds",                                           \
    "Mean step-time breakdown in the last closed window (phase: compute, comm, data_wait, wall)", \
    "worker", "phase")                                                                         \
  X(server_latency, Gauge, "pacer_monitor_server_latency_milliseconds",                         \
    "PS server request latency (median over reporters)", "server")                             \
  X(server_class, Gauge, "pacer_monitor_server_class",                                          \
    "PS server class: 0 unknown, 1 normal, 2 straggler (hot)", "server")

namespace pacer {

PACER_DECLARE_METRICS(MonitorMetricSeries, PACER_MONITOR_METRICS);

class MonitorMetrics {
 public:
  explicit MonitorMetrics(MetricsRegistry* registry);

  // Adds what changed in `issues` and `accepted` since the last call.
  void CountReports(uint64_t accepted, const RejectionCounts& issues);
  void CountWindows(int closed, size_t events);
  // Sets every gauge from a fresh view of the state; `window_ms` tells live workers.
  void Publish(double median_speed, const std::vector<WorkerStatus>& workers,
               const std::vector<WorkerStatus>& servers, int64_t window_ms);

 private:
  MonitorMetricSeries m_;
  uint64_t published_accepted_ = 0;
  RejectionCounts published_issues_;
};

}  // namespace pacer
