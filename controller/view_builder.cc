#include "controller/view_builder.h"

#include <algorithm>
#include <cmath>

namespace pacer {
namespace {

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + static_cast<long>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

SlowLevel LevelOf(const Classification& c) {
  if (c.worker_class() != WORKER_CLASS_STRAGGLER) return SlowLevel::kNone;
  switch (c.scope()) {
    case SCOPE_NODE: return SlowLevel::kNode;
    case SCOPE_SERVER: return SlowLevel::kServer;
    default: return SlowLevel::kWorker;
  }
}

}  // namespace

MonitorOptions MonitorOptionsFromPolicy(const PolicyConfig& policy, MonitorOptions base) {
  const DetectionConfig& d = policy.detection;
  base.straggler_threshold = d.straggler_threshold;
  base.leader_threshold = d.leader_threshold;
  base.window_ms = static_cast<int64_t>(std::llround(d.window_s * 1000));
  base.persistent_k = static_cast<uint32_t>(d.persistent_windows);
  base.persistent_w = static_cast<uint32_t>(d.history_windows);
  base.running_step_bound = d.running_step_bound;
  // The server rule acts on a *persistent* hot server, and persistence is the monitor's
  // classification: it must call a server hot at the policy's threshold, not only at its own
  // default (2×), or servers between the two are never acted on.
  if (policy.server.hot_threshold > 1) base.hot_server_ratio = policy.server.hot_threshold;
  return base;
}

ClusterView BuildClusterView(const ViewInputs& in) {
  static const WorkerFacts kNoFacts;
  ClusterView v;
  v.now_ms = in.now_ms;
  JobView& j = v.job;
  j.mode = in.job.mode;
  j.current_step = in.job.current_step;
  j.last_plan_version = in.job.last_plan_version;
  j.heartbeat_interval_s = in.job.heartbeat_interval_s;
  j.restart_cost_s = in.job.restart_cost_s;
  j.migrate_cost_s = in.job.migrate_cost_s;
  j.lost_work_s = in.job.progress_interval_s / 2;
  j.typical_shard_time_s = in.job.typical_shard_time_s;

  const int64_t stale_ms = static_cast<int64_t>(std::max(1, in.stale_windows)) *
                           std::max<int64_t>(in.window_ms, 1);
  std::vector<double> walls;
  int64_t batch_sum = 0;
  double async_rate = 0;
  int live = 0;
  bool all_honor = true;
  v.workers.reserve(in.workers.size());
  for (const WorkerStatus& s : in.workers) {
    auto f = in.facts.find(s.id());
    const WorkerFacts& facts = f == in.facts.end() ? kNoFacts : f->second;
    WorkerView w;
    w.id = s.id();
    w.node = facts.node.empty() ? s.node() : facts.node;
    w.alive = s.reports() > 0 && in.now_ms - s.last_report_ms() <= stale_ms &&
              s.last_report_ms() >= in.job.run_started_ms;
    w.restarting = facts.restarting;
    w.speed = s.smoothed_speed() > 0 ? s.smoothed_speed() : s.speed();
    w.last_window_speed = s.speed();
    w.relative_speed = s.relative_speed() > 0 ? s.relative_speed() : 1.0;
    const Classification& c = s.classification();
    w.straggler = c.worker_class() == WORKER_CLASS_STRAGGLER;
    w.leader = c.worker_class() == WORKER_CLASS_LEADER;
    w.persistent = c.persistence() == PERSISTENCE_PERSISTENT;
    w.contention = c.cause() == CAUSE_CONTENTION;
    w.level = LevelOf(c);
    w.confidence = c.confidence();
    w.local_batch = s.local_batch();
    w.max_local_batch = facts.max_local_batch;
    w.step_fixed_s = std::max(0.0, s.model_fixed_s());
    w.step_per_sample_s = std::max(0.0, s.model_per_sample_s());
    w.shard_elapsed_s = facts.shard_elapsed_s;
    if (w.alive && !w.restarting) {
      ++live;
      all_honor = all_honor && facts.honors_exclusion;
      batch_sum += w.local_batch;
      if (s.wall_s() > 0) {
        walls.push_back(s.wall_s());
        async_rate += static_cast<double>(w.local_batch) / s.wall_s();
      }
    }
    v.workers.push_back(std::move(w));
  }
  if (!walls.empty()) {
    j.step_time_s = Median(walls);
    j.throughput = j.mode == JobMode::kSync ? static_cast<double>(batch_sum) / j.step_time_s : async_rate;
  }
  j.global_batch = in.job.global_batch > 0 ? in.job.global_batch : batch_sum;
  j.can_exclude_workers = live > 0 && all_honor;

  for (const NodeStatus& n : in.nodes) {
    NodeView nv;
    nv.name = n.node();
    nv.slow = n.workers() > 0 && n.stragglers() * 4 >= n.workers() * 3;
    nv.contention = n.contention_score() >= 1.0;
    nv.cpu_steal = n.last_metrics().cpu_steal_frac();
    v.nodes.push_back(std::move(nv));
  }

  std::vector<double> lat;
  for (const auto& s : in.servers)
    if (s.latency_ms() > 0) lat.push_back(s.latency_ms());
  double median = 0;
  if (!lat.empty()) {
    std::sort(lat.begin(), lat.end());
    const size_t n = lat.size();
    median = n % 2 ? lat[n / 2] : 0.5 * (lat[n / 2 - 1] + lat[n / 2]);
  }
  for (const WorkerStatus& s : in.servers) {
    ServerView sv;
    sv.id = s.id();
    sv.node = s.node();
    sv.latency_ms = s.latency_ms();
    sv.relative_latency = s.relative_speed() > 0          ? 1.0 / s.relative_speed()
                          : median > 0 && sv.latency_ms > 0 ? sv.latency_ms / median
                                                            : 1.0;
    sv.hot = s.classification().worker_class() == WORKER_CLASS_STRAGGLER ||
             sv.relative_latency >= in.hot_threshold;
    sv.persistent = s.classification().persistence() == PERSISTENCE_PERSISTENT;
    v.servers.push_back(std::move(sv));
  }

  int64_t remaining = 0;
  for (const DatasetProgress& d : in.job.datasets) {
    if (d.num_epochs == 0 || d.records_per_epoch == 0) continue;
    const uint64_t total = d.records_per_epoch * d.num_epochs;
    const uint64_t done = std::min<uint64_t>(
        total, d.completed_epochs * d.records_per_epoch + (d.finished ? 0 : d.records_done_current_epoch));
    remaining += static_cast<int64_t>(total - done);
    if (j.epoch_progress == 0 && !d.finished) {
      j.epoch_progress = static_cast<double>(d.records_done_current_epoch) / d.records_per_epoch;
    }
  }
  j.remaining_samples = remaining;
  return v;
}

}  // namespace pacer
