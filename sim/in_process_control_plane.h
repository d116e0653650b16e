// InProcessControlPlane: the simulator's own control plane (sim/control_plane.h) -- the real
// ShardingState, MonitorState and Controller that pacerd links, called directly, without
// services, journal or RPC, so that pacer-sim runs 4 096 workers.
//
// What it does for each call is what pacerd's services do for the request it stands for:
// a fetch is decided by DecideFetch and applied as one CreateLeaseUpdate, an
// acknowledgement is a ProgressUpdate or an EndLeaseUpdate checked against the lease's fencing
// token, a step report is the monitor's IngestStep, a reconcile builds the view with
// controller/view_builder.h and runs Controller::Reconcile. Every update carries the clock's
// time, set by the model (SetTime).
//
// Not thread-safe.
#pragma once

#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "common/clock.h"
#include "common/recent_durations.h"
#include "controller/controller.h"
#include "controller/policy_config.h"
#include "monitor/monitor_state.h"
#include "sharding_service/sharding_state.h"
#include "sim/control_plane.h"

namespace pacer::sim {

// The job facts a control plane is configured with (pacerd: its command line).
struct ControlPlaneJob {
  JobMode mode = JobMode::kSync;
  int64_t global_batch = 0;        // sync: samples per step; 0: Σ local batches
  double heartbeat_interval_s = 1;
  double progress_interval_s = 1;  // how often workers acknowledge their progress
  double restart_cost_s = 60;
  double migrate_cost_s = 0;
  std::string dataset = "train";
};

class InProcessControlPlane : public ControlPlane {
 public:
  static absl::StatusOr<std::unique_ptr<InProcessControlPlane>> Create(
      const PolicyConfig& policy, const MonitorOptions& monitor, ControlPlaneJob job, int64_t start_ms);

  absl::Status Start(const DatasetSpec& spec) override;
  void SetTime(double t_s) override;
  int64_t NowMs() const override { return clock_.NowMs(); }

  absl::StatusOr<uint64_t> RegisterWorker(const std::string& id, const std::string& node,
                                          uint32_t* monitor_index) override;
  absl::Status WorkerDown(const std::string& id) override;
  absl::StatusOr<std::optional<LeaseGrant>> Fetch(const std::string& id, uint64_t incarnation) override;
  absl::StatusOr<AckOutcome> Acknowledge(const std::string& id, uint64_t incarnation,
                                         const LeaseGrant& lease, uint64_t records_done,
                                         bool complete, bool may_be_fenced) override;
  absl::Status Release(const std::string& id, uint64_t incarnation, const LeaseGrant& lease,
                       uint64_t records_done) override;
  uint64_t RecordsDone() const override {
    return state_.FindDataset(job_.dataset)->records_done_total;
  }

  void ReportStep(uint32_t monitor_index, const std::string&, const StepSample& r) override {
    monitor_->IngestStepAt(monitor_index, r);
  }
  void ReportNode(const NodeMetrics& m) override { monitor_->IngestNodeMetrics(m); }
  void ReportServerLatency(const ServerLatency& l) override { monitor_->IngestServerLatency(l); }

  absl::Status CloseWindows() override;
  absl::StatusOr<std::vector<Action>> Reconcile(const ModelFacts& facts) override;
  absl::StatusOr<std::vector<Action>> DecideBursts(const std::vector<StepTiming>& timings,
                                                   int64_t decide_ms, const ModelFacts&) override;
  bool DecideBurstsReadsFacts() const override { return false; }
  double BurstStepLineS() const override { return controller_->BurstStepLineS(); }
  absl::Status Reallocate(const Action& a, uint64_t shard_size) override;

  std::vector<Decision> Decisions() const override;
  uint64_t sharding_updates() const override { return updates_; }
  const Controller& controller() const { return *controller_; }

 private:
  InProcessControlPlane(const PolicyConfig& policy, ControlPlaneJob job, int64_t start_ms)
      : policy_(policy), job_(std::move(job)), clock_(start_ms) {}
  absl::Status Apply(Update u);
  // Keeps the batch plans among `actions` as pacerd's WorkerSessions keeps the plans it sends:
  // the rates an epoch's end is shared by (sharding_service/fetch_rates.h).
  void NotePlans(const std::vector<Action>& actions);

  const PolicyConfig policy_;
  const ControlPlaneJob job_;
  SimulatedClock clock_;
  int64_t clock_ns_ = 0;
  double t_ = 0;
  std::unique_ptr<MonitorState> monitor_;
  std::unique_ptr<Controller> controller_;
  ShardingState state_;
  FetchRates rates_;  // the plans in force (NotePlans), as pacerd's fetches see them
  uint64_t updates_ = 0;
  // Recent completed lease durations (as pacerd's sharding service keeps them) and when each
  // worker's lease began.
  RecentDurations shard_times_;
  absl::flat_hash_map<std::string, double> lease_start_;  // by worker: it holds one at a time
  // The monitor's worker statuses of the last reconcile, refilled in place by the next one.
  std::vector<WorkerStatus> worker_statuses_;
  absl::flat_hash_map<std::string, double> lease_ages_;  // Reconcile's, by worker
};

}  // namespace pacer::sim
