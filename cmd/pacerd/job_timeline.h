// JobTimeline: what pacerd remembers of the job over time for `pacerctl report` — one sample
// per closed monitor window (records done, the balanced bound Σ v_i, the batch plan in force,
// every worker's speed and class) and the monitor's classification changes (detections).
//
// Bounded memory whatever the job's length and size: at most kMaxWorkerPoints worker entries
// in all (a reply of about 4 MB) and at most kMaxSamples samples. When full, every other sample is
// dropped and from then on only every 2nd (4th, ...) window is sampled, so a long job keeps
// its whole span at a coarser resolution; with 4 096 workers, 32 samples are kept. Detections
// keep the newest kMaxDetections.
//
// In memory only: a restarted pacerd begins a new timeline (the actions are durable in the
// controller store). Thread-safe (one mutex); time comes from the caller.
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "proto/pacer/operator.pb.h"

namespace pacer {

class JobTimeline {
 public:
  static constexpr size_t kMaxWorkerPoints = 131'072;
  static constexpr size_t kMaxSamples = 4'096;
  static constexpr size_t kMinSamples = 32;
  static constexpr size_t kMaxDetections = 4'096;

  explicit JobTimeline(int64_t started_ms) : started_ms_(started_ms) {}

  // Adds the sample of monitor window `sample.window()` unless that window is already
  // sampled or falls between the sampled ones (after thinning).
  void Add(TimelineSample sample);
  void AddDetection(DetectionEvent event);
  // The newest window sampled (-1: none yet), to skip building a sample for nothing.
  int64_t last_window() const;
  void Fill(const GetTimelineRequest& req, GetTimelineResponse* resp) const;

 private:
  size_t Capacity(size_t workers) const;

  const int64_t started_ms_;
  mutable absl::Mutex mu_;
  std::deque<TimelineSample> samples_ ABSL_GUARDED_BY(mu_);
  std::deque<DetectionEvent> detections_ ABSL_GUARDED_BY(mu_);
  int64_t every_ ABSL_GUARDED_BY(mu_) = 1;  // sample windows that are multiples of this
  int64_t last_window_ ABSL_GUARDED_BY(mu_) = -1;
};

}  // namespace pacer
