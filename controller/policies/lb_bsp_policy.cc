// Baseline "lb-bsp" (LB-BSP, Chen et al.): resize local batches in proportion to the speeds
// measured in the last window. No prediction, no accumulation, memory caps by water-filling;
// sync jobs only. The file's adjust_batch.hysteresis still applies (0 = replan on any change).
#include "controller/policies/action_rules.h"
#include "controller/policies/policy.h"

namespace pacer {

std::vector<Action> DecideLbBsp(const ClusterView& view, const History& history,
                                const PolicyConfig& cfg) {
  AdjustBatchConfig batch = cfg.adjust_batch;
  batch.use_last_window = true;
  batch.accumulation = false;
  if (auto a = ProposeBatchPlan(view, history, batch, nullptr)) return {std::move(*a)};
  return {};
}

}  // namespace pacer
