#include "sim/view_builder.h"

#include "controller/reconciler.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace pacer::sim {

MonitorOptions MonitorOptionsForPolicy(const PolicyConfig& policy) {
  // pacerd's mapping (controller/reconciler.h), on a base that keeps ten windows of history:
  // enough for every policy rule, and 4 096 workers × 6 policies stay small.
  MonitorOptions base;
  base.history_ms = std::max<int64_t>(10, policy.detection.history_windows) *
                    static_cast<int64_t>(std::llround(policy.detection.window_s * 1000));
  return MonitorOptionsFromPolicy(policy.detection, base);
}

void FillWorkerViews(const std::vector<WorkerStatus>& workers, const std::vector<WorkerFacts>& facts,
                     ClusterView* view) {
  view->workers.clear();
  view->workers.reserve(workers.size());
  for (size_t i = 0; i < workers.size(); ++i) {
    const WorkerStatus& s = workers[i];
    const WorkerFacts& f = facts[i];
    WorkerView w;
    w.id = s.id();
    w.node = f.node.empty() ? s.node() : f.node;
    w.alive = f.alive;
    w.restarting = f.restarting;
    w.speed = s.smoothed_speed() > 0 ? s.smoothed_speed() : s.speed();
    w.last_window_speed = s.speed();
    w.relative_speed = s.relative_speed() > 0 ? s.relative_speed() : 1.0;
    const Classification& c = s.classification();
    w.straggler = c.worker_class() == WORKER_CLASS_STRAGGLER;
    w.leader = c.worker_class() == WORKER_CLASS_LEADER;
    w.persistent = c.persistence() == PERSISTENCE_PERSISTENT;
    w.contention = c.cause() == CAUSE_CONTENTION;
    switch (c.scope()) {
      case SCOPE_WORKER: w.level = SlowLevel::kWorker; break;
      case SCOPE_NODE: w.level = SlowLevel::kNode; break;
      case SCOPE_SERVER: w.level = SlowLevel::kServer; break;
      default: w.level = SlowLevel::kNone; break;
    }
    w.confidence = c.confidence();
    w.local_batch = f.local_batch;
    w.max_local_batch = f.max_local_batch;
    w.step_fixed_s = std::max(0.0, s.model_fixed_s());
    w.step_per_sample_s = std::max(0.0, s.model_per_sample_s());
    w.shard_elapsed_s = f.shard_elapsed_s;
    view->workers.push_back(std::move(w));
  }
}

void FillServerViews(const std::vector<WorkerStatus>& servers, double hot_threshold,
                     ClusterView* view) {
  view->servers.clear();
  // MonitorState::Servers() leaves relative_speed unset (an API gap): relative latency is
  // computed here as latency / median latency over the servers that reported.
  std::vector<double> lat;
  for (const auto& s : servers)
    if (s.latency_ms() > 0) lat.push_back(s.latency_ms());
  double median = 0;
  if (!lat.empty()) {
    std::sort(lat.begin(), lat.end());
    const size_t n = lat.size();
    median = n % 2 ? lat[n / 2] : 0.5 * (lat[n / 2 - 1] + lat[n / 2]);
  }
  for (const auto& s : servers) {
    ServerView v;
    v.id = s.id();
    v.node = s.node();
    v.latency_ms = s.latency_ms();
    // The monitor's relative speed of a server is median latency / latency.
    v.relative_latency = s.relative_speed() > 0   ? 1.0 / s.relative_speed()
                         : median > 0 && v.latency_ms > 0 ? v.latency_ms / median
                                                          : 1.0;
    v.hot = s.classification().worker_class() == WORKER_CLASS_STRAGGLER ||
            v.relative_latency >= hot_threshold;
    v.persistent = s.classification().persistence() == PERSISTENCE_PERSISTENT;
    view->servers.push_back(std::move(v));
  }
}

void FillNodeViews(const std::vector<NodeStatus>& nodes, ClusterView* view) {
  view->nodes.clear();
  for (const auto& n : nodes) {
    NodeView v;
    v.name = n.node();
    v.slow = n.workers() > 0 && n.stragglers() * 4 >= n.workers() * 3;
    v.contention = n.contention_score() >= 1.0;
    v.cpu_steal = n.last_metrics().cpu_steal_frac();
    view->nodes.push_back(std::move(v));
  }
}

}  // namespace pacer::sim
