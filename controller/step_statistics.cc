#include "controller/step_statistics.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace pacer {

void StepStatistics::Observe(const StepTiming& t) {
  if (t.worker_id.empty() || t.probe || t.in_progress || t.samples <= 0 ||
      !(t.compute_s > 0) || !std::isfinite(t.compute_s))
    return;
  Worker& w = w_.At(t.worker_id, t.worker_index);
  if (t.step == w.step) return;  // counted already
  if (t.step < w.step) w = Worker();  // a new run
  const double x = t.compute_s / static_cast<double>(t.samples);
  // Weighted Welford with every older weight decayed by kForgetting: after the decay the sums
  // and m2 shrink by f (f² for Σw²), the mean stays; the new step comes in with weight 1.
  w.w = kForgetting * w.w + 1;
  w.w2 = kForgetting * kForgetting * w.w2 + 1;
  const double delta = x - w.mean;
  w.mean += delta / w.w;
  w.m2 = kForgetting * w.m2 + delta * (x - w.mean);
  w.step = t.step;
  w.samples = t.samples;
  w.time_ms = std::max(w.time_ms, t.time_ms);
  if (w.count < 1000) ++w.count;
}

StepStatistics::SummaryMap StepStatistics::Summaries(int64_t now_ms, int64_t stale_ms) const {
  struct Row {
    const std::string* id;
    double rel_var;  // unbiased weighted variance / mean²; < 0: one step, none known
    double n;        // effective steps
    double mean;
  };
  std::vector<Row> rows;
  rows.reserve(w_.size());
  std::vector<double> known;
  known.reserve(w_.size());
  w_.ForEach([&](const std::string& id, const Worker& w) {
    const double step_ms = 1000 * w.mean * static_cast<double>(w.samples);
    if (w.count < 1 || !(w.mean > 0) ||
        static_cast<double>(now_ms - w.time_ms) > std::max(static_cast<double>(stale_ms), 3 * step_ms))
      return;
    const double n = w.w * w.w / w.w2;
    // Reliability weights: the unbiased variance is m2 / (Σw − Σw²/Σw).
    const double denom = w.w - w.w2 / w.w;
    double rel_var = -1;
    if (w.count >= 2 && n > 1 && denom > 0) {
      rel_var = std::max(0.0, w.m2 / denom) / (w.mean * w.mean);
      known.push_back(rel_var);
    }
    rows.push_back({&id, rel_var, n, w.mean});
  });
  SummaryMap out;
  out.reserve(rows.size());
  double job_rel_var = -1;
  if (!known.empty()) {
    std::nth_element(known.begin(), known.begin() + static_cast<long>(known.size() / 2), known.end());
    job_rel_var = known[known.size() / 2];
  }
  for (const Row& r : rows) {
    Summary s;
    s.speed = 1 / r.mean;
    // No spread known anywhere yet (every worker has one step): nothing is shown.
    s.rel_se = job_rel_var < 0 ? 1.0 : std::sqrt(std::max(r.rel_var, job_rel_var) / r.n);
    s.steps = r.n;
    out.emplace(*r.id, s);
  }
  return out;
}

}  // namespace pacer
