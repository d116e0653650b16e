// MonitorMetrics: the monitor's Prometheus series, declared once (docs/design.md §9 naming):
//
//   pacer_monitor_reports_accepted_total                 counter
//   pacer_monitor_reports_rejected_total{reason}         counter (repairs use clamped_* reasons)
//   pacer_monitor_windows_closed_total                   counter
//   pacer_monitor_events_total                           counter
//   pacer_monitor_job_median_speed_samples_per_second    gauge
//   pacer_monitor_workers{class}                         gauge (count per class)
//   pacer_monitor_worker_speed_samples_per_second{worker}
//   pacer_monitor_worker_relative_speed{worker}
//   pacer_monitor_worker_class{worker}                   gauge: WorkerClass enum value
//                                                        (0 unknown, 1 normal, 2 straggler, 3 leader)
//   pacer_monitor_worker_persistent{worker}              gauge 0/1
//   pacer_monitor_worker_step_seconds{worker,phase}      gauge, phase = compute|comm|data_wait|wall
//   pacer_monitor_server_latency_milliseconds{server}    gauge
//   pacer_monitor_server_class{server}                   gauge: WorkerClass enum value
//
// Per-entity series are created on first publish and kept (workers are never forgotten by the
// monitor). Thread-compatible: the service calls it under its mutex; the series themselves are
// atomic for the scraper.
#pragma once

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>

#include <array>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "common/metrics.h"
#include "monitor/report_validator.h"
#include "proto/pacer/monitor.pb.h"

namespace pacer {

class MonitorMetrics {
 public:
  explicit MonitorMetrics(MetricsRegistry* registry);

  // Adds what changed in `issues` and `accepted` since the last call.
  void CountReports(uint64_t accepted, const RejectionCounts& issues);
  void CountWindows(int closed, size_t events);
  // Sets every gauge from a fresh view of the state.
  void Publish(double median_speed, const std::vector<WorkerStatus>& workers,
               const std::vector<WorkerStatus>& servers);

 private:
  struct WorkerSeries {
    prometheus::Gauge* speed;
    prometheus::Gauge* relative;
    prometheus::Gauge* worker_class;
    prometheus::Gauge* persistent;
    std::array<prometheus::Gauge*, 4> step;  // compute, comm, data_wait, wall
  };
  struct ServerSeries {
    prometheus::Gauge* latency;
    prometheus::Gauge* server_class;
  };

  prometheus::Counter& accepted_;
  prometheus::Family<prometheus::Counter>& rejected_family_;
  prometheus::Counter& windows_;
  prometheus::Counter& events_;
  prometheus::Gauge& median_;
  prometheus::Family<prometheus::Gauge>& workers_by_class_;
  prometheus::Family<prometheus::Gauge>& speed_;
  prometheus::Family<prometheus::Gauge>& relative_;
  prometheus::Family<prometheus::Gauge>& class_;
  prometheus::Family<prometheus::Gauge>& persistent_;
  prometheus::Family<prometheus::Gauge>& step_;
  prometheus::Family<prometheus::Gauge>& server_latency_;
  prometheus::Family<prometheus::Gauge>& server_class_;

  uint64_t published_accepted_ = 0;
  RejectionCounts published_issues_;
  std::array<prometheus::Counter*, static_cast<size_t>(ReportIssue::kCount)> rejected_{};
  std::array<prometheus::Gauge*, 4> class_counts_{};
  absl::flat_hash_map<std::string, WorkerSeries> worker_series_;
  absl::flat_hash_map<std::string, ServerSeries> server_series_;
};

}  // namespace pacer
