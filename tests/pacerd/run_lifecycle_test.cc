// Two consecutive runs of a job against one pacerd (docs/design.md, "Job lifecycle"): run 1 ends at a
// high step with a batch plan in force; run 2's workers count from step 0. Its plan must be
// scheduled within run 2's steps and take effect, not at a step of run 1 (the bug: "@step 4872"
// in a run that ends at step 2100, never applied, silently). In process on a simulated clock
// (tests/testing/pacerd_harness.h: real gRPC on loopback, real RocksDB, production's
// housekeeping step); the workers are ScriptedWorkers (step reports and heartbeats), whose
// LocalBatchPlan (the SDK's) decides whether a plan it received applied.
#include <map>

#include <gtest/gtest.h>

#include "common/auth.h"
#include "tests/testing/pacerd_harness.h"

namespace pacer {
namespace {

using testing::PacerdHarness;
using testing::ScriptedWorker;

constexpr int kWorkers = 3;
constexpr uint32_t kBatch = 64;

class RunLifecycleTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(h_.ok()); }

  // A new run: kWorkers fresh processes register (sharding, with `run_id`, and monitor).
  void StartWorkers(const std::string& run_id = "") {
    workers_.clear();
    for (int i = 0; i < kWorkers; ++i) {
      ScriptedWorker::Options o;
      o.id = "w" + std::to_string(i);
      o.node = "n" + std::to_string(i);
      o.batch = kBatch;
      o.run_id = run_id;
      workers_.push_back(std::make_unique<ScriptedWorker>(h_, o));
      absl::Status s = workers_.back()->Connect();
      ASSERT_TRUE(s.ok()) << s;
    }
  }

  // `ticks` steps of 100 ms from `step` on (production's housekeeping after each 100 ms), worker
  // slow_ (w2 unless a test says otherwise) computing at half speed; a heartbeat every second. Each worker's LocalBatchPlan is offered
  // what its heartbeat reply carries and asked for every step's batch, as the SDK does.
  void Train(int ticks, uint64_t* step) {
    for (int tick = 0; tick < ticks; ++tick) {
      h_.Advance(100);
      ++*step;
      for (int i = 0; i < kWorkers; ++i) {
        ScriptedWorker& w = *workers_[i];
        w.set_step(*step);  // the batch of this step, as the SDK asks its plan
        const double compute = (i == slow_ ? 0.0025 : 0.00125) * w.batch_in_force().micro_batch;
        w.set_step(*step - 1);  // Step() reports step *step
        ASSERT_TRUE(w.Step(compute, 0.09, 0.01).ok());
      }
      if (tick % 10 == 9) {
        for (auto& w : workers_) {
          auto r = w->Heartbeat();
          ASSERT_TRUE(r.ok()) << r.status();
          for (const auto& cmd : r->commands()) {
            if (cmd.has_batch_plan()) {
              received_.push_back(cmd.batch_plan());
              received_by_.emplace_back(w->id(), cmd.batch_plan());
            }
          }
        }
      }
    }
  }

  // Plays run 2 from step 0 and checks its plan: above run 1's version, scheduled within run
  // 2's steps, applied by every worker, the straggler's batch the smaller.
  // Not even before the new run is known may a plan of run 1 reach run 2: a relaunch within the
  // gap is known only once every worker reported steps below run 1's, and until then pacerd
  // holds the plan back from a new process (RunTracker::InRun) -- the first rank to get run 1's
  // plan would apply it alone, and with no plan of run 2 (policy none) keep it for the run.
  void ExpectSecondRunPlanApplies(uint64_t run1_version, uint64_t run1_end) {
    received_.clear();
    uint64_t step = 0;
    ASSERT_NO_FATAL_FAILURE(Train(150, &step));
    int of_run2 = 0;
    for (const auto& p : received_) {
      if (p.version() <= run1_version) {
        ADD_FAILURE() << "a plan of run 1 was sent to run 2: v" << p.version();
        continue;
      }
      ++of_run2;
      EXPECT_LT(p.effective_step(), step) << "scheduled past run 2's steps (run 1 ended at "
                                          << run1_end << ")";
    }
    ASSERT_GT(of_run2, 0) << "run 2 got no plan of its own";
    for (int i = 0; i < kWorkers; ++i) {
      workers_[i]->set_step(step);
      EXPECT_EQ(workers_[i]->batch_in_force().version, received_.back().version())
          << "w" << i << " did not apply the plan";
    }
    EXPECT_LT(workers_[2]->batch_in_force().micro_batch, workers_[0]->batch_in_force().micro_batch);
    EXPECT_EQ(h_->reconciler()->Run().second, static_cast<int64_t>(step));
  }

  // Run 1's processes end; `gap_ms` later (pacerd's housekeeping running through the gap every
  // `tick_ms`, as its thread would) every worker registers anew.
  void RelaunchAfter(int64_t gap_ms, int64_t tick_ms) {
    workers_.clear();
    for (int64_t t = 0; t < gap_ms; t += tick_ms) h_.Advance(tick_ms);
    ASSERT_NO_FATAL_FAILURE(StartWorkers());
  }

  // Run 1: from a high step (a long run), until it has a plan in force.
  uint64_t FirstRun(uint64_t* version) {
    StartWorkers(run1_id_);
    uint64_t step = 4700;
    Train(150, &step);
    auto plan = h_->reconciler()->PlanFor("w0");
    EXPECT_TRUE(plan.has_value()) << "run 1 should have a plan";
    *version = plan ? plan->version() : 0;
    EXPECT_GT(plan ? plan->effective_step() : 0, 4700u);
    return step;
  }

  PacerdHarness h_{{.policy = "dedicated-1s"}};  // 1 s windows, plans after 2 slow of 3
  std::string run1_id_;
  std::vector<std::unique_ptr<ScriptedWorker>> workers_;
  std::vector<BatchPlanCommand> received_;
  std::vector<std::pair<std::string, BatchPlanCommand>> received_by_;  // (worker, command)
  int slow_ = 2;
};

TEST_F(RunLifecycleTest, AfterEveryWorkerWasGoneTheNextRunsPlanIsScheduledInItsOwnSteps) {
  uint64_t v1 = 0;
  const uint64_t end1 = FirstRun(&v1);
  ASSERT_GT(v1, 0u);
  const uint64_t gen1 = h_->reconciler()->Run().first;
  // The script ends; a minute later it is run again.
  ASSERT_NO_FATAL_FAILURE(RelaunchAfter(60'000, 1000));
  EXPECT_EQ(h_->reconciler()->Run().first, gen1 + 1);
  EXPECT_FALSE(h_->reconciler()->PlanFor("w0").has_value()) << "run 1's plan withdrawn";
  bool audited = false;
  const ListActionsResponse actions = h_.Actions();
  for (const auto& a : actions.actions()) {
    audited = audited || a.reason().find("withdrawn") != std::string::npos;
  }
  EXPECT_TRUE(audited) << "the withdrawal is in the audit trail";
  ExpectSecondRunPlanApplies(v1, end1);
}

TEST_F(RunLifecycleTest, TheNextRunsFirstPlanFollowsItsOwnStragglerNotTheLastRunsOne) {
  uint64_t v1 = 0;
  FirstRun(&v1);  // w2 slow
  ASSERT_GT(v1, 0u);
  const uint64_t gen1 = h_->reconciler()->Run().first;
  // Run again later; the new processes register, then take two seconds to start up (a
  // trainer importing its framework and building its model) before their first step. The
  // controller reconciles meanwhile, on whatever speeds the monitor holds.
  ASSERT_NO_FATAL_FAILURE(RelaunchAfter(5'500, 100));
  ASSERT_EQ(h_->reconciler()->Run().first, gen1 + 1);
  for (int s = 0; s < 20; ++s) h_.Advance(100);
  slow_ = 0;  // this run's straggler is w0; w2 is as fast as w1
  received_by_.clear();
  uint64_t step = 0;
  ASSERT_NO_FATAL_FAILURE(Train(150, &step));
  // The first plan of run 2, as each worker got it.
  uint64_t first = 0;
  std::map<std::string, uint32_t> samples;
  for (const auto& [worker, cmd] : received_by_) {
    if (cmd.version() <= v1) continue;
    if (first == 0) first = cmd.version();
    if (cmd.version() == first) samples[worker] = static_cast<uint32_t>(cmd.samples());
  }
  ASSERT_GT(first, 0u) << "run 2 got no plan";
  ASSERT_EQ(samples.size(), static_cast<size_t>(kWorkers));
  EXPECT_LT(samples["w0"], samples["w1"]) << "run 2's first plan lightens its own straggler";
  EXPECT_GE(samples["w2"], samples["w1"]) << "not the last run's straggler (w2 is fast now)";
  EXPECT_EQ(h_->reconciler()->Run().first, gen1 + 1);
}

TEST_F(RunLifecycleTest, ARelaunchWithinTheGapIsSeenByTheStepsGoingBack) {
  uint64_t v1 = 0;
  const uint64_t end1 = FirstRun(&v1);
  ASSERT_GT(v1, 0u);
  const uint64_t gen1 = h_->reconciler()->Run().first;
  // Relaunched at once: run 1's workers were heard a moment ago, so only the steps tell.
  ASSERT_NO_FATAL_FAILURE(RelaunchAfter(200, 200));
  EXPECT_EQ(h_->reconciler()->Run().first, gen1) << "not yet: others were just heard";
  ExpectSecondRunPlanApplies(v1, end1);
  EXPECT_EQ(h_->reconciler()->Run().first, gen1 + 1);
}

TEST_F(RunLifecycleTest, ARestartedRankGetsTheRunsPlanOnceAPeerStepsOn) {
  uint64_t v1 = 0;
  const uint64_t end1 = FirstRun(&v1);
  ASSERT_GT(v1, 0u);
  const uint64_t gen1 = h_->reconciler()->Run().first;
  // w1's process crashes and is started again, resuming from an earlier checkpoint; its peers
  // live on. Until one of them steps on, pacerd cannot tell this from the first rank of a
  // relaunched job, so w1 gets no plan yet.
  ScriptedWorker::Options o;
  o.id = "w1";
  o.node = "n1";
  o.batch = kBatch;
  workers_[1] = std::make_unique<ScriptedWorker>(h_, o);
  ASSERT_TRUE(workers_[1]->Connect().ok());
  workers_[1]->set_step(end1 - 40);
  h_.Advance(100);
  auto first = workers_[1]->Heartbeat();
  ASSERT_TRUE(first.ok()) << first.status();
  for (const auto& cmd : first->commands()) EXPECT_FALSE(cmd.has_batch_plan()) << "held back: not yet known to be of run 1";
  // w0's next heartbeat shows the run going on: same run, and w1 gets its plan.
  h_.Advance(100);
  ASSERT_TRUE(workers_[0]->Heartbeat().ok());
  h_.Advance(100);
  auto second = workers_[1]->Heartbeat();
  ASSERT_TRUE(second.ok()) << second.status();
  bool got = false;
  for (const auto& cmd : second->commands()) got = got || (cmd.has_batch_plan() && cmd.batch_plan().version() == v1);
  EXPECT_TRUE(got) << "the restarted rank rejoins its run with the plan in force";
  EXPECT_EQ(h_->reconciler()->Run().first, gen1);
}

TEST_F(RunLifecycleTest, RunIdsDecideAndARestartedRankRejoinsItsRun) {
  run1_id_ = "job-a";
  uint64_t v1 = 0;
  const uint64_t end1 = FirstRun(&v1);
  ASSERT_GT(v1, 0u);
  const uint64_t gen1 = h_->reconciler()->Run().first;
  // One rank of run 1 restarts (same run id): same run, the plan stays.
  {
    auto sharding = ShardingService::NewStub(h_.channel());
    grpc::ClientContext ctx;
    AttachToken(&ctx, h_.job_token());
    RegisterWorkerRequest req;
    req.set_worker_id("w1");
    req.set_run_id("job-a");
    RegisterWorkerResponse resp;
    ASSERT_TRUE(sharding->RegisterWorker(&ctx, req, &resp).ok());
  }
  EXPECT_EQ(h_->reconciler()->Run().first, gen1);
  EXPECT_TRUE(h_->reconciler()->PlanFor("w0").has_value());
  // A new run id: a new run at once, although run 1's workers were just heard.
  workers_.clear();
  ASSERT_NO_FATAL_FAILURE(StartWorkers("job-b"));
  EXPECT_EQ(h_->reconciler()->Run().first, gen1 + 1);
  EXPECT_FALSE(h_->reconciler()->PlanFor("w0").has_value());
  ExpectSecondRunPlanApplies(v1, end1);
}

}  // namespace
}  // namespace pacer
