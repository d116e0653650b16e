#include "sim/balanced_bound.h"

#include <algorithm>

namespace pacer::sim {

double BalancedSyncRate(double sum_speed, double global_batch, double sync_cost_s) {
  if (sum_speed <= 0) return 0;
  return global_batch / (global_batch / sum_speed + sync_cost_s);
}

BoundResult ComputeBalancedBound(const SpeedModel& model, double max_s) {
  const Scenario& sc = model.scenario();
  const bool sync = sc.job.mode == SimJobMode::kSync;
  const int64_t n = model.workers();
  const double B = static_cast<double>(sc.job.global_batch);
  const double b = B / static_cast<double>(n);
  SpeedState state(&model);
  std::vector<double> contrib(static_cast<size_t>(n), 0.0);
  double sum = 0, comm = sc.job.sync_cost_s;
  auto contribution = [&](int64_t w) {
    const double v = state.Speed(w);
    if (sync) return v;
    return v > 0 ? b * v / (b + comm * v) : 0.0;
  };
  BoundResult out;
  const double total = static_cast<double>(sc.job.total_samples);
  double done = 0, t = 0;
  int64_t updates = 0;
  for (;;) {
    state.AdvanceTo(t, nullptr);
    bool all = false;
    std::vector<int64_t> dirty = state.TakeDirty(&all);
    if (!sync && state.server_changed()) {
      comm = sc.job.sync_cost_s / std::max(1e-9, state.MinServerFactor());
      all = true;
    }
    updates += static_cast<int64_t>(dirty.size());
    if (all || updates > 4 * n) {  // full recompute now and then bounds rounding drift
      sum = 0;
      for (int64_t w = 0; w < n; ++w) sum += (contrib[w] = contribution(w));
      updates = 0;
    } else {
      std::sort(dirty.begin(), dirty.end());
      dirty.erase(std::unique(dirty.begin(), dirty.end()), dirty.end());
      for (int64_t w : dirty) {
        const double c = contribution(w);
        sum += c - contrib[w];
        contrib[w] = c;
      }
    }
    const double rate = sync ? BalancedSyncRate(sum, B, sc.job.sync_cost_s) : sum;
    if (out.rate.empty() || out.rate.back().second != rate) out.rate.emplace_back(t, rate);
    const double next = std::min(state.NextChange(), max_s);
    if (rate > 0 && done + rate * (next - t) >= total) {
      out.jct_s = t + (total - done) / rate;
      return out;
    }
    if (next >= max_s) {
      out.jct_s = kForever;
      return out;
    }
    done += rate * (next - t);
    t = next;
  }
}

}  // namespace pacer::sim
