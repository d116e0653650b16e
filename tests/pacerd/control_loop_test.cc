// pacerd's control loop end to end, in process on a simulated clock (tests/testing/
// pacerd_harness.h): workers report steps to the monitor, one of them at half speed; the
// dedicated policy's reconcile produces a batch plan that reaches every worker in its heartbeat
// reply, proportional to speed, with the global batch kept and an effective step in the future.
// Real gRPC on loopback, real RocksDB, production's housekeeping step.
#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <thread>

#include "tests/testing/pacerd_harness.h"

namespace pacer {
namespace {

using testing::PacerdHarness;
using testing::ScriptedWorker;

constexpr int kWorkers = 4;
constexpr uint32_t kBatch = 64;

struct Job {
  explicit Job(PacerdHarness& h) : h(h) {}
  PacerdHarness& h;
  std::vector<std::unique_ptr<ScriptedWorker>> workers;
  uint64_t step = 0, step_at_plan = 0, effective_at_plan = 0;
};

// Connects kWorkers workers and plays 12 simulated seconds of 10 steps/s in which w3 computes
// at half speed, heartbeating once a second; the harness runs housekeeping every 100 ms.
void RunStragglerScenario(Job* job) {
  for (int i = 0; i < kWorkers; ++i) {
    ScriptedWorker::Options o;
    o.id = "w" + std::to_string(i);
    o.node = "n" + std::to_string(i);
    o.batch = kBatch;
    job->workers.push_back(std::make_unique<ScriptedWorker>(job->h, o));
    ASSERT_TRUE(job->workers.back()->Connect().ok());
  }
  // Sync all-reduce: every wall step equals the slowest one's, so only compute time tells who
  // is slow.
  for (int tick = 0; tick < 120; ++tick) {
    job->h.Advance(100);
    ++job->step;
    for (int i = 0; i < kWorkers; ++i) {
      ASSERT_TRUE(job->workers[i]->Step(i == 3 ? 0.08 : 0.04, 0.09, i == 3 ? 0.01 : 0.05).ok());
    }
    if (tick % 10 == 9) {
      for (auto& w : job->workers) {
        // The first plan is read from the reconciler, not applied, so heartbeats hold none.
        HeartbeatRequest hb;
        hb.set_step(w->step());
        ASSERT_TRUE(w->sharding().Heartbeat(hb).ok());
      }
      if (auto plan = job->h->reconciler()->PlanFor("w0"); plan && job->step_at_plan == 0) {
        job->step_at_plan = job->step;  // the newest step any worker had reported when the plan was made
        job->effective_at_plan = plan->effective_step();
      }
    }
  }
}

// Each worker's next heartbeat: the batch plan command it carries, if any.
std::map<std::string, BatchPlanCommand> PlansInHeartbeats(Job& job, uint64_t plan_version_held = 0) {
  std::map<std::string, BatchPlanCommand> got;
  for (auto& w : job.workers) {
    HeartbeatRequest hb;
    hb.set_step(job.step);
    hb.set_plan_version(plan_version_held);
    auto r = w->sharding().Heartbeat(hb);
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) continue;
    for (const auto& cmd : r->commands()) {
      if (cmd.has_batch_plan()) {
        got[w->id()] = cmd.batch_plan();
        EXPECT_FALSE(cmd.reason().empty()) << "a command says why it was sent";
      }
    }
  }
  return got;
}

const ActionRecord* ExecutedPlan(const ListActionsResponse& actions) {
  for (const auto& a : actions.actions()) {
    if (a.kind() == "ADJUST_BS" && a.outcome() == "executed") return &a;
  }
  return nullptr;
}

TEST(ControlLoopTest, PersistentStragglerGetsASmallerBatchThroughHeartbeats) {
  PacerdHarness h({.policy = "dedicated-1s"});
  ASSERT_TRUE(h.ok());
  Job job(h);
  ASSERT_NO_FATAL_FAILURE(RunStragglerScenario(&job));

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
  auto again = job.workers[0]->sharding().Heartbeat(hb);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->commands_size(), 0);

  // The decision is audited with its reason and where it went.
  const ListActionsResponse actions = h.Actions();
  const ActionRecord* plan = ExecutedPlan(actions);
  ASSERT_NE(plan, nullptr);
  EXPECT_FALSE(plan->reason().empty());
  EXPECT_GT(plan->predicted_gain(), 0.0);
  EXPECT_EQ(plan->dispatch(), "plan sent in heartbeat replies");
}

// A classification change is acted on at once: pacerd's housekeeping thread wakes and
// reconciles, rather than at its next round (up to a second later by default). Here its round
// is an hour and the reconcile interval too, so only the wake can produce the plan: the job
// runs on the real clock (the production thread), workers step every 50 ms of real time, one
// at half speed, and a plan must reach the reconciler within the deadline.
TEST(ControlLoopTest, AClassificationChangeIsReconciledAtOnce) {
  PacerdHarness h({.policy = "dedicated-1s",
                   .real_clock = true,
                   .reconcile_interval_ms = 3'600'000,
                   .adjust = [](PacerdOptions& o) { o.housekeeping_period_ms = 3'600'000; }});
  ASSERT_TRUE(h.ok());
  std::vector<std::unique_ptr<ScriptedWorker>> workers;
  for (int i = 0; i < kWorkers; ++i) {
    ScriptedWorker::Options o;
    o.id = "w" + std::to_string(i);
    o.node = "n" + std::to_string(i);
    o.batch = kBatch;
    workers.push_back(std::make_unique<ScriptedWorker>(h, o));
    ASSERT_TRUE(workers.back()->Connect().ok());
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  bool planned = false;
  for (int tick = 0; !planned && std::chrono::steady_clock::now() < deadline; ++tick) {
    for (int i = 0; i < kWorkers; ++i)
      ASSERT_TRUE(workers[i]->Step(i == 3 ? 0.08 : 0.04, 0.09, i == 3 ? 0.01 : 0.05).ok());
    if (tick % 10 == 9) {
      for (auto& w : workers) {
        HeartbeatRequest hb;
        hb.set_step(w->step());
        ASSERT_TRUE(w->sharding().Heartbeat(hb).ok());
      }
    }
    planned = h->reconciler()->PlanFor("w3").has_value();
    // The modelled step's length in real time (the monitor's windows are on the real clock).
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(planned) << "no reconcile followed the straggler's classification";
  const BatchPlanCommand w3 = *h->reconciler()->PlanFor("w3");
  const BatchPlanCommand w0 = *h->reconciler()->PlanFor("w0");
  EXPECT_LT(w3.samples(), w0.samples()) << "the straggler gets the smaller batch";
}

// The controller's state is durable: after pacerd stops (or crashes: every decision is synced
// before it is dispatched) and starts again on the same data dir, the audit trail, the plan in
// force (same version, re-sent to workers that do not hold it), and the policy applied with
// `pacerctl policy apply` are still there. Started with an edited --policy file, pacerd uses
// that file instead of the applied policy.
TEST(ControlLoopTest, ControllerStateSurvivesARestart) {
  PacerdHarness h({.policy = "dedicated-1s"});
  ASSERT_TRUE(h.ok());
  Job job(h);
  ASSERT_NO_FATAL_FAILURE(RunStragglerScenario(&job));
  const ListActionsResponse before = h.Actions();
  const ActionRecord* plan_before = ExecutedPlan(before);
  ASSERT_NE(plan_before, nullptr);
  const ActionRecord plan_record = *plan_before;
  ASSERT_GT(before.plan_version(), 0u);
  const BatchPlanCommand w3_before = *h->reconciler()->PlanFor("w3");

  // Hot reload of a dry-run variant through the admin RPC.
  std::string policy_text;
  {
    std::ifstream in(h.policy_path());
    policy_text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  std::string applied = policy_text;
  applied.replace(applied.find("name: test-dd"), 13, "name: applied-dd");
  {
    auto ctl = ControllerService::NewStub(h.channel());
    grpc::ClientContext ctx;
    AttachToken(&ctx, h.admin_token());
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
    AttachToken(&ctx2, h.admin_token());
    req.set_yaml(rewindowed);
    grpc::Status refused = ctl->ApplyPolicy(&ctx2, req, &resp);
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << refused.error_message();
    EXPECT_NE(refused.error_message().find("restart"), std::string::npos) << refused.error_message();
    EXPECT_EQ(h.Actions().policy_name(), "applied-dd");
    // New thresholds reach the monitor at once.
    std::string stricter = applied;
    stricter.replace(stricter.find("straggler_threshold: 0.85"), 25, "straggler_threshold: 0.80");
    grpc::ClientContext ctx3;
    AttachToken(&ctx3, h.admin_token());
    req.set_yaml(stricter);
    ASSERT_TRUE(ctl->ApplyPolicy(&ctx3, req, &resp).ok());
    EXPECT_DOUBLE_EQ(h->monitor()->Options().straggler_threshold, 0.80);
  }
  job.workers.clear();

  // Same data dir, same --policy file.
  h.Restart();
  ASSERT_TRUE(h.ok());
  const ListActionsResponse after = h.Actions();
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
  auto w3 = h->reconciler()->PlanFor("w3");
  ASSERT_TRUE(w3.has_value());
  EXPECT_EQ(w3->version(), w3_before.version());
  EXPECT_EQ(w3->samples(), w3_before.samples());
  EXPECT_EQ(w3->effective_step(), w3_before.effective_step());

  // An edited --policy file wins over the policy applied before.
  std::string edited = policy_text;
  edited.replace(edited.find("name: test-dd"), 13, "name: edited-dd");
  std::ofstream(h.policy_path(), std::ios::trunc) << edited;
  h.Restart();
  ASSERT_TRUE(h.ok());
  const ListActionsResponse third_actions = h.Actions();
  EXPECT_EQ(third_actions.policy_name(), "edited-dd");
  EXPECT_EQ(third_actions.plan_version(), before.plan_version()) << "the plan version survives";
}

}  // namespace
}  // namespace pacer
