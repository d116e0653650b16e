#include "monitor/speed_estimator.h"

#include <algorithm>

#include "absl/container/inlined_vector.h"

#include "monitor/robust_stats.h"

namespace pacer {

namespace {

uint32_t RecentWindows(const MonitorOptions& o) {
  const uint32_t h = o.HistoryWindows();
  const uint32_t need = std::max({o.persistent_w, o.smoothed_windows, o.stable_smoothed_windows, 1u});
  return std::min(h, need);
}

uint32_t CoarseSpan(const MonitorOptions& o) {
  const uint32_t rest = o.HistoryWindows() - RecentWindows(o);
  return rest == 0 ? 1 : (rest + SpeedEstimator::kCoarseEntries - 1) / SpeedEstimator::kCoarseEntries;
}

uint32_t CoarseEntries(const MonitorOptions& o) {
  const uint32_t rest = o.HistoryWindows() - RecentWindows(o);
  const uint32_t c = CoarseSpan(o);
  return (rest + c - 1) / c;  // <= kCoarseEntries
}

}  // namespace

SpeedEstimator::SpeedEstimator(const MonitorOptions& options)
    : options_(options),
      history_windows_(options.HistoryWindows()),
      recent_windows_(RecentWindows(options)),
      coarse_entries_(CoarseEntries(options)),
      coarse_span_(CoarseSpan(options)),
      kept_per_window_(std::max<uint32_t>(1, options.samples_kept_per_window)) {}

uint32_t SpeedEstimator::AddWorker() {
  open_.emplace_back();
  recent_.emplace_back();
  coarse_.emplace_back();
  speeds_.resize(speeds_.size() + kept_per_window_);
  recent_entries_.resize(recent_entries_.size() + recent_windows_);
  if (coarse_entries_ > 0) {
    coarse_entries_v_.resize(coarse_entries_v_.size() + coarse_entries_);
    merging_.emplace_back();
  }
  return static_cast<uint32_t>(open_.size() - 1);
}

void SpeedEstimator::Forget(uint32_t worker) {
  open_[worker] = Open();
  recent_[worker] = Tier();
  coarse_[worker] = Tier();
  if (!merging_.empty()) merging_[worker] = Merge();
}

bool SpeedEstimator::Add(uint32_t worker, uint64_t samples, double compute_s, double comm_s,
                         double data_wait_s, double wall_s) {
  Open& o = open_[worker];
  if (o.reports >= options_.max_reports_per_worker_per_window) return false;
  const float speed = static_cast<float>(static_cast<double>(samples) / compute_s);
  float* slots = &speeds_[static_cast<size_t>(worker) * kept_per_window_];
  if (o.kept < kept_per_window_) {
    slots[o.kept++] = speed;
  } else {
    slots[o.next_slot] = speed;  // keep the most recent steps
  }
  o.next_slot = o.next_slot + 1 == kept_per_window_ ? 0 : o.next_slot + 1;
  ++o.reports;
  o.samples += static_cast<double>(samples);
  o.compute += compute_s;
  o.comm += comm_s;
  o.data_wait += data_wait_s;
  o.wall += wall_s;
  return true;
}

WindowSummary* SpeedEstimator::RecentAt(uint32_t worker, uint32_t age) {
  const Tier& t = recent_[worker];
  if (age >= t.size) return nullptr;
  uint32_t i = t.head + recent_windows_ - 1 - age;
  if (i >= recent_windows_) i -= recent_windows_;
  return &recent_entries_[static_cast<size_t>(worker) * recent_windows_ + i];
}

WindowSummary SpeedEstimator::Merged(const Merge& m) {
  WindowSummary s = m.first;
  const double n = m.windows;
  s.speed = static_cast<float>(m.speed / n);
  s.relative = static_cast<float>(m.relative / n);
  s.compute_s = static_cast<float>(m.compute / n);
  s.comm_s = static_cast<float>(m.comm / n);
  s.data_wait_s = static_cast<float>(m.data_wait / n);
  s.wall_s = static_cast<float>(m.wall / n);
  s.reports = static_cast<uint16_t>(std::min<uint32_t>(m.reports, 65535));
  s.windows = static_cast<uint16_t>(m.windows);
  return s;
}

void SpeedEstimator::Demote(uint32_t worker, const WindowSummary& s) {
  if (coarse_entries_ == 0) return;  // the recent tier is the whole history
  Merge& m = merging_[worker];
  if (m.windows == 0) m.first = s;
  m.speed += s.speed;
  m.relative += s.relative;
  m.compute += s.compute_s;
  m.comm += s.comm_s;
  m.data_wait += s.data_wait_s;
  m.wall += s.wall_s;
  m.reports += s.reports;
  ++m.windows;
  m.first.worker_class = s.worker_class;  // the class of the last window merged
  m.first.persistence = s.persistence;
  if (m.windows < coarse_span_) return;
  Tier& t = coarse_[worker];
  coarse_entries_v_[static_cast<size_t>(worker) * coarse_entries_ + t.head] = Merged(m);
  t.head = t.head + 1 == coarse_entries_ ? 0 : t.head + 1;
  t.size = std::min(t.size + 1, coarse_entries_);
  m = Merge();
}

SpeedEstimator::Closed SpeedEstimator::CloseWindow(int64_t window, bool bound_running,
                                                   double last_reference, double straggler_line) {
  Closed closed;
  closed.window = window;
  medians_scratch_.clear();
  auto keep = [&](uint32_t w, const WindowSummary& s) {
    Tier& t = recent_[w];
    WindowSummary& slot = recent_entries_[static_cast<size_t>(w) * recent_windows_ + t.head];
    if (t.size == recent_windows_) Demote(w, slot);  // the oldest full window moves down
    slot = s;
    t.head = t.head + 1 == recent_windows_ ? 0 : t.head + 1;
    t.size = std::min(t.size + 1, recent_windows_);
    closed.estimated.push_back(w);
    medians_scratch_.push_back(s.speed);
  };
  size_t bounds = 0;  // estimates that are running steps' bounds
  for (uint32_t w = 0; w < open_.size(); ++w) {
    Open& o = open_[w];
    if (bound_running && o.reports == 0 && o.running_compute > 0 && o.running_speed > 0) {
      const WindowSummary* last = Last(w);
      const double bound = o.running_speed;
      if (last != nullptr && last->window >= 0 && last->speed > 0 &&
          bound < std::max<double>(last->speed, straggler_line)) {
        WindowSummary s;
        s.window = window;
        s.speed = static_cast<float>(bound);
        s.compute_s = static_cast<float>(o.running_compute);
        s.reports = 0;
        keep(w, s);
        ++bounds;
      }
    }
    o.running_speed = o.running_compute = 0;
    if (o.reports >= options_.min_reports_per_window && o.reports > 0) {
      WindowSummary s;
      s.window = window;
      if (o.kept >= 3) {
        const float* slots = &speeds_[static_cast<size_t>(w) * kept_per_window_];
        scratch_.assign(slots, slots + o.kept);
        s.speed = MedianInPlace(scratch_);
      } else {
        s.speed = static_cast<float>(o.samples / o.compute);
      }
      const double n = o.reports;
      s.compute_s = static_cast<float>(o.compute / n);
      s.comm_s = static_cast<float>(o.comm / n);
      s.data_wait_s = static_cast<float>(o.data_wait / n);
      s.wall_s = static_cast<float>(o.wall / n);
      s.reports = static_cast<uint16_t>(std::min<uint32_t>(o.reports, 65535));
      keep(w, s);
    }
    o.reports = 0;
    o.next_slot = 0;
    o.kept = 0;
    o.samples = o.compute = o.comm = o.data_wait = o.wall = 0;
  }
  const size_t n = closed.estimated.size();
  if (n == 2 && options_.pair_detection) {
    closed.reference_speed = std::max(medians_scratch_[0], medians_scratch_[1]);
    closed.rule = Closed::Rule::kPair;
  }
  if (n >= options_.min_workers) {
    closed.median_speed = MedianInPlace(medians_scratch_);
    if (closed.rule == Closed::Rule::kNone) {
      closed.reference_speed = closed.median_speed;
      closed.rule = Closed::Rule::kMedian;
    }
  }
  if (!(closed.reference_speed > 0) && bounds > 0 && bounds == n && last_reference > 0) {
    closed.reference_speed = last_reference;
    closed.rule = Closed::Rule::kLast;
  }
  if (!(closed.reference_speed > 0)) {
    closed.reference_speed = 0;
    closed.rule = Closed::Rule::kNone;
  }
  for (uint32_t w : closed.estimated) {
    WindowSummary* s = Last(w);
    s->relative =
        closed.reference_speed > 0 ? static_cast<float>(s->speed / closed.reference_speed) : 0;
  }
  return closed;
}

WindowSummary* SpeedEstimator::Last(uint32_t worker) { return RecentAt(worker, 0); }

const WindowSummary* SpeedEstimator::Last(uint32_t worker) const { return RecentAt(worker, 0); }

std::vector<WindowSummary> SpeedEstimator::History(uint32_t worker) const {
  std::vector<WindowSummary> out;
  const Tier& r = recent_[worker];
  if (coarse_entries_ > 0) {
    const Tier& c = coarse_[worker];
    out.reserve(c.size + 1 + r.size);
    const size_t base = static_cast<size_t>(worker) * coarse_entries_;
    for (uint32_t i = 0; i < c.size; ++i) {
      out.push_back(coarse_entries_v_[base + (c.head + coarse_entries_ - c.size + i) % coarse_entries_]);
    }
    if (merging_[worker].windows > 0) out.push_back(Merged(merging_[worker]));
  }
  for (uint32_t age = r.size; age-- > 0;) out.push_back(*RecentAt(worker, age));
  return out;
}

double SpeedEstimator::SmoothedSpeed(uint32_t worker, uint32_t n) const {
  n = std::min(n, recent_[worker].size);
  if (n == 0) return 0;
  // Called for every worker at every view: a small median, no allocation for typical n.
  absl::InlinedVector<double, 16> v;
  for (uint32_t i = 0; i < n; ++i) v.push_back(RecentAt(worker, i)->speed);
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<long>(mid), v.end());
  if (v.size() % 2 == 1) return v[mid];
  return 0.5 * (*std::max_element(v.begin(), v.begin() + static_cast<long>(mid)) + v[mid]);
}

double SpeedEstimator::StragglerSpeed(uint32_t worker, uint32_t n) const {
  const double smoothed = SmoothedSpeed(worker, n);
  const WindowSummary* last = Last(worker);
  if (last == nullptr || last->window < 0 || last->reports != 0 || !(last->speed > 0))
    return smoothed;
  return std::min(smoothed, static_cast<double>(last->speed));
}

size_t SpeedEstimator::MemoryBytes() const {
  return open_.capacity() * sizeof(Open) + (recent_.capacity() + coarse_.capacity()) * sizeof(Tier) +
         speeds_.capacity() * sizeof(float) +
         (recent_entries_.capacity() + coarse_entries_v_.capacity()) * sizeof(WindowSummary) +
         merging_.capacity() * sizeof(Merge) +
         (scratch_.capacity() * sizeof(float) + medians_scratch_.capacity() * sizeof(double));
}

}  // namespace pacer
