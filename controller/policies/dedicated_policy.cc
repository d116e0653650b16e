// AntDT-DD: dedicated clusters with mixed hardware, where stragglers are deterministic (an
// older GPU is always slower). Speed-proportional batches with gradient accumulation where a
// fast worker's share exceeds its memory; relaunches only when the file enables them (the
// cost model still has to agree); async jobs get speed-weighted allocation.
#include "controller/policies/action_rules.h"
#include "controller/policies/policy.h"

namespace pacer {

std::vector<Action> DecideDedicated(const ClusterView& view, const History& history,
                                    const PolicyConfig& cfg) {
  std::vector<Action> out;
  if (view.job.mode == JobMode::kSync && cfg.adjust_batch.enabled) {
    AdjustBatchConfig batch = cfg.adjust_batch;
    batch.accumulation = true;  // the point of this preset
    if (auto a = ProposeBatchPlan(view, history, batch, &cfg.detection)) out.push_back(std::move(*a));
  }
  if (view.job.mode == JobMode::kAsync && cfg.reallocate.enabled) {
    if (auto a = ProposeReallocation(view, history, cfg.reallocate)) out.push_back(std::move(*a));
  }
  for (auto& a : ProposeRelaunches(view, history, cfg)) out.push_back(std::move(a));
  return out;
}

}  // namespace pacer
