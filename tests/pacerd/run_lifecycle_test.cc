// Two consecutive runs of a job against one pacerd (issue 13, "Job lifecycle"): run 1 ends at a
// high step with a batch plan in force; run 2's workers count from step 0. Its plan must be
// scheduled within run 2's steps and take effect, not at a step of run 1 (the bug: "@step 4872"
// in a run that ends at step 2100, never applied, silently). In process on a simulated clock,
// real gRPC on loopback, real RocksDB; the workers are fake (step reports and heartbeats), and
// a worker's LocalBatchPlan (the SDK's) decides whether a plan it received applied.
#include <gtest/gtest.h>

#include <fstream>

#include "cmd/pacerd/pacerd.h"
#include "common/auth.h"
#include "proto/pacer/controller.grpc.pb.h"
#include "proto/pacer/monitor.grpc.pb.h"
#include "tests/testing/test_util.h"
#include "worker_sdk/batch_plan.h"
#include "worker_sdk/sharding_client.h"

namespace pacer {
namespace {

constexpr char kPolicy[] = R"(version: 1
name: test-dd
policy: dedicated
detection:
  straggler_threshold: 0.85
  leader_threshold: 1.15
  window_s: 1
  persistent_windows: 2
  history_windows: 3
  min_confidence: 0.1
actions:
  adjust_batch:
    enabled: true
    accumulation: false
    hysteresis: 0.1
    lead_heartbeats: 3
    min_steps_ahead: 2
  restart:
    enabled: false
safety:
  min_gain: 0.01
  adjust_batch_cooldown_s: 1
)";

constexpr int kWorkers = 3;
constexpr uint32_t kBatch = 64;

class RunLifecycleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    policy_path_ = dir_.Sub("policy.yaml");
    std::ofstream(policy_path_) << kPolicy;
    PacerdOptions o;
    o.data_dir = dir_.Sub("data");
    o.listen = "127.0.0.1:0";
    o.metrics_listen = "";
    o.policy_file = policy_path_;
    o.reconciler.interval_ms = 1000;
    o.housekeeping = false;  // the test ticks the monitor and reconciles on its clock
    auto d = Pacerd::Start(o, &clock_);
    ASSERT_TRUE(d.ok()) << d.status();
    pacerd_ = std::move(*d);
    channel_ = grpc::CreateChannel(pacerd_->address(), grpc::InsecureChannelCredentials());
    monitor_ = Monitor::NewStub(channel_);
  }

  // A new run: kWorkers fresh processes register (sharding, with `run_id`, and monitor).
  void StartWorkers(const std::string& run_id = "") {
    clients_.clear();
    plans_.clear();
    auto sharding = ShardingService::NewStub(channel_);
    for (int i = 0; i < kWorkers; ++i) {
      const std::string id = "w" + std::to_string(i);
      if (!run_id.empty()) {
        // The SDK sends run_id in RegisterWorker; ShardingClient registers again below (same
        // run: the id rejoins it).
        grpc::ClientContext ctx;
        AttachToken(&ctx, pacerd_->job_token());
        RegisterWorkerRequest req;
        req.set_worker_id(id);
        req.set_run_id(run_id);
        RegisterWorkerResponse resp;
        ASSERT_TRUE(sharding->RegisterWorker(&ctx, req, &resp).ok());
      }
      ShardingClientOptions co;
      co.address = pacerd_->address();
      co.token = pacerd_->job_token();
      co.worker_id = id;
      co.node = "n" + std::to_string(i);
      auto c = ShardingClient::Connect(co);
      ASSERT_TRUE(c.ok()) << c.status();
      clients_.push_back(std::move(*c));
      plans_.push_back(std::make_unique<LocalBatchPlan>(LocalBatch{0, 0, kBatch, 1, kBatch * kWorkers}));
      grpc::ClientContext ctx;
      AttachToken(&ctx, pacerd_->job_token());
      MonitorRegisterRequest req;
      req.set_worker_id(id);
      req.set_node(co.node);
      MonitorRegisterResponse resp;
      ASSERT_TRUE(monitor_->RegisterWorker(&ctx, req, &resp).ok());
    }
  }

  // `ticks` steps of 100 ms from `step` on, w2 computing at half speed; a heartbeat, a monitor
  // tick and a reconcile every second. Each worker's LocalBatchPlan is offered what its
  // heartbeat reply carries and asked for every step's batch, as the SDK does.
  void Train(int ticks, uint64_t* step) {
    for (int tick = 0; tick < ticks; ++tick) {
      clock_.AdvanceMs(100);
      ++*step;
      ReportStepsRequest req;
      for (int i = 0; i < kWorkers; ++i) {
        const LocalBatch& b = plans_[i]->ForStep(*step);
        StepReport* r = req.add_steps();
        r->set_worker_id("w" + std::to_string(i));
        r->set_step(*step);
        r->set_local_batch(b.micro_batch);
        r->set_samples(b.micro_batch);
        r->set_compute_s((i == 2 ? 0.0025 : 0.00125) * b.micro_batch);
        r->set_comm_s(0.01);
        r->set_wall_s(0.09);
        r->set_time_ms(clock_.NowMs());
      }
      grpc::ClientContext ctx;
      AttachToken(&ctx, pacerd_->job_token());
      ReportStepsResponse resp;
      ASSERT_TRUE(monitor_->ReportSteps(&ctx, req, &resp).ok());
      if (tick % 10 == 9) {
        for (int i = 0; i < kWorkers; ++i) {
          HeartbeatRequest hb;
          hb.set_step(*step);
          hb.set_plan_version(plans_[i]->newest_version());
          auto r = clients_[i]->Heartbeat(hb);
          ASSERT_TRUE(r.ok()) << r.status();
          for (const auto& cmd : r->commands()) {
            if (cmd.has_batch_plan()) {
              plans_[i]->Offer(cmd.batch_plan());
              received_.push_back(cmd.batch_plan());
            }
          }
        }
        pacerd_->monitor()->Tick();
        pacerd_->reconciler()->MaybeReconcile();
      }
    }
  }

  ListActionsResponse Actions() {
    auto ctl = ControllerService::NewStub(channel_);
    grpc::ClientContext ctx;
    AttachToken(&ctx, pacerd_->job_token());
    ListActionsResponse actions;
    EXPECT_TRUE(ctl->ListActions(&ctx, ListActionsRequest(), &actions).ok());
    return actions;
  }

  // Plays run 2 from step 0 and checks its plan: above run 1's version, scheduled within run
  // 2's steps, applied by every worker, the straggler's batch the smaller.
  // `strict`: not even before the new run is known may a plan of run 1 reach run 2 (a relaunch
  // within the gap is known only once every worker reported steps below run 1's; what run 1's
  // plan it got until then is superseded, as the SDK keeps the newest version whose step came).
  void ExpectSecondRunPlanApplies(uint64_t run1_version, uint64_t run1_end, bool strict = true) {
    received_.clear();
    uint64_t step = 0;
    ASSERT_NO_FATAL_FAILURE(Train(150, &step));
    int of_run2 = 0;
    for (const auto& p : received_) {
      if (p.version() <= run1_version) {
        EXPECT_FALSE(strict) << "a plan of run 1 was sent to run 2: v" << p.version();
        continue;
      }
      ++of_run2;
      EXPECT_LT(p.effective_step(), step) << "scheduled past run 2's steps (run 1 ended at "
                                          << run1_end << ")";
    }
    ASSERT_GT(of_run2, 0) << "run 2 got no plan of its own";
    for (int i = 0; i < kWorkers; ++i) {
      const LocalBatch& b = plans_[i]->ForStep(step);
      EXPECT_EQ(b.version, received_.back().version()) << "w" << i << " did not apply the plan";
    }
    EXPECT_LT(plans_[2]->ForStep(step).micro_batch, plans_[0]->ForStep(step).micro_batch);
    EXPECT_EQ(pacerd_->reconciler()->Run().second, static_cast<int64_t>(step));
  }

  // Run 1: from a high step (a long run), until it has a plan in force.
  uint64_t FirstRun(uint64_t* version) {
    StartWorkers(run1_id_);
    uint64_t step = 4700;
    Train(150, &step);
    auto plan = pacerd_->reconciler()->PlanFor("w0");
    EXPECT_TRUE(plan.has_value()) << "run 1 should have a plan";
    *version = plan ? plan->version() : 0;
    EXPECT_GT(plan ? plan->effective_step() : 0, 4700u);
    return step;
  }

  testing::TempDir dir_;
  std::string policy_path_;
  std::string run1_id_;
  SimulatedClock clock_{RealClock::Get()->NowMs()};
  std::unique_ptr<Pacerd> pacerd_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<Monitor::Stub> monitor_;
  std::vector<std::unique_ptr<ShardingClient>> clients_;
  std::vector<std::unique_ptr<LocalBatchPlan>> plans_;
  std::vector<BatchPlanCommand> received_;
};

TEST_F(RunLifecycleTest, AfterEveryWorkerWasGoneTheNextRunsPlanIsScheduledInItsOwnSteps) {
  uint64_t v1 = 0;
  const uint64_t end1 = FirstRun(&v1);
  ASSERT_GT(v1, 0u);
  const uint64_t gen1 = pacerd_->reconciler()->Run().first;
  // The script ends; a minute later it is run again: every worker registers anew.
  clients_.clear();
  clock_.AdvanceMs(60'000);
  ASSERT_NO_FATAL_FAILURE(StartWorkers());
  EXPECT_EQ(pacerd_->reconciler()->Run().first, gen1 + 1);
  EXPECT_FALSE(pacerd_->reconciler()->PlanFor("w0").has_value()) << "run 1's plan withdrawn";
  bool audited = false;
  const ListActionsResponse actions = Actions();
  for (const auto& a : actions.actions()) {
    audited = audited || a.reason().find("withdrawn") != std::string::npos;
  }
  EXPECT_TRUE(audited) << "the withdrawal is in the audit trail";
  ExpectSecondRunPlanApplies(v1, end1);
}

TEST_F(RunLifecycleTest, ARelaunchWithinTheGapIsSeenByTheStepsGoingBack) {
  uint64_t v1 = 0;
  const uint64_t end1 = FirstRun(&v1);
  ASSERT_GT(v1, 0u);
  const uint64_t gen1 = pacerd_->reconciler()->Run().first;
  // Relaunched at once: run 1's workers were heard a moment ago, so only the steps tell.
  clients_.clear();
  clock_.AdvanceMs(200);
  ASSERT_NO_FATAL_FAILURE(StartWorkers());
  EXPECT_EQ(pacerd_->reconciler()->Run().first, gen1) << "not yet: others were just heard";
  ExpectSecondRunPlanApplies(v1, end1, /*strict=*/false);
  EXPECT_EQ(pacerd_->reconciler()->Run().first, gen1 + 1);
}

TEST_F(RunLifecycleTest, RunIdsDecideAndARestartedRankRejoinsItsRun) {
  run1_id_ = "job-a";
  uint64_t v1 = 0;
  const uint64_t end1 = FirstRun(&v1);
  ASSERT_GT(v1, 0u);
  const uint64_t gen1 = pacerd_->reconciler()->Run().first;
  // One rank of run 1 restarts (same run id): same run, the plan stays.
  {
    auto sharding = ShardingService::NewStub(channel_);
    grpc::ClientContext ctx;
    AttachToken(&ctx, pacerd_->job_token());
    RegisterWorkerRequest req;
    req.set_worker_id("w1");
    req.set_run_id("job-a");
    RegisterWorkerResponse resp;
    ASSERT_TRUE(sharding->RegisterWorker(&ctx, req, &resp).ok());
  }
  EXPECT_EQ(pacerd_->reconciler()->Run().first, gen1);
  EXPECT_TRUE(pacerd_->reconciler()->PlanFor("w0").has_value());
  // A new run id: a new run at once, although run 1's workers were just heard.
  clients_.clear();
  ASSERT_NO_FATAL_FAILURE(StartWorkers("job-b"));
  EXPECT_EQ(pacerd_->reconciler()->Run().first, gen1 + 1);
  EXPECT_FALSE(pacerd_->reconciler()->PlanFor("w0").has_value());
  ExpectSecondRunPlanApplies(v1, end1);
}

}  // namespace
}  // namespace pacer
