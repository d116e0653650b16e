// The monitor's state → the controller's ClusterView, and a policy → MonitorOptions, for the
// simulator. pacerd's Reconciler (controller/reconciler.h) does the same from the monitor
// *service*; its view builder is private to it and bound to the gRPC-era services, so the
// simulator keeps this copy (same field mapping, plus the server relative latency the monitor
// leaves unset; see docs/simulator.md, "API wishes").
//
// Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "controller/cluster_view.h"
#include "controller/policy_config.h"
#include "monitor/monitor_options.h"
#include "proto/pacer/monitor.pb.h"

namespace pacer::sim {

// pacerd's MonitorOptionsFromPolicy, with ten windows of history.
MonitorOptions MonitorOptionsForPolicy(const PolicyConfig& policy);

// What the simulator knows about a worker that the monitor does not (the agent's and the
// sharding service's part of pacerd's view).
struct WorkerFacts {
  bool alive = true;
  bool restarting = false;
  int64_t local_batch = 0;
  int64_t max_local_batch = 0;
  double shard_elapsed_s = 0;
  std::string node;  // current placement (the monitor may lag after a migration)
};

// One WorkerView per monitor status (same order); statuses without an estimate yet get speed 0
// (the planner then assumes the median). Nodes and servers from the monitor's lists.
void FillWorkerViews(const std::vector<WorkerStatus>& workers, const std::vector<WorkerFacts>& facts,
                     ClusterView* view);
void FillServerViews(const std::vector<WorkerStatus>& servers, double hot_threshold,
                     ClusterView* view);
void FillNodeViews(const std::vector<NodeStatus>& nodes, ClusterView* view);

}  // namespace pacer::sim
