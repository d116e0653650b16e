// Running a scenario against several policies: resolving `--policy NAME|FILE`, computing the
// balanced bound, and running every policy (on worker threads; results are independent of
// the thread count because each run owns all its state and its random streams).
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "controller/policy_config.h"
#include "sim/report.h"
#include "sim/speed_model.h"

namespace pacer::sim {

// The default comparison: the four baselines and the two presets.
std::vector<std::string> DefaultPolicies();

// A policy to run: its display name and validated config. `spec` is a name (a preset or a
// baseline: policies/<name>.yaml or policies/baseline-<name>.yaml under `policy_dir`) or a
// path to a policy file. Errors name the file, line and field (the controller's loader).
struct PolicyChoice {
  std::string name;
  PolicyConfig config;
};
absl::StatusOr<PolicyChoice> ResolvePolicy(const std::string& spec, const std::string& policy_dir);

// Bound + every policy. `threads` ≥ 1.
absl::StatusOr<Comparison> RunComparison(const Scenario& scenario,
                                         const std::vector<PolicyChoice>& policies, int threads);

}  // namespace pacer::sim
