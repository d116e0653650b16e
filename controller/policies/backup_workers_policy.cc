// Baseline "backup-workers" (Chen et al., "Revisiting distributed synchronous SGD"): run N+b
// workers and let each step proceed without the gradients of the slowest b. Sync jobs only.
// The excluded set is the b slowest live workers by predicted speed (ties by id); an action is
// proposed only when that set changes.
#include <algorithm>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "controller/policies/action_rules.h"
#include "controller/policies/policy.h"

namespace pacer {

std::vector<Action> DecideBackupWorkers(const ClusterView& view, const History& history,
                                        const PolicyConfig& cfg) {
  if (view.job.mode != JobMode::kSync || !view.job.can_exclude_workers) {
    if (auto a = EndExclusions(view, history, "backup-workers")) return {*a};
    return {};
  }
  std::vector<const WorkerView*> live;
  for (const auto& w : view.workers)
    if (w.alive && !w.restarting) live.push_back(&w);
  const size_t b = static_cast<size_t>(cfg.backup_workers.count);
  if (live.size() <= b) return {};
  std::sort(live.begin(), live.end(), [](const WorkerView* x, const WorkerView* y) {
    return x->speed != y->speed ? x->speed < y->speed : x->id < y->id;
  });
  std::vector<std::string> excluded;
  for (size_t i = 0; i < b; ++i) excluded.push_back(live[i]->id);
  std::sort(excluded.begin(), excluded.end());
  if (excluded == history.excluded_workers()) return {};

  // Equal batches: a step waits for the slowest counted worker; excluded gradients are lost.
  const double n = static_cast<double>(live.size());
  const double slowest_all = live[0]->speed, slowest_counted = live[b]->speed;
  double gain = 0;
  if (slowest_all > 0) gain = (n - static_cast<double>(b)) / n * slowest_counted / slowest_all - 1;
  Action a;
  a.kind = ActionKind::kExcludeWorkers;
  a.excluded_workers = excluded;
  a.predicted_gain = gain;
  a.reason = absl::StrFormat("N+b with b=%d: do not wait for %s", cfg.backup_workers.count,
                             absl::StrJoin(excluded, ","));
  return {a};
}

}  // namespace pacer
