#include "controller/burst_detector.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace pacer {

void BurstDetector::Observe(const StepTiming& t) {
  if (t.worker_id.empty() || t.samples <= 0 || !(t.compute_s > 0) || !std::isfinite(t.compute_s))
    return;
  Worker& w = w_.At(t.worker_id, t.worker_index);
  if (t.in_progress) {
    // A lower bound on a step that has not ended: kept apart, and only for a later step than
    // the newest finished one (the worker's batch is that step's).
    if (t.step <= w.step || t.probe) return;
    if (t.step > w.running_step ||
        t.compute_s / static_cast<double>(t.samples) > w.running_per_sample_s) {
      w.running_step = t.step;
      w.running_per_sample_s = t.compute_s / static_cast<double>(t.samples);
    }
    if (w.step < 0) w.batch = t.samples;  // nothing finished yet: the running step's batch
    w.time_ms = std::max(w.time_ms, t.time_ms);
    return;
  }
  if (t.step < w.step || (t.step == w.step && t.time_ms < w.time_ms)) return;  // older
  if (t.step >= w.running_step) w.running_step = -1, w.running_per_sample_s = 0;
  w.step = t.step;
  w.time_ms = t.time_ms;
  w.per_sample_s = t.compute_s / static_cast<double>(t.samples);
  w.probe = t.probe;
  // A probe is half the batch the worker would train on (a plan made while it is excluded
  // changes it).
  w.batch = t.probe ? 2 * t.samples : t.samples;
}

std::optional<double> BurstDetector::NewestSpeed(const std::string& worker_id,
                                                 int64_t now_ms) const {
  const Worker* w = w_.Find(worker_id);
  if (w == nullptr || w->step < 0 || !Fresh(*w, now_ms) || !(w->per_sample_s > 0))
    return std::nullopt;
  return 1 / w->per_sample_s;
}

std::optional<double> BurstDetector::StepSeconds(const std::string& worker_id,
                                                 int64_t now_ms) const {
  const Worker* found = w_.Find(worker_id);
  if (found == nullptr) return std::nullopt;
  const Worker& w = *found;
  if (!Fresh(w, now_ms) || w.batch <= 0) return std::nullopt;
  const double per_sample =
      w.running_step > w.step ? std::max(w.per_sample_s, w.running_per_sample_s) : w.per_sample_s;
  return per_sample * static_cast<double>(w.batch);
}

bool BurstDetector::HasFreshTimings(int64_t now_ms) const {
  return w_.Any([&](const std::string&, const Worker& w) { return Fresh(w, now_ms); });
}

BurstDetector::Gathered BurstDetector::Gather(int64_t now_ms, double lo, double hi,
                                              double line) const {
  // Sums in locals (kept in registers: a loop over every worker at every decision), written
  // out at the end.
  size_t n = 0, below = 0, in = 0;
  double batch_sum = 0, rest_slowest = 0;
  steps_.clear();
  select_.resize(w_.size());
  double* const band = select_.data();
  w_.ForEach([&](const std::string& id, const Worker& w) {
    if (!Fresh(w, now_ms) || w.batch <= 0) return;
    const double b = static_cast<double>(w.batch);
    const double per_sample = w.running_step > w.step
                                  ? std::max(w.per_sample_s, w.running_per_sample_s)
                                  : w.per_sample_s;
    const double step_s = per_sample * b;
    ++n;
    batch_sum += b;
    below += step_s < lo ? 1 : 0;  // branch-free: which side of the median a step is is noise
    band[in] = step_s;
    in += step_s >= lo && step_s <= hi ? 1 : 0;
    if (step_s > line) steps_.push_back({&id, &w, step_s, b, false});
    else rest_slowest = std::max(rest_slowest, step_s);
  });
  return {n, below, in, batch_sum, rest_slowest};
}

BurstDecision BurstDetector::Decide(const std::vector<std::string>& excluded_now,
                                    const BurstExclusionConfig& cfg, int64_t now_ms) const {
  BurstDecision d;
  auto was_excluded = [&](const std::string& id) {
    return std::find(excluded_now.begin(), excluded_now.end(), id) != excluded_now.end();
  };
  // The excluded workers' records, found once (a hashed lookup each) and sorted by address: a
  // worker is told from them by a binary search on its record's address, not by comparing its
  // id with every excluded one.
  std::vector<const Worker*> out_now;
  out_now.reserve(excluded_now.size());
  for (const auto& id : excluded_now)
    if (const Worker* w = w_.Find(id)) out_now.push_back(w);
  std::sort(out_now.begin(), out_now.end());
  auto record_excluded = [&](const Worker* w) {
    return std::binary_search(out_now.begin(), out_now.end(), w);
  };
  // One pass over the fresh workers' steps (Gather) takes all the rule needs of them: their
  // number and batch, the steps in [lo, hi] (in `band`) and the number below it, for the
  // median; the steps above `line` (in `steps`) and the slowest of the others. A job's steps
  // crowd around their median, which moves little from one decision to the next: with the
  // band around the last decision's median (± kBand) and `line` the rejoin line that median's
  // low end would draw, the median is selected from a few hundred of 4 096 steps and only the
  // few above the line are kept -- every step above the rejoin line is among them (the rejoin
  // line of a median in the band is at or above `line`), and the others count only by their
  // slowest. When the median is not in the band (the first decision; a batch plan moved every
  // step), the pass is made again with every step in the band and above the line. The same
  // median, the same steps out and the same sums either way. (Buffers kept for their
  // capacity.)
  constexpr double kBand = 0.01;
  const double rejoin = std::min(cfg.rejoin_factor, cfg.step_factor);
  constexpr double kInf = std::numeric_limits<double>::infinity();
  std::vector<Step>& steps = steps_;
  std::vector<double>& band = select_;
  Gathered g;
  auto decides = [&] {
    return g.n >= 3 && g.batch_sum > 0 && BurstExclusionCap(cfg, g.n) > 0 && cfg.step_factor > 0;
  };
  bool median_in_band = false;
  if (median_guess_ > 0 && rejoin > 0) {
    const double lo = median_guess_ * (1 - kBand), hi = median_guess_ * (1 + kBand);
    g = Gather(now_ms, lo, hi, rejoin * lo);
    median_in_band = g.below <= g.n / 2 && g.n / 2 < g.below + g.in;
  }
  if (!median_in_band && (median_guess_ <= 0 || rejoin <= 0 || decides()))
    g = Gather(now_ms, -kInf, kInf, -kInf);  // every step in the band and above the line
  const size_t n = g.n;
  const double batch_sum = g.batch_sum;
  double rest_slowest = g.rest_slowest;
  std::vector<std::string> chosen;
  double best = 1;
  const int64_t cap = BurstExclusionCap(cfg, n);
  if (decides()) {
    // The median: the (n/2)-th smallest step, the (n/2 − below)-th of the band.
    const auto mid = band.begin() + static_cast<long>(n / 2 - g.below);
    std::nth_element(band.begin(), mid, band.begin() + static_cast<long>(g.in));
    d.median_step_s = *mid;
    median_guess_ = d.median_step_s;
    const double enter = cfg.step_factor * d.median_step_s;
    const double stay = rejoin * d.median_step_s;
    // Only steps above the rejoin line (stay <= enter) can be out; they go first, slowest
    // first (ties by id), and the rest is only ever counted: its slowest step is all the
    // rates below need of it. The same order and the same sums as sorting every step. Whether
    // a worker is excluded now matters only up there.
    size_t head = 0;
    for (size_t i = 0; i < steps.size(); ++i) {
      if (steps[i].s > stay) std::swap(steps[head++], steps[i]);
      else rest_slowest = std::max(rest_slowest, steps[i].s);
    }
    std::sort(steps.begin(), steps.begin() + static_cast<long>(head),
              [](const Step& a, const Step& b) { return a.s != b.s ? a.s > b.s : *a.id < *b.id; });
    for (size_t i = 0; i < head; ++i)
      steps[i].was = !out_now.empty() && record_excluded(steps[i].record);
    // Predicted throughput (up to a constant) with `out` not waited for:
    // (1 − their share of the batch) / (slowest counted step).
    std::vector<bool> out(head, false);
    auto rate = [&](const std::vector<bool>& o) {
      double dropped = 0, slowest = 0;
      for (size_t i = 0; i < head; ++i) {
        if (o[i]) dropped += steps[i].batch;
        else slowest = std::max(slowest, steps[i].s);
      }
      slowest = std::max(slowest, rest_slowest);
      return slowest > 0 ? (1 - dropped / batch_sum) / slowest : 0;
    };
    // 1. Excluded workers still slow (above the rejoin line) stay out: an exclusion ends on
    //    the worker's own pace, not because another worker's noise changed the arithmetic.
    int64_t n_out = 0;
    for (size_t i = 0; i < head && i + 1 < n && n_out < cap; ++i) {
      if (steps[i].was && steps[i].s > stay) {
        out[i] = true;
        ++n_out;
      }
    }
    // 2. New workers above the entry line, slowest first; the additions are the prefix with
    //    the best predicted throughput over keeping only those in step 1 (several workers in
    //    a burst at once are dropped together: dropping one of two equally slow ones gains
    //    nothing, both together do).
    const double base = rate(out);
    std::vector<bool> trial = out, best_out = out;
    int64_t n_trial = n_out;
    for (size_t i = 0; i < head && i + 1 < n && n_trial < cap; ++i) {
      if (out[i]) continue;
      if (!(steps[i].s > enter)) break;
      trial[i] = true;
      ++n_trial;
      const double r = rate(trial);
      if (base > 0 && r / base > best) {
        best = r / base;
        best_out = trial;
      }
    }
    if (base > 0 && best <= 1) best = 1;
    for (size_t i = 0; i < head; ++i)
      if (best_out[i]) chosen.push_back(*steps[i].id);
  }
  std::sort(chosen.begin(), chosen.end());
  d.excluded = chosen;
  d.predicted_gain = best - 1;
  for (const auto& id : excluded_now)
    if (!std::binary_search(chosen.begin(), chosen.end(), id)) d.rejoined.push_back(id);
  std::sort(d.rejoined.begin(), d.rejoined.end());
  for (const auto& id : chosen)
    if (!was_excluded(id)) d.added.push_back(id);
  if (!d.rejoined.empty())
    d.rejoin_reason = absl::StrFormat(
        "burst over: wait for %s again (newest step within %.2fx the median %.3fs, or no "
        "recent step timing)",
        absl::StrJoin(d.rejoined, ","), std::min(cfg.rejoin_factor, cfg.step_factor),
        d.median_step_s);
  if (!d.added.empty())
    d.add_reason = absl::StrFormat(
        "burst: do not wait for %s (newest step > %.2fx the median %.3fs; dropping %zu of %zu "
        "gradients pays %.2fx over the exclusion in force)",
        absl::StrJoin(d.added, ","), cfg.step_factor, d.median_step_s, chosen.size(), n, best);
  return d;
}

}  // namespace pacer
