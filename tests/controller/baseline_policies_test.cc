// The comparison baselines decide what their papers describe, and nothing else.
#include <gtest/gtest.h>

#include <random>

#include "controller/policies/policy.h"
#include "controller/relaunch_cost_model.h"
#include "tests/controller/test_views.h"

namespace pacer {
namespace {

using testing::MakeStraggler;
using testing::SyncView;

TEST(BaselinePoliciesTest, RegistryKnowsEveryName) {
  for (const auto& name : PolicyNames()) EXPECT_TRUE(FindPolicy(name).ok()) << name;
  EXPECT_EQ(FindPolicy("magic").status().code(), absl::StatusCode::kNotFound);
}

TEST(BaselinePoliciesTest, NoneNeverActs) {
  ClusterView v = SyncView(4, 1000);
  MakeStraggler(v, 0, 0.1, true);
  EXPECT_TRUE(DecideNone(v, History(), PolicyConfig()).empty());
}

TEST(BaselinePoliciesTest, BackupWorkersDropsTheSlowestB) {
  ClusterView v = SyncView(6, 600);
  v.workers[4].speed = 20;
  v.workers[1].speed = 40;
  PolicyConfig c;
  c.backup_workers.count = 2;
  // Only where a step can go on without some gradients (the simulator; not pacerd yet).
  EXPECT_TRUE(DecideBackupWorkers(v, History(), c).empty());
  v.job.can_exclude_workers = true;
  auto actions = DecideBackupWorkers(v, History(), c);
  ASSERT_EQ(actions.size(), 1u);
  EXPECT_EQ(actions[0].kind, ActionKind::kExcludeWorkers);
  EXPECT_EQ(actions[0].excluded_workers, (std::vector<std::string>{"w1", "w4"}));
  // 4/6 of the samples per step at 5× the pace of the slowest: (4/6)·(100/20) − 1.
  EXPECT_NEAR(actions[0].predicted_gain, 4.0 / 6 * 5 - 1, 1e-9);
  // Once in force, the same set is not proposed again.
  History h;
  h.SetExcluded({"w1", "w4"});
  EXPECT_TRUE(DecideBackupWorkers(v, h, c).empty());
}

TEST(BaselinePoliciesTest, LbBspResizesFromTheLastWindowEvenForTransients) {
  ClusterView v = SyncView(4, 1000);
  MakeStraggler(v, 3, 0.5, /*persistent=*/false);  // LB-BSP does not classify
  auto actions = DecideLbBsp(v, History(), PolicyConfig());
  ASSERT_EQ(actions.size(), 1u);
  EXPECT_EQ(actions[0].plan->Find("w3")->samples, 143);
  // The AntDT presets ignore the same transient dip.
  PolicyConfig nd;
  nd.policy = "non-dedicated";
  EXPECT_TRUE(DecideNonDedicated(v, History(), nd).empty());
}

TEST(BaselinePoliciesTest, TimeoutRelaunchRestartsOnlyPastThreeTimesTypical) {
  ClusterView v = SyncView(4, 0);
  v.job.mode = JobMode::kAsync;
  v.job.typical_shard_time_s = 10;
  v.workers[0].shard_elapsed_s = 31;
  v.workers[1].shard_elapsed_s = 29;
  v.workers[2].shard_elapsed_s = 5;
  auto actions = DecideTimeoutRelaunch(v, History(), PolicyConfig());
  ASSERT_EQ(actions.size(), 1u);
  EXPECT_EQ(actions[0].kind, ActionKind::kRestart);
  EXPECT_EQ(actions[0].target, "w0");
  // Without a typical time from the job, the median shard in progress is the yardstick.
  v.job.typical_shard_time_s = 0;
  v.workers[0].shard_elapsed_s = 60;
  v.workers[1].shard_elapsed_s = 10;
  v.workers[2].shard_elapsed_s = 12;
  v.workers[3].shard_elapsed_s = 11;
  actions = DecideTimeoutRelaunch(v, History(), PolicyConfig());  // yardstick 12 s → > 36 s
  ASSERT_EQ(actions.size(), 1u);
  EXPECT_EQ(actions[0].target, "w0");
}


// Weighing a relaunch candidate is O(1) from the baseline (a 4 096-worker job weighs thousands
// per reconcile): it must predict what replacing that worker's speed in the view predicts —
// sync and async, balanced or not, ties at the minimum, dead and restarting workers, one worker.
TEST(BaselinePoliciesTest, RelaunchBaselinePredictsWhatTheViewPredicts) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 400; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 12);
    ClusterView v = SyncView(n, 1200);
    if (trial % 2) v.job.mode = JobMode::kAsync;
    for (auto& w : v.workers) {
      w.speed = 10.0 * (1 + rng() % 6);  // few distinct values: ties at the minimum
      w.alive = rng() % 7 != 0;
      w.restarting = rng() % 9 == 0;
    }
    for (const bool balanced : {false, true}) {
      const RelaunchBaseline b = ComputeRelaunchBaseline(v, balanced);
      for (const auto& w : v.workers) {
        for (const double speed : {5.0, w.speed, 35.0, 100.0}) {
          EXPECT_NEAR(b.ThroughputWith(w, speed), PredictThroughput(v, balanced, w.id, speed), 1e-9)
              << "trial " << trial << " " << w.id << " balanced " << balanced << " speed " << speed;
        }
      }
    }
  }
}

}  // namespace
}  // namespace pacer
