// JobSimulation: one training job under one policy, on the simulated clock (docs/design.md §7).
//
// What is real and what is modelled:
//   real      MonitorState (speed windows, straggler classification), Controller (policy,
//             SafetyGate, audit, rollback), BatchPlanner, ShardingState (leases, progress,
//             requeue, fencing, tail backups) — the same classes pacerd links;
//   modelled  the workers (SpeedState speeds, per-step noise, memory caps and accumulation),
//             the all-reduce / parameter-server network (sync_cost_s), the node agents
//             (relaunch after restart_cost_s, migration to a free node) and node CPU-steal
//             signals for contention.
//
// The model talks to its control plane (sim/control_plane.h) as a real job talks to pacerd;
// RunPolicy uses the simulator's own (InProcessControlPlane), RunPolicyOn any other.
//
// One Run(), in order (each loop iteration is one coarse "chunk" of the model):
//  1. open/close the slowdown episodes due (SpeedState), crash the workers whose failure is
//     due, bring back the workers whose relaunch finished (re-registered with the monitor and
//     the sharding state, as a relaunched process would);
//  2. at each report interval: every worker sends the monitor one StepReport (its mean step
//     over the interval) and acknowledges its progress to the sharding state (ProgressUpdate);
//     agents send NodeMetrics; PS workers report server latency; the monitor closes windows;
//  3. every reconcile interval (after a window closed): build the ClusterView from the
//     monitor and the job, run Controller::Reconcile, dispatch the executed actions
//     (batch plans switch at their effective step; REALLOCATE → SetAllocation / tail backups;
//     restarts, migrations, server restarts take the worker or server down for the cost);
//  4. advance the model to the next boundary (report, timeline change, relaunch end, or one
//     tick): sync jobs run k whole steps of max_i(compute_i) + sync_cost; async workers run
//     at their own pace with PS wait sync_cost / (worst server factor). Workers consume data
//     through leases (fetch → consume → complete), so a relaunch loses exactly the
//     un-acknowledged work (WorkerLostUpdate requeues the unconsumed suffix).
// The job ends when ShardingState counts every record done. DataLedger checks, independently,
// that none was lost and none counted twice.
//
// Deterministic: every random draw comes from the scenario seed (SpeedModel streams, and one
// noise stream per run), so the same scenario and policy give bit-identical results.
// Not thread-safe; independent runs may go on separate threads.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "controller/policy_config.h"
#include "monitor/monitor_options.h"
#include "sim/control_plane.h"
#include "sim/in_process_control_plane.h"
#include "sim/speed_model.h"

namespace pacer::sim {

struct ActionMark {
  double t_s = 0;
  std::string kind;  // ActionKindName
  std::string target;
};

struct PolicyRun {
  std::string name;    // as given on the command line
  std::string policy;  // decision function
  bool finished = false;
  double jct_s = 0;  // kForever when not finished by max_sim_s
  // Executed actions by kind (rollbacks included in their kind).
  uint64_t plans = 0, restarts = 0, migrations = 0, server_actions = 0, reallocations = 0,
           exclusions = 0, rollbacks = 0, failures = 0, invalid_plans = 0;
  uint64_t records_lost = 0, records_duplicated = 0, backup_overlap = 0;
  uint64_t wasted_samples = 0;      // consumed but never acknowledged (lost to relaunches)
  uint64_t fenced_reports = 0;      // reports refused because the lease was fenced off
  uint64_t state_done_mismatch = 0; // |ShardingState done − ledger union|: must be 0
  uint64_t model_events = 0;        // chunks + reports + updates + reconciles + timeline changes
  uint64_t sharding_updates = 0, monitor_reports = 0, reconciles = 0, chunks = 0;
  double wall_s = 0;
  double cpu_s = 0;  // CPU seconds of the thread that ran it (the machine's load aside)
  std::vector<std::pair<double, double>> throughput;  // (t, samples/s) per report interval
  std::vector<ActionMark> actions;
};

// The monitor's options for a run of `policy`: pacerd's MonitorOptionsFromPolicy with ten
// windows of history.
MonitorOptions MonitorOptionsForPolicy(const PolicyConfig& policy);

// The simulated clock's time at the job's start (model time 0).
inline constexpr int64_t kSimStartMs = 1'700'000'000'000;

// What a control plane is configured with for the scenario's job (pacerd: its flags).
ControlPlaneJob ControlPlaneJobFor(const Scenario& scenario);

// Runs `policy` (a validated PolicyConfig; `display_name` labels it) on the scenario until the
// dataset is done or `max_sim_s`, on the simulator's own control plane (InProcessControlPlane).
// INTERNAL when a real component refused what the model assumed it would accept (a bug in the
// glue, reported, never hidden).
absl::StatusOr<PolicyRun> RunPolicy(const SpeedModel& model, const PolicyConfig& policy,
                                    const std::string& display_name, double max_sim_s);

// The same run against another control plane (sim/control_plane.h), e.g. a real pacerd
// (tests/testing/pacerd_control_plane.h), started at kSimStartMs and deciding with `policy`.
absl::StatusOr<PolicyRun> RunPolicyOn(const SpeedModel& model, const PolicyConfig& policy,
                                      const std::string& display_name, double max_sim_s,
                                      ControlPlane& control_plane);

}  // namespace pacer::sim
