// SpeedEstimator and robust statistics: window medians resist outlier steps, relative speeds
// are against the job median, history is a bounded ring (recent windows + coarse ones).
#include "monitor/speed_estimator.h"

#include <gtest/gtest.h>

#include "monitor/robust_stats.h"

namespace pacer {
namespace {

TEST(RobustStatsTest, MedianAndSpread) {
  std::vector<double> odd{5, 1, 3};
  EXPECT_EQ(MedianInPlace(odd), 3);
  std::vector<double> even{4, 1, 3, 2};
  EXPECT_EQ(MedianInPlace(even), 2.5);
  std::vector<double> empty;
  EXPECT_EQ(MedianInPlace(empty), 0);
  EXPECT_EQ(CoefficientOfVariation({2, 2, 2}), 0);
  EXPECT_NEAR(CoefficientOfVariation({1, 3}), std::sqrt(2.0) / 2, 1e-9);
}

TEST(SpeedEstimatorTest, WindowSpeedIsTheMedianOfStepsSoOutliersDoNotMoveIt) {
  MonitorOptions o;
  SpeedEstimator est(o);
  for (int i = 0; i < 3; ++i) est.AddWorker();
  for (int s = 0; s < 9; ++s) {
    est.Add(0, 32, 1.0, 0.1, 0, 1.1);
    est.Add(1, 32, 1.0, 0.1, 0, 1.1);
    est.Add(2, 32, 2.0, 0.1, 0, 2.1);
  }
  est.Add(0, 32, 0.001, 0, 0, 0.001);  // one absurdly fast step
  est.Add(0, 32, 0.001, 0, 0, 0.001);
  auto closed = est.CloseWindow(7);
  EXPECT_EQ(closed.window, 7);
  EXPECT_EQ(closed.estimated.size(), 3u);
  EXPECT_NEAR(closed.median_speed, 32, 1e-6);
  EXPECT_NEAR(est.Last(0)->speed, 32, 1e-6);
  EXPECT_NEAR(est.Last(2)->relative, 0.5, 1e-6);
  EXPECT_NEAR(est.Last(1)->compute_s, 1.0, 1e-6);
  EXPECT_EQ(est.Last(0)->reports, 11);
}

TEST(SpeedEstimatorTest, TooFewWorkersMeansNoMedianAndNoRelativeSpeed) {
  MonitorOptions o;
  o.pair_detection = false;
  SpeedEstimator est(o);
  est.AddWorker();
  est.AddWorker();
  est.Add(0, 10, 1, 0, 0, 1);
  est.Add(1, 10, 1, 0, 0, 1);
  auto closed = est.CloseWindow(0);
  EXPECT_EQ(closed.median_speed, 0);
  EXPECT_EQ(closed.reference_speed, 0);
  EXPECT_EQ(est.Last(0)->relative, 0);
  // One worker: nobody to compare with, whatever the options.
  SpeedEstimator one(MonitorOptions{});
  one.AddWorker();
  one.Add(0, 10, 1, 0, 0, 1);
  EXPECT_EQ(one.CloseWindow(0).reference_speed, 0);
  EXPECT_EQ(one.Last(0)->relative, 0);
}

TEST(SpeedEstimatorTest, PairIsComparedWithTheFasterWorker) {
  SpeedEstimator est(MonitorOptions{});  // min_workers 3, pair_detection on
  est.AddWorker();
  est.AddWorker();
  est.Add(0, 30, 1, 0, 0, 1);  // 30 samples/s
  est.Add(1, 10, 1, 0, 0, 1);  // 10 samples/s: 3x slower
  auto closed = est.CloseWindow(0);
  EXPECT_EQ(closed.rule, SpeedEstimator::Closed::Rule::kPair);
  EXPECT_EQ(closed.median_speed, 0);  // the median rule needs min_workers
  EXPECT_NEAR(closed.reference_speed, 30, 1e-6);
  EXPECT_NEAR(est.Last(0)->relative, 1.0, 1e-6);
  EXPECT_NEAR(est.Last(1)->relative, 1.0 / 3, 1e-6);
  // Three: the median again.
  est.AddWorker();
  for (uint32_t w = 0; w < 3; ++w) est.Add(w, 10 * (w + 1), 1, 0, 0, 1);
  closed = est.CloseWindow(1);
  EXPECT_EQ(closed.rule, SpeedEstimator::Closed::Rule::kMedian);
  EXPECT_NEAR(closed.reference_speed, 20, 1e-6);
  EXPECT_NEAR(est.Last(0)->relative, 0.5, 1e-6);
}

TEST(SpeedEstimatorTest, HistoryIsABoundedRingOldestFirst) {
  MonitorOptions o;
  o.window_ms = 1000;
  o.history_ms = 5000;  // 5 windows
  SpeedEstimator est(o);
  for (int i = 0; i < 3; ++i) est.AddWorker();
  for (int w = 0; w < 12; ++w) {
    for (uint32_t i = 0; i < 3; ++i) est.Add(i, 10 + w, 1, 0, 0, 1);
    est.CloseWindow(w);
  }
  auto h = est.History(1);
  ASSERT_EQ(h.size(), 5u);
  EXPECT_EQ(h.front().window, 7);
  EXPECT_EQ(h.back().window, 11);
  EXPECT_NEAR(h.back().speed, 21, 1e-6);
  EXPECT_NEAR(est.SmoothedSpeed(1, 3), 20, 1e-6);
}

// A persistent straggler's planning speed: the median of its last windows, but no more than the
// bound of the step it is still computing (the newest window's, when that is a bound).
TEST(SpeedEstimatorTest, StragglerSpeedIsAtMostItsRunningStepsBound) {
  MonitorOptions o;
  o.window_ms = 1000;
  o.history_ms = 10'000;
  SpeedEstimator est(o);
  for (int i = 0; i < 3; ++i) est.AddWorker();
  // Worker 1's window: a finished step at `speed`, or (`bound`) a step still running, which has
  // computed long enough that its bound is `speed`.
  auto window = [&](int64_t w, double speed, bool bound) {
    est.Add(0, 100, 1, 0, 0, 1);
    est.Add(2, 100, 1, 0, 0, 1);
    if (bound) est.NoteRunning(1, 100, 100 / speed);
    else est.Add(1, speed, 1, 0, 0, 1);
    est.CloseWindow(w, /*bound_running=*/true, /*last_reference=*/100, /*straggler_line=*/85);
  };
  window(0, 100, false);
  window(1, 100, false);
  window(2, 60, true);  // its slow step began: the bound so far
  window(3, 40, true);  // the same step, longer: a tighter bound
  ASSERT_EQ(est.Last(1)->reports, 0);
  EXPECT_NEAR(est.SmoothedSpeed(1, 3), 60, 1e-4) << "the median of 100, 60, 40";
  EXPECT_NEAR(est.StragglerSpeed(1, 3), 40, 1e-4) << "the running step's newest bound";
  window(4, 30, false);  // the step ended: 30 samples/s
  EXPECT_NEAR(est.StragglerSpeed(1, 3), 40, 1e-4) << "no step running: the median of 60, 40, 30";
  window(5, 32, false);
  EXPECT_NEAR(est.StragglerSpeed(1, 3), 32, 1e-4) << "40, 30, 32";
  window(6, 50, true);  // a bound above the median says nothing more
  EXPECT_NEAR(est.StragglerSpeed(1, 3), 32, 1e-4) << "the median of 30, 32, 50";
  EXPECT_NEAR(est.StragglerSpeed(0, 3), 100, 1e-4) << "finished steps only: the median";
}

// A running step's estimate: the lower of its bound (samples / compute so far) and the speed
// measured over its progress (samples done / compute when they were done).
TEST(SpeedEstimatorTest, ARunningStepsProgressMeasuresItsSpeed) {
  MonitorOptions o;
  o.window_ms = 1000;
  o.history_ms = 10'000;
  SpeedEstimator est(o);
  for (int i = 0; i < 3; ++i) est.AddWorker();
  auto window = [&](int64_t w, auto note_w1) {
    est.Add(0, 100, 1, 0, 0, 1);
    est.Add(2, 100, 1, 0, 0, 1);
    note_w1();
    est.CloseWindow(w, /*bound_running=*/true, /*last_reference=*/100, /*straggler_line=*/85);
  };
  window(0, [&] { est.Add(1, 100, 1, 0, 0, 1); });
  // 400 samples, 2 s so far (bound 200/s: says nothing); 50 of them done in the first 1 s.
  window(1, [&] { est.NoteRunning(1, 400, 2.0, 50, 1.0); });
  ASSERT_EQ(est.Last(1)->window, 1);
  EXPECT_NEAR(est.Last(1)->speed, 50, 1e-4);
  EXPECT_EQ(est.Last(1)->reports, 0);
  // Progress faster than the bound (the step slowed after it): the bound.
  window(2, [&] { est.NoteRunning(1, 400, 8.0, 300, 2.0); });
  EXPECT_NEAR(est.Last(1)->speed, 50, 1e-4);
  // No progress said: the bound alone, which says nothing above the line.
  window(3, [&] { est.NoteRunning(1, 400, 1.0); });
  EXPECT_EQ(est.Last(1)->window, 2);
}

// Memory is windows in two tiers, sized when a worker is added: flat over time, whatever the
// report rate, and (R + K + 1) summaries per worker (docs/design.md §3, "Memory").
TEST(SpeedEstimatorTest, MemoryIsBoundedByWindowTiersNotByTime) {
  for (int64_t window_ms : {10'000, 1'000}) {
    MonitorOptions o;  // history_ms = 1 h: 360 or 3 600 windows
    o.window_ms = window_ms;
    SpeedEstimator est(o);
    constexpr uint32_t kWorkers = 256;
    for (uint32_t i = 0; i < kWorkers; ++i) est.AddWorker();
    EXPECT_EQ(est.recent_windows(), 10u);  // stable_smoothed_windows
    const uint32_t rest = o.HistoryWindows() - 10;
    EXPECT_EQ(est.coarse_span(), (rest + 63) / 64);
    EXPECT_EQ(est.coarse_entries(), (rest + est.coarse_span() - 1) / est.coarse_span());
    EXPECT_LE(est.coarse_entries(), SpeedEstimator::kCoarseEntries);
    size_t after_first = 0;
    const int64_t windows = o.HistoryWindows() + 200;  // past the whole history
    for (int64_t w = 0; w < windows; ++w) {
      for (uint32_t i = 0; i < kWorkers; ++i) {
        for (int k = 0; k < 5; ++k) est.Add(i, 100, 1 + 0.01 * k, 0, 0, 1.1);  // 5 reports
      }
      est.CloseWindow(w);
      if (w == 0) after_first = est.MemoryBytes();
    }
    EXPECT_EQ(est.MemoryBytes(), after_first) << "window_ms " << window_ms;
    // The formula: per worker (R + K) summaries, the merge being filled, the speed slots, the
    // open window and two ring heads; plus the job-wide scratch.
    const size_t per_worker = (10 + est.coarse_entries()) * sizeof(WindowSummary) + o.samples_kept_per_window * 4 +
                              200 /* Open + Tier x 2 + Merge, with vector slack */;
    EXPECT_LE(est.MemoryBytes(), kWorkers * (per_worker + 100) + 64 * 1024) << "window_ms " << window_ms;
    EXPECT_LT(est.MemoryBytes() / kWorkers, 4 * 1024u);  // vs 14 / 144 KiB for every window
    // History: coarse entries then the recent windows, oldest first, covering <= H windows.
    const auto h = est.History(3);
    ASSERT_LE(h.size(), 10u + est.coarse_entries() + 1u);
    uint32_t covered = 0;
    for (size_t i = 0; i < h.size(); ++i) {
      covered += h[i].windows;
      if (i > 0) EXPECT_GT(h[i].window, h[i - 1].window);
    }
    const uint32_t tiers = 10 + est.coarse_entries() * est.coarse_span();
    EXPECT_GE(tiers, o.HistoryWindows());
    EXPECT_GE(covered, tiers);
    EXPECT_LT(covered, tiers + est.coarse_span());
    EXPECT_EQ(h.back().window, windows - 1);
    EXPECT_EQ(h.back().windows, 1);
    EXPECT_EQ(h.front().windows, est.coarse_span());
    EXPECT_NEAR(h.front().speed, h.back().speed, 1e-3);  // a merged entry is a mean
    EXPECT_EQ(h.front().reports, 5 * est.coarse_span());
  }
}

TEST(SpeedEstimatorTest, FloodIsCappedPerWorkerPerWindow) {
  MonitorOptions o;
  o.max_reports_per_worker_per_window = 5;
  SpeedEstimator est(o);
  est.AddWorker();
  int taken = 0;
  for (int i = 0; i < 100; ++i) taken += est.Add(0, 1, 1, 0, 0, 1);
  EXPECT_EQ(taken, 5);
  EXPECT_FALSE(est.HasRoom(0));
  est.CloseWindow(0);
  EXPECT_TRUE(est.HasRoom(0));
}

}  // namespace
}  // namespace pacer
