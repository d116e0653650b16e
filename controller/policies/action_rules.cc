#include "controller/policies/action_rules.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "controller/batch_planner.h"
#include "controller/relaunch_cost_model.h"
#include "controller/safety_gate.h"

namespace pacer {

bool BatchesBalanced(const ClusterView& view, const History& history) {
  if (!history.plan()) return false;
  for (const auto& w : view.workers) {
    if (!w.alive || w.restarting) continue;
    if (!history.plan()->Find(w.id)) return false;
  }
  return true;
}

namespace {

// `f` (a copy of `w`) planned at `speed`, its step-time model following (the payoff test's view:
// predicted on the monitor's own model, a plan made on other speeds reads slower than it is).
void SetPlannedSpeed(const WorkerView& w, double speed, WorkerView& f) {
  if (w.step_per_sample_s > 0 && w.speed > 0)
    f.step_per_sample_s = w.step_per_sample_s * w.speed / speed;
  f.speed = f.last_window_speed = speed;
}

// The expected step of `plan` on `view`'s speeds when every worker's step varies with its
// per-step noise (step_noise, relative; the median of the known ones where a worker has none):
// E[max of the workers' normal step times] by Clark's moment-matching (the max of two normals
// taken as a normal, folded in one worker at a time). 0 when no worker of the plan is live.
double NoisyStepSeconds(const ClusterView& view, const BatchPlan& plan) {
  std::vector<double> known;
  for (const auto& w : view.workers)
    if (w.alive && !w.restarting && w.step_noise > 0) known.push_back(w.step_noise);
  double typical = 0;
  if (!known.empty()) {
    std::nth_element(known.begin(), known.begin() + static_cast<long>(known.size() / 2), known.end());
    typical = known[known.size() / 2];
  }
  bool any = false;
  double mean = 0, second = 0;  // E[max], E[max²] so far
  for (const auto& wb : plan.workers) {
    const WorkerView* w = view.FindWorker(wb.worker_id);
    if (w == nullptr || !w->alive || w->restarting || !(w->speed > 0)) continue;
    const double fixed = static_cast<double>(wb.accumulation) * w->step_fixed_s;
    const double t = w->step_per_sample_s > 0
                         ? fixed + w->step_per_sample_s * static_cast<double>(wb.samples)
                         : fixed + static_cast<double>(wb.samples) / w->speed;
    const double sd = t * (w->step_noise > 0 ? w->step_noise : typical);
    if (!any) {
      mean = t;
      second = t * t + sd * sd;
      any = true;
      continue;
    }
    const double var = std::max(0.0, second - mean * mean);
    const double theta = std::sqrt(var + sd * sd);
    if (!(theta > 0)) {
      mean = std::max(mean, t);
      second = mean * mean;
      continue;
    }
    const double alpha = (mean - t) / theta;
    const double cdf = 0.5 * std::erfc(-alpha / std::sqrt(2.0));
    const double pdf = std::exp(-0.5 * alpha * alpha) / std::sqrt(2 * M_PI);
    const double m = mean * cdf + t * (1 - cdf) + theta * pdf;
    second = (second)*cdf + (t * t + sd * sd) * (1 - cdf) + (mean + t) * theta * pdf;
    mean = m;
  }
  return any ? mean : 0;
}

}  // namespace

std::optional<Action> ProposeBatchPlan(const ClusterView& view, const History& history,
                                       const AdjustBatchConfig& cfg,
                                       const DetectionConfig* detection) {
  if (view.job.mode != JobMode::kSync) return std::nullopt;
  const BatchPlan* current = history.plan() ? &*history.plan() : nullptr;
  const ClusterView* planning = &view;
  ClusterView filtered;
  bool shown = false;  // some worker's steps show the plan in force is wrong about it
  std::map<size_t, double> shown_speed;  // those workers (index in view), at their steps' speed
  double resolution = 0;  // the largest speed_significance × standard error among them
  bool beyond_thresholds = false;  // one of them is slower (faster) than a straggler (leader)
  ClusterView pinned;
  if (detection) {
    // A worker flagged but not (yet, or not surely) persistent is planned at the speed of the
    // unflagged live workers: the median of all would be the mean of a pair (the monitor's
    // pair rule, docs/design.md §3), under which a pair's transient straggler already shifts
    // the shares — a plan made on a transient.
    std::vector<double> unflagged;
    for (const auto& w : view.workers)
      if (w.alive && !w.restarting && !w.straggler && !w.leader && w.speed > 0)
        unflagged.push_back(w.speed);
    double median = MedianLiveSpeed(view);
    if (!unflagged.empty()) {
      std::sort(unflagged.begin(), unflagged.end());
      const size_t n = unflagged.size();
      median = n % 2 ? unflagged[n / 2] : 0.5 * (unflagged[n / 2 - 1] + unflagged[n / 2]);
    }
    // A worker whose steps do not show its difference — its recent steps' mean speed is within
    // speed_significance standard errors (its own, and the reference's: the median of n means,
    // ~1.25·se/√n) of the median worker's — is not planned at its windowed speed: one or two
    // noisy steps are no reason to move batches, and a worker given more on a lucky window is
    // the slowest on the next steps, which is all such a plan does. It is planned at the typical
    // speed moved by its steps' difference shrunk toward 0 by τ² / (τ² + se²), τ² the spread of
    // true differences the job shows (the robust spread of the workers' differences less their
    // noise; the empirical-Bayes estimate under a normal prior): all of it where workers really
    // differ by more than their noise (mixed speeds, fast steps), none of it where the spread is
    // noise. A worker whose steps do show its difference (a real straggler: a 30 % slowdown at
    // 12 % noise within ~6 steps) is planned at its own speed, as before. Workers without step
    // statistics (no timings reach the controller) are planned as before.
    const double z = cfg.speed_significance;
    double reference = 0, reference_se = 0, tau2 = 0;
    if (z > 0) {
      std::vector<double> speeds, ses;
      for (const auto& w : view.workers)
        if (w.alive && !w.restarting && w.step_speed > 0 && w.step_speed_rel_se > 0) {
          speeds.push_back(w.step_speed);
          ses.push_back(w.step_speed_rel_se);
        }
      if (speeds.size() >= 3) {
        auto median_of = [](std::vector<double> v) {
          std::nth_element(v.begin(), v.begin() + static_cast<long>(v.size() / 2), v.end());
          return v[v.size() / 2];
        };
        reference = median_of(speeds);
        const double se_mid = median_of(ses);
        reference_se = 1.25 * se_mid / std::sqrt(static_cast<double>(ses.size()));
        std::vector<double> dev;
        for (double v : speeds) dev.push_back(std::fabs(v / reference - 1));
        const double spread = 1.4826 * median_of(dev);  // robust sd of the differences
        tau2 = std::max(0.0, spread * spread - se_mid * se_mid);
      }
    }
    // The speeds the plan in force was built on, relative to their mean (the even split's when
    // there is none): what a "shown" difference below is measured against. Hashed: it is
    // looked up for every worker of the view (4 096 of them), in the view's order.
    absl::flat_hash_map<std::string, double> assumed;
    if (reference > 0) {
      std::optional<BatchPlan> reported;  // read in place when a plan is in force
      if (!current) reported = BatchPlanner::InForce(view, cfg);
      const BatchPlan& in_force = current ? *current : *reported;
      std::vector<double> shares;
      for (const auto& [id, share] : in_force.basis_share)
        if (share > 0) shares.push_back(share);
      if (!shares.empty()) {
        // Relative to the median share, as the differences are to the median worker.
        std::nth_element(shares.begin(), shares.begin() + static_cast<long>(shares.size() / 2),
                         shares.end());
        const double mid = shares[shares.size() / 2];
        assumed.reserve(shares.size());
        for (const auto& [id, share] : in_force.basis_share)
          if (share > 0) assumed.emplace(id, share / mid);
      }
    }
    for (size_t i = 0; i < view.workers.size(); ++i) {
      const WorkerView& w = view.workers[i];
      const bool flagged = w.straggler || w.leader;
      double planned = -1;  // < 0: its own speed
      if (flagged && (!w.persistent || w.confidence < detection->min_confidence)) {
        planned = median;
      } else if (reference > 0 && w.alive && !w.restarting && w.step_speed > 0 &&
                 w.step_speed_rel_se > 0) {
        const double d = w.step_speed / reference - 1;
        const double se2 = w.step_speed_rel_se * w.step_speed_rel_se + reference_se * reference_se;
        const double bar = z * std::sqrt(se2);
        if (std::fabs(d) <= bar) planned = median * (1 + d * tau2 / (tau2 + se2));
        // Whether the plan in force is wrong about it by more than its noise explains.
        // And lasting: the steps behind its statistics (n = (noise / se)², at most ~39 with
        // their forgetting) span at least the monitor's persistence (persistent_windows ×
        // window_s). In a job of 0.25 s steps they span 10 s, and a transient straggler of 20 s
        // looks as shown as a slow worker: there the monitor's windows decide.
        const double n_steps = w.step_noise > 0 ? std::pow(w.step_noise / w.step_speed_rel_se, 2) : 0;
        const bool lasting = n_steps * view.job.step_time_s >=
                             static_cast<double>(detection->persistent_windows) * detection->window_s;
        if (auto it = assumed.find(w.id); lasting && it != assumed.end() &&
                                          std::fabs((1 + d) / it->second - 1) > bar) {
          shown = true;
          shown_speed[i] = median * (1 + d);
          resolution = std::max(resolution, bar);
          // A difference past the monitor's thresholds is the monitor's (flagged, persistent
          // within a few windows, then planned past the hysteresis at its own speed).
          beyond_thresholds = beyond_thresholds || 1 + d < detection->straggler_threshold ||
                              1 + d > detection->leader_threshold;
        }
      }
      if (planned < 0) continue;
      if (planning == &view) {
        filtered = view;  // the same workers in the same order
        planning = &filtered;
      }
      filtered.workers[i].speed = filtered.workers[i].last_window_speed = planned;
    }
    // For the payoff test (below): the shown workers at the difference their steps show, every
    // other one at the speed the plan in force assumed for it — a plan that moves only what the
    // steps show, not a share that noise or a transient flag moved meanwhile.
    if (shown) {
      pinned = *planning;
      for (size_t i = 0; i < view.workers.size(); ++i) {
        const WorkerView& w = view.workers[i];
        if (!w.alive || w.restarting) continue;
        double v = -1;
        if (auto it = shown_speed.find(i); it != shown_speed.end()) {
          v = it->second;
        } else if (auto a = assumed.find(w.id); a != assumed.end()) {
          v = median * a->second;
        }
        if (v > 0) SetPlannedSpeed(w, v, pinned.workers[i]);
      }
    }
  }
  absl::StatusOr<std::optional<BatchProposal>> proposal =
      BatchPlanner::Propose(*planning, current, cfg);
  if (!proposal.ok()) return std::nullopt;
  bool must_pay = false;
  // Only while the monitor flags no persistent straggler or leader: those are the hysteresis
  // path's (a plan for them moves shares by more than the hysteresis), and plans made past it
  // while they come and go (node contention, memory-capped leaders) only add switches.
  bool flagged_persistent = false;
  for (const auto& w : view.workers)
    flagged_persistent = flagged_persistent || (w.alive && !w.restarting &&
                                                (w.straggler || w.leader) && w.persistent);
  if (!proposal->has_value() && shown && !flagged_persistent && !beyond_thresholds) {
    // A difference the steps show, under the hysteresis (or min_replan_gain): planned when what
    // it saves over the rest of the job pays for the switch (PayoffOf).
    AdjustBatchConfig any = cfg;
    any.hysteresis = 0;
    any.min_replan_gain = 0;
    proposal = BatchPlanner::Propose(pinned, current, any);
    if (!proposal.ok() || !proposal->has_value() || (*proposal)->membership_changed)
      return std::nullopt;
    must_pay = true;
  }
  if (!proposal->has_value()) return std::nullopt;
  BatchProposal& p = **proposal;
  Action a;
  a.kind = ActionKind::kAdjustBatch;
  a.reason = p.reason;
  a.mandatory = p.membership_changed;
  a.plan = std::move(p.plan);
  a.predicted_gain = p.predicted_gain;
  if (must_pay) {
    // The step-time models have no noise: with per-step noise the step is the slowest of n
    // noisy workers, above the slowest mean whatever the plan, and a difference smaller than the
    // noise is mostly hidden in it (a 12 % slow worker among 16 at 4 % noise: predicted +10.9 %
    // without noise, measured +5.1 %). The gain it is planned on, judged on, and must pay by is
    // the expected one with each worker's own noise (NoisyStepSeconds).
    std::optional<BatchPlan> reported;  // read in place when a plan is in force
    if (!current) reported = BatchPlanner::InForce(pinned, cfg);
    const double before = NoisyStepSeconds(pinned, current ? *current : *reported);
    const double after = NoisyStepSeconds(pinned, *a.plan);
    const double collective_s = BatchPlanner::CollectiveSeconds(view, before);
    const double expected =
        before > 0 && after > 0 ? (before + collective_s) / (after + collective_s) - 1 : 0;
    // A gain within what the steps resolve (the shown workers' speed_significance × standard
    // error) is not one: a job of 0.2 s steps shows 2 % differences, and plans for them flap.
    if (!(expected > resolution)) return std::nullopt;
    absl::StrAppendFormat(&a.reason, "; with per-step noise %.3fs → %.3fs", before + collective_s,
                          after + collective_s);
    a.predicted_gain = expected;
  }
  // A plan equivalent to one rolled back is predicted to gain what that one measured, not what
  // the models said (they said it then too).
  if (const AuditRecord* undone = a.mandatory ? nullptr : EquivalentUndonePlan(a, history);
      undone && undone->measured_gain && *undone->measured_gain < a.predicted_gain) {
    a.predicted_gain = *undone->measured_gain;
    absl::StrAppendFormat(&a.reason, "; predicted as its equivalent #%d measured (%.3f)",
                          undone->id, a.predicted_gain);
  }
  if (must_pay) {
    const std::optional<PlanPayoff> payoff =
        PayoffOf(view, a.predicted_gain, a.plan->effective_step);
    if (!payoff || payoff->saved_s <= payoff->cost_s) return std::nullopt;
    a.saved_s = payoff->saved_s;
    a.cost_s = payoff->cost_s;
    absl::StrAppendFormat(&a.reason, "; steps show it: saves %.0fs of the %.0fs left for %.0fs",
                          a.saved_s, payoff->remaining_s, a.cost_s);
  }
  return a;
}

std::optional<PlanPayoff> PayoffOf(const ClusterView& view, double gain, int64_t effective_step) {
  const double rate = view.job.throughput;
  const double step_s = view.job.step_time_s;
  if (!(rate > 0) || view.job.remaining_samples <= 0 || !(step_s > 0) || !(gain > 0))
    return std::nullopt;
  PlanPayoff out;
  out.remaining_s = static_cast<double>(view.job.remaining_samples) / rate;
  const double share = gain / (1 + gain);  // of each second left
  const double lead_s =
      static_cast<double>(std::max<int64_t>(0, effective_step - view.job.current_step)) * step_s;
  out.saved_s = out.remaining_s * share;
  out.cost_s = kPlanSwitchSteps * step_s + std::min(lead_s, out.remaining_s) * share;
  return out;
}

std::optional<Action> EndExclusions(const ClusterView& view, const History& history,
                                    const std::string& rule) {
  if (history.excluded_workers().empty()) return std::nullopt;
  Action a;
  a.kind = ActionKind::kExcludeWorkers;
  a.target = absl::StrJoin(history.excluded_workers(), ",");
  a.mandatory = true;  // waiting for everyone is the default
  a.reason = absl::StrCat(
      "wait for ", a.target, " again: ",
      view.job.mode == JobMode::kSync && !view.job.can_exclude_workers
          ? "a live worker cannot carry out an exclusion"
          : absl::StrCat(rule, " is off in the policy in force"));
  return a;
}

std::vector<Action> ProposeBurstExclusions(const ClusterView& view, const History& history,
                                           const PolicyConfig& cfg) {
  std::vector<Action> out;
  const int64_t max_excluded =
      BurstExclusionCap(cfg.burst_exclusion, static_cast<size_t>(view.LiveWorkers()));
  if (view.job.mode != JobMode::kSync || max_excluded <= 0 || !view.job.can_exclude_workers) {
    if (auto a = EndExclusions(view, history, "burst exclusion")) out.push_back(std::move(*a));
    return out;
  }
  const double rejoin_line = std::min(1.0, cfg.detection.straggler_threshold + kBurstRejoinMargin);
  struct Step {
    const WorkerView* w;
    double s;  // predicted step seconds at its batch now and its last window's speed
  };
  std::vector<Step> steps;
  double batch_sum = 0;
  for (const auto& w : view.workers) {
    if (!w.alive || w.restarting || w.local_batch <= 0) continue;
    const double v = w.last_window_speed > 0 ? w.last_window_speed : w.speed;
    if (!(v > 0)) continue;
    steps.push_back({&w, static_cast<double>(w.local_batch) / v});
    batch_sum += static_cast<double>(w.local_batch);
  }
  const std::vector<std::string>& before = history.excluded_workers();
  auto was_excluded = [&](const std::string& id) {
    return std::find(before.begin(), before.end(), id) != before.end();
  };
  std::vector<std::string> keep;  // still excluded: the rest of `before` is re-included
  std::vector<std::string> chosen;
  double gain = 0;
  if (steps.size() >= 3 && batch_sum > 0) {
    std::vector<double> s;
    for (const Step& st : steps) s.push_back(st.s);
    std::nth_element(s.begin(), s.begin() + static_cast<long>(s.size() / 2), s.end());
    const double median = s[s.size() / 2];
    std::sort(steps.begin(), steps.end(), [](const Step& a, const Step& b) {
      return a.s != b.s ? a.s > b.s : a.w->id < b.w->id;
    });
    const double enter = median / cfg.detection.straggler_threshold;
    const double stay = median / rejoin_line;
    // Greedy, slowest first: each further worker dropped must improve the predicted throughput
    // (1 − dropped share) / (slowest counted step) over the one before.
    const double all = steps.front().s;
    double dropped = 0, best = 1;
    size_t k = 0;
    for (; k < steps.size() - 1 && static_cast<int64_t>(k) < max_excluded; ++k) {
      const Step& st = steps[k];
      const bool slow = st.s > enter || (was_excluded(st.w->id) && st.s > stay);
      if (!slow) break;
      const double share = dropped + static_cast<double>(st.w->local_batch) / batch_sum;
      const double rel = (1 - share) * all / steps[k + 1].s;  // throughput vs waiting for all
      if (rel <= best) break;
      best = rel;
      dropped = share;
      chosen.push_back(st.w->id);
    }
    gain = best - 1;
  }
  std::sort(chosen.begin(), chosen.end());
  for (const auto& id : before)
    if (std::find(chosen.begin(), chosen.end(), id) != chosen.end()) keep.push_back(id);
  std::vector<std::string> back, added;
  for (const auto& id : before)
    if (std::find(keep.begin(), keep.end(), id) == keep.end()) back.push_back(id);
  for (const auto& id : chosen)
    if (!was_excluded(id)) added.push_back(id);
  if (!back.empty()) {
    Action a;
    a.kind = ActionKind::kExcludeWorkers;
    a.excluded_workers = keep;
    a.target = absl::StrJoin(back, ",");
    a.mandatory = true;  // waiting for everyone again is the default; nothing to predict
    a.reason = absl::StrFormat("burst over: wait for %s again (step back within %.2fx the median)",
                               a.target, 1 / rejoin_line);
    out.push_back(std::move(a));
  }
  if (!added.empty() && gain > 0) {
    Action a;
    a.kind = ActionKind::kExcludeWorkers;
    a.excluded_workers = chosen;
    a.target = absl::StrJoin(added, ",");
    a.predicted_gain = gain;
    a.reason = absl::StrFormat(
        "burst: do not wait for %s (step > %.2fx the median at its last window's speed; "
        "dropping %zu of %zu gradients pays)",
        a.target, 1 / cfg.detection.straggler_threshold, chosen.size(), steps.size());
    out.push_back(std::move(a));
  }
  return out;
}

std::optional<Action> ProposeReallocation(const ClusterView& view, const History& history,
                                          const ReallocateConfig& cfg) {
  if (view.job.mode != JobMode::kAsync) return std::nullopt;
  std::vector<const WorkerView*> live;
  double sum = 0;
  for (const auto& w : view.workers) {
    if (!w.alive || w.restarting || !(w.speed > 0)) continue;
    live.push_back(&w);
    sum += w.speed;
  }
  if (live.empty()) return std::nullopt;
  std::sort(live.begin(), live.end(),
            [](const WorkerView* a, const WorkerView* b) { return a->id < b->id; });
  const double mean = sum / static_cast<double>(live.size());
  std::map<std::string, double> in_force;
  for (const auto& a : history.allocations()) in_force[a.worker_id] = a.weight;

  Action a;
  a.kind = ActionKind::kReallocate;
  double drift = 0;
  bool any_straggler = false;
  std::string who;
  for (const WorkerView* w : live) {
    WorkerAllocation alloc;
    alloc.worker_id = w->id;
    alloc.weight = w->speed / mean;
    alloc.shard_scale = std::min(1.0, w->relative_speed > 0 ? w->relative_speed : 1.0);
    auto it = in_force.find(w->id);
    const double before = it == in_force.end() ? 1.0 : it->second;
    const double d = std::fabs(alloc.weight / before - 1);
    if (d > drift) {
      drift = d;
      who = absl::StrFormat("%s weight %.2f→%.2f", w->id, before, alloc.weight);
    }
    any_straggler = any_straggler || w->straggler;
    a.allocations.push_back(alloc);
  }
  const bool want_tail = cfg.tail_backups && any_straggler &&
                         view.job.epoch_progress >= cfg.tail_backup_progress;
  const bool reweigh = drift > cfg.hysteresis;
  // Speeds even again (every new weight within the hysteresis of 1) while an allocation is in
  // force: back to the default (no allocation). It predicts no gain of its own, so the gate
  // would hold it back forever; it is mandatory like a toggle. It cannot flap: from the
  // default, the next reweighting needs a drift past the hysteresis and a predicted gain.
  bool even = !history.allocations().empty();
  for (const auto& al : a.allocations) even = even && std::fabs(al.weight - 1) <= cfg.hysteresis;
  const bool restore = reweigh && even;
  if (!reweigh && want_tail == history.tail_backups()) return std::nullopt;
  if (want_tail != history.tail_backups()) a.tail_backups = want_tail;
  if (!reweigh) a.allocations = history.allocations();  // keep weights, toggle backups only
  if (restore) a.allocations.clear();
  // Pull-based fetching already balances an async job; reweighting mostly trims the tail, so
  // the predicted gain is the share of throughput the slowest worker's tail wastes.
  double min_rel = 1;
  for (const WorkerView* w : live) min_rel = std::min(min_rel, w->speed / mean);
  a.predicted_gain =
      reweigh && !restore ? std::max(0.0, (1 - min_rel) / static_cast<double>(live.size())) : 0;
  // Toggling tail backups or restoring the default has no throughput prediction of its own.
  a.mandatory = !reweigh || restore;
  a.reason = restore   ? absl::StrFormat("speeds even again: default weights (%s)", who)
             : reweigh ? absl::StrFormat("weights drifted %.0f%% (%s)", 100 * drift, who)
                       : absl::StrFormat("tail backups %s at epoch progress %.2f",
                                         want_tail ? "on" : "off", view.job.epoch_progress);
  if (reweigh && a.tail_backups) a.reason += want_tail ? "; tail backups on" : "; tail backups off";
  return a;
}

namespace {

// Whether `w` was migrated within bad_node_ttl_s and is no faster for it: its relative speed now
// is below kCured × what it was when the migration was decided. The cause then travels with the
// worker (its data, its model shard, a device class the placement cannot avoid), and relaunching
// it again would only cost: it is left to batch plans and data allocation until the TTL passes.
// A restart in place that did not cure is not judged so: the node may be the cause, and the
// bad-node memory moves the worker after bad_node_threshold such restarts. A migration recorded
// without the speed (an older journal) is not judged.
// `last`: the newest executed MIGRATE of the worker (History::LastExecuted), or null.
bool MigrationDidNotCure(const WorkerView& w, const AuditRecord* last, int64_t now_ms,
                         const RestartConfig& cfg) {
  constexpr double kCured = 1.1;
  if (last == nullptr || last->action.relative_speed_before <= 0) return false;
  if (static_cast<double>(now_ms - last->time_ms) > cfg.bad_node_ttl_s * 1000) return false;
  return w.relative_speed < kCured * last->action.relative_speed_before;
}

}  // namespace

std::vector<Action> ProposeRelaunches(const ClusterView& view, const History& history,
                                      const PolicyConfig& cfg) {
  std::vector<Action> out;
  if (!cfg.restart.enabled) return out;
  // With ADJUST_BS enabled the job runs (or is about to run, in this same decision)
  // speed-proportional batches, so a relaunch gains the worker's speed difference, not the
  // gap between the slowest and the second slowest.
  const bool balanced = view.job.mode == JobMode::kAsync || cfg.adjust_batch.enabled ||
                        BatchesBalanced(view, history);
  std::vector<const WorkerView*> candidates;
  for (const auto& w : view.workers) {
    if (!w.alive || w.restarting || !w.straggler || !w.persistent) continue;
    if (w.confidence < cfg.detection.min_confidence) continue;
    if (w.level == SlowLevel::kServer) continue;  // the server is the cause, not the worker
    candidates.push_back(&w);
  }
  // Slowest first, so the limits of the safety layer go to the biggest wins.
  std::sort(candidates.begin(), candidates.end(), [](const WorkerView* a, const WorkerView* b) {
    return a->relative_speed != b->relative_speed ? a->relative_speed < b->relative_speed
                                                  : a->id < b->id;
  });
  const RelaunchBaseline baseline =
      candidates.empty() ? RelaunchBaseline{} : ComputeRelaunchBaseline(view, balanced);
  // Each worker's newest executed MIGRATE (History::LastExecuted), from one walk of the audit,
  // newest first: a job of 4 096 workers has hundreds of candidates (a slow hardware group), and
  // the audit up to audit.max_records records.
  absl::flat_hash_map<std::string_view, const AuditRecord*> migrated;
  if (!candidates.empty()) {
    for (auto it = history.audit().rbegin(); it != history.audit().rend(); ++it)
      if (it->outcome == AuditRecord::Outcome::kExecuted && it->action.kind == ActionKind::kMigrate)
        migrated.emplace(it->action.target, &*it);  // the first seen is the newest
  }
  for (const WorkerView* w : candidates) {
    const auto m = migrated.find(w->id);
    if (MigrationDidNotCure(*w, m == migrated.end() ? nullptr : m->second, view.now_ms,
                            cfg.restart))
      continue;
    const bool bad_node = history.IsBadNode(w->node, view.now_ms, cfg.restart);
    std::optional<RelaunchEstimate> best;
    if (!bad_node) {
      best = EstimateRelaunch(view, *w, ActionKind::kRestart, balanced, cfg.restart, baseline);
    }
    if (cfg.restart.migrate) {
      RelaunchEstimate m =
          EstimateRelaunch(view, *w, ActionKind::kMigrate, balanced, cfg.restart, baseline);
      if (!best || (m.pays && (!best->pays || m.saved_s - m.cost_s > best->saved_s - best->cost_s)))
        best = m;
    }
    if (!best || !best->pays) continue;
    Action a;
    a.kind = best->kind;
    a.target = w->id;
    a.node = w->node;
    a.predicted_gain = best->predicted_gain;
    a.cost_s = best->cost_s;
    a.saved_s = best->saved_s;
    a.relative_speed_before = w->relative_speed;
    a.reason = absl::StrFormat("persistent %s straggler (r=%.2f, %s)%s; %s",
                               SlowLevelName(w->level), w->relative_speed,
                               w->contention ? "contention" : "deterministic",
                               bad_node ? ", node remembered as bad" : "", best->reason);
    if (a.kind == ActionKind::kMigrate) {
      a.avoid_nodes = history.BadNodes(view.now_ms, cfg.restart);
      if (std::find(a.avoid_nodes.begin(), a.avoid_nodes.end(), w->node) == a.avoid_nodes.end())
        a.avoid_nodes.push_back(w->node);
      std::sort(a.avoid_nodes.begin(), a.avoid_nodes.end());
    }
    out.push_back(std::move(a));
  }
  return out;
}

std::vector<Action> ProposeServerActions(const ClusterView& view, const History& history,
                                         const PolicyConfig& cfg) {
  std::vector<Action> out;
  if (!cfg.server.enabled || view.job.mode != JobMode::kAsync) return out;
  for (const auto& s : view.servers) {
    if (!s.persistent || !(s.hot || s.relative_latency >= cfg.server.hot_threshold)) continue;
    Action a;
    a.kind = cfg.server.restart ? ActionKind::kRestartServer : ActionKind::kRelieveServer;
    a.target = s.id;
    a.node = s.node;
    // Workers wait on the hot server for the excess latency: relieving it wins that share.
    a.predicted_gain = std::max(0.0, 1 - 1 / std::max(1.0, s.relative_latency));
    a.reason = absl::StrFormat("persistent hot server (latency %.1f ms, %.2f× median)",
                               s.latency_ms, s.relative_latency);
    out.push_back(std::move(a));
  }
  return out;
}

}  // namespace pacer
