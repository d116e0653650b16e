#include "cmd/pacerd/job_timeline.h"

#include <algorithm>

namespace pacer {

size_t JobTimeline::Capacity(size_t workers) const {
  return std::clamp(kMaxWorkerPoints / std::max<size_t>(workers, 1), kMinSamples, kMaxSamples);
}

void JobTimeline::Add(TimelineSample sample) {
  absl::MutexLock l(&mu_);
  if (sample.window() <= last_window_ || sample.window() % every_ != 0) return;
  last_window_ = sample.window();
  const size_t capacity = Capacity(sample.workers_size());
  samples_.push_back(std::move(sample));
  while (samples_.size() > capacity) {
    // Thin: keep the samples on multiples of the doubled period (and always the newest).
    every_ *= 2;
    std::deque<TimelineSample> kept;
    for (size_t i = 0; i < samples_.size(); ++i) {
      if (samples_[i].window() % every_ == 0 || i + 1 == samples_.size()) {
        kept.push_back(std::move(samples_[i]));
      }
    }
    if (kept.size() == samples_.size()) kept.pop_front();  // cannot thin (sparse windows)
    samples_ = std::move(kept);
  }
}

void JobTimeline::AddDetection(DetectionEvent event) {
  absl::MutexLock l(&mu_);
  detections_.push_back(std::move(event));
  while (detections_.size() > kMaxDetections) detections_.pop_front();
}

int64_t JobTimeline::last_window() const {
  absl::MutexLock l(&mu_);
  return last_window_;
}

void JobTimeline::Fill(const GetTimelineRequest& req, GetTimelineResponse* resp) const {
  absl::MutexLock l(&mu_);
  const bool all = req.since_ms() == 0;
  for (const auto& s : samples_) {
    if (all || s.time_ms() > req.since_ms()) *resp->add_samples() = s;
  }
  for (const auto& d : detections_) {
    if (all || d.time_ms() > req.since_ms()) *resp->add_detections() = d;
  }
  resp->set_started_ms(started_ms_);
  resp->set_sample_every_windows(every_);
}

}  // namespace pacer
