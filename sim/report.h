// Report: the comparison of policies on one scenario, as a human table, JSON and an SVG plot.
//
// Efficiency = balanced-bound JCT / JCT (above 1 when migration or a server restart beat the
// bound, which the table says rather than hides). Speed-up = JCT(none) / JCT. Pure formatting;
// thread-safe.
#pragma once

#include <string>
#include <vector>

#include "sim/balanced_bound.h"
#include "sim/job_simulation.h"

namespace pacer::sim {

struct Comparison {
  const Scenario* scenario = nullptr;
  BoundResult bound;
  std::vector<PolicyRun> runs;
  double wall_s = 0;          // whole program: bound + every run
  uint64_t model_events = 0;  // Σ over runs
};

// Index of the run named `name`, or -1.
int FindRun(const Comparison& c, const std::string& name);
double Efficiency(const Comparison& c, const PolicyRun& r);
double SpeedupVsNone(const Comparison& c, const PolicyRun& r);  // 0 when `none` was not run

std::string FormatTable(const Comparison& c);
std::string FormatJson(const Comparison& c);
// Throughput over time per policy, the bound's throughput, actions as ticks; self-contained.
std::string FormatSvg(const Comparison& c);

}  // namespace pacer::sim
