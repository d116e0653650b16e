// The balanced bound: the job time if every step were perfectly balanced over the speeds the
// scenario gives. Throughput at time t:
//   sync:  B / (B / Σ v_i(t) + sync_cost_s)        (one step of B samples, balanced, + sync)
//   async: Σ b / (b / v_i(t) + sync_cost_s / f(t))  (b = B / n; f = worst PS server factor)
// with v_i(t) from SpeedState on the home placement: no restarts, no failures, no noise.
// Rates are piecewise constant between timeline changes, so the integral is exact.
// Migrating a worker off a contended node, or restarting a hot server, can beat the bound.
//
// Pure function of the scenario; thread-safe.
#pragma once

#include <vector>

#include "sim/speed_model.h"

namespace pacer::sim {

struct BoundResult {
  double jct_s = 0;      // kForever when total_samples is not reached by max_s
  // (t, samples/s) at every change of rate, for plots.
  std::vector<std::pair<double, double>> rate;
};

// Rate of the balanced job given Σ v (sync) — exposed for tests.
double BalancedSyncRate(double sum_speed, double global_batch, double sync_cost_s);

BoundResult ComputeBalancedBound(const SpeedModel& model, double max_s);

}  // namespace pacer::sim
