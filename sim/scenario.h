// Scenario: one simulated training job and what happens to its cluster, as read from a
// sim/scenarios/*.yaml file (docs/design.md §7).
//
// Shape (keys beyond the base format of docs/design.md §7 are marked "ext"; every key is checked, an unknown one is an
// error naming file, line and field):
//   name: mixed-hardware
//   description: free text                                   (ext)
//   suited: dedicated | non-dedicated | <policy name>        (ext; the preset that fits)
//   seed: 7
//   job: {mode: sync|async, workers, workers_per_node, servers, global_batch, total_samples,
//         sync_cost_s, restart_cost_s, migrate_cost_s (ext), batch_cap, spare_nodes (ext)}
//   speeds: {median, sigma, groups: [{fraction, factor}]}    groups are by node (hardware)
//   noise: 0.05                                               per-step noise (see noise_dist)
//   noise_dist: uniform | lognormal | exponential             (ext) uniform ±noise (default);
//                                                             or skewed, mean 1 and std `noise`
//   events: [{at_s, kind, ...}]                               see EventKind below
//   sim: {tick_s, report_interval_s, progress_interval_s, shard_size, max_sim_s, reconcile_s,
//         decision_heartbeats, step_deadline, trainer_deadline}                                                          (ext)
//
// Plain value type; a Scenario returned by ParseScenario has passed every range check.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace pacer::sim {

enum class SimJobMode { kSync, kAsync };

// Per-step noise on a worker's compute time (a factor around 1). kUniform: 1 ± noise, evenly;
// kLognormal: exp(σZ − σ²/2) with mean 1 and std `noise` (mildly right-skewed); kExponential:
// 1 + noise·(E − 1), E ~ Exp(1): mean 1, std `noise`, never below 1 − noise, a long right tail
// (skewness 2: most steps near the typical time, now and then a much slower one).
enum class NoiseDist { kUniform, kLognormal, kExponential };

// What an event does. `worker` / `node` / `server` name one target; `fraction` instead picks
// that share of workers (or nodes) at random from the seed.
enum class EventKind {
  kSlowdown,        // worker(s) run at `factor` for duration_s (0 = until cured or forever)
  kTransient,       // Poisson episodes per worker: rate_per_worker_hour, mean_duration_s
  kNodeContention,  // every worker of node(s) at `factor`
  kFailure,         // worker(s) crash at at_s (or at rate_per_worker_hour); the agent relaunches
  kHotServer,       // PS server's latency × 1/factor (async jobs)
};

struct SpeedGroup {
  double fraction = 0;  // share of nodes
  double factor = 1;    // speed multiplier of their hardware
};

struct ScenarioEvent {
  EventKind kind = EventKind::kSlowdown;
  double at_s = 0;
  int64_t worker = -1, node = -1, server = -1;  // -1: not given
  double fraction = 0;                          // instead of one target
  double factor = 1;
  double duration_s = 0;  // 0 = persistent (until the end, or until cured by a relaunch)
  double rate_per_worker_hour = 0;
  double mean_duration_s = 30;
  // Whether the node's CPU-steal signal shows it (contention) or not (hardware-like, a
  // deterministic slowdown). Contention on a worker is cured by restarting it; hardware by
  // migrating it. Default: true except for slowdowns with `contention: false`.
  bool contention = true;
  int line = 0;  // 1-based line in the file, for messages
};

struct ScenarioJob {
  SimJobMode mode = SimJobMode::kSync;
  int64_t workers = 0;
  int64_t workers_per_node = 1;
  int64_t servers = 0;
  int64_t global_batch = 0;   // sync: samples per step; async: Σ local batches
  int64_t total_samples = 0;  // records in the one-epoch dataset
  double sync_cost_s = 0;     // sync: all-reduce per step; async: push/pull per step
  double restart_cost_s = 60;
  double migrate_cost_s = 0;  // 0 = 1.5 × restart_cost_s
  int64_t batch_cap = 0;      // memory cap on one micro-batch; 0 = none
  int64_t spare_nodes = -1;   // free nodes for migration; -1 = max(1, nodes / 8)
};

struct ScenarioSpeeds {
  double median = 100;  // samples per second of a median worker
  double sigma = 0;     // lognormal spread of per-worker speed
  std::vector<SpeedGroup> groups;
};

struct SimSettings {
  double tick_s = 1;              // coarse step of the model
  double report_interval_s = 10;  // SDK step-report interval (one mean step per interval)
  double progress_interval_s = 0;  // progress acknowledgements; 0 = report_interval_s
  int64_t shard_size = 0;         // 0 = ~30 s of a median worker's work
  double max_sim_s = 0;           // 0 = 20 × the bound
  double reconcile_s = 0;         // 0 = the policy's detection window
  // The burst rule's step path: how many heartbeats after the one that carried a step timing
  // its decision reaches the worker. 0 (default): pacerd decides inside the heartbeat handler
  // and that heartbeat's reply carries it (Reconciler::OnHeartbeatSteps, what pacerd does).
  // 1: the decision reaches the worker in its next heartbeat's reply (pacerd before the
  // heartbeat carried step timings: a decision once per heartbeat interval), for comparison.
  int64_t decision_heartbeats = 0;
  // Whether a heartbeat also says how long a step still running has run (a per-step deadline:
  // HeartbeatRequest.step_timings, StepTiming.in_progress). true (default): what the SDK's
  // heartbeat carries (a StepTimer told the step's samples, as pacer-train-mlp does). false:
  // only finished steps reach the rule (an SDK that does not report its running step).
  bool step_deadline = true;
  // Whether the job's trainers keep the step line (default false): pacerd hands the burst
  // rule's entry line in heartbeat replies (HeartbeatResponse.step_line_s); a trainer whose
  // step passes it reports at once in a heartbeat of its own, which the rule decides inside,
  // and, excluded by the reply, joins the all-reduce with weight 0 and hands the step's records
  // back uncounted (pacer-train-mlp does, checking between 4 slices of its batch; pacer.torch's
  // loader does not). A worker the rule leaves in finishes its step. docs/simulator.md "Scale".
  bool trainer_deadline = false;
};

struct Scenario {
  std::string file;  // where it was read from ("" when built in code)
  std::string name;
  std::string description;
  std::string suited = "non-dedicated";
  uint64_t seed = 1;
  ScenarioJob job;
  ScenarioSpeeds speeds;
  double noise = 0;
  NoiseDist noise_dist = NoiseDist::kUniform;
  std::vector<ScenarioEvent> events;
  SimSettings sim;

  int64_t nodes() const { return (job.workers + job.workers_per_node - 1) / job.workers_per_node; }
  int64_t spare_nodes() const {
    return job.spare_nodes >= 0 ? job.spare_nodes : std::max<int64_t>(1, nodes() / 8);
  }
  double migrate_cost_s() const {
    return job.migrate_cost_s > 0 ? job.migrate_cost_s : 1.5 * job.restart_cost_s;
  }
};

const char* EventKindName(EventKind kind);

// Largest scenario file accepted (a larger one is refused after reading one byte past it).
inline constexpr size_t kMaxScenarioBytes = 1u << 20;

// Parses scenario YAML; `file_name` is used in messages ("FILE:LINE:COL: field 'job.x': ...").
// INVALID_ARGUMENT on malformed YAML, an unknown or duplicate key, a wrong type, a value out of
// range or a missing required field. Never throws.
absl::StatusOr<Scenario> ParseScenario(std::string_view yaml_text, std::string_view file_name);

// Reads and parses a file; NOT_FOUND when it cannot be read.
absl::StatusOr<Scenario> LoadScenarioFile(const std::string& path);

// Range and cross-field checks (also run by ParseScenario); for scenarios built in code.
absl::Status ValidateScenario(const Scenario& scenario);

}  // namespace pacer::sim
