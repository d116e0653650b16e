// Policies: pure decision functions (docs/style.md §2).
//
//   std::vector<Action> Decide(const ClusterView&, const History&, const PolicyConfig&)
//
// A policy reads the view, the controller's history and the operator's policy file, and
// proposes actions; it changes nothing. The safety layer and the Controller decide what is
// admitted, audited and dispatched. Each policy lives in its own file in this folder; the
// shared rules they are built from are in action_rules.h. Thread-safe (no state).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "controller/action.h"
#include "controller/cluster_view.h"
#include "controller/history.h"
#include "controller/policy_config.h"

namespace pacer {

using DecideFn = std::vector<Action> (*)(const ClusterView&, const History&, const PolicyConfig&);

// AntDT-ND: ADJUST_BS on sync jobs, REALLOCATE on async PS jobs, and kill/restart (or migrate)
// of persistent stragglers when the cost model says it pays; hot PS servers restarted/relieved.
std::vector<Action> DecideNonDedicated(const ClusterView&, const History&, const PolicyConfig&);
// AntDT-DD: ADJUST_BS with gradient accumulation for mixed hardware; relaunch only when the
// file enables it (deterministic stragglers do not get faster by restarting).
std::vector<Action> DecideDedicated(const ClusterView&, const History&, const PolicyConfig&);
// Baselines for comparison.
std::vector<Action> DecideNone(const ClusterView&, const History&, const PolicyConfig&);
std::vector<Action> DecideBackupWorkers(const ClusterView&, const History&, const PolicyConfig&);
std::vector<Action> DecideLbBsp(const ClusterView&, const History&, const PolicyConfig&);
std::vector<Action> DecideTimeoutRelaunch(const ClusterView&, const History&, const PolicyConfig&);

// What the Controller does around a registered policy's decisions.
struct PolicyTraits {
  // The per-step burst rule runs beside it (Controller::DecideBursts; the policy file's
  // burst_exclusion must enable it too).
  bool burst_rule = false;
  // Its batch plans are checked against step statistics (ProposeBatchPlan's significance test;
  // LB-BSP plans on raw window speeds, as published).
  bool step_statistics = false;
  // It excludes workers itself; under any other policy an exclusion inherited from an earlier
  // one ends.
  bool manages_exclusions = false;
};

// The decision function registered under `name` (the policy file's `policy` field).
// NOT_FOUND listing the known names otherwise.
absl::StatusOr<DecideFn> FindPolicy(std::string_view name);
// Its traits; a name not registered has none.
PolicyTraits TraitsOf(std::string_view name);
std::vector<std::string> PolicyNames();

}  // namespace pacer
