// pacerd's control loop end to end, in process on a simulated clock: workers report steps to
// the monitor, one of them at half speed; the dedicated policy's reconcile produces a batch
// plan that reaches every worker in its heartbeat reply, proportional to speed, with the
// global batch kept and an effective step in the future. Real gRPC on loopback, real RocksDB.
#include <gtest/gtest.h>

#include <fstream>

#include "cmd/pacerd/pacerd.h"
#include "common/auth.h"
#include "proto/pacer/controller.grpc.pb.h"
#include "proto/pacer/monitor.grpc.pb.h"
#include "tests/testing/test_util.h"
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

TEST(ControlLoopTest, PersistentStragglerGetsASmallerBatchThroughHeartbeats) {
  testing::TempDir dir;
  const std::string policy_path = dir.Sub("policy.yaml");
  std::ofstream(policy_path) << kPolicy;
  SimulatedClock clock(RealClock::Get()->NowMs());
  PacerdOptions o;
  o.data_dir = dir.Sub("data");
  o.listen = "127.0.0.1:0";
  o.metrics_listen = "";
  o.policy_file = policy_path;
  o.reconciler.interval_ms = 1000;
  auto pacerd = Pacerd::Start(o, &clock);
  ASSERT_TRUE(pacerd.ok()) << pacerd.status();
  Pacerd& d = **pacerd;

  auto channel = grpc::CreateChannel(d.address(), grpc::InsecureChannelCredentials());
  auto monitor = Monitor::NewStub(channel);
  std::vector<std::unique_ptr<ShardingClient>> clients;
  constexpr int kWorkers = 4;
  constexpr uint32_t kBatch = 64;
  for (int i = 0; i < kWorkers; ++i) {
    ShardingClientOptions co;
    co.address = d.address();
    co.token = d.job_token();
    co.worker_id = "w" + std::to_string(i);
    co.node = "n" + std::to_string(i);
    auto c = ShardingClient::Connect(co);
    ASSERT_TRUE(c.ok()) << c.status();
    clients.push_back(std::move(*c));
    grpc::ClientContext ctx;
    AttachToken(&ctx, d.job_token());
    MonitorRegisterRequest req;
    req.set_worker_id(co.worker_id);
    req.set_node(co.node);
    MonitorRegisterResponse resp;
    ASSERT_TRUE(monitor->RegisterWorker(&ctx, req, &resp).ok());
  }
  // 12 simulated seconds of 10 steps/s; w3 computes at half speed. Sync all-reduce: every
  // wall step equals the slowest one's, so only compute time tells who is slow.
  uint64_t step = 0, step_at_plan = 0, effective_at_plan = 0;
  for (int tick = 0; tick < 120; ++tick) {
    clock.AdvanceMs(100);
    ++step;
    ReportStepsRequest req;
    for (int i = 0; i < kWorkers; ++i) {
      StepReport* r = req.add_steps();
      r->set_worker_id("w" + std::to_string(i));
      r->set_step(step);
      r->set_local_batch(kBatch);
      r->set_samples(kBatch);
      r->set_compute_s(i == 3 ? 0.08 : 0.04);
      r->set_comm_s(i == 3 ? 0.01 : 0.05);
      r->set_wall_s(0.09);
      r->set_time_ms(clock.NowMs());
    }
    grpc::ClientContext ctx;
    AttachToken(&ctx, d.job_token());
    ReportStepsResponse resp;
    ASSERT_TRUE(monitor->ReportSteps(&ctx, req, &resp).ok());
    if (tick % 10 == 9) {
      for (auto& c : clients) {
        HeartbeatRequest hb;
        hb.set_step(step);
        ASSERT_TRUE(c->Heartbeat(hb).ok());
      }
      d.monitor()->Tick();
      d.reconciler()->MaybeReconcile();
      if (auto plan = d.reconciler()->PlanFor("w0"); plan && step_at_plan == 0) {
        step_at_plan = step;  // the newest step any worker had reported when the plan was made
        effective_at_plan = plan->effective_step();
      }
    }
  }
  // Every worker's next heartbeat carries the same plan version; the straggler's share is
  // about half of the others', the sum is the global batch, and it applies in the future.
  std::map<std::string, BatchPlanCommand> got;
  for (auto& c : clients) {
    HeartbeatRequest hb;
    hb.set_step(step);
    auto r = c->Heartbeat(hb);
    ASSERT_TRUE(r.ok()) << r.status();
    for (const auto& cmd : r->commands()) {
      if (cmd.has_batch_plan()) got[c->worker_id()] = cmd.batch_plan();
    }
  }
  ASSERT_EQ(got.size(), static_cast<size_t>(kWorkers)) << "every worker gets the plan";
  uint64_t total = 0;
  for (const auto& [w, p] : got) {
    EXPECT_EQ(p.version(), got.begin()->second.version());
    EXPECT_EQ(p.effective_step(), got.begin()->second.effective_step());
    EXPECT_EQ(p.effective_step(), effective_at_plan);
    EXPECT_EQ(p.global_batch(), kWorkers * kBatch);
    total += p.samples();
  }
  EXPECT_EQ(total, kWorkers * kBatch);
  ASSERT_GT(step_at_plan, 0u);
  EXPECT_GT(effective_at_plan, step_at_plan) << "the plan must apply in the future";
  const double ratio = static_cast<double>(got["w3"].samples()) / got["w0"].samples();
  EXPECT_NEAR(ratio, 0.5, 0.12) << "w3 " << got["w3"].samples() << " vs w0 " << got["w0"].samples();

  // A worker that reports the plan's version gets no command again.
  HeartbeatRequest hb;
  hb.set_step(step);
  hb.set_plan_version(got["w0"].version());
  auto again = clients[0]->Heartbeat(hb);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->commands_size(), 0);

  // The decision is audited with its reason and where it went.
  auto ctl = ControllerService::NewStub(channel);
  grpc::ClientContext ctx;
  AttachToken(&ctx, d.job_token());
  ListActionsResponse actions;
  ASSERT_TRUE(ctl->ListActions(&ctx, ListActionsRequest(), &actions).ok());
  bool found = false;
  for (const auto& a : actions.actions()) {
    if (a.kind() == "ADJUST_BS" && a.outcome() == "executed") {
      found = true;
      EXPECT_FALSE(a.reason().empty());
      EXPECT_GT(a.predicted_gain(), 0.0);
      EXPECT_EQ(a.dispatch(), "plan sent in heartbeat replies");
    }
  }
  EXPECT_TRUE(found);
}

}  // namespace
}  // namespace pacer
