#include "controller/relaunch_cost_model.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "absl/strings/str_format.h"

namespace pacer {

double MedianLiveSpeed(const ClusterView& view) {
  std::vector<double> v;
  for (const auto& w : view.workers)
    if (w.alive && !w.restarting && w.speed > 0) v.push_back(w.speed);
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double PredictThroughput(const ClusterView& view, bool balanced, const std::string& worker_id,
                         double speed) {
  double sum = 0, min = 0;
  int64_t n = 0;
  for (const auto& w : view.workers) {
    if (!w.alive || w.restarting) continue;
    const double v = (!worker_id.empty() && w.id == worker_id) ? speed : w.speed;
    sum += v;
    min = n == 0 ? v : std::min(min, v);
    ++n;
  }
  if (view.job.mode == JobMode::kAsync || balanced) return sum;
  return static_cast<double>(n) * min;
}

RelaunchBaseline ComputeRelaunchBaseline(const ClusterView& view, bool balanced) {
  RelaunchBaseline b;
  b.median_speed = MedianLiveSpeed(view);
  b.throughput_now = PredictThroughput(view, balanced, "", 0);
  b.by_sum = view.job.mode == JobMode::kAsync || balanced;
  b.min1 = b.min2 = std::numeric_limits<double>::infinity();
  for (const auto& w : view.workers) {
    if (!w.alive || w.restarting) continue;
    ++b.live;
    b.sum += w.speed;
    if (w.speed < b.min1) {
      b.min2 = b.min1;
      b.min1 = w.speed;
    } else if (w.speed < b.min2) {
      b.min2 = w.speed;
    }
  }
  return b;
}

double RelaunchBaseline::ThroughputWith(const WorkerView& worker, double speed) const {
  if (!worker.alive || worker.restarting || live == 0) return throughput_now;  // not counted
  if (by_sum) return sum - worker.speed + speed;
  // The slowest of the others (the next smallest when this worker is the slowest) and `speed`.
  const double others = worker.speed == min1 ? min2 : min1;
  return static_cast<double>(live) * std::min(others, speed);
}

RelaunchEstimate EstimateRelaunch(const ClusterView& view, const WorkerView& worker,
                                  ActionKind kind, bool balanced, const RestartConfig& cfg) {
  return EstimateRelaunch(view, worker, kind, balanced, cfg,
                          ComputeRelaunchBaseline(view, balanced));
}

RelaunchEstimate EstimateRelaunch(const ClusterView& view, const WorkerView& worker,
                                  ActionKind kind, bool balanced, const RestartConfig& cfg,
                                  const RelaunchBaseline& baseline) {
  RelaunchEstimate e;
  e.kind = kind;
  e.speed_now = worker.speed;
  const double median = baseline.median_speed;
  const bool same_node = kind == ActionKind::kRestart;
  const bool cause_stays =
      same_node && ((!worker.contention && !cfg.restart_deterministic) ||
                    worker.level == SlowLevel::kNode);
  e.speed_after = cause_stays ? worker.speed : std::max(median, worker.speed);
  e.throughput_now = baseline.throughput_now;
  e.throughput_after = baseline.ThroughputWith(worker, e.speed_after);
  const double R = static_cast<double>(view.job.remaining_samples);
  double relaunch_s = view.job.restart_cost_s;
  if (kind == ActionKind::kMigrate)
    relaunch_s = view.job.migrate_cost_s > 0 ? view.job.migrate_cost_s
                                             : view.job.restart_cost_s * cfg.migrate_cost_factor;
  if (R <= 0 || view.job.restart_cost_s <= 0 || e.throughput_now <= 0) {
    e.reason = R <= 0 ? "remaining work unknown" : "restart cost not measured yet";
    return e;
  }
  e.saved_s = R / e.throughput_now - R / e.throughput_after;
  const double stall_s = relaunch_s + view.job.lost_work_s;
  e.cost_s = view.job.mode == JobMode::kSync ? stall_s
                                             : stall_s * worker.speed / e.throughput_now;
  e.pays = e.saved_s > e.cost_s * (1 + cfg.margin);
  e.predicted_gain = e.throughput_after / e.throughput_now - 1;
  e.reason = absl::StrFormat(
      "%s: speed %.1f→%.1f/s, job %.1f→%.1f/s, saves %.0fs over %.0f samples vs cost %.0fs "
      "(×%.2f margin)%s",
      ActionKindName(kind), e.speed_now, e.speed_after, e.throughput_now, e.throughput_after,
      e.saved_s, R, e.cost_s, 1 + cfg.margin, e.pays ? "" : ": does not pay");
  return e;
}

}  // namespace pacer
