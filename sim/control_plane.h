// ControlPlane: everything a simulated job talks to, behind one interface.
//
// The job model (sim/job_simulation.cc) plays the workers, their node agents and the parameter
// servers. What a real job talks to -- the sharding service, the monitor, the controller -- is a
// ControlPlane, told at each event of the model what a real job would tell pacerd, and asked at
// the model's decision points what it decides:
//
//   tells    a worker process starts (registers) or dies; shard fetch, progress, release and
//            completion; step reports, node metrics and server latencies; per-step timings for
//            the burst rule; the worker-side facts pacerd learns from heartbeats and agents
//            (WorkerReport);
//   asks     CloseWindows (the monitor's window grid has passed), Reconcile, DecideBursts: each
//            returns the actions the controller executed, which the model then carries out.
//
// Two implementations:
//   InProcessControlPlane (sim/in_process_control_plane.h)  the real MonitorState, Controller
//            and ShardingState called directly: pacer-sim, 4 096 workers;
//   PacerdControlPlane (tests/testing/pacerd_control_plane.h)  a real in-process pacerd on the
//            simulated clock: its sharding service, monitor, agent registry and reconciler,
//            through the calls a worker, an SDK and an agent make
//            (tests/sim/differential_test.cc runs one trace through both and compares the
//            decisions).
//
// Time: the model sets it (SetTime) before the calls that happen then; it never goes back.
// Not thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "controller/action.h"
#include "controller/burst_detector.h"
#include "controller/view_builder.h"
#include "monitor/monitor_state.h"
#include "proto/pacer/sharding.pb.h"

namespace pacer::sim {

// A lease as the worker holding it sees it.
struct LeaseGrant {
  uint64_t id = 0;
  uint64_t token = 0;
  uint64_t lease_begin = 0;  // the lease's first position
  uint64_t begin = 0;        // first position not yet done (lease_begin + its done prefix)
  uint64_t end = 0;
  bool backup = false;
  uint64_t partner = 0;  // a backup: the primary lease it copies (0: unknown)
};

// What the model knows of one worker at a decision point that pacerd learns from the worker's
// heartbeats and its node agent (controller/view_builder.h, WorkerFacts).
struct WorkerReport {
  std::string id;
  std::string node;             // where it runs now
  bool down = false;            // its process is being relaunched
  bool honors_exclusion = true;
  int64_t max_local_batch = 0;
  uint64_t incarnation = 0;
};

// The job's facts at a decision point that the control plane cannot know by itself.
struct ModelFacts {
  int64_t current_step = 0;  // the job's step (sync: every worker's; async: summed)
  std::vector<WorkerReport> workers;
};

// One audit record, in the words pacerctl shows (ActionRecord): what the two implementations'
// decisions are compared on.
struct Decision {
  int64_t time_ms = 0;
  std::string outcome;  // AuditOutcomeName
  std::string kind;     // ActionKindName
  std::string target;
  std::string detail;   // DescribeAction
  std::string reason;
  std::string veto_reason;
  double predicted_gain = 0;
  int64_t repeats = 0;       // identical vetoes folded into the record
  bool rolled_back = false;  // a rollback of it was issued
};

enum class AckOutcome {
  kCounted,  // the records up to `records_done` are counted
  kFenced,   // the lease ended elsewhere (its backup partner completed first): nothing counted
};

class ControlPlane {
 public:
  virtual ~ControlPlane() = default;

  // Before anything else, at model time 0: the job's one dataset.
  virtual absl::Status Start(const DatasetSpec& spec) = 0;
  // Model seconds since the job's start.
  virtual void SetTime(double t_s) = 0;
  virtual int64_t NowMs() const = 0;

  // ---- a worker process (the SDK's calls) ----
  // A process of worker `id` started on `node`: registered with the sharding service and the
  // monitor. Returns its incarnation; *monitor_index is the handle for ReportStep.
  virtual absl::StatusOr<uint64_t> RegisterWorker(const std::string& id, const std::string& node,
                                                  uint32_t* monitor_index) = 0;
  // Its process died (a crash, or its agent killed it to restart or migrate it).
  virtual absl::Status WorkerDown(const std::string& id) = 0;
  // nullopt: nothing to lease now (wait, or the end of the data).
  virtual absl::StatusOr<std::optional<LeaseGrant>> Fetch(const std::string& id,
                                                          uint64_t incarnation) = 0;
  // Acknowledges the done prefix `records_done` of `lease` (relative to lease_begin);
  // `complete`: every record of it. `may_be_fenced`: the lease is one of a tail-backup pair.
  virtual absl::StatusOr<AckOutcome> Acknowledge(const std::string& id, uint64_t incarnation,
                                                 const LeaseGrant& lease, uint64_t records_done,
                                                 bool complete, bool may_be_fenced) = 0;
  // Hands the rest of `lease` back (the worker was excluded).
  virtual absl::Status Release(const std::string& id, uint64_t incarnation, const LeaseGrant& lease,
                               uint64_t records_done) = 0;
  // Records of the dataset counted done.
  virtual uint64_t RecordsDone() const = 0;

  // ---- the monitor's inputs ----
  virtual void ReportStep(uint32_t monitor_index, const std::string& id, const StepSample& r) = 0;
  virtual void ReportNode(const NodeMetrics& m) = 0;
  virtual void ReportServerLatency(const ServerLatency& l) = 0;

  // ---- decision points ----
  // The monitor's window grid has passed: closes the windows due.
  virtual absl::Status CloseWindows() = 0;
  // The controller decides on the job as it is now; returns the executed actions, in order.
  virtual absl::StatusOr<std::vector<Action>> Reconcile(const ModelFacts& facts) = 0;
  // The burst rule: the step timings a heartbeat round carried, then its decision at
  // `decide_ms` (the heartbeat's time). Returns the executed actions.
  virtual absl::StatusOr<std::vector<Action>> DecideBursts(const std::vector<StepTiming>& timings,
                                                           int64_t decide_ms,
                                                           const ModelFacts& facts) = 0;
  // Whether DecideBursts reads `facts` (the model builds them for every worker at every
  // heartbeat only then: at 4 096 workers that is most of a heartbeat's cost).
  virtual bool DecideBurstsReadsFacts() const { return true; }
  // The burst rule's entry line in compute seconds (Controller::BurstStepLineS; 0: none): the
  // step line pacerd hands the workers, read when the scenario's trainers keep it
  // (sim.trainer_deadline).
  virtual double BurstStepLineS() const { return 0; }
  // REALLOCATE's effect on the data: the sharding service's allocation and tail backups.
  virtual absl::Status Reallocate(const Action& a, uint64_t shard_size) = 0;

  // Every decision so far (the audit trail, oldest first; operator records left out).
  virtual std::vector<Decision> Decisions() const = 0;
  // Sharding updates applied so far (pacer-sim's model_events); 0 when not counted.
  virtual uint64_t sharding_updates() const = 0;
};

}  // namespace pacer::sim
