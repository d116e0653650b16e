#include "controller/burst_detector.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace pacer {

void BurstDetector::Observe(const StepTiming& t) {
  if (t.worker_id.empty() || t.samples <= 0 || !(t.compute_s > 0) || !std::isfinite(t.compute_s))
    return;
  Worker& w = w_[t.worker_id];
  if (t.step < w.step || (t.step == w.step && t.time_ms < w.time_ms)) return;  // older
  w.step = t.step;
  w.time_ms = t.time_ms;
  w.per_sample_s = t.compute_s / static_cast<double>(t.samples);
  w.probe = t.probe;
  if (!t.probe) w.batch = t.samples;
  else if (w.batch <= 0) w.batch = 2 * t.samples;  // a probe is half the training batch
}

bool BurstDetector::Fresh(const Worker& w, int64_t now_ms) const {
  const double step_s = w.per_sample_s * static_cast<double>(w.batch);
  const double fresh_s = std::max(kMinFreshS, kFreshSteps * step_s);
  return static_cast<double>(now_ms - w.time_ms) <= fresh_s * 1000;
}

bool BurstDetector::HasFreshTimings(int64_t now_ms) const {
  for (const auto& [id, w] : w_)
    if (Fresh(w, now_ms)) return true;
  return false;
}

BurstDecision BurstDetector::Decide(const std::vector<std::string>& excluded_now,
                                    const BurstExclusionConfig& cfg, int64_t now_ms) const {
  BurstDecision d;
  auto was_excluded = [&](const std::string& id) {
    return std::find(excluded_now.begin(), excluded_now.end(), id) != excluded_now.end();
  };
  struct Step {
    const std::string* id;
    double s;      // seconds for a step at its training batch, at its newest timing's pace
    double batch;  // its training batch
    bool was;      // excluded now
  };
  std::vector<Step> steps;
  double batch_sum = 0;
  for (const auto& [id, w] : w_) {
    if (!Fresh(w, now_ms) || w.batch <= 0) continue;
    const double b = static_cast<double>(w.batch);
    steps.push_back({&id, w.per_sample_s * b, b, was_excluded(id)});
    batch_sum += b;
  }
  std::vector<std::string> chosen;
  double best = 1;
  if (steps.size() >= 3 && batch_sum > 0 && cfg.max_workers > 0 && cfg.step_factor > 0) {
    std::vector<double> s;
    s.reserve(steps.size());
    for (const Step& st : steps) s.push_back(st.s);
    std::nth_element(s.begin(), s.begin() + static_cast<long>(s.size() / 2), s.end());
    d.median_step_s = s[s.size() / 2];
    const double enter = cfg.step_factor * d.median_step_s;
    const double stay = std::min(cfg.rejoin_factor, cfg.step_factor) * d.median_step_s;
    std::sort(steps.begin(), steps.end(), [](const Step& a, const Step& b) {
      return a.s != b.s ? a.s > b.s : *a.id < *b.id;
    });
    // Slowest first; the set is the prefix with the best predicted throughput
    // (1 − dropped share) × (step waiting for all) / (slowest counted step). Several workers
    // in a burst at once are dropped together (dropping one of two equally slow ones gains
    // nothing, both together do).
    const double all = steps.front().s;
    double share = 0;
    size_t best_k = 0;
    for (size_t k = 0; k + 1 < steps.size() && static_cast<int64_t>(k) < cfg.max_workers; ++k) {
      const Step& st = steps[k];
      const bool slow = st.s > enter || (st.was && st.s > stay);
      if (!slow) break;
      share += st.batch / batch_sum;
      const double rel = (1 - share) * all / steps[k + 1].s;
      if (rel > best) {
        best = rel;
        best_k = k + 1;
      }
    }
    for (size_t k = 0; k < best_k; ++k) chosen.push_back(*steps[k].id);
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
        "gradients pays %.2fx)",
        absl::StrJoin(d.added, ","), cfg.step_factor, d.median_step_s, chosen.size(),
        steps.size(), best);
  return d;
}

}  // namespace pacer
