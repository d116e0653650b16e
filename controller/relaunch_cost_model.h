// RelaunchCostModel: does killing and relaunching a straggler pay for itself?
//
//   saved_s = R / T_now − R / T_after     (R = remaining samples, T = job samples/s)
//   cost_s  = restart (or migrate) cost + lost work, as job time:
//             sync: the whole job waits for the relaunch, so the full cost;
//             async: only this worker stops, so cost × v_k / T_now.
//   pays    ⇔ saved_s > cost_s × (1 + margin)
//
// T is predicted from the monitor's speeds: Σv when the job is balanced (async PS, or sync
// with ADJUST_BS in force), n·min(v) for a sync job on equal batches. The speed after the
// relaunch is the median speed, except where a relaunch cannot help: an in-place restart of a
// deterministic (hardware-bound) straggler or of one on a slow node keeps its speed. Migration
// assumes a typical node. Unknown remaining work (R = 0) or an unmeasured restart cost (≤ 0)
// never pays: the model does not guess in the disruptive direction.
//
// Pure functions; thread-safe.
#pragma once

#include <string>

#include "controller/action.h"
#include "controller/cluster_view.h"
#include "controller/policy_config.h"

namespace pacer {

struct RelaunchEstimate {
  ActionKind kind = ActionKind::kRestart;  // kRestart or kMigrate
  double speed_now = 0, speed_after = 0;
  double throughput_now = 0, throughput_after = 0;
  double saved_s = 0;
  double cost_s = 0;
  bool pays = false;
  double predicted_gain = 0;  // throughput_after / throughput_now − 1
  std::string reason;         // one line with the numbers
};

// What every estimate on one view shares, computed once per decision in O(workers): weighing
// a candidate is then O(1) (a large job weighs thousands per reconcile; the throughput with one
// speed replaced follows from the live workers' sum and two smallest speeds).
struct RelaunchBaseline {
  double median_speed = 0;    // MedianLiveSpeed(view)
  double throughput_now = 0;  // PredictThroughput(view, balanced, "", 0)
  bool by_sum = false;        // async or balanced: the job runs at Σ v; else at n × min v
  int64_t live = 0;           // live workers (alive, not restarting)
  double sum = 0;             // Σ v over them
  double min1 = 0, min2 = 0;  // their smallest speed and the next one (equal when tied)
  // = PredictThroughput(view, balanced, worker.id, speed), up to the rounding of the sum.
  double ThroughputWith(const WorkerView& worker, double speed) const;
};
RelaunchBaseline ComputeRelaunchBaseline(const ClusterView& view, bool balanced);

// Estimates relaunching `worker` (a member of view.workers) by `kind`. `balanced`: the sync
// job runs speed-proportional batches (ADJUST_BS in force).
RelaunchEstimate EstimateRelaunch(const ClusterView& view, const WorkerView& worker,
                                  ActionKind kind, bool balanced, const RestartConfig& cfg,
                                  const RelaunchBaseline& baseline);
RelaunchEstimate EstimateRelaunch(const ClusterView& view, const WorkerView& worker,
                                  ActionKind kind, bool balanced, const RestartConfig& cfg);

// Median speed over live workers (0 when none).
double MedianLiveSpeed(const ClusterView& view);

// Predicted job throughput with `worker_id`'s speed replaced by `speed` (empty id: as is).
double PredictThroughput(const ClusterView& view, bool balanced, const std::string& worker_id,
                         double speed);

}  // namespace pacer
