// Baseline "timeout-relaunch" (ElasticDL / DLRover): relaunch a worker whose current shard has
// taken more than `factor` × the typical shard time. No classification and no cost model: the
// timeout alone decides (the safety layer's limits still apply).
#include <algorithm>
#include <vector>

#include "absl/strings/str_format.h"
#include "controller/policies/policy.h"
#include "controller/relaunch_cost_model.h"

namespace pacer {

std::vector<Action> DecideTimeoutRelaunch(const ClusterView& view, const History& history,
                                          const PolicyConfig& cfg) {
  double typical = view.job.typical_shard_time_s;
  if (typical <= 0) {  // fall back to the median of the shards in progress
    std::vector<double> t;
    for (const auto& w : view.workers)
      if (w.alive && !w.restarting && w.shard_elapsed_s > 0) t.push_back(w.shard_elapsed_s);
    if (t.empty()) return {};
    std::sort(t.begin(), t.end());
    typical = t[t.size() / 2];
  }
  const bool balanced = view.job.mode == JobMode::kAsync;
  const double median = MedianLiveSpeed(view);
  const double now = PredictThroughput(view, balanced, "", 0);
  std::vector<Action> out;
  for (const auto& w : view.workers) {
    if (!w.alive || w.restarting) continue;
    if (w.shard_elapsed_s <= cfg.timeout_relaunch.factor * typical) continue;
    Action a;
    a.kind = ActionKind::kRestart;
    a.target = w.id;
    a.node = w.node;
    const double after = PredictThroughput(view, balanced, w.id, std::max(median, w.speed));
    a.predicted_gain = now > 0 ? after / now - 1 : 0;
    a.reason = absl::StrFormat("shard running %.0fs > %.1f × typical %.0fs", w.shard_elapsed_s,
                               cfg.timeout_relaunch.factor, typical);
    out.push_back(std::move(a));
  }
  return out;
}

}  // namespace pacer
