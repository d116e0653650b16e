// AntDT-ND: shared (non-dedicated) clusters, where stragglers come mostly from contention.
// Sync jobs get speed-proportional batches, and a step does not wait for a worker caught in a
// short burst (its gradient is dropped while it is slow); async PS jobs get speed-weighted data allocation
// (and tail backups near an epoch's end); persistent stragglers are killed and relaunched when
// the cost model says the relaunch pays; persistent hot servers are restarted or relieved.
#include "controller/policies/action_rules.h"
#include "controller/policies/policy.h"

namespace pacer {

std::vector<Action> DecideNonDedicated(const ClusterView& view, const History& history,
                                       const PolicyConfig& cfg) {
  std::vector<Action> out;
  if (view.job.mode == JobMode::kSync) {
    if (cfg.adjust_batch.enabled) {
      if (auto a = ProposeBatchPlan(view, history, cfg.adjust_batch, &cfg.detection)) out.push_back(std::move(*a));
    }
    // Shared clusters have short bursts of contention: the plan covers persistent stragglers,
    // the step does not wait for a worker in a burst (at most burst_exclusion.max_workers; 0
    // turns it off, and ends exclusions in force).
    for (auto& a : ProposeBurstExclusions(view, history, cfg)) out.push_back(std::move(a));
  }
  if (view.job.mode == JobMode::kAsync && cfg.reallocate.enabled) {
    if (auto a = ProposeReallocation(view, history, cfg.reallocate)) out.push_back(std::move(*a));
  }
  // A hot server slows every worker, a straggler only itself: the server goes first, so that
  // max_restarts_per_window, which both count against, goes to it before the workers.
  for (auto& a : ProposeServerActions(view, history, cfg)) out.push_back(std::move(a));
  for (auto& a : ProposeRelaunches(view, history, cfg)) out.push_back(std::move(a));
  return out;
}

}  // namespace pacer
