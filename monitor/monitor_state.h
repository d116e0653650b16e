// MonitorState: everything the monitor knows, driven by an injected Clock (docs/design.md §3).
//
// Owns the roster (workers and their nodes, PS servers, nodes), the per-worker step
// de-duplication and step-time models, the SpeedEstimator (windows and history), NodeSignals,
// the ServerLatencyTracker, one StragglerClassifier for workers and one for servers, the
// event ring, and the reason->count map of refused or repaired input.
//
// Time: windows are aligned on the clock, window k = [k*window_ms, (k+1)*window_ms). A report
// counts in the window open when it is *received* (worker clocks may be skewed; the report's
// own time_ms is only checked for staleness / future). AdvanceWindows() closes every window
// that has ended by the clock's now, classifies, and returns the events; callers invoke it
// before ingesting and periodically (pacerd's housekeeping), and the simulator after each clock
// step. Nothing here sleeps or reads the real clock.
//
// Input handling (each refusal/repair counted by ReportIssue):
//  * field checks: CheckStepReport / CheckServerLatency / CheckNodeMetrics;
//  * unknown worker (unless admit_unknown_workers), roster full;
//  * out-of-order steps are fine; a step seen before is a duplicate; a step more than 64 below
//    the newest is stale, except a jump back of more than 4096 steps, taken as a restarted
//    counter (RegisterWorker again also resets it);
//  * a worker's reports beyond max_reports_per_worker_per_window are a flood;
//  * a latency sample needs its reporter (a registered worker), which has one vote per server
//    and window (ServerLatencyTracker) and adds at most max_servers_per_reporter server rows.
// Shared tables and who fills them: a node row that only worker registrations name
// (no agent reported its metrics) is freed once no worker is registered on it, and a worker
// moving to a new node name takes its own row along, so each worker holds at most one such row
// whatever the count of names it tries; rows agents reported stay. Freed rows are reused.
// A refused report changes nothing; one worker's reports only ever change that worker's
// estimate (and its single vote in the job median).
//
// Invariants: every worker index is valid in the estimator and the classifier; events have
// strictly increasing seq. Memory: bounded per worker by the window tiers of SpeedEstimator
// (recent full windows + coarse merged ones, never raw reports), plus O(servers + nodes) and
// events_kept events; docs/benchmarks.md "Memory bounds of the monitor and the controller"
// gives the formula, MemoryBytes() the bytes.
//
// Thread-compatible: MonitorServiceImpl guards it with its mutex.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/clock.h"
#include "monitor/monitor_options.h"
#include "monitor/node_signals.h"
#include "monitor/report_validator.h"
#include "monitor/server_latency.h"
#include "monitor/speed_estimator.h"
#include "monitor/step_time_model.h"
#include "monitor/straggler_classifier.h"
#include "proto/pacer/monitor.pb.h"

namespace pacer {

class MonitorState {
 public:
  // Validates `options`; `clock` must outlive the state.
  static absl::StatusOr<std::unique_ptr<MonitorState>> Create(const MonitorOptions& options,
                                                              const Clock* clock);

  // Declares (or re-declares, e.g. after a restart) a worker on `node`. Re-declaring keeps the
  // history and resets the step de-duplication. INVALID_ARGUMENT for a bad id,
  // RESOURCE_EXHAUSTED when max_workers / max_nodes are reached.
  absl::Status RegisterWorker(absl::string_view worker_id, absl::string_view node);
  // A new run of the job began (pacerd's reconciler, controller/run_tracker.h): every worker's
  // speed windows, step-time model and classification are forgotten, so that the new run is
  // judged on its own steps (a straggler of the last run is not one of this run). The roster,
  // nodes, servers and the events already emitted stay.
  void ForgetWorkerHistories();

  // Each returns kNone when used (possibly repaired), else the reason it was refused.
  ReportIssue IngestStep(StepReport report);
  // IngestStep for a registered worker known by its index (WorkerIndex()): the same checks
  // and effects, without a message or an id lookup (kUnknownWorker for a bad index).
  ReportIssue IngestStepAt(uint32_t worker, StepSample sample);
  // The dense index of a registered (or admitted) worker; stable for the state's lifetime.
  std::optional<uint32_t> WorkerIndex(absl::string_view worker_id) const;
  ReportIssue IngestServerLatency(const ServerLatency& sample);
  ReportIssue IngestNodeMetrics(const NodeMetrics& metrics);
  // Counts refusals decided outside (e.g. a request over max_reports_per_request).
  void CountIssue(ReportIssue issue, uint64_t n = 1) { issues_.Add(issue, n); }

  // The step a worker is computing, as its heartbeat says (HeartbeatRequest.step_timings'
  // running step: samples, compute seconds so far, and its progress when said: samples_done of
  // them in the first done_compute_s); read only with options().running_step_bound
  // (MonitorOptions). Unknown workers and implausible values (the step-report limits) are
  // ignored; a progress that does not fit the step (more samples done than it computes, or
  // done later than its compute so far) is ignored and the step's bound alone counts.
  void NoteRunningStep(absl::string_view worker_id, uint64_t samples, double compute_s,
                       uint64_t samples_done = 0, double done_compute_s = 0);
  // Closes every window that ended by now, classifies, appends the events to `events` (may be
  // null) and keeps them in the ring. Returns the number of windows closed.
  int AdvanceWindows(std::vector<ClassificationEvent>* events);

  // ---- views ----
  absl::StatusOr<WorkerStatus> Worker(absl::string_view worker_id) const;
  // Every worker's status; without evidence, the classifications carry no evidence text
  // (cheaper: a controller reading only the classes and speeds does not need it).
  std::vector<WorkerStatus> Workers(bool with_evidence = true) const;
  // The same into `out`, reusing its messages (a caller that asks every reconcile keeps their
  // strings and sub-messages: 4 096 statuses are ~12 000 allocations when built afresh).
  void Workers(std::vector<WorkerStatus>* out, bool with_evidence = true) const;
  std::vector<WorkerStatus> Servers() const;
  std::vector<NodeStatus> Nodes(bool with_evidence = true) const;  // evidence: contention text
  std::vector<ClassificationEvent> EventsAfter(uint64_t seq, size_t max) const;
  absl::StatusOr<std::vector<WindowSummary>> History(absl::string_view worker_id) const;
  // Predicted compute seconds of one step of `batch` samples on the worker (its fitted
  // fixed + per-sample model). NOT_FOUND for an unknown worker, FAILED_PRECONDITION before
  // any report.
  absl::StatusOr<double> PredictStepSeconds(absl::string_view worker_id, uint32_t batch) const;
  absl::StatusOr<StepTimeModel::Fit> StepModel(absl::string_view worker_id) const;

  const RejectionCounts& issues() const { return issues_; }
  uint64_t accepted() const { return accepted_; }
  int64_t last_closed_window() const { return last_closed_; }
  double median_speed() const { return median_speed_; }
  // What the last window's r_i were relative to: the median (>= min_workers workers), the
  // faster worker of a pair, or 0 (nobody compared). See MonitorOptions::min_workers.
  double reference_speed() const { return reference_speed_; }
  const MonitorOptions& options() const { return options_; }
  // Hot reload of the detection settings (policy apply): thresholds, K-of-W, cause and scope
  // settings take effect from the next window closed. FAILED_PRECONDITION when `options`
  // changes the window geometry (window, history, estimator settings) or the input limits:
  // those need a restart. INVALID_ARGUMENT when `options` fails Validate(). Nothing changes
  // on error.
  absl::Status UpdateDetection(const MonitorOptions& options);
  size_t num_workers() const { return workers_.size(); }
  // Approximate bytes held by the state (buffers' capacities).
  size_t MemoryBytes() const;

 private:
  MonitorState(const MonitorOptions& options, const Clock* clock);

  struct StepDedup {
    bool any = false;
    uint64_t newest = 0;
    uint64_t seen = 0;  // bit d: step newest - d was seen
    ReportIssue Accept(uint64_t step);
  };
  struct WorkerRecord {
    std::string id;
    uint32_t node = StragglerClassifier::kNoNode;
    StepDedup dedup;
    StepTimeModel model;
    uint32_t last_batch = 0;
    int64_t last_report_ms = 0;
    uint64_t reports = 0;
    int64_t class_since_ms = 0;
    uint32_t servers_added = 0;  // server rows its latency samples added
  };
  struct NodeRecord {
    std::string name;       // empty: a free row, in free_nodes_
    uint32_t workers = 0;   // registered on it
    bool reported = false;  // an agent reported its metrics: kept for good
  };
  struct ServerRecord {
    std::string id;
    int64_t last_report_ms = 0;
    uint64_t reports = 0;
    int64_t class_since_ms = 0;
  };

  // The row of `node` (kNoNode for ""), added when new: a free row reused, else a new one while
  // fewer than max_nodes.
  absl::StatusOr<uint32_t> NodeIndex(absl::string_view node);
  // `worker` moves from row `from` to row `to` (either may be kNoNode); a row left with no worker
  // and no agent report is freed.
  void MoveWorkerNode(uint32_t worker, uint32_t from, uint32_t to);
  void FreeNodeIfUnused(uint32_t node);
  absl::StatusOr<uint32_t> AddWorker(absl::string_view worker_id, uint32_t node);
  void CloseWindow(int64_t window, std::vector<ClassificationEvent>* events);
  void Emit(int64_t window, EntityKind kind, const std::string& id,
            const StragglerClassifier::Change& change, std::vector<ClassificationEvent>* events);
  WorkerStatus StatusOf(uint32_t worker, bool with_evidence = true) const;
  // StatusOf into a cleared message.
  void StatusInto(uint32_t worker, bool with_evidence, WorkerStatus* st) const;
  // Windows WorkerStatus.smoothed_speed is the median of: smoothed_windows, growing while the
  // worker's classification holds up to stable_smoothed_windows (MonitorOptions).
  uint32_t SmoothingWindows(uint32_t worker) const;
  ReportIssue Accept(uint32_t worker, const StepSample& report, const RejectionCounts& repairs,
                     int64_t now_ms);

  MonitorOptions options_;
  const Clock* clock_;
  int64_t open_window_;
  int64_t last_closed_ = -1;
  double median_speed_ = 0;
  double reference_speed_ = 0;

  absl::flat_hash_map<std::string, uint32_t> worker_index_;
  std::vector<WorkerRecord> workers_;
  absl::flat_hash_map<std::string, uint32_t> node_index_;
  std::vector<NodeRecord> nodes_;
  std::vector<uint32_t> free_nodes_;
  absl::flat_hash_map<std::string, uint32_t> server_index_;
  std::vector<ServerRecord> servers_;

  SpeedEstimator speed_;
  NodeSignals node_signals_;
  ServerLatencyTracker server_latency_;
  StragglerClassifier worker_classifier_;
  StragglerClassifier server_classifier_;

  std::vector<Contention> contention_scratch_;  // CloseWindow's per-node assessments
  std::vector<StragglerClassifier::Observation> observed_scratch_;  // CloseWindow's, reused
  std::vector<StragglerClassifier::Change> changes_scratch_;
  std::deque<ClassificationEvent> events_;
  uint64_t next_event_seq_ = 1;
  RejectionCounts issues_;
  uint64_t accepted_ = 0;
};

}  // namespace pacer
