// SafetyGate: the rules every proposed action passes before it is executed, whatever policy
// proposed it. Checked in this order (the first failing rule is the veto reason):
//  1. mandatory actions (membership change, rollbacks) are always admitted;
//  2. hysteresis: predicted gain ≥ safety.min_gain;
//  3. after a rollback of this kind, no new action of the kind for safety.window_s — except a
//     batch plan that lightens a worker the rolled-back plan did not (a new straggler);
//  4. cooldown per (kind, target): cooldown_s (adjust_batch_cooldown_s for ADJUST_BS);
//  5. at most max_actions_per_window executed actions in the last window_s;
//  6. at most max_restarts_per_window disruptive ones (RESTART, MIGRATE, server restart);
//  7. a worker-disruptive action (or an exclusion) may not leave fewer than min_live_workers.
// `admitted_now` lists actions this reconcile admitted that are not in `history` yet (dry-run
// ones), so limits hold within one reconcile too. Pure; thread-safe.
#pragma once

#include <string>
#include <vector>

#include "controller/action.h"
#include "controller/cluster_view.h"
#include "controller/history.h"
#include "controller/policy_config.h"

namespace pacer {

// Veto reasons do not mention elapsed time, so the same veto repeated over reconciles folds
// into one audit record.
struct SafetyVerdict {
  bool admitted = false;
  std::string reason;  // why it was vetoed; empty when admitted
};

// The batch plan the newest rollback of ADJUST_BS undid, when `action` (a batch plan) is
// equivalent to it (rule 3's test; at any age): what that plan measured is the better prediction
// for this one. nullptr otherwise.
const AuditRecord* EquivalentUndonePlan(const Action& action, const History& history);

SafetyVerdict ReviewAction(const Action& action, const ClusterView& view, const History& history,
                           const SafetyConfig& cfg, const std::vector<Action>& admitted_now);

}  // namespace pacer
