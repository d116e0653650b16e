// Input validation for the monitor: what makes a step report, a server-latency sample or a node
// metrics report unusable, and the counts of everything refused or repaired.
//
// Field checks here are stateless (a report against the options and the current time);
// checks that need state (unknown worker, duplicate step, flood) live in MonitorState but use
// the same reasons, so one reason->count map tells an operator everything that was dropped.
// A rejected report changes no estimate; a clamped one is used with the repaired fields
// (negative or NaN communication / data-wait time -> 0, wall time raised to at least the sum of
// its parts).
//
// RejectionCounts is thread-compatible (the service guards it with its mutex).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>

#include "monitor/monitor_options.h"
#include "proto/pacer/monitor.pb.h"

namespace pacer {

enum class ReportIssue : uint8_t {
  kNone = 0,
  // Rejections.
  kMissingId,
  kIdTooLong,
  kUnknownWorker,
  kTooManyEntities,  // worker / server / node table full
  kBadBatch,         // local_batch 0 or above max_local_batch
  kBadSamples,       // samples 0, above max, or far above local_batch
  kBadComputeTime,   // NaN, inf, <= 0 or above max_step_s
  kImplausibleSpeed,
  kStale,            // time_ms older than max_report_age_ms
  kFutureTime,       // time_ms beyond max_clock_skew_ms ahead
  kDuplicateStep,
  kFlood,            // above max_reports_per_worker_per_window
  kRequestTooLarge,  // reports beyond max_reports_per_request in one request
  kBadLatency,       // server latency NaN / negative / absurd
  kBadNodeMetrics,
  // Repairs (the report is used).
  kClampedComm,
  kClampedDataWait,
  kClampedWall,
  kCount,
};

// Stable snake_case name, used as the map key and the Prometheus label.
const char* ReportIssueName(ReportIssue issue);
inline bool IsRejection(ReportIssue issue) {
  return issue != ReportIssue::kNone && issue < ReportIssue::kClampedComm;
}

class RejectionCounts {
 public:
  void Add(ReportIssue issue, uint64_t n = 1) { counts_[static_cast<size_t>(issue)] += n; }
  uint64_t Get(ReportIssue issue) const { return counts_[static_cast<size_t>(issue)]; }
  uint64_t TotalRejected() const;
  // reason name -> count, reasons with a zero count left out.
  std::map<std::string, uint64_t> ToMap() const;

 private:
  std::array<uint64_t, static_cast<size_t>(ReportIssue::kCount)> counts_{};
};

// The numbers of one step report (StepReport without the worker id): the form the monitor
// ingests for a worker it already knows by index (MonitorState::IngestStepAt), so a caller
// with thousands of workers (the simulator) builds no message and hashes no id per report.
struct StepSample {
  uint64_t step = 0;
  uint32_t local_batch = 0;
  uint64_t samples = 0;
  double compute_s = 0, comm_s = 0, data_wait_s = 0, wall_s = 0;
  int64_t time_ms = 0;
  static StepSample Of(const StepReport& r);
};

// Checks the fields of `report` and repairs the repairable ones in place. Returns the
// rejection reason (kNone when usable); each repair made is added to `repairs` (may be null).
ReportIssue CheckStepReport(const MonitorOptions& options, int64_t now_ms, StepReport* report,
                            RejectionCounts* repairs);
// The same checks and repairs, the id check aside.
ReportIssue CheckStepSample(const MonitorOptions& options, int64_t now_ms, StepSample* sample,
                            RejectionCounts* repairs);

ReportIssue CheckServerLatency(const MonitorOptions& options, int64_t now_ms,
                               const ServerLatency& sample);

ReportIssue CheckNodeMetrics(const MonitorOptions& options, int64_t now_ms,
                             const NodeMetrics& metrics);

}  // namespace pacer
