#include "monitor/speed_estimator.h"

#include <algorithm>

#include "absl/container/inlined_vector.h"

#include "monitor/robust_stats.h"

namespace pacer {

SpeedEstimator::SpeedEstimator(const MonitorOptions& options)
    : options_(options), history_windows_(options.HistoryWindows()) {}

uint32_t SpeedEstimator::AddWorker() {
  open_.emplace_back();
  history_.emplace_back();
  return static_cast<uint32_t>(open_.size() - 1);
}

bool SpeedEstimator::Add(uint32_t worker, uint64_t samples, double compute_s, double comm_s,
                         double data_wait_s, double wall_s) {
  Open& o = open_[worker];
  if (o.reports >= options_.max_reports_per_worker_per_window) return false;
  const float speed = static_cast<float>(static_cast<double>(samples) / compute_s);
  if (o.speeds.size() < options_.samples_kept_per_window) {
    if (o.speeds.capacity() == 0) o.speeds.reserve(options_.samples_kept_per_window);
    o.speeds.push_back(speed);
  } else {
    o.speeds[o.next_slot] = speed;  // keep the most recent steps
  }
  o.next_slot = (o.next_slot + 1) % options_.samples_kept_per_window;
  ++o.reports;
  o.samples += static_cast<double>(samples);
  o.compute += compute_s;
  o.comm += comm_s;
  o.data_wait += data_wait_s;
  o.wall += wall_s;
  return true;
}

SpeedEstimator::Closed SpeedEstimator::CloseWindow(int64_t window) {
  Closed closed;
  closed.window = window;
  medians_scratch_.clear();
  for (uint32_t w = 0; w < open_.size(); ++w) {
    Open& o = open_[w];
    if (o.reports >= options_.min_reports_per_window && o.reports > 0) {
      WindowSummary s;
      s.window = window;
      if (o.speeds.size() >= 3) {
        scratch_.assign(o.speeds.begin(), o.speeds.end());
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
      Ring& ring = history_[w];
      if (ring.entries.empty()) ring.entries.resize(history_windows_);
      ring.entries[ring.head] = s;
      ring.head = (ring.head + 1) % history_windows_;
      ring.size = std::min(ring.size + 1, history_windows_);
      closed.estimated.push_back(w);
      medians_scratch_.push_back(s.speed);
    }
    o.reports = 0;
    o.next_slot = 0;
    o.samples = o.compute = o.comm = o.data_wait = o.wall = 0;
    o.speeds.clear();
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

WindowSummary* SpeedEstimator::Last(uint32_t worker) {
  Ring& ring = history_[worker];
  if (ring.size == 0) return nullptr;
  return &ring.entries[(ring.head + history_windows_ - 1) % history_windows_];
}

const WindowSummary* SpeedEstimator::Last(uint32_t worker) const {
  return const_cast<SpeedEstimator*>(this)->Last(worker);
}

std::vector<WindowSummary> SpeedEstimator::History(uint32_t worker) const {
  const Ring& ring = history_[worker];
  std::vector<WindowSummary> out;
  out.reserve(ring.size);
  for (uint32_t i = 0; i < ring.size; ++i) {
    out.push_back(ring.entries[(ring.head + history_windows_ - ring.size + i) % history_windows_]);
  }
  return out;
}

double SpeedEstimator::SmoothedSpeed(uint32_t worker, uint32_t n) const {
  const Ring& ring = history_[worker];
  n = std::min(n, ring.size);
  if (n == 0) return 0;
  // Called for every worker at every view: a small median, no allocation for typical n.
  absl::InlinedVector<double, 16> v;
  for (uint32_t i = 0; i < n; ++i) {
    v.push_back(ring.entries[(ring.head + history_windows_ - 1 - i) % history_windows_].speed);
  }
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<long>(mid), v.end());
  if (v.size() % 2 == 1) return v[mid];
  return 0.5 * (*std::max_element(v.begin(), v.begin() + static_cast<long>(mid)) + v[mid]);
}

size_t SpeedEstimator::MemoryBytes() const {
  size_t bytes = open_.capacity() * sizeof(Open) + history_.capacity() * sizeof(Ring);
  for (const Open& o : open_) bytes += o.speeds.capacity() * sizeof(float);
  for (const Ring& r : history_) bytes += r.entries.capacity() * sizeof(WindowSummary);
  return bytes;
}

}  // namespace pacer
