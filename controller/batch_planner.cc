#include "controller/batch_planner.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace pacer {
namespace {

struct LiveWorker {
  const WorkerView* view;
  double speed;
};

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

bool Usable(double speed) { return std::isfinite(speed) && speed > 0; }

// Step 1: live workers sorted by id, each with a usable speed.
std::vector<LiveWorker> LiveWorkers(const ClusterView& view, bool use_last_window) {
  std::vector<LiveWorker> live;
  live.reserve(view.workers.size());
  bool all_usable = true;
  for (const auto& w : view.workers) {
    if (!w.alive || w.restarting) continue;
    const double v = use_last_window ? w.last_window_speed : w.speed;
    live.push_back({&w, v});
    all_usable = all_usable && Usable(v);
  }
  // A worker without a usable speed is planned at the median of the known ones (sorted only
  // when one needs it).
  if (!all_usable) {
    std::vector<double> known;
    for (const auto& lw : live)
      if (Usable(lw.speed)) known.push_back(lw.speed);
    const double prior = known.empty() ? 1.0 : Median(known);
    for (auto& lw : live)
      if (!Usable(lw.speed)) lw.speed = prior;
  }
  std::sort(live.begin(), live.end(),
            [](const LiveWorker& a, const LiveWorker& b) { return a.view->id < b.view->id; });
  return live;
}

double WorkerStepSeconds(const WorkerView& w, double speed, int64_t samples, int64_t accumulation) {
  const double fixed = static_cast<double>(accumulation) * w.step_fixed_s;
  if (w.step_per_sample_s > 0) return fixed + w.step_per_sample_s * static_cast<double>(samples);
  return fixed + static_cast<double>(samples) / speed;
}

// Fills micro_batch / accumulation from samples and the worker's cap.
void SplitMicroBatches(WorkerBatch& wb, int64_t cap) {
  wb.accumulation = 1;
  if (cap > 0 && wb.samples > cap) wb.accumulation = (wb.samples + cap - 1) / cap;
  wb.micro_batch = wb.samples == 0 ? 0 : (wb.samples + wb.accumulation - 1) / wb.accumulation;
}

BatchPlan BuildPlan(const std::vector<LiveWorker>& live, const std::vector<int64_t>& samples,
                    int64_t global_batch) {
  BatchPlan plan;
  plan.global_batch = global_batch;
  double total_speed = 0;
  for (const auto& lw : live) total_speed += lw.speed;
  for (size_t i = 0; i < live.size(); ++i) {
    WorkerBatch wb;
    wb.worker_id = live[i].view->id;
    wb.samples = samples[i];
    SplitMicroBatches(wb, live[i].view->max_local_batch);
    wb.predicted_step_s =
        WorkerStepSeconds(*live[i].view, live[i].speed, wb.samples, wb.accumulation);
    plan.predicted_step_s = std::max(plan.predicted_step_s, wb.predicted_step_s);
    // In id order (`live` is sorted): appended at the end, not searched for.
    plan.basis_share.insert_or_assign(plan.basis_share.end(), wb.worker_id,
                                      live[i].speed / total_speed);
    plan.workers.push_back(std::move(wb));
  }
  return plan;
}

}  // namespace

absl::Status CheckBatchPlan(const BatchPlan& plan, const std::map<std::string, int64_t>& caps) {
  int64_t total = 0;
  for (size_t i = 0; i < plan.workers.size(); ++i) {
    const WorkerBatch& w = plan.workers[i];
    if (i > 0 && !(plan.workers[i - 1].worker_id < w.worker_id))
      return absl::FailedPreconditionError("plan workers not sorted/unique at " + w.worker_id);
    if (w.samples < 0 || w.accumulation < 1)
      return absl::FailedPreconditionError("bad samples/accumulation for " + w.worker_id);
    auto cap = caps.find(w.worker_id);
    if (cap != caps.end() && cap->second > 0 && w.micro_batch > cap->second)
      return absl::FailedPreconditionError("micro-batch above cap for " + w.worker_id);
    const int64_t expect_micro =
        w.samples == 0 ? 0 : (w.samples + w.accumulation - 1) / w.accumulation;
    if (w.micro_batch != expect_micro)
      return absl::FailedPreconditionError("micro-batch != ceil(samples/k) for " + w.worker_id);
    if (w.accumulation > 1 && w.micro_batch * (w.accumulation - 1) >= w.samples)
      return absl::FailedPreconditionError("needless accumulation for " + w.worker_id);
    total += w.samples;
  }
  if (total != plan.global_batch)
    return absl::FailedPreconditionError(
        absl::StrCat("plan sums to ", total, ", not the global batch ", plan.global_batch));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<double>> WaterFill(const std::vector<double>& weights,
                                              const std::vector<double>& lo,
                                              const std::vector<double>& hi, double total) {
  const size_t n = weights.size();
  if (n == 0 || lo.size() != n || hi.size() != n)
    return absl::InvalidArgumentError("water-fill: empty or mismatched inputs");
  double sum_lo = 0, sum_hi = 0;
  bool unbounded = false;
  for (size_t i = 0; i < n; ++i) {
    if (!(weights[i] > 0) || !std::isfinite(weights[i]))
      return absl::InvalidArgumentError("water-fill: weights must be positive");
    sum_lo += lo[i];
    if (hi[i] < 0) unbounded = true; else sum_hi += hi[i];
  }
  if (sum_lo > total + 1e-9)
    return absl::FailedPreconditionError(
        absl::StrFormat("the minimum batches need %.0f samples, more than %.0f", sum_lo, total));
  if (!unbounded && sum_hi < total - 1e-9)
    return absl::FailedPreconditionError(absl::StrFormat(
        "the memory caps hold %.0f samples, fewer than the global batch %.0f", sum_hi, total));

  std::vector<double> x(n, 0);
  std::vector<bool> fixed(n, false);
  // Each round fixes at least one worker at a bound, so n + 1 rounds suffice.
  for (size_t round = 0; round <= n; ++round) {
    double remaining = total, free_weight = 0;
    for (size_t i = 0; i < n; ++i) {
      if (fixed[i]) remaining -= x[i]; else free_weight += weights[i];
    }
    if (free_weight == 0) break;
    for (size_t i = 0; i < n; ++i)
      if (!fixed[i]) x[i] = remaining * weights[i] / free_weight;
    bool changed = false;
    for (size_t i = 0; i < n; ++i) {
      if (!fixed[i] && hi[i] >= 0 && x[i] > hi[i]) {
        x[i] = hi[i];
        fixed[i] = true;
        changed = true;
      }
    }
    if (changed) continue;
    for (size_t i = 0; i < n; ++i) {
      if (!fixed[i] && x[i] < lo[i]) {
        x[i] = lo[i];
        fixed[i] = true;
        changed = true;
      }
    }
    if (!changed) break;
  }
  const double sum = std::accumulate(x.begin(), x.end(), 0.0);
  if (std::fabs(sum - total) > 1e-6 * std::max(1.0, total))
    return absl::FailedPreconditionError("water-fill: bounds cannot hold the total");
  return x;
}

std::vector<int64_t> RoundKeepingSum(const std::vector<double>& shares,
                                     const std::vector<int64_t>& lo,
                                     const std::vector<int64_t>& hi, int64_t total) {
  const size_t n = shares.size();
  std::vector<int64_t> out(n);
  int64_t sum = 0;
  for (size_t i = 0; i < n; ++i) {
    int64_t f = static_cast<int64_t>(std::floor(shares[i]));
    f = std::max(f, lo[i]);
    if (hi[i] >= 0) f = std::min(f, hi[i]);
    out[i] = f;
    sum += f;
  }
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  // Largest fractional remainder first; ties to the lower index (stable, deterministic).
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return shares[a] - static_cast<double>(out[a]) > shares[b] - static_cast<double>(out[b]);
  });
  int64_t left = total - sum;
  // Normally one pass hands out every unit; more passes only absorb floating-point slack.
  for (int pass = 0; left > 0 && pass < 1000; ++pass) {
    bool gave = false;
    for (size_t i : order) {
      if (left == 0) break;
      if (hi[i] >= 0 && out[i] >= hi[i]) continue;
      ++out[i];
      --left;
      gave = true;
    }
    if (!gave) break;
  }
  for (int pass = 0; left < 0 && pass < 1000; ++pass) {
    bool took = false;
    for (auto it = order.rbegin(); it != order.rend() && left < 0; ++it) {
      if (out[*it] <= lo[*it]) continue;
      --out[*it];
      ++left;
      took = true;
    }
    if (!took) break;
  }
  return out;
}

namespace {

// Target() on the live workers of `view` (LiveWorkers(view, cfg.use_last_window)).
absl::StatusOr<BatchPlan> TargetOn(const std::vector<LiveWorker>& live, const ClusterView& view,
                                   const AdjustBatchConfig& cfg) {
  if (live.empty()) return absl::FailedPreconditionError("no live worker to plan for");
  const int64_t B = view.job.global_batch;
  if (B < 1) return absl::FailedPreconditionError("the job has no global batch");
  const size_t n = live.size();
  std::vector<double> weights(n), lo(n, static_cast<double>(cfg.min_local_batch)), hi(n, -1),
      unbounded(n, -1);
  std::vector<int64_t> lo_i(n, cfg.min_local_batch), hi_i(n, -1), unbounded_i(n, -1);
  for (size_t i = 0; i < n; ++i) {
    weights[i] = live[i].speed;
    const int64_t cap = live[i].view->max_local_batch;
    if (cap > 0) {
      hi[i] = static_cast<double>(std::max(cap, cfg.min_local_batch));
      hi_i[i] = std::max(cap, cfg.min_local_batch);
    }
  }
  std::optional<BatchPlan> best;
  absl::StatusOr<std::vector<double>> capped = WaterFill(weights, lo, hi, static_cast<double>(B));
  if (capped.ok()) best = BuildPlan(live, RoundKeepingSum(*capped, lo_i, hi_i, B), B);
  if (cfg.accumulation) {
    absl::StatusOr<std::vector<double>> free =
        WaterFill(weights, lo, unbounded, static_cast<double>(B));
    if (!free.ok()) return free.status();
    BatchPlan accum = BuildPlan(live, RoundKeepingSum(*free, lo_i, unbounded_i, B), B);
    // Strictly better only: equal times keep the plan without accumulation.
    if (!best || accum.predicted_step_s < best->predicted_step_s * (1 - 1e-9))
      best = std::move(accum);
  }
  if (!best) return capped.status();
  return std::move(*best);  // moved, not copied: a plan names every worker twice
}

// PredictStepSeconds() on the live workers of the view (LiveWorkers, sorted by id): each planned
// worker against the live entries of its id (comparing every planned id with every live one was
// 4 096² string compares per prediction, half the time of a 4 096-worker sync simulation). A
// plan's workers are in id order too (batch_plan.h), so the entries are found by one walk along
// `live`; a planned id out of that order is found by binary search. Ids are unique in a valid
// view; with a repeated id every live entry of it still counts, in the live order.
double PredictOnLive(const std::vector<LiveWorker>& live, const BatchPlan& plan) {
  struct ById {
    bool operator()(const LiveWorker& a, const std::string& b) const { return a.view->id < b; }
  };
  double worst = 0;
  auto it = live.begin();  // the first live entry not below the planned ids so far
  const std::string* prev = nullptr;
  for (const auto& wb : plan.workers) {
    if (prev != nullptr && wb.worker_id < *prev)
      it = std::lower_bound(live.begin(), live.end(), wb.worker_id, ById());
    prev = &wb.worker_id;
    while (it != live.end() && it->view->id < wb.worker_id) ++it;
    for (auto e = it; e != live.end() && e->view->id == wb.worker_id; ++e)
      worst = std::max(worst, WorkerStepSeconds(*e->view, e->speed, wb.samples, wb.accumulation));
  }
  return worst;
}

}  // namespace

absl::StatusOr<BatchPlan> BatchPlanner::Target(const ClusterView& view,
                                               const AdjustBatchConfig& cfg) {
  return TargetOn(LiveWorkers(view, cfg.use_last_window), view, cfg);
}

double BatchPlanner::CollectiveSeconds(const ClusterView& view, double predicted_compute_s) {
  const double wall = view.job.step_time_s;
  if (!(wall > 0) || !(predicted_compute_s > 0) || !std::isfinite(wall)) return 0;
  return std::max(0.0, wall - predicted_compute_s);
}

double BatchPlanner::PredictStepSeconds(const ClusterView& view, const BatchPlan& plan,
                                        bool use_last_window) {
  return PredictOnLive(LiveWorkers(view, use_last_window), plan);
}

int64_t BatchPlanner::EffectiveStep(const ClusterView& view, const AdjustBatchConfig& cfg,
                                    double predicted_step_s) {
  // The faster of the step now and the step under the new plan: steps may speed up once the
  // plan applies, and the lead must hold either way.
  double step_s = view.job.step_time_s;
  if (predicted_step_s > 0 && (step_s <= 0 || predicted_step_s < step_s)) step_s = predicted_step_s;
  int64_t ahead = cfg.min_steps_ahead;
  if (step_s > 0) {
    const double lead_s =
        static_cast<double>(cfg.lead_heartbeats) * std::max(view.job.heartbeat_interval_s, 0.0);
    const double steps = std::ceil(lead_s / step_s);
    ahead = std::max<int64_t>(ahead, static_cast<int64_t>(std::min(steps, 1e12)));
  }
  return view.job.current_step + ahead;
}

BatchPlan BatchPlanner::InForce(const ClusterView& view, const AdjustBatchConfig& cfg) {
  const std::vector<LiveWorker> live = LiveWorkers(view, cfg.use_last_window);
  std::vector<int64_t> samples;
  int64_t sum = 0;
  for (const auto& lw : live) {
    samples.push_back(std::max<int64_t>(lw.view->local_batch, 0));
    sum += samples.back();
  }
  const int64_t B = view.job.global_batch;
  if ((sum != B || sum == 0) && !live.empty()) {  // unknown: assume an even split
    const int64_t n = static_cast<int64_t>(live.size());
    for (int64_t i = 0; i < n; ++i) samples[i] = B / n + (i < B % n ? 1 : 0);
  }
  BatchPlan plan = BuildPlan(live, samples, B);
  plan.basis_share.clear();
  for (const auto& wb : plan.workers)  // in id order, as BuildPlan
    plan.basis_share.insert_or_assign(
        plan.basis_share.end(), wb.worker_id,
        B > 0 ? static_cast<double>(wb.samples) / static_cast<double>(B) : 0);
  return plan;
}

absl::StatusOr<std::optional<BatchProposal>> BatchPlanner::Propose(const ClusterView& view,
                                                                   const BatchPlan* current,
                                                                   const AdjustBatchConfig& cfg) {
  // A plan balances workers against each other: with one live worker there is nothing to
  // balance, and a "plan" for it would only hand it the whole global batch while the others
  // (quiet, finishing, or restarting) may still be in the collective.
  if (view.LiveWorkers() < 2) {
    return absl::FailedPreconditionError(
        absl::StrCat("a batch plan needs 2 live workers, ", view.LiveWorkers(), " live"));
  }
  // The live workers once, for the target and the prediction of the plan in force.
  const std::vector<LiveWorker> live = LiveWorkers(view, cfg.use_last_window);
  absl::StatusOr<BatchPlan> target = TargetOn(live, view, cfg);
  if (!target.ok()) return target.status();
  BatchProposal p;
  p.plan = std::move(*target);

  // The plan in force now: the current one, or what the workers report running (read where it
  // is, copied only into a proposal).
  std::optional<BatchPlan> reported;
  if (!current) reported = InForce(view, cfg);
  const BatchPlan& baseline = current ? *current : *reported;

  // The two plans' sets of worker ids (sorted, repeats dropped; views into the plans). A
  // plan's workers are sorted by id already (batch_plan.h), checked rather than sorted again.
  auto ids_of = [](const BatchPlan& plan) {
    std::vector<std::string_view> ids;
    ids.reserve(plan.workers.size());
    for (const auto& wb : plan.workers) ids.push_back(wb.worker_id);
    if (!std::is_sorted(ids.begin(), ids.end())) std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    return ids;
  };
  const std::vector<std::string_view> now_ids = ids_of(p.plan), plan_ids = ids_of(baseline);
  p.membership_changed =
      current && (now_ids != plan_ids || current->global_batch != view.job.global_batch);

  // Step 5a, the gain in the quantity the rollback measures. Speeds and the step-time models
  // are in compute seconds (wall minus the time blocked in the collective); the job's
  // throughput, which the gain is measured by, is in wall seconds. A step's wall time is the
  // slowest compute plus the collective's own cost, which no batch plan changes: it is what
  // the measured step time (job.step_time_s, under the plan in force) has beyond the predicted
  // slowest compute. Left out, a plan for a job whose step is half communication would predict
  // twice the gain it can measure.
  const double before = PredictOnLive(live, baseline);
  const double after = p.plan.predicted_step_s;
  const double collective_s = CollectiveSeconds(view, before);
  p.predicted_gain =
      (after > 0 && before > 0) ? (before + collective_s) / (after + collective_s) - 1 : 0;

  if (!p.membership_changed) {
    double drift = 0;
    std::string who;
    // Both maps are in id order: one walk along the baseline's, not a search per worker.
    auto it = baseline.basis_share.begin();
    for (const auto& [id, share] : p.plan.basis_share) {
      while (it != baseline.basis_share.end() && it->first < id) ++it;
      if (it == baseline.basis_share.end() || it->first != id || it->second <= 0) continue;
      const double d = std::fabs(share / it->second - 1);
      if (d > drift) {
        drift = d;
        who = absl::StrFormat("%s share %.3f→%.3f", id, it->second, share);
      }
    }
    if (drift <= cfg.hysteresis) return std::optional<BatchProposal>();
    // Step 5b: with a plan in force, a new one must also pay for the switch — shares that
    // drifted on noise, or a slightly different optimum, are not worth another plan.
    if (current && p.predicted_gain < cfg.min_replan_gain) return std::optional<BatchProposal>();
    p.reason = absl::StrFormat("speed shares moved %.0f%% (%s); predicted step %.3fs → %.3fs",
                               100 * drift, who, before + collective_s, after + collective_s);
  } else {
    p.reason = absl::StrFormat("workers or global batch changed (%zu → %zu workers)",
                               plan_ids.size(), now_ids.size());
  }
  p.baseline = current ? *current : std::move(*reported);
  p.plan.version = std::max<uint64_t>(current ? current->version : 0, view.job.last_plan_version) + 1;
  p.plan.effective_step = EffectiveStep(view, cfg, p.plan.predicted_step_s);
  return std::optional<BatchProposal>(std::move(p));
}

}  // namespace pacer
