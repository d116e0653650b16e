// The balanced bound on cases small enough to check by hand.
#include <gtest/gtest.h>

#include "sim/balanced_bound.h"
#include "sim/data_ledger.h"

namespace pacer::sim {
namespace {

Scenario Base() {
  Scenario sc;
  sc.name = "hand";
  sc.job.mode = SimJobMode::kSync;
  sc.job.workers = 4;
  sc.job.workers_per_node = 2;
  sc.job.global_batch = 400;
  sc.job.total_samples = 1'000'000;
  sc.speeds.median = 100;  // sigma 0: every worker exactly 100 samples/s
  return sc;
}

TEST(BalancedBound, UniformSyncWithoutSyncCost) {
  Scenario sc = Base();
  // Σv = 400/s → 1e6 samples in 2 500 s.
  EXPECT_NEAR(ComputeBalancedBound(SpeedModel(sc), 1e9).jct_s, 2500.0, 1e-6);
}

TEST(BalancedBound, SyncCostPerStep) {
  Scenario sc = Base();
  sc.job.sync_cost_s = 0.5;
  // A step of 400 samples takes 400/400 + 0.5 = 1.5 s; 2 500 steps → 3 750 s.
  EXPECT_NEAR(ComputeBalancedBound(SpeedModel(sc), 1e9).jct_s, 3750.0, 1e-6);
  EXPECT_DOUBLE_EQ(BalancedSyncRate(400, 400, 0.5), 400.0 / 1.5);
}

TEST(BalancedBound, HardwareGroupsAreSummedNotMinimised) {
  Scenario sc = Base();
  sc.speeds.groups = {{0.5, 0.5}};  // one of the two nodes (2 workers) at half speed
  // Σv = 2·100 + 2·50 = 300/s (a sync job on equal batches would run at 4·50 = 200/s).
  EXPECT_NEAR(ComputeBalancedBound(SpeedModel(sc), 1e9).jct_s, 1e6 / 300.0, 1e-6);
}

TEST(BalancedBound, TimedSlowdownIsIntegrated) {
  Scenario sc = Base();
  ScenarioEvent e;
  e.kind = EventKind::kSlowdown;
  e.worker = 1;
  e.at_s = 1000;
  e.duration_s = 1000;
  e.factor = 0.0;  // worker 1 stops entirely for [1000, 2000)
  e.factor = 0.001;
  sc.events.push_back(e);
  // 0–1000: 400/s (4e5); 1000–2000: 300.1/s (3.001e5); then 400/s for the remaining 2.999e5
  // → 749.75 s. Total 2749.75 s.
  EXPECT_NEAR(ComputeBalancedBound(SpeedModel(sc), 1e9).jct_s, 2749.75, 1e-6);
}

TEST(BalancedBound, AsyncUsesPerWorkerStepWithPsWait) {
  Scenario sc = Base();
  sc.job.mode = SimJobMode::kAsync;
  sc.job.servers = 2;
  sc.job.sync_cost_s = 1.0;  // push/pull per step
  // b = 100 per worker: step = 100/100 + 1 = 2 s → 50/s per worker, 200/s in all → 5 000 s.
  EXPECT_NEAR(ComputeBalancedBound(SpeedModel(sc), 1e9).jct_s, 5000.0, 1e-6);
  ScenarioEvent hot;
  hot.kind = EventKind::kHotServer;
  hot.server = 1;
  hot.factor = 0.5;  // from t=0: PS wait doubles → step 3 s → 133.3/s → 7 500 s
  sc.events.push_back(hot);
  EXPECT_NEAR(ComputeBalancedBound(SpeedModel(sc), 1e9).jct_s, 7500.0, 1e-6);
}

TEST(BalancedBound, UnreachableWithinLimit) {
  Scenario sc = Base();
  EXPECT_EQ(ComputeBalancedBound(SpeedModel(sc), 100).jct_s, kForever);
}

TEST(DataLedger, CountsUnionDuplicatesAndBackupOverlap) {
  DataLedger l;
  l.Acknowledge(0, 100, 0);
  l.Acknowledge(200, 300, 0);
  l.Acknowledge(100, 200, 0);
  EXPECT_EQ(l.covered(), 300u);
  EXPECT_EQ(l.segments(), 1u);
  EXPECT_EQ(l.duplicated(), 0u);
  l.Acknowledge(250, 350, 0);  // 50 counted twice
  EXPECT_EQ(l.duplicated(), 50u);
  l.Acknowledge(400, 450, 7);  // a backup pair: both copies acknowledge the same records
  l.Acknowledge(420, 470, 7);
  EXPECT_EQ(l.backup_overlap(), 30u);
  EXPECT_EQ(l.duplicated(), 50u);
  EXPECT_EQ(l.Lost(500), 500u - l.covered());
}

}  // namespace
}  // namespace pacer::sim
