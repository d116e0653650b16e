// pacerd's control loop end to end, in process on a simulated clock: workers report steps to
// the monitor, one of them at half speed; the dedicated policy's reconcile produces a batch
// plan that reaches every worker in its heartbeat reply, proportional to speed, with the
// global batch kept and an effective step in the future. Real gRPC on loopback, real RocksDB.
#include <gtest/gtest.h>

#include <fstream>
#include <set>

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

struct Job {
  std::unique_ptr<Pacerd> pacerd;
  std::shared_ptr<grpc::Channel> channel;
  std::vector<std::unique_ptr<ShardingClient>> clients;
  uint64_t step = 0, step_at_plan = 0, effective_at_plan = 0;
};

constexpr int kWorkers = 4;
constexpr uint32_t kBatch = 64;

PacerdOptions OptionsFor(const testing::TempDir& dir, const std::string& policy_path) {
  PacerdOptions o;
  o.data_dir = dir.Sub("data");
  o.listen = "127.0.0.1:0";
  o.metrics_listen = "";
  o.policy_file = policy_path;
  o.reconciler.interval_ms = 1000;
  o.housekeeping = false;  // the scenario ticks the monitor and reconciles on its clock
  return o;
}

// Starts pacerd, connects kWorkers workers and plays 12 simulated seconds of 10 steps/s in
// which w3 computes at half speed, heartbeating and reconciling once a second.
void RunStragglerScenario(const PacerdOptions& o, SimulatedClock* clock, Job* job) {
  auto pacerd = Pacerd::Start(o, clock);
  ASSERT_TRUE(pacerd.ok()) << pacerd.status();
  job->pacerd = std::move(*pacerd);
  Pacerd& d = *job->pacerd;
  job->channel = grpc::CreateChannel(d.address(), grpc::InsecureChannelCredentials());
  auto monitor = Monitor::NewStub(job->channel);
  for (int i = 0; i < kWorkers; ++i) {
    ShardingClientOptions co;
    co.address = d.address();
    co.token = d.job_token();
    co.worker_id = "w" + std::to_string(i);
    co.node = "n" + std::to_string(i);
    auto c = ShardingClient::Connect(co);
    ASSERT_TRUE(c.ok()) << c.status();
    job->clients.push_back(std::move(*c));
    grpc::ClientContext ctx;
    AttachToken(&ctx, d.job_token());
    MonitorRegisterRequest req;
    req.set_worker_id(co.worker_id);
    req.set_node(co.node);
    MonitorRegisterResponse resp;
    ASSERT_TRUE(monitor->RegisterWorker(&ctx, req, &resp).ok());
  }
  // Sync all-reduce: every wall step equals the slowest one's, so only compute time tells who
  // is slow.
  for (int tick = 0; tick < 120; ++tick) {
    clock->AdvanceMs(100);
    ++job->step;
    ReportStepsRequest req;
    for (int i = 0; i < kWorkers; ++i) {
      StepReport* r = req.add_steps();
      r->set_worker_id("w" + std::to_string(i));
      r->set_step(job->step);
      r->set_local_batch(kBatch);
      r->set_samples(kBatch);
      r->set_compute_s(i == 3 ? 0.08 : 0.04);
      r->set_comm_s(i == 3 ? 0.01 : 0.05);
      r->set_wall_s(0.09);
      r->set_time_ms(clock->NowMs());
    }
    grpc::ClientContext ctx;
    AttachToken(&ctx, d.job_token());
    ReportStepsResponse resp;
    ASSERT_TRUE(monitor->ReportSteps(&ctx, req, &resp).ok());
    if (tick % 10 == 9) {
      for (auto& c : job->clients) {
        HeartbeatRequest hb;
        hb.set_step(job->step);
        ASSERT_TRUE(c->Heartbeat(hb).ok());
      }
      d.monitor()->Tick();
      d.reconciler()->MaybeReconcile();
      if (auto plan = d.reconciler()->PlanFor("w0"); plan && job->step_at_plan == 0) {
        job->step_at_plan = job->step;  // the newest step any worker had reported when the plan was made
        job->effective_at_plan = plan->effective_step();
      }
    }
  }
}

// Each worker's next heartbeat: the batch plan command it carries, if any.
std::map<std::string, BatchPlanCommand> PlansInHeartbeats(Job& job, uint64_t plan_version_held = 0) {
  std::map<std::string, BatchPlanCommand> got;
  for (auto& c : job.clients) {
    HeartbeatRequest hb;
    hb.set_step(job.step);
    hb.set_plan_version(plan_version_held);
    auto r = c->Heartbeat(hb);
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) continue;
    for (const auto& cmd : r->commands()) {
      if (cmd.has_batch_plan()) got[c->worker_id()] = cmd.batch_plan();
    }
  }
  return got;
}

ListActionsResponse Actions(const Job& job) {
  auto ctl = ControllerService::NewStub(job.channel);
  grpc::ClientContext ctx;
  AttachToken(&ctx, job.pacerd->job_token());
  ListActionsResponse actions;
  EXPECT_TRUE(ctl->ListActions(&ctx, ListActionsRequest(), &actions).ok());
  return actions;
}

const ActionRecord* ExecutedPlan(const ListActionsResponse& actions) {
  for (const auto& a : actions.actions()) {
    if (a.kind() == "ADJUST_BS" && a.outcome() == "executed") return &a;
  }
  return nullptr;
}

TEST(ControlLoopTest, PersistentStragglerGetsASmallerBatchThroughHeartbeats) {
  testing::TempDir dir;
  const std::string policy_path = dir.Sub("policy.yaml");
  std::ofstream(policy_path) << kPolicy;
  SimulatedClock clock(RealClock::Get()->NowMs());
  Job job;
  ASSERT_NO_FATAL_FAILURE(RunStragglerScenario(OptionsFor(dir, policy_path), &clock, &job));

  // Every worker's next heartbeat carries the same plan version; the straggler's share is
  // about half of the others', the sum is the global batch, and it applies in the future.
  std::map<std::string, BatchPlanCommand> got = PlansInHeartbeats(job);
  ASSERT_EQ(got.size(), static_cast<size_t>(kWorkers)) << "every worker gets the plan";
  uint64_t total = 0;
  for (const auto& [w, p] : got) {
    EXPECT_EQ(p.version(), got.begin()->second.version());
    EXPECT_EQ(p.effective_step(), got.begin()->second.effective_step());
    EXPECT_EQ(p.effective_step(), job.effective_at_plan);
    EXPECT_EQ(p.global_batch(), kWorkers * kBatch);
    total += p.samples();
  }
  EXPECT_EQ(total, kWorkers * kBatch);
  ASSERT_GT(job.step_at_plan, 0u);
  EXPECT_GT(job.effective_at_plan, job.step_at_plan) << "the plan must apply in the future";
  const double ratio = static_cast<double>(got["w3"].samples()) / got["w0"].samples();
  EXPECT_NEAR(ratio, 0.5, 0.12) << "w3 " << got["w3"].samples() << " vs w0 " << got["w0"].samples();

  // A worker that reports the plan's version gets no command again.
  HeartbeatRequest hb;
  hb.set_step(job.step);
  hb.set_plan_version(got["w0"].version());
  auto again = job.clients[0]->Heartbeat(hb);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->commands_size(), 0);

  // The decision is audited with its reason and where it went.
  const ListActionsResponse actions = Actions(job);
  const ActionRecord* plan = ExecutedPlan(actions);
  ASSERT_NE(plan, nullptr);
  EXPECT_FALSE(plan->reason().empty());
  EXPECT_GT(plan->predicted_gain(), 0.0);
  EXPECT_EQ(plan->dispatch(), "plan sent in heartbeat replies");
}

// The controller's state is durable: after pacerd stops (or crashes: every decision is synced
// before it is dispatched) and starts again on the same data dir, the audit trail, the plan in
// force (same version, re-sent to workers that do not hold it), and the policy applied with
// `pacerctl policy apply` are still there. Started with an edited --policy file, pacerd uses
// that file instead of the applied policy.
TEST(ControlLoopTest, ControllerStateSurvivesARestart) {
  testing::TempDir dir;
  const std::string policy_path = dir.Sub("policy.yaml");
  std::ofstream(policy_path) << kPolicy;
  SimulatedClock clock(RealClock::Get()->NowMs());
  const PacerdOptions options = OptionsFor(dir, policy_path);
  Job job;
  ASSERT_NO_FATAL_FAILURE(RunStragglerScenario(options, &clock, &job));
  const ListActionsResponse before = Actions(job);
  const ActionRecord* plan_before = ExecutedPlan(before);
  ASSERT_NE(plan_before, nullptr);
  const ActionRecord plan_record = *plan_before;
  ASSERT_GT(before.plan_version(), 0u);
  const BatchPlanCommand w3_before = *job.pacerd->reconciler()->PlanFor("w3");

  // Hot reload of a dry-run variant through the admin RPC.
  std::string applied = kPolicy;
  applied.replace(applied.find("name: test-dd"), 13, "name: applied-dd");
  {
    auto ctl = ControllerService::NewStub(job.channel);
    grpc::ClientContext ctx;
    AttachToken(&ctx, job.pacerd->admin_token());
    ApplyPolicyRequest req;
    req.set_yaml(applied);
    req.set_file_name("applied.yaml");
    ApplyPolicyResponse resp;
    grpc::Status s = ctl->ApplyPolicy(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(resp.policy_name(), "applied-dd");
    // A policy that changes the monitor's window needs a restart: refused, nothing changes.
    std::string rewindowed = applied;
    rewindowed.replace(rewindowed.find("window_s: 1"), 11, "window_s: 2");
    rewindowed.replace(rewindowed.find("name: applied-dd"), 16, "name: windowed-dd");
    grpc::ClientContext ctx2;
    AttachToken(&ctx2, job.pacerd->admin_token());
    req.set_yaml(rewindowed);
    grpc::Status refused = ctl->ApplyPolicy(&ctx2, req, &resp);
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << refused.error_message();
    EXPECT_NE(refused.error_message().find("restart"), std::string::npos) << refused.error_message();
    EXPECT_EQ(Actions(job).policy_name(), "applied-dd");
    // New thresholds reach the monitor at once.
    std::string stricter = applied;
    stricter.replace(stricter.find("straggler_threshold: 0.85"), 25, "straggler_threshold: 0.80");
    grpc::ClientContext ctx3;
    AttachToken(&ctx3, job.pacerd->admin_token());
    req.set_yaml(stricter);
    ASSERT_TRUE(ctl->ApplyPolicy(&ctx3, req, &resp).ok());
    EXPECT_DOUBLE_EQ(job.pacerd->monitor()->Options().straggler_threshold, 0.80);
  }
  job.clients.clear();
  job.pacerd.reset();

  // Same data dir, same --policy file.
  Job again;
  auto restarted = Pacerd::Start(options, &clock);
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  again.pacerd = std::move(*restarted);
  again.channel = grpc::CreateChannel(again.pacerd->address(), grpc::InsecureChannelCredentials());
  const ListActionsResponse after = Actions(again);
  EXPECT_EQ(after.plan_version(), before.plan_version());
  EXPECT_EQ(after.policy_name(), "applied-dd") << "the applied policy outlives the restart";
  const ActionRecord* plan_after = nullptr;
  for (const auto& a : after.actions()) {
    if (a.id() == plan_record.id()) plan_after = &a;
  }
  ASSERT_NE(plan_after, nullptr) << "the plan's audit record is still listed";
  EXPECT_EQ(plan_after->kind(), "ADJUST_BS");
  EXPECT_EQ(plan_after->time_ms(), plan_record.time_ms());
  EXPECT_EQ(plan_after->reason(), plan_record.reason());
  EXPECT_EQ(plan_after->detail(), plan_record.detail());
  EXPECT_EQ(plan_after->dispatch(), plan_record.dispatch());
  // Ids stay unique and keep growing: the restore of the applied policy is a new record.
  std::set<uint64_t> ids;
  uint64_t newest_policy_id = 0;
  for (const auto& a : after.actions()) {
    EXPECT_TRUE(ids.insert(a.id()).second) << "duplicate audit id " << a.id();
    if (a.kind() == "POLICY") newest_policy_id = std::max<uint64_t>(newest_policy_id, a.id());
  }
  EXPECT_GT(newest_policy_id, plan_record.id()) << "policy changes are audited, after the plan";
  // A worker that does not hold the plan gets it again, same version and batch.
  auto w3 = again.pacerd->reconciler()->PlanFor("w3");
  ASSERT_TRUE(w3.has_value());
  EXPECT_EQ(w3->version(), w3_before.version());
  EXPECT_EQ(w3->samples(), w3_before.samples());
  EXPECT_EQ(w3->effective_step(), w3_before.effective_step());
  again.pacerd.reset();

  // An edited --policy file wins over the policy applied before.
  std::string edited = kPolicy;
  edited.replace(edited.find("name: test-dd"), 13, "name: edited-dd");
  std::ofstream(policy_path, std::ios::trunc) << edited;
  Job third;
  auto third_start = Pacerd::Start(options, &clock);
  ASSERT_TRUE(third_start.ok()) << third_start.status();
  third.pacerd = std::move(*third_start);
  third.channel = grpc::CreateChannel(third.pacerd->address(), grpc::InsecureChannelCredentials());
  const ListActionsResponse third_actions = Actions(third);
  EXPECT_EQ(third_actions.policy_name(), "edited-dd");
  EXPECT_EQ(third_actions.plan_version(), before.plan_version()) << "the plan version survives";
}

}  // namespace
}  // namespace pacer
