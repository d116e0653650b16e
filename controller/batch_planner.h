// BatchPlanner: ADJUST_BS for synchronous jobs — local batch b_i ∝ predicted speed v_i with
// the global batch B fixed.
//
// Walk-through of Propose():
//  1. Take the live workers (alive, not restarting) and their speeds (predicted, or the last
//     window's when use_last_window). A worker with no speed yet gets the median.
//  2. Water-fill: real shares x_i = B·v_i/Σv, clamped to [min_local_batch, cap_i]; clamped
//     workers are fixed and the rest of B is shared again among the others, until no bound
//     is violated.
//  3. When the caps cannot hold B, or accumulation is allowed: also build the accumulation
//     plan (shares ∝ v_i with no upper bound; a worker whose share exceeds its cap runs
//     k_i = ceil(b_i / cap_i) micro-batches of ≤ cap_i). The plan with the lower predicted
//     step time wins.
//  4. Round with the largest-remainder method (ties broken by worker id), so Σb_i == B
//     exactly and every bound still holds.
//  5. Hysteresis: when a current plan covers the same workers and B, propose nothing unless
//     some worker's speed share v_i/Σv moved by more than `hysteresis` (relative) from the
//     share the current plan was built on, AND the new plan's predicted gain over the plan in
//     force, both on today's speeds, is at least `min_replan_gain`. Plans therefore do not
//     flap on noise: ±5 % noise moves a share by at most 1.05/0.95 − 1 ≈ 10.5 %, under the
//     15 % default, and a share that did drift but leaves the plan in force near-balanced
//     (the step-time models say so) changes nothing. The predicted gain counts the
//     collective's own cost (CollectiveSeconds), as the measured throughput does.
//     Fewer than 2 live workers: no plan (nothing to balance).
//  6. Version = current + 1; effective step = current step + max(min_steps_ahead,
//     ceil(lead_heartbeats × heartbeat interval / step time)), so that every worker, picking
//     commands up once per heartbeat, holds the plan before the step it applies to.
//
// Step-time model per worker: t_i = k_i·fixed_i + per_sample_i·b_i, or k_i·fixed_i + b_i/v_i
// when no per-sample time is known. A plan's step time is the slowest worker's.
//
// Stateless; every function is pure and thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "controller/batch_plan.h"
#include "controller/cluster_view.h"
#include "controller/policy_config.h"

namespace pacer {

// Splits `total` over weights with bounds lo_i ≤ x_i ≤ hi_i (hi_i < 0 = unbounded), x_i ∝
// weight_i among the workers not at a bound. FAILED_PRECONDITION when Σlo > total or
// Σhi < total. Weights must be > 0.
absl::StatusOr<std::vector<double>> WaterFill(const std::vector<double>& weights,
                                              const std::vector<double>& lo,
                                              const std::vector<double>& hi, double total);

// Rounds real shares that sum to `total` into integers that sum to `total` exactly, each
// within [lo_i, hi_i] (hi_i < 0 = unbounded), by the largest-remainder method; ties go to
// the lower index. Requires lo_i ≤ shares_i ≤ hi_i.
std::vector<int64_t> RoundKeepingSum(const std::vector<double>& shares,
                                     const std::vector<int64_t>& lo,
                                     const std::vector<int64_t>& hi, int64_t total);

struct BatchProposal {
  BatchPlan plan;
  BatchPlan baseline;  // the plan in force now (what a rollback restores)
  double predicted_gain = 0;  // step time now / step time under the plan − 1
  bool membership_changed = false;  // workers or B differ from the current plan: must apply
  std::string reason;
};

class BatchPlanner {
 public:
  // The target plan for `view` (steps 1–4; version and effective step left 0).
  // FAILED_PRECONDITION when no live worker, B < Σ min_local_batch, or caps cannot hold B
  // without accumulation.
  static absl::StatusOr<BatchPlan> Target(const ClusterView& view, const AdjustBatchConfig& cfg);

  // Steps 1–6 against the current plan (nullptr = none yet: the workers' current local
  // batches are the baseline). nullopt when hysteresis says keep the current plan.
  static absl::StatusOr<std::optional<BatchProposal>> Propose(const ClusterView& view,
                                                              const BatchPlan* current,
                                                              const AdjustBatchConfig& cfg);

  // The plan the workers run now when the controller has none: their reported local batches
  // (an even split of B when those do not add up to B); version 0, basis = batch shares.
  static BatchPlan InForce(const ClusterView& view, const AdjustBatchConfig& cfg);

  // Predicted step time of the slowest worker if `plan` ran on `view`'s speeds.
  static double PredictStepSeconds(const ClusterView& view, const BatchPlan& plan,
                                   bool use_last_window = false);

  // The part of the measured step (job.step_time_s, wall) that is not the slowest worker's
  // compute under the plan in force (`predicted_compute_s`): the collective's own cost, the same
  // under any batch plan. 0 when the view has no step time.
  static double CollectiveSeconds(const ClusterView& view, double predicted_compute_s);

  // The first step at which a plan made now can take effect (step 6).
  static int64_t EffectiveStep(const ClusterView& view, const AdjustBatchConfig& cfg,
                               double predicted_step_s);
};

}  // namespace pacer
