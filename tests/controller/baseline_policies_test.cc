// The comparison baselines decide what their papers describe, and nothing else.
#include <gtest/gtest.h>

#include "controller/policies/policy.h"
#include "tests/controller/view_builder.h"

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

}  // namespace
}  // namespace pacer
