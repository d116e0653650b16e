// Step statistics (controller/step_statistics.h) and the test batch plans are held to with them
// (ProposeBatchPlan, adjust_batch.speed_significance): a worker is planned at its own speed
// only when its steps show the difference. Pure functions and scripted timings; no clock.
#include "controller/step_statistics.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "controller/controller.h"
#include "controller/policies/action_rules.h"
#include "tests/controller/test_views.h"

namespace pacer {
namespace {

using testing::SyncView;
using testing::Timing;

TEST(StepStatistics, MeanAndStandardErrorOfTheRecentSteps) {
  StepStatistics s;
  // Alternating 0.9 / 1.1 s for 100 samples: mean 1 s, sd 0.1 (relative 10 %).
  for (int k = 0; k < 200; ++k) s.Observe(Timing("w0", k, k % 2 ? 1.1 : 0.9, 100, 1000 * k));
  auto m = s.Summaries(200'000, 10'000);
  ASSERT_EQ(m.count("w0"), 1u);
  EXPECT_NEAR(m["w0"].speed, 100, 0.5);
  // About (1 + f) / (1 − f) = 39 steps' worth: 0.1 / √39 ≈ 0.016.
  EXPECT_NEAR(m["w0"].steps, 39, 0.5);
  EXPECT_NEAR(m["w0"].rel_se, 0.1 / std::sqrt(39.0), 0.002);
}

TEST(StepStatistics, CountsFinishedTrainingStepsOnceAndForgetsStaleWorkers) {
  StepStatistics s;
  s.Observe(Timing("w0", 1, 1.0, 100, 1000));
  // One step, no spread known anywhere: its speed, and nothing shown yet.
  ASSERT_EQ(s.Summaries(1000, 10'000).size(), 1u);
  EXPECT_EQ(s.Summaries(1000, 10'000)["w0"].rel_se, 1.0);
  s.Observe(Timing("w0", 1, 5.0, 100, 1500));            // the same step again: not counted
  StepTiming probe = Timing("w0", 2, 9.0, 50, 2000);
  probe.probe = true;
  s.Observe(probe);
  StepTiming running = Timing("w0", 3, 9.0, 100, 2500);
  running.in_progress = true;
  s.Observe(running);
  s.Observe(Timing("w0", 4, 1.2, 100, 3000));
  auto m = s.Summaries(3000, 10'000);
  ASSERT_EQ(m.count("w0"), 1u);
  EXPECT_NEAR(1 / m["w0"].speed, 0.011, 0.0011);  // between 1.0 and 1.2 s per 100 samples
  // Silent for longer than the limit (and 3 of its steps): left out.
  EXPECT_TRUE(s.Summaries(3000 + 20'000, 10'000).empty());
  // A new run counts from step 0 again: the old steps are gone.
  s.Observe(Timing("w0", 0, 3.0, 100, 40'000));
  EXPECT_EQ(s.Summaries(40'000, 10'000)["w0"].rel_se, 1.0);
  EXPECT_NEAR(s.Summaries(40'000, 10'000)["w0"].speed, 100 / 3.0, 1e-9);
}

TEST(StepStatistics, AWorkerIsNotJudgedSurerThanTheJobsNoise) {
  // w0 happens to have two identical steps; the others spread by 12 %: w0's error is the job's.
  StepStatistics s;
  s.Observe(Timing("w0", 1, 1.0, 100, 1000));
  s.Observe(Timing("w0", 2, 1.0, 100, 2000));
  std::mt19937_64 rng(3);
  std::normal_distribution<double> noise(1.0, 0.12);
  for (int i = 1; i < 9; ++i)
    for (int k = 1; k <= 6; ++k)
      s.Observe(Timing("w" + std::to_string(i), k, noise(rng), 100, 1000 * k));
  auto m = s.Summaries(6000, 10'000);
  ASSERT_EQ(m.size(), 9u);
  // The job's 12 % over w0's two steps: ~0.085, not 0.
  EXPECT_GT(m["w0"].rel_se, 0.04);
}

// 32 workers of a sync job, each with its recent steps' speed and standard error; `speeds` are
// the monitor's (windowed) speeds the planner would otherwise believe.
ClusterView NoisyView(const std::vector<double>& window_speeds, const std::vector<double>& step_speeds,
                      double rel_se) {
  ClusterView v = SyncView(static_cast<int>(window_speeds.size()), 38400, 200);
  for (size_t i = 0; i < window_speeds.size(); ++i) {
    v.workers[i].speed = v.workers[i].last_window_speed = window_speeds[i];
    v.workers[i].step_speed = step_speeds[i];
    v.workers[i].step_speed_rel_se = rel_se;
  }
  return v;
}

PolicyConfig Dedicated() {
  PolicyConfig c;
  c.policy = "dedicated";
  c.adjust_batch.hysteresis = 0.1;
  c.adjust_batch.accumulation = true;
  return c;
}

TEST(SpeedSignificance, WindowSpeedsThatTheStepsDoNotBearOutMoveNoBatch) {
  // Windowed speeds ±15 % (one or two noisy steps each), the steps' means within 2 standard
  // errors (3 %) of each other: nothing to plan. Without the test the planner shifts batches.
  std::vector<double> window, steps;
  for (int i = 0; i < 32; ++i) {
    window.push_back(200 * (1 + 0.15 * std::sin(i * 1.7)));
    steps.push_back(200 * (1 + 0.06 * std::sin(i * 2.3)));
  }
  ClusterView v = NoisyView(window, steps, 0.03);
  const PolicyConfig cfg = Dedicated();
  History h;
  EXPECT_FALSE(ProposeBatchPlan(v, h, cfg.adjust_batch, &cfg.detection).has_value());
  AdjustBatchConfig off = cfg.adjust_batch;
  off.speed_significance = 0;
  EXPECT_TRUE(ProposeBatchPlan(v, h, off, &cfg.detection).has_value());
}

TEST(SpeedSignificance, AStragglerWhoseStepsShowItIsPlannedAtItsOwnSpeed) {
  std::vector<double> window(32, 200), steps(32, 200);
  window[5] = steps[5] = 140;  // 30 % slower: 10 standard errors at 3 %
  ClusterView v = NoisyView(window, steps, 0.03);
  const PolicyConfig cfg = Dedicated();
  History h;
  std::optional<Action> a = ProposeBatchPlan(v, h, cfg.adjust_batch, &cfg.detection);
  ASSERT_TRUE(a.has_value());
  const WorkerBatch* slow = a->plan->Find("w5");
  const WorkerBatch* other = a->plan->Find("w6");
  ASSERT_TRUE(slow && other);
  EXPECT_NEAR(static_cast<double>(slow->samples) / other->samples, 0.7, 0.01);
  // Every other worker is planned alike (the typical speed), not at its own noise.
  for (const auto& wb : a->plan->workers) {
    if (wb.worker_id != "w5") {
      EXPECT_NEAR(wb.samples, other->samples, 1) << wb.worker_id;
    }
  }
}

TEST(SpeedSignificance, WorkersWithoutStepStatisticsArePlannedAsBefore) {
  std::vector<double> window(32, 200), steps(32, 0);
  window[5] = 140;
  ClusterView v = NoisyView(window, steps, 0);
  const PolicyConfig cfg = Dedicated();
  History h;
  std::optional<Action> a = ProposeBatchPlan(v, h, cfg.adjust_batch, &cfg.detection);
  ASSERT_TRUE(a.has_value());
  EXPECT_LT(a->plan->Find("w5")->samples, a->plan->Find("w6")->samples);
}

TEST(SpeedSignificance, TheControllerFeedsTheStepsIntoTheView) {
  // A dedicated controller that observes the steps of 8 workers, one of them 40 % slower,
  // plans it; one that sees equal steps (but a noisy window speed) does not.
  for (bool slow : {true, false}) {
    PolicyConfig cfg = Dedicated();
    cfg.safety.min_gain = 0.03;
    auto c = Controller::Create(cfg);
    ASSERT_TRUE(c.ok()) << c.status();
    ClusterView v = SyncView(8, 800, 100);
    v.now_ms = 100'000;
    if (!slow) v.workers[3].speed = v.workers[3].last_window_speed = 70;  // one bad window
    std::vector<StepTiming> timings;
    for (int k = 1; k <= 10; ++k)
      for (int i = 0; i < 8; ++i) {
        const double per_sample = (slow && i == 3 ? 1 / 60.0 : 1 / 100.0) * (k % 2 ? 0.95 : 1.05);
        timings.push_back(
            Timing("w" + std::to_string(i), k, per_sample * 100, 100, 90'000 + 1000 * k));
      }
    (*c)->ObserveSteps(timings);
    if (slow) v.workers[3].speed = v.workers[3].last_window_speed = 60;
    auto r = (*c)->Reconcile(v);
    ASSERT_TRUE(r.ok()) << r.status();
    bool planned = false;
    for (const Action& a : r->dispatch) planned = planned || a.kind == ActionKind::kAdjustBatch;
    EXPECT_EQ(planned, slow);
  }
}

}  // namespace
}  // namespace pacer
