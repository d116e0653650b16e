// ViewBuilder: the one place a ClusterView is assembled, for pacerd and for the simulator.
//
// The controller decides on a ClusterView (cluster_view.h). pacerd's Reconciler and pacer-sim
// both build it here, from the same kinds of inputs:
//   - the monitor's statuses (WorkerStatus / NodeStatus, the same proto pacerd's ListWorkers
//     answers and MonitorState::Workers() returns): speeds, classes, step-time models, the
//     last report's local batch and step wall time;
//   - what the monitor does not know, per worker (WorkerFacts): restarting (the agents),
//     memory cap and whether the trainer honours exclusion (the worker's heartbeats), the age of
//     the shard lease it holds (the sharding state);
//   - job facts (JobFacts): the run's step, plan versions, costs, data progress.
// Every field a policy reads is filled from these in both drivers; a field a driver cannot know
// stays at its documented "unknown" value (0), and the policies treat it as such.
//
// The rules, stated once:
//   alive       the worker reported in the current run within `stale_windows` windows;
//   speed       the monitor's smoothed speed, else the last window's;
//   throughput  sync: Σ local batch of live workers / median step wall; async: Σ b_i / wall_i;
//   node slow   at least 3/4 of the node's workers are stragglers;
//   server      relative latency = the monitor's, else latency / median latency over servers;
//               hot when classified a straggler or relative latency ≥ hot_threshold;
//   exclusion   possible only while every live worker's trainer honours it;
//   lost work   half a progress interval (what a relaunch throws away on average).
//
// Pure functions of their inputs; thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "controller/cluster_view.h"
#include "controller/policy_config.h"
#include "monitor/monitor_options.h"
#include "proto/pacer/monitor.pb.h"

namespace pacer {

// What a driver knows about one worker besides the monitor's status. Missing entries mean
// "nothing known": not restarting, no cap, honours nothing, no lease held.
struct WorkerFacts {
  bool restarting = false;       // being relaunched (agent: backoff, stopping, restart pending)
  int64_t max_local_batch = 0;   // memory cap on one micro-batch; 0 = unknown
  bool honors_exclusion = false;  // the trainer carries out ExclusionCommands
  double shard_elapsed_s = 0;    // age of the oldest lease it holds; 0 = none held
  std::string node;              // current placement when the driver knows better than the
                                 // monitor (after a migration); empty = the monitor's
};

// Progress of one bounded dataset (streams are left out by the driver).
struct DatasetProgress {
  uint64_t records_per_epoch = 0;
  uint32_t num_epochs = 0;
  uint32_t completed_epochs = 0;
  uint64_t records_done_current_epoch = 0;
  bool finished = false;
};

struct JobFacts {
  JobMode mode = JobMode::kSync;
  int64_t current_step = 0;        // the newest step of the current run
  uint64_t last_plan_version = 0;  // newest plan version ever issued
  int64_t global_batch = 0;        // 0: Σ local batches of the live workers
  double heartbeat_interval_s = 1;
  double progress_interval_s = 1;  // how often a worker acknowledges its progress
  double restart_cost_s = 0;
  double migrate_cost_s = 0;
  double typical_shard_time_s = 0;  // median duration of recently completed leases; 0 = unknown
  int64_t run_started_ms = 0;       // reports before it belong to an earlier run
  std::vector<DatasetProgress> datasets;
};

struct ViewInputs {
  int64_t now_ms = 0;
  int64_t window_ms = 1000;  // the monitor's window
  int stale_windows = 3;     // a worker silent for longer is not alive
  double hot_threshold = 1.5;  // policy.server.hot_threshold
  std::vector<WorkerStatus> workers;  // the monitor's, without evidence
  std::vector<NodeStatus> nodes;
  std::vector<WorkerStatus> servers;
  std::map<std::string, WorkerFacts> facts;  // by worker id
  JobFacts job;
};

// The controller's view of the job now.
ClusterView BuildClusterView(const ViewInputs& in);

// MonitorOptions with the policy's detection settings applied, and its hot-server threshold
// (`actions.server.hot_threshold`) as the monitor's (pacerd at start and on every policy reload;
// the simulator per run).
MonitorOptions MonitorOptionsFromPolicy(const PolicyConfig& policy, MonitorOptions base);

}  // namespace pacer
