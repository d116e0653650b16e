// PacerdControlPlane: the simulator's control plane (sim/control_plane.h) played by a real
// pacerd in the test's process, on the harness's simulated clock (tests/testing/pacerd_harness.h).
//
// The simulator's job model talks to it as a real job talks to pacerd, through the service
// implementations a worker's, an SDK's and an agent's RPCs reach (no gRPC hop; the calls are
// the same, synchronous in the test's thread, so a run is deterministic):
//   worker process    ShardingService RegisterWorker / FetchShard / ReportProgress /
//                     CompleteShard / ReleaseShard, Monitor RegisterWorker / ReportSteps;
//   its heartbeats    ShardingService Heartbeat once a simulated second for every live worker
//                     (its step, plan and exclusion versions held, whether it honours
//                     exclusion, its memory cap), and once more before every decision;
//   node agents       AgentRegistry Heartbeat per node, once a second and when its node
//                     metrics are due, listing its workers (RUNNING, or BACKOFF while the model
//                     relaunches one);
//   decisions         the model's decision points are pacerd's, so both decide at the same
//                     instants: CloseWindows is the monitor's Tick; Reconcile runs production's
//                     housekeeping step (Pacerd::HousekeepingStep) with a reconcile due every
//                     time; DecideBursts hands the heartbeat's finished step timings to the
//                     reconciler's StepObserver (the route pacerd's accepted step reports take),
//                     a step still running to Reconciler::OnHeartbeatSteps (what the SDK's
//                     heartbeat says of it; observed only) and runs the reconciler's
//                     MaybeDecideBursts: the model decides for every worker on its heartbeat
//                     grid, where production pacerd decides inside the heartbeat that brought
//                     the news, a worker's heartbeat at a time. The model's one mean step report per
//                     report interval goes to the monitor's windows only (the observer is
//                     detached from the monitor): it stands for the interval's step reports,
//                     whose per-step timings DecideBursts brings.
// What pacerd decides is carried out by its own action sink (plans and exclusions to the
// heartbeat sessions, REALLOCATE to its sharding service, agent commands queued) and then by
// the model (PacerdOptions::also_carry): Reconcile and DecideBursts return those actions.
//
// Not thread-safe; one run per instance.
#pragma once

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "controller/action_sink.h"
#include "sim/control_plane.h"
#include "sim/in_process_control_plane.h"
#include "tests/testing/pacerd_harness.h"

namespace pacer::testing {

class PacerdControlPlane : public sim::ControlPlane, private ActionSink {
 public:
  // Starts pacerd with `policy_file` (a path) and the job's facts as its flags, on a simulated
  // clock starting at `start_ms`. Failures to start are gtest failures; check ok().
  PacerdControlPlane(const std::string& policy_file, const sim::ControlPlaneJob& job, int64_t start_ms);
  ~PacerdControlPlane() override;
  bool ok() const { return harness_->ok(); }
  PacerdHarness& harness() { return *harness_; }

  absl::Status Start(const DatasetSpec& spec) override;
  void SetTime(double t_s) override;
  int64_t NowMs() const override { return start_ms_ + target_ns_ / 1'000'000; }  // the model's

  absl::StatusOr<uint64_t> RegisterWorker(const std::string& id, const std::string& node,
                                          uint32_t* monitor_index) override;
  absl::Status WorkerDown(const std::string& id) override;
  absl::StatusOr<std::optional<sim::LeaseGrant>> Fetch(const std::string& id, uint64_t incarnation) override;
  absl::StatusOr<sim::AckOutcome> Acknowledge(const std::string& id, uint64_t incarnation,
                                              const sim::LeaseGrant& lease, uint64_t records_done,
                                              bool complete, bool may_be_fenced) override;
  absl::Status Release(const std::string& id, uint64_t incarnation, const sim::LeaseGrant& lease,
                       uint64_t records_done) override;
  uint64_t RecordsDone() const override { return records_done_; }

  void ReportStep(uint32_t monitor_index, const std::string& id, const StepSample& r) override;
  void ReportNode(const NodeMetrics& m) override;
  void ReportServerLatency(const ServerLatency& l) override;

  absl::Status CloseWindows() override;
  absl::StatusOr<std::vector<Action>> Reconcile(const sim::ModelFacts& facts) override;
  absl::StatusOr<std::vector<Action>> DecideBursts(const std::vector<StepTiming>& timings,
                                                   int64_t decide_ms, const sim::ModelFacts& facts) override;
  absl::Status Reallocate(const Action&, uint64_t) override {
    return absl::OkStatus();  // pacerd's own sink applied it to its sharding service
  }

  std::vector<sim::Decision> Decisions() const override;
  uint64_t sharding_updates() const override { return 0; }
  // Calls a component refused (a glue bug; the test expects none).
  const std::vector<std::string>& errors() const { return errors_; }

 private:
  struct Worker {
    std::string node;
    uint64_t incarnation = 0;
    bool down = true;
    bool honors_exclusion = true;
    int64_t max_local_batch = 0;
    uint64_t plan_version = 0, exclusion_version = 0;
  };
  // ActionSink (PacerdOptions::also_carry): what pacerd carried out, for the model.
  absl::StatusOr<std::string> Carry(const Action& a, const CarryContext&) override {
    carried_.push_back(a);
    return std::string("handed to the simulator's model");
  }
  // The clock follows the model lazily: each call first brings it to the model's time (Sync),
  // so a heartbeat decision can still happen at its grid time just behind the model.
  void Sync() { AdvanceTo(target_ns_); }
  void AdvanceTo(int64_t ns);
  void Note(const absl::Status& s, const std::string& what);
  void HeartbeatRound();
  void AgentHeartbeat(const std::string& node, const NodeMetrics* metrics);
  void Learn(const sim::ModelFacts& facts);
  void RefreshRecordsDone();
  std::vector<Action> TakeCarried();

  const sim::ControlPlaneJob job_;
  std::unique_ptr<PacerdHarness> harness_;
  int64_t start_ms_;
  int64_t clock_ns_ = 0;   // since start_ms_
  int64_t target_ns_ = 0;  // the model's time
  int64_t next_heartbeat_ms_ = 0;
  int64_t step_ = 0;
  uint64_t records_done_ = 0;
  uint64_t records_total_ = 0;
  std::map<std::string, Worker> workers_;
  std::map<std::string, std::set<std::string>> node_workers_;
  std::map<std::string, uint64_t> primary_of_shard_;  // shard id -> its primary lease
  std::vector<Action> carried_;
  std::vector<std::string> errors_;
};

}  // namespace pacer::testing
