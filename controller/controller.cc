#include "controller/controller.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <string_view>

#include "absl/container/flat_hash_set.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "controller/batch_planner.h"
#include "controller/policies/action_rules.h"
#include "controller/safety_gate.h"

namespace pacer {
namespace {

bool Reversible(ActionKind kind) {
  return kind == ActionKind::kAdjustBatch || kind == ActionKind::kReallocate ||
         kind == ActionKind::kExcludeWorkers;
}

// Step seconds of a sync job without the `excluded` workers, each at its batch now and its
// last window's speed; `counted` gets the share of the batch that still counts. 0 when a
// counted worker has no speed.
double StepWithout(const ClusterView& view, const std::vector<std::string>& excluded,
                   double* counted) {
  double step = 0, all = 0, kept = 0;
  // Hashed once: a 4 096-worker job has hundreds of workers out, and every window's rollback
  // check asks this of each of its workers for every exclusion being judged.
  const absl::flat_hash_set<std::string_view> out(excluded.begin(), excluded.end());
  for (const auto& w : view.workers) {
    if (!w.alive || w.restarting || w.local_batch <= 0) continue;
    all += static_cast<double>(w.local_batch);
    if (!out.empty() && out.contains(w.id)) continue;
    kept += static_cast<double>(w.local_batch);
    const double v = w.last_window_speed > 0 ? w.last_window_speed : w.speed;
    if (!(v > 0)) return 0;
    step = std::max(step, static_cast<double>(w.local_batch) / v);
  }
  *counted = all > 0 ? kept / all : 0;
  return step;
}

// Whether an exclusion's measured shortfall says nothing about the exclusion. The job's
// throughput moves with every speed change: in a shared cluster a burst on another worker
// during the evaluation halves it, and a rollback also blocks every exclusion for
// safety.window_s. An exclusion's own effect is measured directly every window instead: on
// the last window's speeds, either the excluded workers no longer hold the step back (their
// burst is over: the policy waits for them again itself, nothing to undo), or dropping them
// still beats waiting for them by safety.min_gain, the bar the gate admits actions by (the
// throughput fell for another reason). Only in between — they are slow, but not enough to
// pay — is the measured shortfall taken as the exclusion's.
bool ExclusionShortfallExplained(const AuditRecord& rec, double min_gain,
                                 const ClusterView& view) {
  if (view.job.mode != JobMode::kSync || rec.action.kind != ActionKind::kExcludeWorkers)
    return false;
  double c_with = 0, c_without = 0;
  const double t_with = StepWithout(view, rec.previous_excluded, &c_with);
  const double t_without = StepWithout(view, rec.action.excluded_workers, &c_without);
  if (!(t_with > 0) || !(t_without > 0) || !(c_with > 0)) return false;
  const double gain_now = (c_without / t_without) / (c_with / t_with) - 1;
  return gain_now <= 0 || gain_now >= min_gain;
}

// Whether an action is judged by the job's throughput. REALLOCATE is not: its predicted gain
// (ProposeReallocation) is the epoch tail it trims — (1 − min_rel)/n, the time the slowest
// worker's last shard keeps the others waiting — but an async job already runs at Σ speeds
// while the epoch lasts (pull-based fetching), and reweighting does not change that sum, so
// the throughput it would be compared with moves only with the workers' speeds: rollbacks
// would fire on noise, and a rollback cannot be told from a burst elsewhere. The tail itself
// is not in the view (it shows once per epoch). So a reallocation is never rolled back on
// throughput; like an exclusion whose workers recovered, it is kept current by the policy
// instead, which reweighs (or restores even weights) as soon as the weights in force drift
// from the speeds by more than reallocate.hysteresis. Its throughput change is still recorded
// as the measured gain, for the audit.
bool JudgedByThroughput(ActionKind kind) { return kind != ActionKind::kReallocate; }

// The job step from which an action's effect shows: a batch plan's effective step; any other
// action in a sync job from the step after the one it was decided at. -1: unknown (async, or
// decided before a restart of pacerd).
int64_t FirstStepUnder(const AuditRecord& r, const std::map<uint64_t, int64_t>& decided) {
  if (r.action.kind == ActionKind::kAdjustBatch && r.action.plan)
    return r.action.plan->effective_step;
  auto it = decided.find(r.id);
  return it == decided.end() ? -1 : it->second + 1;
}

// Whether workers were excluded when a decision at `from_ms` was made, or exclusions changed
// between it and `to_ms`. The job's throughput then moved with the exclusions (a worker not
// waited for no longer holds the step back), not only with the decision: a batch plan made
// while the step rule kept a straggler out gains little over that, though it gains what it
// predicted over waiting for it — and it is what lets the straggler back in.
bool ExclusionsMoved(const History& history, int64_t from_ms, int64_t to_ms) {
  const auto& audit = history.audit();
  for (auto it = audit.rbegin(); it != audit.rend(); ++it) {
    if (it->outcome != AuditRecord::Outcome::kExecuted ||
        it->action.kind != ActionKind::kExcludeWorkers || it->time_ms > to_ms)
      continue;
    if (it->time_ms >= from_ms) return true;            // changed during the evaluation
    return !it->action.excluded_workers.empty();        // in force at the decision
  }
  return false;
}

// The per-step burst rule (Controller::DecideBursts).
bool BurstRuleIn(const PolicyConfig& config) {
  return TraitsOf(config.policy).burst_rule && config.burst_exclusion.step_factor > 0 &&
         config.burst_exclusion.max_workers > 0;
}

// Batch plans checked against step statistics (PolicyTraits::step_statistics).
bool StepStatisticsIn(const PolicyConfig& config) {
  return TraitsOf(config.policy).step_statistics &&
         config.adjust_batch.enabled && config.adjust_batch.speed_significance > 0;
}

bool SameAllocations(const std::vector<WorkerAllocation>& a,
                     const std::vector<WorkerAllocation>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].worker_id != b[i].worker_id || a[i].weight != b[i].weight ||
        a[i].shard_scale != b[i].shard_scale)
      return false;
  }
  return true;
}

}  // namespace

std::string SummarizeView(const ClusterView& view) {
  std::string s = absl::StrFormat("%s job, live %d/%zu, B=%d, step %d, throughput %.1f/s",
                                  JobModeName(view.job.mode), view.LiveWorkers(),
                                  view.workers.size(), view.job.global_batch,
                                  view.job.current_step, view.job.throughput);
  int shown = 0;
  for (const auto& w : view.workers) {
    if (!w.straggler && !w.leader) continue;
    if (shown++ == 8) {
      absl::StrAppend(&s, " …");
      break;
    }
    absl::StrAppendFormat(&s, "; %s@%s r=%.2f %s %s %s %s conf=%.2f", w.id, w.node,
                          w.relative_speed, w.straggler ? "straggler" : "leader",
                          w.persistent ? "persistent" : "transient",
                          w.contention ? "contention" : "deterministic", SlowLevelName(w.level),
                          w.confidence);
  }
  return s;
}

bool DecidedByStepRule(const AuditRecord& record) {
  return absl::StartsWith(record.inputs, kStepRuleInputs);
}

absl::StatusOr<std::unique_ptr<Controller>> Controller::Create(const PolicyConfig& config) {
  if (absl::Status s = ValidatePolicyConfig(config); !s.ok()) return s;
  absl::StatusOr<DecideFn> decide = FindPolicy(config.policy);
  if (!decide.ok()) return decide.status();
  return std::unique_ptr<Controller>(new Controller(config, *decide));
}

absl::Status Controller::ApplyPolicy(const PolicyConfig& config, int64_t now_ms) {
  if (absl::Status s = ValidatePolicyConfig(config); !s.ok()) return s;
  absl::StatusOr<DecideFn> decide = FindPolicy(config.policy);
  if (!decide.ok()) return decide.status();
  AuditRecord r;
  r.time_ms = now_ms;
  r.policy = config.name;
  r.outcome = AuditRecord::Outcome::kPolicy;
  r.action.reason = absl::StrFormat("policy '%s' (%s) replaces '%s' (%s)%s", config.name,
                                    config.policy, config_.name, config_.policy,
                                    config.dry_run ? ", dry run" : "");
  config_ = config;
  decide_ = *decide;
  history_.Record(std::move(r), config_.audit.max_records);
  return absl::OkStatus();
}

// Whether an action has had the chance to show its effect: it is judged only once the job ran
// rollback.evaluate_after_steps steps under it (a plan: past its effective step; any other
// action of a sync job: past the step it was decided at), as well as evaluate_after_s after
// the decision. Judged earlier — a slow step before a switch, a plan scheduled at a step this
// run never reaches, 60 s of a job whose steps take 46 s — it would be measured on what it
// replaced. Async jobs (no job-wide step) by time alone.
bool Controller::RanLongEnough(const AuditRecord& r, const ClusterView& view) const {
  const int64_t first = FirstStepUnder(r, decided_step_);
  if (first < 0) return true;
  return view.job.current_step >= first + config_.safety.rollback.evaluate_after_steps;
}

// The measured gain of an action. In a sync job, with evaluate_after_steps > 0: the job's step
// rate over the steps run under the action (at least evaluate_after_steps, and
// evaluate_after_s) against the rate just before its decision (over at least
// evaluate_after_steps steps and the step running at the decision) — a mean over many steps,
// whatever their length,
// where the last window's throughput holds one step of a job with 46 s steps, or none. Both
// spans run between step transitions seen by the reconciles (the first sample showing a new
// step), so a span is only as uncertain as one reconcile interval, not one step. nullopt: not
// enough steps under it yet (measured later). Otherwise (async, steps unknown, too little
// history before it or too few reconciles since): the last window's throughput against the
// one at the decision.
std::optional<Controller::Measured> Controller::MeasuredGain(const AuditRecord& r,
                                                             const ClusterView& view) const {
  const Measured fallback{view.job.throughput / r.baseline_throughput - 1};
  const int64_t n = config_.safety.rollback.evaluate_after_steps;
  const int64_t first = FirstStepUnder(r, decided_step_);
  if (view.job.mode != JobMode::kSync || n <= 0 || first < 0 || step_samples_.size() < 2)
    return fallback;
  // Transitions: samples whose step differs from the one before.
  auto transition = [&](size_t i) {
    return i > 0 && step_samples_[i].step != step_samples_[i - 1].step;
  };
  // After: from the switch to `first` (interpolated between the samples around it: exact
  // enough whether a reconcile interval holds many steps or a step many intervals) to the
  // newest transition (where the current step was first seen).
  std::optional<size_t> f, z;
  for (size_t i = 0; i < step_samples_.size(); ++i) {
    if (!f && step_samples_[i].step >= first && step_samples_[i].ms >= r.time_ms) f = i;
    if (transition(i)) z = i;
  }
  if (!f || !z || *z < *f) return fallback;
  double switch_ms = static_cast<double>(step_samples_[*f].ms);
  if (*f > 0 && step_samples_[*f].step > step_samples_[*f - 1].step) {
    const StepSample& p = step_samples_[*f - 1];
    const StepSample& q = step_samples_[*f];
    const double frac = std::clamp(static_cast<double>(first - p.step) /
                                       static_cast<double>(q.step - p.step), 0.0, 1.0);
    switch_ms = static_cast<double>(p.ms) + frac * static_cast<double>(q.ms - p.ms);
  }
  const StepSample& sz = step_samples_[*z];
  if (sz.step - first < n) return std::nullopt;  // not enough steps under it yet
  const double after_ms = static_cast<double>(sz.ms) - switch_ms;
  // Before: the shortest span back from the last transition at or before the decision with
  // evaluate_after_steps steps — what the job ran at when it decided (one reconcile interval
  // of a fast job, n steps of a slow one), not what it ran at before the trouble began.
  std::optional<size_t> b1, b0;
  for (size_t i = step_samples_.size(); i-- > 1;) {
    if (!transition(i) || step_samples_[i].ms > r.time_ms) continue;
    if (!b1) {
      b1 = i;
      continue;
    }
    b0 = i;
    if (step_samples_[*b1].step - step_samples_[i].step >= n) break;
  }
  if (!b1 || !b0 || step_samples_[*b1].step - step_samples_[*b0].step < n) return fallback;
  const StepSample& s1 = step_samples_[*b1];
  const StepSample& s0 = step_samples_[*b0];
  if (!(after_ms > 0) || s1.ms <= s0.ms) return fallback;
  const double after_rate = static_cast<double>(sz.step - first) / after_ms;
  // The step running at the decision (begun at s1) counts as one more step, as long as the
  // mean of those before it or as long as it had run by then, whichever is longer. When it had
  // run more than twice their mean, the job slowed down in it -- a plan made in the middle of
  // the first slow step after a sudden slowdown (the monitor measures a running step:
  // detection.running_step_bound) -- and it alone is the rate before (at most one step in the
  // time it had run): the plan is measured against the slowdown it answers, not against the
  // fast steps before it.
  const double k = static_cast<double>(s1.step - s0.step);
  const double span_ms = static_cast<double>(s1.ms - s0.ms);
  const double ran_ms = static_cast<double>(r.time_ms - s1.ms);
  const double running_ms = std::max(ran_ms, span_ms / k);
  const double before_rate =
      ran_ms > 2 * span_ms / k ? 1 / ran_ms : (k + 1) / (span_ms + running_ms);
  return Measured{after_rate / before_rate - 1, 1000 * before_rate, 1000 * after_rate};
}

namespace {

// The gain an action predicted, as a gain over the step rate measured before it. A batch plan
// predicts a step time; its gain is over the step time the planner predicted for the plan in
// force at the speeds it saw. When the job ran faster than that before the decision -- the
// span measured before it holds steps from before the slowdown the plan answers, as after a
// sudden one, where the plan comes within the first slow step or two -- the plan's step time
// over that measured rate is the gain it can show (less than predicted: 1.92 predicted, 0.56 at
// best against three fast steps and one slow, where 0.3 x 1.92 was asked). Never more than
// predicted: a job measured slower than the planner thought is judged as before.
double PredictedOverMeasured(const AuditRecord& r, double before_steps_per_s) {
  const double predicted = r.action.predicted_gain;
  if (!(before_steps_per_s > 0) || r.action.kind != ActionKind::kAdjustBatch || !r.action.plan ||
      !(r.action.plan->predicted_step_s > 0))
    return predicted;
  return std::min(predicted, 1 / (r.action.plan->predicted_step_s * before_steps_per_s) - 1);
}

}  // namespace

bool UsesStepTimings(const PolicyConfig& config) {
  return BurstRuleIn(config) || StepStatisticsIn(config);
}

bool Controller::StepRuleConfigured() const { return BurstRuleIn(config_); }

bool Controller::StepStatisticsConfigured() const { return StepStatisticsIn(config_); }

bool Controller::StepRuleActive(int64_t now_ms) const {
  return StepRuleConfigured() && last_view_ && burst_view_.job.mode == JobMode::kSync &&
         burst_view_.job.can_exclude_workers && bursts_.HasFreshTimings(now_ms);
}

double Controller::StepLineS(const std::string& worker_id, int64_t now_ms) const {
  if (!StepRuleConfigured() || !last_view_ || burst_view_.job.mode != JobMode::kSync ||
      !burst_view_.job.can_exclude_workers || !(burst_median_s_ > 0) ||
      !bursts_.StepSeconds(worker_id, now_ms))
    return 0;
  const std::vector<std::string>& excluded = history_.excluded_workers();
  if (std::find(excluded.begin(), excluded.end(), worker_id) != excluded.end()) return 0;
  return BurstStepLineS();
}

void Controller::HoldRestoredExclusion(int64_t now_ms) {
  const double hold_s = std::max(BurstDetector::kMinFreshS, 2 * config_.detection.window_s);
  restored_exclusion_held_until_ms_ = now_ms + static_cast<int64_t>(hold_s * 1000);
}

bool Controller::ExclusionsLeftAlone(int64_t now_ms) const {
  return StepRuleActive(now_ms) || now_ms < restored_exclusion_held_until_ms_;
}

void Controller::ObserveSteps(const std::vector<StepTiming>& timings) {
  const bool stats = StepStatisticsConfigured(), rule = StepRuleConfigured();
  if (!stats && !rule) return;
  // One pass over the timings for both (a 4 096-worker heartbeat carries 4 096 of them).
  for (const StepTiming& t : timings) {
    if (stats) step_stats_.Observe(t);
    if (rule) bursts_.Observe(t);
  }
}

bool Controller::ObserveHeartbeatSteps(const std::vector<StepTiming>& timings, int64_t now_ms) {
  if (!StepRuleConfigured() || timings.empty()) return false;
  for (const StepTiming& t : timings) bursts_.Observe(t);
  if (!(burst_median_s_ > 0) || !StepRuleActive(now_ms)) return false;
  const BurstExclusionConfig& cfg = config_.burst_exclusion;
  const std::vector<std::string>& excluded = history_.excluded_workers();
  const std::string* last = nullptr;
  for (const StepTiming& t : timings) {
    if (last != nullptr && *last == t.worker_id) continue;
    last = &t.worker_id;
    const std::optional<double> s = bursts_.StepSeconds(t.worker_id, now_ms);
    if (!s) continue;
    const bool out = std::find(excluded.begin(), excluded.end(), t.worker_id) != excluded.end();
    if (!out && *s > cfg.step_factor * burst_median_s_ &&
        static_cast<int64_t>(excluded.size()) < BurstExclusionCap(cfg, bursts_.workers()))
      return true;
    if (out && *s <= std::min(cfg.rejoin_factor, cfg.step_factor) * burst_median_s_) return true;
  }
  return false;
}

absl::StatusOr<ReconcileResult> Controller::DecideBursts(int64_t now_ms) {
  ReconcileResult result;
  if (!StepRuleConfigured() || !last_view_ || burst_view_.job.mode != JobMode::kSync)
    return result;
  ClusterView& view = burst_view_;
  view.now_ms = now_ms;
  std::vector<Action> proposals;
  std::string inputs;
  if (!view.job.can_exclude_workers) {
    if (auto a = EndExclusions(view, history_, "burst exclusion")) proposals.push_back(std::move(*a));
    inputs = absl::StrCat(kStepRuleInputs, "; a live worker cannot carry out an exclusion");
  } else if (bursts_.HasFreshTimings(now_ms)) {
    BurstDecision d =
        bursts_.Decide(history_.excluded_workers(), config_.burst_exclusion, now_ms);
    burst_median_s_ = d.median_step_s;
    // Only workers the last view knows as live are excluded (a timing from a worker the
    // reconciler has not seen yet, or one restarting, is not acted on).
    auto live = [&](const std::string& id) {
      auto it = burst_index_.find(id);
      const WorkerView* w = it == burst_index_.end() ? nullptr : &view.workers[it->second];
      return w && w->alive && !w->restarting;
    };
    std::vector<std::string> added, excluded;
    for (const auto& id : d.excluded)
      if (live(id) || !std::binary_search(d.added.begin(), d.added.end(), id))
        excluded.push_back(id);
    for (const auto& id : d.added)
      if (live(id)) added.push_back(id);
    inputs = absl::StrFormat("%s of %d workers, median step %.3fs, excluded %s",
                             kStepRuleInputs, static_cast<int>(bursts_.workers()), d.median_step_s,
                             history_.excluded_workers().empty()
                                 ? std::string("none")
                                 : absl::StrJoin(history_.excluded_workers(), ","));
    if (!d.rejoined.empty()) {
      Action a;
      a.kind = ActionKind::kExcludeWorkers;
      for (const auto& id : history_.excluded_workers())
        if (!std::binary_search(d.rejoined.begin(), d.rejoined.end(), id))
          a.excluded_workers.push_back(id);
      a.target = absl::StrJoin(d.rejoined, ",");
      a.mandatory = true;  // waiting for everyone again is the default; nothing to predict
      a.reason = d.rejoin_reason;
      proposals.push_back(std::move(a));
    }
    // Additions below min_gain are not proposed: the gate would veto them at every heartbeat
    // (equally slow workers of mixed hardware, before a plan), filling the audit log.
    if (!added.empty() && d.predicted_gain >= config_.safety.min_gain && d.predicted_gain > 0) {
      Action a;
      a.kind = ActionKind::kExcludeWorkers;
      a.excluded_workers = excluded;
      a.target = absl::StrJoin(added, ",");
      a.predicted_gain = d.predicted_gain;
      a.reason = d.add_reason;
      proposals.push_back(std::move(a));
    }
  }
  SafetyConfig safety = config_.safety;
  safety.cooldown_s = config_.burst_exclusion.cooldown_s;
  ReviewAndExecute(proposals, view, inputs, /*check_members=*/false, safety, result);
  return result;
}

absl::StatusOr<ReconcileResult> Controller::Reconcile(const ClusterView& view) {
  if (absl::Status s = ValidateClusterView(view); !s.ok()) return s;
  ReconcileResult result;
  const std::string inputs = SummarizeView(view);
  if (StepRuleConfigured()) {
    // What the step path needs of the view between reconciles (job facts, who is live).
    burst_view_.job = view.job;
    burst_view_.workers.clear();
    burst_view_.workers.reserve(view.workers.size());
    burst_index_.clear();
    for (const auto& w : view.workers) {
      WorkerView v;
      v.id = w.id;
      v.alive = w.alive;
      v.restarting = w.restarting;
      burst_index_.emplace(w.id, burst_view_.workers.size());  // the first of an id, as FindWorker
      burst_view_.workers.push_back(std::move(v));
    }
    last_view_ = true;
  }
  if (view.job.mode == JobMode::kSync) {
    if (!step_samples_.empty() && view.job.current_step < step_samples_.back().step)
      step_samples_.clear();  // a new run counts steps from 0 again
    if (step_samples_.empty() || view.now_ms > step_samples_.back().ms)
      step_samples_.push_back({view.now_ms, view.job.current_step});
    while (step_samples_.size() > kMaxStepSamples) step_samples_.pop_front();
  }
  MeasureAndRollBack(view, inputs, result);

  NoteQuietWorkers(view);
  // While the step rule acts on bursts, the rest of the policy (batch plans, relaunches) sees a
  // worker as slow only when its windows *and* its newest step say so: a plan made on a burst
  // arrives when the burst is over (K of W windows, then the plan's lead time), and the burst
  // is the step rule's; a worker slow for good is slow in both. Only a newest step faster than
  // the window by rejoin_factor (the line an excluded worker comes back by) replaces the
  // window's speed: one step's noise would make every plan a few percent worse.
  const ClusterView* decide_view = &view;
  ClusterView steady;
  // Each worker's step statistics: a batch plan moves a worker off the typical speed only when
  // its steps show the difference (adjust_batch.speed_significance). A worker silent for as
  // long as the monitor takes to call it gone (3 windows, and 3 of its steps) is left out.
  if (view.job.mode == JobMode::kSync && StepStatisticsConfigured() && step_stats_.workers() > 0) {
    const StepStatistics::SummaryMap stats = step_stats_.Summaries(
        view.now_ms, static_cast<int64_t>(3 * config_.detection.window_s * 1000));
    if (!stats.empty()) {
      steady = view;
      for (auto& w : steady.workers) {
        auto it = stats.find(w.id);
        if (it == stats.end()) continue;
        w.step_speed = it->second.speed;
        w.step_speed_rel_se = it->second.rel_se;
        w.step_noise = it->second.rel_se * std::sqrt(it->second.steps);
      }
      decide_view = &steady;
    }
  }
  if (StepRuleActive(view.now_ms)) {
    if (decide_view != &steady) steady = view;
    for (auto& w : steady.workers) {
      const std::optional<double> newest = bursts_.NewestSpeed(w.id, view.now_ms);
      const double recovered = config_.burst_exclusion.rejoin_factor;
      if (!newest || !(w.speed > 0) || *newest < recovered * w.speed) continue;
      w.speed = *newest;
      if (w.last_window_speed > 0) w.last_window_speed = std::max(w.last_window_speed, *newest);
    }
    decide_view = &steady;
  }
  std::vector<Action> proposals = decide_(*decide_view, history_, config_);
  // The step rule, while it has timings, manages exclusions between reconciles (DecideBursts);
  // the window rule's proposals would undo its decisions a window late (and, just after a
  // restart, before the workers have even reported whether they honour exclusion:
  // HoldRestoredExclusion).
  if (ExclusionsLeftAlone(view.now_ms)) {
    proposals.erase(std::remove_if(proposals.begin(), proposals.end(),
                                   [](const Action& a) {
                                     return a.kind == ActionKind::kExcludeWorkers;
                                   }),
                    proposals.end());
  }
  // Exclusions inherited from an earlier policy end with it (PolicyTraits::manages_exclusions).
  if (!TraitsOf(config_.policy).manages_exclusions) {
    if (auto a = EndExclusions(view, history_, absl::StrCat("policy '", config_.policy, "'"))) {
      a->reason = absl::StrCat("wait for ", a->target, " again: policy '", config_.policy,
                               "' does not exclude workers");
      proposals.push_back(std::move(*a));
    }
  }
  ReviewAndExecute(proposals, view, inputs, /*check_members=*/true, config_.safety, result);
  return result;
}

void Controller::ReviewAndExecute(std::vector<Action>& proposals, const ClusterView& view,
                                  const std::string& inputs, bool check_members,
                                  const SafetyConfig& safety, ReconcileResult& result) {
  // Executed actions are in the history at once, where the gate counts them; dry-run ones are
  // not, so the gate is told about them to apply the same limits within this reconcile.
  std::vector<Action> dry_run_admitted;
  for (Action& action : proposals) {
    SafetyVerdict verdict = check_members ? KeepsQuietMembers(action, view) : SafetyVerdict{true, ""};
    if (verdict.admitted)
      verdict = ReviewAction(action, view, history_, safety, dry_run_admitted);
    if (verdict.admitted && !config_.dry_run) {
      Execute(std::move(action), view, inputs, result);
      continue;
    }
    if (verdict.admitted) dry_run_admitted.push_back(action);
    AuditRecord r;
    r.time_ms = view.now_ms;
    r.policy = config_.name;
    r.outcome = verdict.admitted ? AuditRecord::Outcome::kDryRun : AuditRecord::Outcome::kVetoed;
    r.veto_reason = verdict.reason;
    r.inputs = inputs;
    r.baseline_throughput = view.job.throughput;
    r.action = std::move(action);
    result.audit_ids.push_back(history_.Record(std::move(r), config_.audit.max_records));
  }
}

void Controller::NoteQuietWorkers(const ClusterView& view) {
  for (const auto& w : view.workers) {
    if (w.alive || w.restarting) {
      if (!quiet_since_ms_.empty()) quiet_since_ms_.erase(w.id);  // mostly none is quiet
    } else {
      quiet_since_ms_.emplace(w.id, view.now_ms);  // keeps the first time seen quiet
    }
  }
  for (auto it = quiet_since_ms_.begin(); it != quiet_since_ms_.end();) {
    it = view.FindWorker(it->first) ? std::next(it) : quiet_since_ms_.erase(it);
  }
}

SafetyVerdict Controller::KeepsQuietMembers(const Action& action, const ClusterView& view) const {
  if (action.kind != ActionKind::kAdjustBatch || action.rollback_of != 0 || !action.plan ||
      !history_.plan())
    return {true, ""};
  const int64_t grace_ms = static_cast<int64_t>(config_.adjust_batch.member_grace_s * 1000);
  if (quiet_since_ms_.empty()) return {true, ""};
  for (const auto& wb : history_.plan()->workers) {
    // The quiet ones first (few; Find scans the plan): the same verdict, not O(workers²).
    auto quiet = quiet_since_ms_.find(wb.worker_id);
    if (quiet == quiet_since_ms_.end()) continue;  // gone from the view, or restarting: left
    if (action.plan->Find(wb.worker_id)) continue;
    const int64_t quiet_ms = view.now_ms - quiet->second;
    if (quiet_ms < grace_ms)
      return {false, absl::StrFormat("%s, in the plan in force, quiet for %.0fs (< "
                                     "member_grace_s %.0fs): not planned without it yet",
                                     wb.worker_id, quiet_ms / 1000.0,
                                     config_.adjust_batch.member_grace_s)};
  }
  return {true, ""};
}

void Controller::Execute(Action action, const ClusterView& view, const std::string& inputs,
                         ReconcileResult& result) {
  AuditRecord r;
  r.time_ms = view.now_ms;
  r.policy = config_.name;
  r.outcome = AuditRecord::Outcome::kExecuted;
  r.inputs = inputs;
  r.baseline_throughput = view.job.throughput;
  switch (action.kind) {
    case ActionKind::kAdjustBatch:
      r.previous_plan = history_.plan() ? *history_.plan()
                                        : BatchPlanner::InForce(view, config_.adjust_batch);
      break;
    case ActionKind::kReallocate:
      r.previous_allocations = history_.allocations();
      r.previous_tail_backups = history_.tail_backups();
      break;
    case ActionKind::kExcludeWorkers:
      r.previous_excluded = history_.excluded_workers();
      break;
    default:
      break;
  }
  r.action = std::move(action);
  // The record first, then what it put in force: the exclusion names the record that decided it.
  const uint64_t id = history_.Record(std::move(r), config_.audit.max_records);
  const AuditRecord& written = *history_.FindRecord(id);
  const Action& a = written.action;
  switch (a.kind) {
    case ActionKind::kAdjustBatch:
      history_.SetPlan(*a.plan);
      break;
    case ActionKind::kReallocate:
      history_.SetAllocations(a.allocations);
      if (a.tail_backups) history_.SetTailBackups(*a.tail_backups);
      break;
    case ActionKind::kExcludeWorkers:
      history_.SetExcluded(a.excluded_workers, id, a.reason, DecidedByStepRule(written));
      break;
    case ActionKind::kRestart:
    case ActionKind::kMigrate:
      if (!a.node.empty()) history_.AddNodeIncident(a.node, view.now_ms);
      // The relaunched process's steps are new evidence: the old one's say nothing of it (an
      // excluded worker rejoins at the next burst decision, not when its old timing goes stale).
      bursts_.Forget(a.target);
      break;
    case ActionKind::kRestartServer:
    case ActionKind::kRelieveServer:
      break;
  }
  result.audit_ids.push_back(id);
  if (view.job.mode == JobMode::kSync) {
    decided_step_[id] = view.job.current_step;
    // Only the records the audit still holds (it drops its oldest).
    while (decided_step_.size() > static_cast<size_t>(config_.audit.max_records) + 1)
      decided_step_.erase(decided_step_.begin());
  }
  result.dispatch.push_back(history_.FindRecord(id)->action);
}

void Controller::MeasureAndRollBack(const ClusterView& view, const std::string& inputs,
                                    ReconcileResult& result) {
  const RollbackConfig& rb = config_.safety.rollback;
  const int64_t after_ms = static_cast<int64_t>(rb.evaluate_after_s * 1000);
  std::vector<uint64_t> due;
  for (const auto& r : history_.audit()) {
    if (r.outcome == AuditRecord::Outcome::kExecuted && !r.measured_gain &&
        view.now_ms - r.time_ms >= after_ms && r.baseline_throughput > 0 &&
        view.job.throughput > 0 && RanLongEnough(r, view))
      due.push_back(r.id);
  }
  for (uint64_t id : due) {
    const std::optional<Measured> measured = MeasuredGain(*history_.FindRecord(id), view);
    if (!measured) continue;  // not enough steps under it yet
    const double gain = measured->gain;
    history_.SetMeasuredGain(id, gain, view.now_ms);
    // Judged where it stands, copied only to be undone (below): a plan's record holds two plans
    // of every worker.
    const AuditRecord& held = *history_.FindRecord(id);
    if (!rb.enabled || !Reversible(held.action.kind) || held.action.rollback_of != 0 ||
        !JudgedByThroughput(held.action.kind) || held.action.mandatory ||
        held.action.predicted_gain <= 0 ||
        gain >= rb.min_fraction_of_predicted *
                    PredictedOverMeasured(held, measured->before_steps_per_s))
      continue;
    // The step rule re-judges its exclusions at every heartbeat (a worker is waited for again
    // as soon as its probe is fast): a job throughput 60 s later says nothing about them.
    // (Asked first: it is a flag, the next test a pass over every worker per exclusion.)
    if (held.action.kind == ActionKind::kExcludeWorkers && ExclusionsLeftAlone(view.now_ms)) continue;
    if (ExclusionShortfallExplained(held, config_.safety.min_gain, view)) continue;
    if (held.action.kind == ActionKind::kAdjustBatch && StepRuleActive(view.now_ms) &&
        ExclusionsMoved(history_, held.time_ms, view.now_ms))
      continue;
    const AuditRecord rec = held;  // copy: Execute() may drop old records
    Action undo;
    undo.kind = rec.action.kind;
    undo.target = rec.action.target;
    undo.rollback_of = rec.id;
    undo.reason = absl::StrFormat(
        "rollback of #%d: measured gain %.3f < %.2f × predicted %.3f", rec.id, gain,
        rb.min_fraction_of_predicted, rec.action.predicted_gain);
    if (measured->before_steps_per_s > 0) {
      const double over = PredictedOverMeasured(rec, measured->before_steps_per_s);
      absl::StrAppendFormat(&undo.reason, " (%s%.3f → %.3f steps/s)",
                            over < rec.action.predicted_gain
                                ? absl::StrFormat("%.3f over the rate measured before it; ", over)
                                : std::string(),
                            measured->before_steps_per_s, measured->after_steps_per_s);
    }
    if (rec.action.kind == ActionKind::kAdjustBatch) {
      // Only when the plan to restore still fits the job (same workers, same B) and the plan
      // being undone is still the one in force.
      if (!rec.previous_plan || !rec.action.plan || !history_.plan() ||
          history_.plan()->version != rec.action.plan->version)
        continue;
      BatchPlan restore = *rec.previous_plan;
      bool fits = restore.global_batch == view.job.global_batch;
      for (const auto& wb : restore.workers) {
        const WorkerView* w = view.FindWorker(wb.worker_id);
        fits = fits && w && w->alive && !w->restarting;
      }
      if (!fits || static_cast<int>(restore.workers.size()) != view.LiveWorkers()) continue;
      restore.version = history_.plan()->version + 1;
      restore.effective_step = BatchPlanner::EffectiveStep(view, config_.adjust_batch,
                                                           restore.predicted_step_s);
      // The restored plan keeps its own hysteresis basis: the next decision weighs the speeds
      // measured since (the workers' steps under the undone plan included) against the plan
      // really in force. The gate holds off the undone plan and its equivalents (safety_gate.h,
      // rule 3), and one made later is predicted at what this one measured (ProposeBatchPlan).
      undo.plan = std::move(restore);
    } else if (rec.action.kind == ActionKind::kReallocate) {
      // Only what this action changed and is still in force: a newer REALLOCATE that set other
      // weights, or switched tail backups since, is not undone by restoring this one's
      // predecessor. The weights go back when they are still this action's; tail backups only
      // when this action switched them and they are still as it left them.
      const bool weights = SameAllocations(history_.allocations(), rec.action.allocations);
      const bool backups = rec.action.tail_backups && rec.previous_tail_backups &&
                           history_.tail_backups() == *rec.action.tail_backups &&
                           *rec.previous_tail_backups != *rec.action.tail_backups;
      if (!weights && !backups) continue;
      undo.allocations = weights ? rec.previous_allocations : history_.allocations();
      if (backups) undo.tail_backups = rec.previous_tail_backups;
    } else {
      // Only an exclusion still in force: one the policy has since changed (a burst ended, a
      // worker rejoined) is not there to undo, and restoring its predecessor would be wrong.
      if (history_.excluded_workers() != rec.action.excluded_workers) continue;
      undo.excluded_workers = rec.previous_excluded;
    }
    history_.MarkRolledBack(rec.id);
    Execute(std::move(undo), view, inputs, result);
  }
}

}  // namespace pacer
