// ClusterView: everything the controller may look at when it decides, as plain values.
//
// The view is the controller's only input about the job (the other is its own History). It is
// a snapshot, built by whoever drives the controller (pacerd from the monitor, the simulator
// from its model, tests by hand) and passed by const reference; the controller keeps no
// pointer into it. Time is a field (`now_ms`), so a decision is a pure function of
// (view, history, policy) and replays exactly (docs/style.md §5).
//
// Units: speeds in samples per compute-second, times in seconds unless the name says _ms.
// Plain structs, no invariants enforced here; ValidateClusterView() checks the ones the
// controller relies on (unique worker ids, non-negative speeds and batches, ...).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace pacer {

// How the job trains: synchronous all-reduce (every step waits for every worker) or
// asynchronous parameter-server training (workers push/pull independently).
enum class JobMode { kSync, kAsync };

// Where a slowdown sits (AntDT's classification).
enum class SlowLevel {
  kNone,    // not slow
  kWorker,  // this worker only
  kNode,    // every worker on the node is slow: the node is the cause
  kServer,  // a hot parameter server slows everyone that talks to it
};

struct WorkerView {
  std::string id;
  std::string node;
  bool alive = true;       // registered and heartbeating
  bool restarting = false;  // being relaunched; not counted as live

  // Monitor estimates.
  double speed = 0;              // predicted samples / compute second (windowed, robust)
  double last_window_speed = 0;  // the last window's raw measurement (LB-BSP uses this)
  double relative_speed = 1;     // speed / median(speed)

  // Classification (meaningful when straggler or leader is set).
  bool straggler = false;
  bool leader = false;
  bool persistent = false;  // held for K of the last W windows; else transient
  bool contention = false;  // non-deterministic (steal, throttling, co-located load); else
                            // deterministic (tied to the hardware)
  SlowLevel level = SlowLevel::kNone;
  double confidence = 0;  // 0..1, how sure the monitor is of the classification

  // Batch and step-time model (sync jobs).
  int64_t local_batch = 0;      // samples per step it trains on now (micro-batch × accumulation)
  int64_t max_local_batch = 0;  // memory cap on one micro-batch; 0 = no cap known
  double step_fixed_s = 0;      // step time ≈ step_fixed_s + step_per_sample_s × batch;
  double step_per_sample_s = 0;  // when step_per_sample_s is 0, batch / speed is used

  // Data progress (async jobs, timeout-relaunch).
  double shard_elapsed_s = 0;  // time spent on the shard it holds now; 0 = none held

  // Step statistics (sync jobs): its speed over its recent training steps and the relative
  // standard error of that mean (controller/step_statistics.h). Filled by the Controller from
  // the step timings it observes, not by the view builder; 0 = none.
  double step_speed = 0;
  double step_speed_rel_se = 0;
  double step_noise = 0;  // relative std of one of its steps (the job's when larger); 0 = unknown
};

struct NodeView {
  std::string name;
  bool slow = false;        // the monitor flags the node (all its workers slow)
  bool contention = false;  // steal / throttling / co-located load seen on the node
  double cpu_steal = 0;     // fraction 0..1, informational
};

struct ServerView {
  std::string id;
  std::string node;
  double latency_ms = 0;       // windowed request latency
  double relative_latency = 1;  // latency / median over servers
  bool hot = false;
  bool persistent = false;
};

struct JobView {
  JobMode mode = JobMode::kSync;
  int64_t global_batch = 0;         // B, samples per synchronous step (sync jobs)
  int64_t current_step = 0;         // the newest step reported in the current run
  // The newest batch plan version issued in any run of the job (a plan withdrawn at a new run
  // included): a new plan numbers above it, so versions only grow (docs/sharding.md, "Runs").
  uint64_t last_plan_version = 0;
  double step_time_s = 0;           // measured wall time of one step (sync jobs)
  double heartbeat_interval_s = 1;  // how often a worker picks up commands
  int64_t remaining_samples = 0;    // samples left to train on (0 = unknown/unbounded)
  double throughput = 0;            // measured job samples / second, last window
  double restart_cost_s = 0;        // measured time one relaunch takes (job-wide stall in sync)
  double migrate_cost_s = 0;        // measured time a relaunch on another node takes; 0 = unknown
  double lost_work_s = 0;           // work thrown away by a relaunch (since last checkpoint)
  double typical_shard_time_s = 0;  // median time a shard takes (timeout-relaunch)
  double epoch_progress = 0;        // 0..1 of the current epoch consumed (tail backups)
  // Whether a synchronous step can go on without some workers' gradients (EXCLUDE_WORKERS:
  // burst exclusion, the backup-workers baseline). The simulator models it; pacerd's all-reduce
  // layer cannot carry it out yet, so pacerd leaves it false and those rules propose nothing
  // (rather than audit actions that change nothing).
  bool can_exclude_workers = false;
};

struct ClusterView {
  int64_t now_ms = 0;
  JobView job;
  std::vector<WorkerView> workers;
  std::vector<NodeView> nodes;
  std::vector<ServerView> servers;

  const WorkerView* FindWorker(const std::string& id) const {
    for (const auto& w : workers)
      if (w.id == id) return &w;
    return nullptr;
  }
  const NodeView* FindNode(const std::string& name) const {
    for (const auto& n : nodes)
      if (n.name == name) return &n;
    return nullptr;
  }
  // Workers that take part in training now (alive and not restarting).
  int LiveWorkers() const {
    int n = 0;
    for (const auto& w : workers) n += (w.alive && !w.restarting) ? 1 : 0;
    return n;
  }
};

// INVALID_ARGUMENT naming the field when the view breaks what the controller relies on:
// unique non-empty worker ids, finite non-negative numbers, caps ≥ 0.
absl::Status ValidateClusterView(const ClusterView& view);

const char* JobModeName(JobMode mode);
const char* SlowLevelName(SlowLevel level);

}  // namespace pacer
