// MonitorServiceImpl: the service layer of the monitor (docs/design.md §3), between the thin gRPC
// adapter (grpc_monitor_service.h) and the pure MonitorState.
//
// Each call: closes the windows that have ended (so a report lands in the right window and
// events are never late by more than one call), validates and ingests under mu_, updates the
// Prometheus series, releases mu_, then hands new classification events to the listener.
// Nothing is journaled: monitor state is soft and rebuilt from fresh reports within a few
// windows after a restart.
//
// Request-level rules: a ReportSteps with more than max_reports_per_request reports (or server
// samples), or with a step number above kMaxStepNumber (common/step_number.h), is refused whole
// with INVALID_ARGUMENT and changes nothing; otherwise each report
// is judged alone and the response says how many were accepted, clamped and rejected, by
// reason. Registration errors are returned as the call's status.
//
// Thread-safe. The event listener runs outside mu_, on the calling thread, one batch at a
// time and in seq order (listener_mu_ serialises deliveries); it may call back into the
// service.
#pragma once

#include <functional>
#include <atomic>
#include <memory>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/metrics.h"
#include "monitor/monitor_metrics.h"
#include "monitor/monitor_state.h"
#include "proto/pacer/monitor.pb.h"

namespace pacer {

// Hears every step report the monitor accepted (pacerd: the reconciler, which feeds the
// controller's per-step burst rule, controller/burst_detector.h). Called after the request was
// ingested, outside the monitor's lock, on the RPC's thread; must be quick and thread-safe.
class StepObserver {
 public:
  virtual ~StepObserver() = default;
  virtual void OnAcceptedSteps(const std::vector<StepReport>& steps) = 0;
};

class MonitorServiceImpl {
 public:
  using EventListener = std::function<void(const std::vector<ClassificationEvent>&)>;

  // `clock` must outlive the service; `metrics` may be null (a private registry is used).
  static absl::StatusOr<std::unique_ptr<MonitorServiceImpl>> Create(const MonitorOptions& options,
                                                                    const Clock* clock,
                                                                    MetricsRegistry* metrics);

  // ---- RPCs ----
  absl::Status RegisterWorker(const MonitorRegisterRequest& req, MonitorRegisterResponse* resp);
  // A new run of the job began: MonitorState::ForgetWorkerHistories.
  void ForgetWorkerHistories();
  absl::Status ReportSteps(const ReportStepsRequest& req, ReportStepsResponse* resp);
  absl::Status ReportNode(const ReportNodeRequest& req, ReportNodeResponse* resp);
  absl::Status ListWorkers(const ListWorkersRequest& req, ListWorkersResponse* resp);

  // ---- in-process API (pacerd, controller, simulator) ----
  // Closes the windows that have ended by the clock's now. pacerd calls it about once a
  // second; the simulator after each clock step.
  void Tick();
  // Receives every classification event (replaces any previous listener; null removes it).
  void SetEventListener(EventListener listener);
  // Every accepted step report from now on goes to `observer` too (null: none). Set before
  // serving; `observer` must outlive the service's RPCs.
  void SetStepObserver(StepObserver* observer) { step_observer_.store(observer); }
  // The running step a worker's heartbeat carries (MonitorState::NoteRunningStep; pacerd's
  // heartbeat handler). Closes the windows due first, so a note counts in the window it
  // arrived in. A no-op unless the detection settings bound running steps.
  void NoteRunningStep(absl::string_view worker_id, uint64_t samples, double compute_s,
                       uint64_t samples_done = 0, double done_compute_s = 0);
  // Hot reload of the detection settings (MonitorState::UpdateDetection).
  absl::Status UpdateDetection(const MonitorOptions& options);
  MonitorOptions Options() const;  // in force now
  absl::StatusOr<WorkerStatus> Worker(absl::string_view worker_id) const;
  absl::StatusOr<double> PredictStepSeconds(absl::string_view worker_id, uint32_t batch) const;
  absl::StatusOr<std::vector<WindowSummary>> History(absl::string_view worker_id) const;
  size_t MemoryBytes() const;

 private:
  MonitorServiceImpl(std::unique_ptr<MonitorState> state, MetricsRegistry* metrics);
  // Closes due windows and refreshes the gauges when any closed.
  void AdvanceLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DeliverEvents() ABSL_LOCKS_EXCLUDED(mu_);

  std::unique_ptr<MetricsRegistry> own_metrics_;
  std::atomic<StepObserver*> step_observer_{nullptr};
  // MonitorOptions::running_step_bound in force (NoteRunningStep skips the lock without it).
  std::atomic<bool> bound_running_{false};

  mutable absl::Mutex mu_;
  std::unique_ptr<MonitorState> state_ ABSL_GUARDED_BY(mu_);
  MonitorMetrics metrics_ ABSL_GUARDED_BY(mu_);
  std::vector<ClassificationEvent> pending_ ABSL_GUARDED_BY(mu_);

  absl::Mutex listener_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  EventListener listener_ ABSL_GUARDED_BY(listener_mu_);
};

}  // namespace pacer
