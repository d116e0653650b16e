// JobTimeline (cmd/pacerd/job_timeline.h): the history `pacerctl report` draws stays within
// its bound however long the job runs and however many workers it has, keeps the whole span
// (first and newest windows), and only ever moves forward.
#include "cmd/pacerd/job_timeline.h"

#include <gtest/gtest.h>

namespace pacer {
namespace {

TimelineSample Sample(int64_t window, int workers) {
  TimelineSample s;
  s.set_window(window);
  s.set_time_ms(window * 1000);
  s.set_records_done(window * 100);
  for (int w = 0; w < workers; ++w) {
    TimelineWorker* t = s.add_workers();
    t->set_id("w" + std::to_string(w));
    t->set_speed(100);
  }
  return s;
}

GetTimelineResponse All(const JobTimeline& t) {
  GetTimelineResponse r;
  t.Fill(GetTimelineRequest(), &r);
  return r;
}

TEST(JobTimelineTest, AWeekOfWindowsStaysWithinTheBoundAndKeepsTheWholeSpan) {
  JobTimeline t(0);
  const int64_t windows = 7 * 24 * 3600;  // a week of 1 s windows
  for (int64_t w = 0; w < windows; ++w) t.Add(Sample(w, 4));
  GetTimelineResponse r = All(t);
  EXPECT_LE(r.samples_size(), static_cast<int>(JobTimeline::kMaxSamples));
  EXPECT_GE(r.samples_size(), static_cast<int>(JobTimeline::kMaxSamples / 2));
  EXPECT_EQ(r.samples(0).window(), 0);  // the start is kept
  EXPECT_GE(r.samples(r.samples_size() - 1).window(), windows - r.sample_every_windows());
  for (int i = 1; i < r.samples_size(); ++i) {
    EXPECT_LT(r.samples(i - 1).window(), r.samples(i).window());
  }
  EXPECT_GT(r.sample_every_windows(), 1);
}

TEST(JobTimelineTest, WorkerEntriesAreBoundedAt4096Workers) {
  JobTimeline t(0);
  for (int64_t w = 0; w < 100; ++w) t.Add(Sample(w, 4096));
  GetTimelineResponse r = All(t);
  size_t entries = 0;
  for (const auto& s : r.samples()) entries += s.workers_size();
  EXPECT_LE(entries, JobTimeline::kMaxWorkerPoints);
  EXPECT_GE(r.samples_size(), static_cast<int>(JobTimeline::kMinSamples / 2));
}

TEST(JobTimelineTest, AWindowIsSampledOnceAndAnOlderOneIsIgnored) {
  JobTimeline t(0);
  t.Add(Sample(5, 2));
  t.Add(Sample(5, 2));
  t.Add(Sample(3, 2));
  EXPECT_EQ(All(t).samples_size(), 1);
  EXPECT_EQ(t.last_window(), 5);
}

TEST(JobTimelineTest, SinceReturnsOnlyNewerSamplesAndDetections) {
  JobTimeline t(0);
  for (int64_t w = 1; w <= 10; ++w) t.Add(Sample(w, 1));
  DetectionEvent d;
  d.set_time_ms(2000);
  d.set_id("w0");
  t.AddDetection(d);
  d.set_time_ms(9000);
  t.AddDetection(d);
  GetTimelineRequest req;
  req.set_since_ms(8000);
  GetTimelineResponse r;
  t.Fill(req, &r);
  EXPECT_EQ(r.samples_size(), 2);  // windows 9 and 10
  EXPECT_EQ(r.detections_size(), 1);
}

TEST(JobTimelineTest, DetectionsKeepTheNewest) {
  JobTimeline t(0);
  for (size_t i = 0; i < JobTimeline::kMaxDetections + 10; ++i) {
    DetectionEvent d;
    d.set_time_ms(static_cast<int64_t>(i));
    t.AddDetection(d);
  }
  GetTimelineResponse r = All(t);
  EXPECT_EQ(r.detections_size(), static_cast<int>(JobTimeline::kMaxDetections));
  EXPECT_EQ(r.detections(r.detections_size() - 1).time_ms(),
            static_cast<int64_t>(JobTimeline::kMaxDetections + 9));
}

}  // namespace
}  // namespace pacer
