// BatchPlanner: sums preserved, caps respected, accumulation chosen where it pays, plans stable
// under noise, effective step far enough ahead.
#include "controller/batch_planner.h"

#include <gtest/gtest.h>

#include <map>
#include <random>

#include "tests/controller/test_views.h"

namespace pacer {
namespace {

using testing::SyncView;

std::map<std::string, int64_t> Caps(const ClusterView& v) {
  std::map<std::string, int64_t> caps;
  for (const auto& w : v.workers) caps[w.id] = w.max_local_batch;
  return caps;
}

TEST(WaterFillTest, ProportionalWithoutBounds) {
  auto x = WaterFill({1, 2, 1}, {0, 0, 0}, {-1, -1, -1}, 100);
  ASSERT_TRUE(x.ok());
  EXPECT_DOUBLE_EQ((*x)[0], 25);
  EXPECT_DOUBLE_EQ((*x)[1], 50);
  EXPECT_DOUBLE_EQ((*x)[2], 25);
}

TEST(WaterFillTest, CappedExcessFlowsToOthersByWeight) {
  // Worker 1 wants 60 but holds 30: the other 30 go to 0 and 2 in proportion 1:2.
  auto x = WaterFill({1, 3, 2}, {0, 0, 0}, {-1, 30, -1}, 120);
  ASSERT_TRUE(x.ok());
  EXPECT_DOUBLE_EQ((*x)[1], 30);
  EXPECT_DOUBLE_EQ((*x)[0], 30);
  EXPECT_DOUBLE_EQ((*x)[2], 60);
}

TEST(WaterFillTest, InfeasibleBoundsAreRefused) {
  EXPECT_EQ(WaterFill({1, 1}, {0, 0}, {10, 10}, 30).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(WaterFill({1, 1}, {20, 20}, {-1, -1}, 30).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(RoundKeepingSumTest, LargestRemainderKeepsTheSumAndBounds) {
  std::mt19937_64 rng(7);
  for (int iter = 0; iter < 2000; ++iter) {
    const int n = 1 + static_cast<int>(rng() % 40);
    const int64_t total = n + static_cast<int64_t>(rng() % 5000);
    std::vector<double> w(n);
    for (auto& x : w) x = 0.05 + static_cast<double>(rng() % 1000) / 100.0;
    std::vector<double> lo(n, 1), hi(n, -1);
    std::vector<int64_t> lo_i(n, 1), hi_i(n, -1);
    for (int i = 0; i < n; ++i) {
      if (rng() % 3 == 0) {
        hi_i[i] = 1 + static_cast<int64_t>(rng() % (2 * total / n + 2));
        hi[i] = static_cast<double>(hi_i[i]);
      }
    }
    auto shares = WaterFill(w, lo, hi, static_cast<double>(total));
    if (!shares.ok()) continue;  // caps too small for this draw
    std::vector<int64_t> b = RoundKeepingSum(*shares, lo_i, hi_i, total);
    int64_t sum = 0;
    for (int i = 0; i < n; ++i) {
      sum += b[i];
      EXPECT_GE(b[i], 1);
      if (hi_i[i] >= 0) {
        EXPECT_LE(b[i], hi_i[i]);
      }
      EXPECT_LT(std::abs(static_cast<double>(b[i]) - (*shares)[i]), 1.0 + 1e-9);
    }
    ASSERT_EQ(sum, total) << "iteration " << iter;
  }
}

TEST(BatchPlannerTest, BatchesFollowSpeedAndSumToTheGlobalBatch) {
  ClusterView v = SyncView(4, 1000);
  v.workers[0].speed = 50;  // half speed
  AdjustBatchConfig cfg;
  auto plan = BatchPlanner::Target(v, cfg);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_TRUE(CheckBatchPlan(*plan, Caps(v)).ok());
  EXPECT_EQ(plan->TotalSamples(), 1000);
  // 50:100:100:100 → 142.86, 285.71 ×3 → 143 + 286 + 286 + 285 (largest remainder, id order)
  EXPECT_EQ(plan->Find("w0")->samples, 143);
  int64_t others = 0;
  for (int i = 1; i < 4; ++i) {
    const int64_t b = plan->Find("w" + std::to_string(i))->samples;
    EXPECT_TRUE(b == 285 || b == 286);
    others += b;
  }
  EXPECT_EQ(others, 857);
  // Every worker's step now takes about the same time: 143/50 ≈ 286/100.
  EXPECT_NEAR(plan->predicted_step_s, 2.86, 0.01);
}

TEST(BatchPlannerTest, MemoryCapsHoldAndTheExcessIsWaterFilled) {
  ClusterView v = SyncView(4, 1000);
  v.workers[3].speed = 400;           // a fast worker...
  v.workers[3].max_local_batch = 300;  // ...with little memory
  AdjustBatchConfig cfg;               // no accumulation
  auto plan = BatchPlanner::Target(v, cfg);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_TRUE(CheckBatchPlan(*plan, Caps(v)).ok());
  EXPECT_EQ(plan->Find("w3")->samples, 300);
  EXPECT_EQ(plan->Find("w3")->accumulation, 1);
  EXPECT_EQ(plan->TotalSamples(), 1000);
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(plan->workers[i].samples, 700.0 / 3, 1);
}

TEST(BatchPlannerTest, CapsThatCannotHoldTheBatchNeedAccumulation) {
  ClusterView v = SyncView(2, 1000);
  v.workers[0].max_local_batch = 200;
  v.workers[1].max_local_batch = 200;
  AdjustBatchConfig cfg;
  EXPECT_EQ(BatchPlanner::Target(v, cfg).status().code(), absl::StatusCode::kFailedPrecondition);
  cfg.accumulation = true;
  auto plan = BatchPlanner::Target(v, cfg);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_TRUE(CheckBatchPlan(*plan, Caps(v)).ok());
  for (const auto& wb : plan->workers) {
    EXPECT_EQ(wb.samples, 500);
    EXPECT_EQ(wb.accumulation, 3);  // 500 = 167 + 167 + 166
    EXPECT_EQ(wb.micro_batch, 167);
  }
}

TEST(BatchPlannerTest, AccumulationChosenWhenACapIsBelowAFastWorkersShare) {
  // Mixed hardware: w0 is 4× faster but holds only 200 samples per micro-batch.
  ClusterView v = SyncView(4, 1400);
  v.workers[0].speed = 400;
  v.workers[0].max_local_batch = 200;
  for (auto& w : v.workers) w.step_fixed_s = 0.01;
  AdjustBatchConfig cfg;
  cfg.accumulation = true;
  auto plan = BatchPlanner::Target(v, cfg);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_TRUE(CheckBatchPlan(*plan, Caps(v)).ok());
  const WorkerBatch* fast = plan->Find("w0");
  EXPECT_EQ(fast->samples, 800);  // its speed share of 1400: 400/700
  EXPECT_EQ(fast->accumulation, 4);
  EXPECT_EQ(fast->micro_batch, 200);
  EXPECT_EQ(plan->TotalSamples(), 1400);
  // Faster than water-filling the excess onto the slow workers.
  cfg.accumulation = false;
  auto capped = BatchPlanner::Target(v, cfg);
  ASSERT_TRUE(capped.ok());
  EXPECT_LT(plan->predicted_step_s, capped->predicted_step_s);
}

TEST(BatchPlannerTest, MinimumLocalBatchHolds) {
  ClusterView v = SyncView(3, 30);
  v.workers[0].speed = 0.5;  // nearly stopped
  AdjustBatchConfig cfg;
  cfg.min_local_batch = 4;
  auto plan = BatchPlanner::Target(v, cfg);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->Find("w0")->samples, 4);
  EXPECT_EQ(plan->TotalSamples(), 30);
}

TEST(BatchPlannerTest, DeadAndRestartingWorkersGetNoBatch) {
  ClusterView v = SyncView(4, 100);
  v.workers[1].alive = false;
  v.workers[2].restarting = true;
  auto plan = BatchPlanner::Target(v, AdjustBatchConfig{});
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->workers.size(), 2u);
  EXPECT_EQ(plan->TotalSamples(), 100);
}

TEST(BatchPlannerTest, EffectiveStepIsFarEnoughAheadForEveryHeartbeat) {
  ClusterView v = SyncView(4, 1000);
  v.workers[0].speed = 50;
  v.job.current_step = 5000;
  v.job.step_time_s = 0.1;
  v.job.heartbeat_interval_s = 2;
  AdjustBatchConfig cfg;  // lead_heartbeats 3
  auto p = BatchPlanner::Propose(v, nullptr, cfg);
  ASSERT_TRUE(p.ok() && p->has_value());
  const BatchPlan& plan = (*p)->plan;
  EXPECT_GT(plan.effective_step, v.job.current_step);
  // Steps may run at the faster of the current and the planned step time; either way, three
  // heartbeats pass before the effective step.
  const double fastest_step = std::min(v.job.step_time_s, plan.predicted_step_s);
  EXPECT_GE(static_cast<double>(plan.effective_step - v.job.current_step) * fastest_step,
            3 * v.job.heartbeat_interval_s - 1e-9);
  EXPECT_EQ(plan.version, 1u);
  // Slow steps: at least min_steps_ahead.
  v.job.step_time_s = 100;
  for (auto& w : v.workers) w.step_per_sample_s = 1;  // predicted steps slow too
  auto slow = BatchPlanner::Propose(v, nullptr, cfg);
  ASSERT_TRUE(slow.ok() && slow->has_value());
  EXPECT_EQ((*slow)->plan.effective_step, v.job.current_step + cfg.min_steps_ahead);
}

TEST(BatchPlannerTest, VersionsGrowFromTheCurrentPlan) {
  ClusterView v = SyncView(4, 1000);
  v.workers[0].speed = 50;
  auto first = BatchPlanner::Propose(v, nullptr, AdjustBatchConfig{});
  ASSERT_TRUE(first.ok() && first->has_value());
  v.workers[0].speed = 100;
  v.workers[1].speed = 40;
  auto second = BatchPlanner::Propose(v, &(*first)->plan, AdjustBatchConfig{});
  ASSERT_TRUE(second.ok() && second->has_value());
  EXPECT_EQ((*second)->plan.version, 2u);
  EXPECT_GT((*second)->predicted_gain, 0.5);
}

TEST(BatchPlannerTest, EvenSpeedsOnEvenBatchesProposeNothing) {
  ClusterView v = SyncView(8, 1024);
  auto p = BatchPlanner::Propose(v, nullptr, AdjustBatchConfig{});
  ASSERT_TRUE(p.ok());
  EXPECT_FALSE(p->has_value());
}

TEST(BatchPlannerTest, StableUnderFivePercentNoise) {
  // A plan made for one slow worker, then 500 noisy views (every speed ±5 %, uniformly):
  // hysteresis must keep the plan every time — no flapping.
  ClusterView v = SyncView(16, 4096);
  v.workers[5].speed = 60;
  AdjustBatchConfig cfg;
  auto first = BatchPlanner::Propose(v, nullptr, cfg);
  ASSERT_TRUE(first.ok() && first->has_value());
  const BatchPlan plan = (*first)->plan;
  std::mt19937_64 rng(42);
  std::uniform_real_distribution<double> noise(-0.05, 0.05);
  int replans = 0;
  for (int i = 0; i < 500; ++i) {
    ClusterView noisy = v;
    for (auto& w : noisy.workers) w.speed *= 1 + noise(rng);
    auto p = BatchPlanner::Propose(noisy, &plan, cfg);
    ASSERT_TRUE(p.ok());
    replans += p->has_value() ? 1 : 0;
  }
  EXPECT_EQ(replans, 0);
  // The worst case of ±5 % noise (one share up 5 %, the rest down 5 %) still holds.
  ClusterView worst = v;
  for (auto& w : worst.workers) w.speed *= 0.95;
  worst.workers[0].speed = v.workers[0].speed * 1.05;
  auto p = BatchPlanner::Propose(worst, &plan, cfg);
  ASSERT_TRUE(p.ok());
  EXPECT_FALSE(p->has_value());
  // A real change (another worker 30 % slower) does replan.
  ClusterView changed = v;
  changed.workers[9].speed = 70;
  auto q = BatchPlanner::Propose(changed, &plan, cfg);
  ASSERT_TRUE(q.ok());
  EXPECT_TRUE(q->has_value());
}

TEST(BatchPlannerTest, MembershipChangeForcesANewPlan) {
  ClusterView v = SyncView(4, 1000);
  v.workers[0].speed = 50;
  auto first = BatchPlanner::Propose(v, nullptr, AdjustBatchConfig{});
  ASSERT_TRUE(first.ok() && first->has_value());
  v.workers[2].alive = false;
  auto p = BatchPlanner::Propose(v, &(*first)->plan, AdjustBatchConfig{});
  ASSERT_TRUE(p.ok() && p->has_value());
  EXPECT_TRUE((*p)->membership_changed);
  EXPECT_EQ((*p)->plan.TotalSamples(), 1000);
  EXPECT_EQ((*p)->plan.workers.size(), 3u);
}

TEST(BatchPlannerTest, RandomViewsAlwaysGiveValidPlans) {
  std::mt19937_64 rng(3);
  for (int iter = 0; iter < 500; ++iter) {
    const int n = 1 + static_cast<int>(rng() % 64);
    const int64_t B = n + static_cast<int64_t>(rng() % 10000);
    ClusterView v = SyncView(n, B);
    for (auto& w : v.workers) {
      w.speed = (rng() % 10 == 0) ? 0 : 1 + static_cast<double>(rng() % 1000);
      if (rng() % 4 == 0) w.max_local_batch = 1 + static_cast<int64_t>(rng() % (2 * B / n + 1));
      w.step_fixed_s = static_cast<double>(rng() % 10) / 1000;
    }
    AdjustBatchConfig cfg;
    cfg.accumulation = rng() % 2 == 0;
    auto plan = BatchPlanner::Target(v, cfg);
    if (!plan.ok()) {
      EXPECT_FALSE(cfg.accumulation) << plan.status();
      continue;
    }
    ASSERT_TRUE(CheckBatchPlan(*plan, Caps(v)).ok()) << CheckBatchPlan(*plan, Caps(v));
  }
}

}  // namespace
}  // namespace pacer
