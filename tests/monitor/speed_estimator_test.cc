// SpeedEstimator and robust statistics: window medians resist outlier steps, relative speeds
// are against the job median, history is a bounded ring.
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
