// The Controller's decisions on ClusterViews made by hand (tests/controller/test_views.h), on a
// SimulatedClock: each test feeds views over time and checks what is dispatched and what the
// audit log says (no mocks, no threads, no real time, no monitor, no pacerd).
//
// The controller's decisions as a whole pacerd makes them are golden scripts
// (tests/pacerd/testdata, run by tests/pacerd/controller_script_test.cc): a persistent straggler's
// plan without a restart, the batch-plan cooldown, dry run, rollback of a plan that did not help,
// and the grace of a quiet member of the plan in force. The cases here are the ones a script
// cannot set up, because its job is a sync job of scripted workers whose view pacerd's monitor
// builds:
//  - restarts and migrations: they need a measured restart cost and the work left, which a
//    scripted job never has (no agent relaunches its workers, no dataset); the restart half of
//    dry run, max_restarts_per_window, min_live_workers, max_actions_per_window and bad nodes
//    are all restart decisions;
//  - a straggler that is slow but not persistent: a scripted worker's steps have no noise, so
//    its step statistics show any slowdown as significant, and pacerd plans for a slowdown of
//    one second (a plan 2 s in, no straggler flagged); the view here says persistent = false;
//  - async jobs (reallocation, hot servers, tail backups): the scripted job is synchronous;
//  - exact speeds, throughputs and step counts: the hysteresis and min_replan_gain bounds, the
//    collective's share of the step, a plan judged only after evaluate_after_steps steps, a
//    rollback that holds off only its own plan, and a plan that helped (a scripted job steps
//    every 100 ms whatever its batch plan, so no plan measures a gain there);
//  - max_local_batch and accumulation: scripted workers declare no memory cap;
//  - the Controller's own contract: a bad policy on hot reload, a malformed view refused, and
//    determinism of Reconcile.
#include "controller/controller.h"

#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "tests/controller/test_views.h"

namespace pacer {
namespace {

using testing::MakeStraggler;
using testing::SyncView;

PolicyConfig NonDedicated() {
  PolicyConfig c;
  c.name = "test-nd";
  c.policy = "non-dedicated";
  c.safety.min_gain = 0.05;
  c.safety.cooldown_s = 120;
  c.safety.adjust_batch_cooldown_s = 10;
  c.safety.window_s = 600;
  c.safety.max_actions_per_window = 20;
  c.safety.max_restarts_per_window = 2;
  c.safety.min_live_workers = 2;
  c.safety.rollback.evaluate_after_s = 60;
  return c;
}

std::unique_ptr<Controller> Make(const PolicyConfig& c) {
  auto ctl = Controller::Create(c);
  EXPECT_TRUE(ctl.ok()) << ctl.status();
  return std::move(*ctl);
}

int Count(const ReconcileResult& r, ActionKind kind) {
  int n = 0;
  for (const auto& a : r.dispatch) n += a.kind == kind ? 1 : 0;
  return n;
}

const Action* Find(const ReconcileResult& r, ActionKind kind) {
  for (const auto& a : r.dispatch)
    if (a.kind == kind) return &a;
  return nullptr;
}

class DecisionTest : public ::testing::Test {
 protected:
  ClusterView At(ClusterView v) {
    v.now_ms = clock_.NowMs();
    return v;
  }
  // 4 workers, w2 a persistent straggler at 0.5x, rollback judged after 10 steps: the first
  // reconcile's batch plan (fails the test when there is none).
  Action PlanForOneStraggler(std::unique_ptr<Controller>* ctl, ClusterView* v) {
    PolicyConfig c = NonDedicated();
    c.safety.rollback.evaluate_after_steps = 10;
    *ctl = Make(c);
    *v = SyncView(4, 1000);
    MakeStraggler(*v, 2, 0.5, true);
    v->job.throughput = 200;
    auto r = (*ctl)->Reconcile(At(*v));
    EXPECT_TRUE(r.ok()) << r.status();
    const Action* a = r.ok() ? Find(*r, ActionKind::kAdjustBatch) : nullptr;
    EXPECT_NE(a, nullptr);
    return a ? *a : Action();
  }
  SimulatedClock clock_;
};

TEST_F(DecisionTest, RestartOnlyWhenTheCostModelSaysItPays) {
  ClusterView v = SyncView(4, 1000);
  MakeStraggler(v, 2, 0.5, true, /*contention=*/true);
  v.job.restart_cost_s = 60;
  v.job.lost_work_s = 10;
  // Lots of work left: 50→100 samples/s on one worker saves hours, far above 70 s × 1.2.
  v.job.remaining_samples = 10'000'000;
  {
    auto ctl = Make(NonDedicated());
    auto r = ctl->Reconcile(At(v));
    ASSERT_TRUE(r.ok());
    const Action* restart = Find(*r, ActionKind::kRestart);
    ASSERT_NE(restart, nullptr);
    EXPECT_EQ(restart->target, "w2");
    EXPECT_GT(restart->saved_s, restart->cost_s * 1.2);
    EXPECT_DOUBLE_EQ(restart->cost_s, 70);  // sync: the whole job waits for the relaunch
    EXPECT_EQ(Count(*r, ActionKind::kAdjustBatch), 1);
  }
  // The same straggler with a restart cost above what it could save: no relaunch.
  {
    auto ctl = Make(NonDedicated());
    v.job.restart_cost_s = 1e6;
    auto r = ctl->Reconcile(At(v));
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(Count(*r, ActionKind::kRestart) + Count(*r, ActionKind::kMigrate), 0);
    EXPECT_EQ(Count(*r, ActionKind::kAdjustBatch), 1);
  }
  // Unmeasured restart cost: the model does not guess.
  {
    auto ctl = Make(NonDedicated());
    v.job.restart_cost_s = 0;
    auto r = ctl->Reconcile(At(v));
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(Count(*r, ActionKind::kRestart) + Count(*r, ActionKind::kMigrate), 0);
  }
  // A deterministic (hardware) straggler: restarting in place cannot help; migrating can.
  {
    auto ctl = Make(NonDedicated());
    v.job.restart_cost_s = 60;
    MakeStraggler(v, 2, 0.5, true, /*contention=*/false);
    auto r = ctl->Reconcile(At(v));
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(Count(*r, ActionKind::kRestart), 0);
    const Action* m = Find(*r, ActionKind::kMigrate);
    ASSERT_NE(m, nullptr);
    EXPECT_EQ(m->avoid_nodes, std::vector<std::string>{"n2"});
    EXPECT_DOUBLE_EQ(m->cost_s, 60 * 1.5 + 10);  // migrate_cost_factor × restart + lost work
  }
}

TEST_F(DecisionTest, TransientStragglerLeadsToNeitherAdjustNorRestart) {
  auto ctl = Make(NonDedicated());
  ClusterView v = SyncView(4, 1000);
  v.job.restart_cost_s = 60;
  v.job.remaining_samples = 10'000'000;
  for (int i = 0; i < 6; ++i) {
    MakeStraggler(v, 1, 0.4, /*persistent=*/false);
    auto r = ctl->Reconcile(At(v));
    ASSERT_TRUE(r.ok());
    EXPECT_TRUE(r->dispatch.empty());
    clock_.AdvanceMs(10'000);
  }
  EXPECT_TRUE(ctl->history().audit().empty());
  EXPECT_FALSE(ctl->history().plan());
}

TEST_F(DecisionTest, RestartLimitsAndCooldownsHold) {
  PolicyConfig c = NonDedicated();
  c.safety.rollback.enabled = false;  // this script keeps throughput flat; see the rollback test
  auto ctl = Make(c);
  ClusterView v = SyncView(10, 1000);
  v.job.restart_cost_s = 30;
  v.job.remaining_samples = 100'000'000;
  for (int i : {1, 3, 5, 7}) MakeStraggler(v, i, 0.5 - 0.05 * i / 2, true);
  auto r = ctl->Reconcile(At(v));
  ASSERT_TRUE(r.ok());
  // Four candidates, max_restarts_per_window = 2: the two slowest go first.
  auto audit_log = [&] {
    std::string log;
    for (const auto& rec : ctl->history().audit())
      log += std::string(ActionKindName(rec.action.kind)) + " " + rec.action.target + " " +
             AuditOutcomeName(rec.outcome) + " " + rec.veto_reason + " | " + rec.action.reason +
             "\n";
    return log;
  };
  ASSERT_EQ(Count(*r, ActionKind::kRestart), 2) << audit_log();
  EXPECT_EQ(r->dispatch[1].target, "w7");
  EXPECT_EQ(r->dispatch[2].target, "w5");
  int vetoed = 0;
  for (const auto& rec : ctl->history().audit())
    if (rec.outcome == AuditRecord::Outcome::kVetoed) {
      ++vetoed;
      EXPECT_NE(rec.veto_reason.find("max_restarts_per_window"), std::string::npos);
    }
  EXPECT_EQ(vetoed, 2);

  // 60 s later the relaunched two are back but still slow (the cause stayed): they are in
  // cooldown, and the window still holds two restarts, so nothing is relaunched.
  for (int t = 0; t < 6; ++t) {
    clock_.AdvanceMs(10'000);
    auto again = ctl->Reconcile(At(v));
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(Count(*again, ActionKind::kRestart), 0);
  }
  const size_t audit_before = ctl->history().audit().size();
  // Repeated identical vetoes fold into their record instead of growing the log.
  clock_.AdvanceMs(10'000);
  ASSERT_TRUE(ctl->Reconcile(At(v)).ok());
  EXPECT_EQ(ctl->history().audit().size(), audit_before) << audit_log();

  // After the window the limit frees up again.
  clock_.AdvanceMs(600'000);
  auto later = ctl->Reconcile(At(v));
  ASSERT_TRUE(later.ok());
  EXPECT_EQ(Count(*later, ActionKind::kRestart), 2) << audit_log();
  // Per-worker incidents were counted for bad-node memory.
  EXPECT_EQ(ctl->history().NodeIncidents("n7"), 2);
}

TEST_F(DecisionTest, MinimumLiveWorkersHolds) {
  PolicyConfig c = NonDedicated();
  c.safety.min_live_workers = 3;
  auto ctl = Make(c);
  ClusterView v = SyncView(3, 300);
  MakeStraggler(v, 0, 0.3, true);
  v.job.restart_cost_s = 10;
  v.job.remaining_samples = 100'000'000;
  auto r = ctl->Reconcile(At(v));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(Count(*r, ActionKind::kRestart), 0);
  bool saw = false;
  for (const auto& rec : ctl->history().audit())
    saw = saw || rec.veto_reason.find("min_live_workers") != std::string::npos;
  EXPECT_TRUE(saw);
}

TEST_F(DecisionTest, MaxActionsPerWindowHolds) {
  PolicyConfig c = NonDedicated();
  c.safety.max_actions_per_window = 1;
  auto ctl = Make(c);
  ClusterView v = SyncView(6, 600);
  MakeStraggler(v, 0, 0.3, true);
  v.job.restart_cost_s = 10;
  v.job.remaining_samples = 100'000'000;
  auto r = ctl->Reconcile(At(v));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->dispatch.size(), 1u);
}

TEST_F(DecisionTest, DryRunChangesNothing) {
  PolicyConfig c = NonDedicated();
  c.dry_run = true;
  auto ctl = Make(c);
  ClusterView v = SyncView(4, 1000);
  MakeStraggler(v, 2, 0.5, true);
  v.job.restart_cost_s = 60;
  v.job.remaining_samples = 10'000'000;
  for (int i = 0; i < 5; ++i) {
    auto r = ctl->Reconcile(At(v));
    ASSERT_TRUE(r.ok());
    EXPECT_TRUE(r->dispatch.empty());
    clock_.AdvanceMs(10'000);
  }
  EXPECT_FALSE(ctl->history().plan());
  EXPECT_EQ(ctl->history().NodeIncidents("n2"), 0);
  // What it would have done is audited once per (kind, target), repeats folded in.
  ASSERT_EQ(ctl->history().audit().size(), 2u);
  for (const auto& rec : ctl->history().audit()) {
    EXPECT_EQ(rec.outcome, AuditRecord::Outcome::kDryRun);
    EXPECT_EQ(rec.repeats, 4);
  }
}

TEST_F(DecisionTest, NoRollbackWhenTheActionHelped) {
  auto ctl = Make(NonDedicated());
  ClusterView v = SyncView(4, 1000);
  MakeStraggler(v, 2, 0.5, true);
  v.job.throughput = 200;
  auto r = ctl->Reconcile(At(v));
  const uint64_t id = Find(*r, ActionKind::kAdjustBatch)->id;
  clock_.AdvanceMs(61'000);
  v.job.current_step += 100;
  v.job.throughput = 345;
  auto later = ctl->Reconcile(At(v));
  ASSERT_TRUE(later.ok());
  EXPECT_TRUE(later->dispatch.empty());
  EXPECT_NEAR(*ctl->history().FindRecord(id)->measured_gain, 0.725, 1e-9);
  EXPECT_FALSE(ctl->history().FindRecord(id)->rolled_back);
}

TEST_F(DecisionTest, BadNodesAreRememberedAndAvoided) {
  PolicyConfig c = NonDedicated();
  c.restart.bad_node_threshold = 2;
  c.safety.cooldown_s = 10;
  c.safety.max_restarts_per_window = 100;
  auto ctl = Make(c);
  ClusterView v = SyncView(4, 1000);
  v.job.restart_cost_s = 30;
  v.job.remaining_samples = 100'000'000;
  v.workers[0].node = "bad";
  MakeStraggler(v, 0, 0.5, true);
  auto r1 = ctl->Reconcile(At(v));
  EXPECT_EQ(Find(*r1, ActionKind::kRestart)->node, "bad");
  clock_.AdvanceMs(20'000);
  auto r2 = ctl->Reconcile(At(v));
  ASSERT_NE(Find(*r2, ActionKind::kRestart), nullptr);
  EXPECT_TRUE(ctl->history().IsBadNode("bad", clock_.NowMs(), c.restart));
  // Third time on the same node: migrate away from it instead of restarting in place.
  clock_.AdvanceMs(20'000);
  auto r3 = ctl->Reconcile(At(v));
  EXPECT_EQ(Find(*r3, ActionKind::kRestart), nullptr);
  const Action* m = Find(*r3, ActionKind::kMigrate);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->avoid_nodes, std::vector<std::string>{"bad"});
  // Bad nodes are forgotten after bad_node_ttl_s.
  EXPECT_FALSE(ctl->history().IsBadNode(
      "bad", clock_.NowMs() + static_cast<int64_t>(c.restart.bad_node_ttl_s * 1000) + 1,
      c.restart));
}

TEST_F(DecisionTest, AsyncJobGetsReallocationAndHotServerRestart) {
  auto ctl = Make(NonDedicated());
  ClusterView v = SyncView(4, 0);
  v.job.mode = JobMode::kAsync;
  v.job.epoch_progress = 0.95;
  MakeStraggler(v, 1, 0.5, true);
  v.servers.push_back(ServerView{"ps0", "n9", 40, 3.0, true, true});
  v.servers.push_back(ServerView{"ps1", "n8", 10, 1.0, false, false});
  auto r = ctl->Reconcile(At(v));
  ASSERT_TRUE(r.ok());
  const Action* re = Find(*r, ActionKind::kReallocate);
  ASSERT_NE(re, nullptr);
  EXPECT_TRUE(re->tail_backups.value_or(false));
  double sum = 0;
  for (const auto& al : re->allocations) {
    sum += al.weight;
    if (al.worker_id == "w1") {
      EXPECT_DOUBLE_EQ(al.shard_scale, 0.5);
    }
  }
  EXPECT_NEAR(sum, 4.0, 1e-9);
  const Action* ps = Find(*r, ActionKind::kRestartServer);
  ASSERT_NE(ps, nullptr);
  EXPECT_EQ(ps->target, "ps0");
  EXPECT_TRUE(ctl->history().tail_backups());
}

// Rolling back a REALLOCATE undoes only what it changed and is still in force: tail backups a
// later action switched on stay on, weights a later action replaced are not overwritten.
TEST_F(DecisionTest, ReallocationRollbackLeavesNewerActionsInForce) {
  auto ctl = Make(NonDedicated());
  ClusterView v = SyncView(4, 0);
  v.job.mode = JobMode::kAsync;
  v.job.throughput = 350;
  v.job.epoch_progress = 0.5;
  MakeStraggler(v, 1, 0.5, true);
  auto r1 = ctl->Reconcile(At(v));
  ASSERT_TRUE(r1.ok());
  const Action* re1 = Find(*r1, ActionKind::kReallocate);
  ASSERT_NE(re1, nullptr);
  EXPECT_FALSE(re1->tail_backups.has_value());  // #1 sets weights only
  const uint64_t id1 = re1->id;

  // 2 s later the epoch nears its end: #2 switches tail backups on, keeping #1's weights.
  clock_.AdvanceMs(2'000);
  v.job.epoch_progress = 0.95;
  auto r2 = ctl->Reconcile(At(v));
  ASSERT_TRUE(r2.ok());
  const Action* re2 = Find(*r2, ActionKind::kReallocate);
  ASSERT_NE(re2, nullptr);
  EXPECT_TRUE(re2->tail_backups.value_or(false));
  ASSERT_TRUE(ctl->history().tail_backups());

  // #1 is judged: the throughput did not move. Whatever is done about #1, the tail backups #2
  // switched on stay on, in the history and in anything dispatched.
  clock_.AdvanceMs(58'000);
  auto r3 = ctl->Reconcile(At(v));
  ASSERT_TRUE(r3.ok());
  EXPECT_TRUE(ctl->history().FindRecord(id1)->measured_gain.has_value());
  for (const Action& a : r3->dispatch) {
    if (a.kind != ActionKind::kReallocate) continue;
    EXPECT_TRUE(a.tail_backups.value_or(true)) << a.reason;
  }
  EXPECT_TRUE(ctl->history().tail_backups());

  // A rollback of #1 after a newer reweighting (#3) leaves #3's weights in force.
  PolicyConfig quick = NonDedicated();
  quick.safety.cooldown_s = 10;
  auto ctl2 = Make(quick);
  clock_.AdvanceMs(1'000);
  v.job.epoch_progress = 0.5;
  auto s1 = ctl2->Reconcile(At(v));
  ASSERT_TRUE(s1.ok());
  ASSERT_NE(Find(*s1, ActionKind::kReallocate), nullptr);
  const uint64_t first = Find(*s1, ActionKind::kReallocate)->id;
  clock_.AdvanceMs(30'000);
  MakeStraggler(v, 1, 0.25, true);  // slower still: the weights drift past the hysteresis
  auto s2 = ctl2->Reconcile(At(v));
  ASSERT_TRUE(s2.ok());
  const Action* newer = Find(*s2, ActionKind::kReallocate);
  ASSERT_NE(newer, nullptr);
  const std::vector<WorkerAllocation> weights3 = newer->allocations;
  clock_.AdvanceMs(30'000);  // #first is judged now, #newer not yet
  auto s3 = ctl2->Reconcile(At(v));
  ASSERT_TRUE(s3.ok());
  EXPECT_TRUE(ctl2->history().FindRecord(first)->measured_gain.has_value());
  ASSERT_EQ(ctl2->history().allocations().size(), weights3.size());
  for (size_t i = 0; i < weights3.size(); ++i) {
    EXPECT_EQ(ctl2->history().allocations()[i].worker_id, weights3[i].worker_id);
    EXPECT_DOUBLE_EQ(ctl2->history().allocations()[i].weight, weights3[i].weight);
  }
}

// An async job runs at Σ speeds whatever the weights; a reallocation trims the epoch's tail,
// which the job's throughput does not show. So a throughput that did not rise (or fell with a
// burst elsewhere) is no reason to undo it; the policy keeps the weights current itself and
// restores even weights once the straggler recovered.
TEST_F(DecisionTest, ReallocationIsNotRolledBackOnAsyncThroughput) {
  auto ctl = Make(NonDedicated());
  ClusterView v = SyncView(4, 0);
  v.job.mode = JobMode::kAsync;
  v.job.epoch_progress = 0.5;
  MakeStraggler(v, 1, 0.5, true);
  v.job.throughput = 350;
  auto r1 = ctl->Reconcile(At(v));
  ASSERT_TRUE(r1.ok());
  const Action* re = Find(*r1, ActionKind::kReallocate);
  ASSERT_NE(re, nullptr);
  ASSERT_GT(re->predicted_gain, 0.0);
  const uint64_t id = re->id;
  const std::vector<WorkerAllocation> weights = re->allocations;

  // Judged at 60 s: the throughput fell 10 % (a burst on another worker). Nothing is undone.
  for (int i = 0; i < 6; ++i) {
    clock_.AdvanceMs(10'000);
    v.job.throughput = 315;
    auto r = ctl->Reconcile(At(v));
    ASSERT_TRUE(r.ok());
    for (const Action& a : r->dispatch) EXPECT_EQ(a.rollback_of, 0u) << a.reason;
  }
  const AuditRecord* rec = ctl->history().FindRecord(id);
  ASSERT_TRUE(rec->measured_gain.has_value());  // the throughput change is still audited
  EXPECT_NEAR(*rec->measured_gain, -0.1, 1e-9);
  EXPECT_FALSE(rec->rolled_back);
  ASSERT_EQ(ctl->history().allocations().size(), weights.size());
  for (size_t i = 0; i < weights.size(); ++i)
    EXPECT_DOUBLE_EQ(ctl->history().allocations()[i].weight, weights[i].weight);

  // The straggler recovers: the policy goes back to even weights on its own.
  v = SyncView(4, 0);
  v.job.mode = JobMode::kAsync;
  v.job.epoch_progress = 0.5;
  v.job.throughput = 400;
  clock_.AdvanceMs(200'000);  // past the cooldown
  auto back = ctl->Reconcile(At(v));
  ASSERT_TRUE(back.ok());
  const Action* even = Find(*back, ActionKind::kReallocate);
  ASSERT_NE(even, nullptr);
  EXPECT_EQ(even->rollback_of, 0u);
  EXPECT_TRUE(even->allocations.empty());  // the default: every worker at weight 1
  EXPECT_TRUE(ctl->history().allocations().empty());
  // ... and stays there (no flapping on the same speeds).
  for (int i = 0; i < 5; ++i) {
    clock_.AdvanceMs(200'000);
    auto r = ctl->Reconcile(At(v));
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(Count(*r, ActionKind::kReallocate), 0);
  }
}

TEST_F(DecisionTest, DedicatedPresetUsesAccumulationAndNeverRestarts) {
  PolicyConfig c;
  c.policy = "dedicated";
  c.restart.enabled = false;
  auto ctl = Make(c);
  ClusterView v = SyncView(4, 1400);
  for (auto& w : v.workers) w.max_local_batch = 400;
  // w0 is a newer GPU: 4× the speed, same memory.
  v.workers[0].speed = 400;
  v.workers[0].relative_speed = 4;
  v.workers[0].leader = true;
  v.workers[0].persistent = true;
  v.job.restart_cost_s = 10;
  v.job.remaining_samples = 100'000'000;
  auto r = ctl->Reconcile(At(v));
  ASSERT_TRUE(r.ok());
  const Action* a = Find(*r, ActionKind::kAdjustBatch);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->plan->Find("w0")->samples, 800);
  EXPECT_EQ(a->plan->Find("w0")->accumulation, 2);
  EXPECT_EQ(Count(*r, ActionKind::kRestart) + Count(*r, ActionKind::kMigrate), 0);
}

// A plan is judged by the throughput only once it ran: rollback.evaluate_after_steps steps past
// its effective step, as well as evaluate_after_s after the decision. A job whose steps stall
// (or a plan scheduled at a step this run does not reach) is not judged on the old plan.
TEST_F(DecisionTest, RollbackNotBeforeThePlanRanEvaluateAfterSteps) {
  std::unique_ptr<Controller> ctl;
  ClusterView v;
  const Action plan = PlanForOneStraggler(&ctl, &v);
  ASSERT_TRUE(plan.plan);
  const uint64_t id = plan.id;
  const int64_t effective = plan.plan->effective_step;
  // Long past evaluate_after_s, the throughput unchanged, but the job only reached the step
  // before the switch + 9: nothing measured, nothing rolled back.
  v.job.throughput = 205;
  for (int64_t step : {v.job.current_step, effective - 1, effective + 9}) {
    clock_.AdvanceMs(60'000);
    v.job.current_step = step;
    auto later = ctl->Reconcile(At(v));
    ASSERT_TRUE(later.ok());
    EXPECT_TRUE(later->dispatch.empty()) << "step " << step;
    EXPECT_FALSE(ctl->history().FindRecord(id)->measured_gain) << "step " << step;
  }
  // Ten steps under the plan: judged, and rolled back (it did not help).
  v.job.current_step = effective + 10;
  clock_.AdvanceMs(1'000);
  auto judged = ctl->Reconcile(At(v));
  ASSERT_TRUE(judged.ok());
  ASSERT_EQ(judged->dispatch.size(), 1u);
  EXPECT_EQ(judged->dispatch[0].rollback_of, id);
  EXPECT_NEAR(*ctl->history().FindRecord(id)->measured_gain, 0.025, 1e-9);
}

// A rollback holds off the decision it judged, not every batch plan: within safety.window_s the
// same plan (the same worker lightened) is vetoed, but a worker that turns slow afterwards is
// planned for at once instead of waiting out the window behind someone else's rollback.
TEST_F(DecisionTest, ARollbackHoldsOffTheSamePlanNotOneForANewStraggler) {
  std::unique_ptr<Controller> ctl;
  ClusterView v;
  const Action plan = PlanForOneStraggler(&ctl, &v);
  ASSERT_TRUE(plan.plan);
  ASSERT_LT(plan.plan->Find("w2")->samples, 250);
  const uint64_t id = plan.id;
  // It did not help: rolled back once judged.
  v.job.current_step = plan.plan->effective_step + 10;
  clock_.AdvanceMs(61'000);
  auto judged = ctl->Reconcile(At(v));
  ASSERT_TRUE(judged.ok());
  ASSERT_EQ(judged->dispatch.size(), 1u);
  ASSERT_EQ(judged->dispatch[0].rollback_of, id);

  // w2 still slow, nothing else changed: no plan again.
  for (int i = 0; i < 3; ++i) {
    clock_.AdvanceMs(30'000);
    v.job.current_step += 20;
    auto again = ctl->Reconcile(At(v));
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(Count(*again, ActionKind::kAdjustBatch), 0) << i;
  }

  // w0 turns slow too, still within the window: a plan that lightens w0 is a new decision.
  MakeStraggler(v, 0, 0.4, true);
  clock_.AdvanceMs(30'000);
  v.job.current_step += 20;
  auto fresh = ctl->Reconcile(At(v));
  ASSERT_TRUE(fresh.ok());
  const Action* p = Find(*fresh, ActionKind::kAdjustBatch);
  ASSERT_NE(p, nullptr) << (ctl->history().audit().empty() ? "" : ctl->history().audit().back().veto_reason);
  EXPECT_LT(p->plan->Find("w0")->samples, 250);
  EXPECT_EQ(p->rollback_of, 0u);
}

// After a rollback, a plan that is not the undone one (here: the straggler partly recovered, so
// the new plan lightens it by much less) is a new decision, admitted within safety.window_s; the
// undone plan itself stays held off.
TEST_F(DecisionTest, ARollbackHoldsOffOnlyAnEquivalentPlan) {
  std::unique_ptr<Controller> ctl;
  ClusterView v;
  const Action plan = PlanForOneStraggler(&ctl, &v);
  ASSERT_TRUE(plan.plan);
  const int64_t undone_w2 = plan.plan->Find("w2")->samples;  // 0.5 / 3.5 of 1000
  v.job.current_step = plan.plan->effective_step + 10;
  clock_.AdvanceMs(61'000);
  auto judged = ctl->Reconcile(At(v));
  ASSERT_TRUE(judged.ok());
  ASSERT_EQ(judged->dispatch.size(), 1u);
  ASSERT_EQ(judged->dispatch[0].rollback_of, plan.id);

  // w2 reads 0.48x: the plan would be the undone one again; held off.
  MakeStraggler(v, 2, 0.48, true);
  clock_.AdvanceMs(30'000);
  v.job.current_step += 20;
  auto same = ctl->Reconcile(At(v));
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(Count(*same, ActionKind::kAdjustBatch), 0);

  // w2 recovered to 0.8x, still within the window: the plan it needs now (211 samples) is
  // nearer the even split in force (250) than the undone plan (143): a different decision.
  MakeStraggler(v, 2, 0.8, true);
  clock_.AdvanceMs(30'000);
  v.job.current_step += 20;
  auto fresh = ctl->Reconcile(At(v));
  ASSERT_TRUE(fresh.ok());
  const Action* p = Find(*fresh, ActionKind::kAdjustBatch);
  ASSERT_NE(p, nullptr) << ctl->history().audit().back().veto_reason;
  EXPECT_GT(p->plan->Find("w2")->samples, undone_w2 + 50);
  EXPECT_LT(p->plan->Find("w2")->samples, 250);
  EXPECT_EQ(p->rollback_of, 0u);
}

// Small persistent differences. A `dedicated`-shaped policy (hysteresis 0.1, min_gain 0.03,
// speed_significance 3): 8 workers with ±3 % step noise, w3 9 % slower on every step (its window
// shows 0.91: unflagged, and its share moves 8 % — under the hysteresis).
class SmallDifferenceTest : public DecisionTest {
 protected:
  PolicyConfig Dedicated() {
    PolicyConfig c;
    c.name = "test-dd";
    c.policy = "dedicated";
    c.detection.straggler_threshold = 0.85;
    c.adjust_batch.hysteresis = 0.1;
    c.adjust_batch.min_replan_gain = 0.05;
    c.adjust_batch.speed_significance = 3;
    c.safety.min_gain = 0.03;
    c.safety.window_s = 600;
    c.safety.max_actions_per_window = 10;
    return c;
  }
  // `steps` steps of every worker at 1000 samples; worker i runs at speed[i] × a deterministic
  // ±`noise` pattern (a different phase per worker).
  void Feed(Controller& ctl, const std::vector<double>& speed, int steps, double noise) {
    std::vector<StepTiming> batch;
    for (int s = 0; s < steps; ++s) {
      clock_.AdvanceMs(10'000);
      batch.clear();
      for (size_t i = 0; i < speed.size(); ++i) {
        const double wobble = noise * (((s + 3 * static_cast<int>(i)) % 5) - 2) / 2.0;
        batch.push_back(testing::Timing("w" + std::to_string(i), step_ + s,
                                        1000 / speed[i] * (1 + wobble), 1000, clock_.NowMs()));
      }
      ctl.ObserveSteps(batch);
    }
    step_ += steps;
  }
  ClusterView View(double w3_window) {
    ClusterView v = SyncView(8, 8000);
    v.job.current_step = step_;
    v.job.remaining_samples = 8000LL * 2000;  // 2 000 steps left: ~6 h
    v.job.throughput = 720;
    v.workers[3].speed = v.workers[3].last_window_speed = 100 * w3_window;
    v.workers[3].relative_speed = w3_window;
    return v;
  }
  int64_t step_ = 100;
};

TEST_F(SmallDifferenceTest, ASignificantSmallSlowdownIsPlannedWhenItPays) {
  auto ctl = Make(Dedicated());
  std::vector<double> speed(8, 100);
  speed[3] = 91;
  Feed(*ctl, speed, 40, 0.03);
  auto r = ctl->Reconcile(At(View(0.91)));
  ASSERT_TRUE(r.ok());
  const Action* a = Find(*r, ActionKind::kAdjustBatch);
  ASSERT_NE(a, nullptr) << (ctl->history().audit().empty() ? "no proposal"
                                                           : ctl->history().audit().back().veto_reason);
  EXPECT_LT(a->plan->Find("w3")->samples, 960);
  EXPECT_GT(a->saved_s, a->cost_s);
  EXPECT_GT(a->cost_s, 0);
}

// The same difference with the job nearly done does not pay for the switch: no plan.
TEST_F(SmallDifferenceTest, NoPlanWhenTheRestOfTheJobIsTooShortToPay) {
  auto ctl = Make(Dedicated());
  std::vector<double> speed(8, 100);
  speed[3] = 91;
  Feed(*ctl, speed, 40, 0.03);
  ClusterView v = View(0.91);
  v.job.remaining_samples = 8000;  // one step left
  auto r = ctl->Reconcile(At(v));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(Count(*r, ActionKind::kAdjustBatch), 0);
}

// Noise alone: every worker's steps alike on average (±12 % per step), w3's window reads 0.87
// (its share would move 12 %, past the hysteresis): its steps do not show the difference, so
// nothing is planned, however long the job.
TEST_F(SmallDifferenceTest, NoiseAloneIsNotPlanned) {
  auto ctl = Make(Dedicated());
  std::vector<double> speed(8, 100);
  Feed(*ctl, speed, 40, 0.12);
  for (int i = 0; i < 5; ++i) {
    auto r = ctl->Reconcile(At(View(0.87)));
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(Count(*r, ActionKind::kAdjustBatch), 0) << i;
    Feed(*ctl, speed, 3, 0.12);
  }
}

// With a plan in force, a share that drifted past `hysteresis` does not make a new plan when the
// new one would gain less than min_replan_gain over it.
TEST_F(DecisionTest, NoReplanBelowMinReplanGain) {
  PolicyConfig c = NonDedicated();
  c.adjust_batch.hysteresis = 0.05;
  c.adjust_batch.min_replan_gain = 0.10;
  c.safety.adjust_batch_cooldown_s = 0;
  auto ctl = Make(c);
  ClusterView v = SyncView(4, 1000);
  MakeStraggler(v, 2, 0.5, true);
  ASSERT_EQ(Count(*ctl->Reconcile(At(v)), ActionKind::kAdjustBatch), 1);
  // The straggler reads 4 % slower: its share moves 3.5 %, under the hysteresis. Then 8 %
  // slower: its share moves 7 %, past the hysteresis, but a new plan would gain only 7.6 %.
  // Then it reads 20 % faster: its share moves 16 %, yet it is no longer the slowest under
  // the plan in force, and the others' step shrinks by only 2.5 %.
  for (double rel : {0.48, 0.46, 0.6}) {
    clock_.AdvanceMs(10'000);
    v.job.current_step += 20;
    MakeStraggler(v, 2, rel, true);
    auto r = ctl->Reconcile(At(v));
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(Count(*r, ActionKind::kAdjustBatch), 0) << rel;
  }
  // 30 % slower than planned for: worth a new plan.
  clock_.AdvanceMs(10'000);
  v.job.current_step += 20;
  MakeStraggler(v, 2, 0.35, true);
  auto r = ctl->Reconcile(At(v));
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(Count(*r, ActionKind::kAdjustBatch), 1);
  EXPECT_GE(Find(*r, ActionKind::kAdjustBatch)->predicted_gain, 0.05);
}

// The predicted gain counts the collective's own cost, as the throughput it is measured by does:
// a step that is half all-reduce gains half as much from balancing the compute.
TEST_F(DecisionTest, PredictedGainCountsTheCollective) {
  auto ctl = Make(NonDedicated());
  ClusterView v = SyncView(4, 1000);
  MakeStraggler(v, 2, 0.5, true);
  // Even split: the straggler computes 250 / 50 = 5 s; the measured step is 10 s (5 s in the
  // collective itself). Balanced: 1000 / 350 = 2.857 s of compute + 5 s.
  v.job.step_time_s = 10;
  auto r = ctl->Reconcile(At(v));
  ASSERT_TRUE(r.ok());
  const Action* a = Find(*r, ActionKind::kAdjustBatch);
  ASSERT_NE(a, nullptr);
  const double compute_after = a->plan->predicted_step_s;
  EXPECT_NEAR(a->predicted_gain, 10.0 / (compute_after + 5) - 1, 1e-9);
  EXPECT_LT(a->predicted_gain, 0.35);  // compute only would say 5 / 2.857 − 1 = 0.75
}

TEST_F(DecisionTest, HotReloadKeepsTheRunningPolicyOnABadConfig) {
  auto ctl = Make(NonDedicated());
  PolicyConfig bad = NonDedicated();
  bad.safety.min_gain = -1;
  EXPECT_EQ(ctl->ApplyPolicy(bad, clock_.NowMs()).code(), absl::StatusCode::kInvalidArgument);
  PolicyConfig unknown = NonDedicated();
  unknown.policy = "magic";
  EXPECT_FALSE(ctl->ApplyPolicy(unknown, clock_.NowMs()).ok());
  EXPECT_EQ(ctl->policy().name, "test-nd");
  EXPECT_TRUE(ctl->history().audit().empty());
  PolicyConfig good = NonDedicated();
  good.name = "reloaded";
  good.dry_run = true;
  ASSERT_TRUE(ctl->ApplyPolicy(good, clock_.NowMs()).ok());
  EXPECT_EQ(ctl->policy().name, "reloaded");
  ASSERT_EQ(ctl->history().audit().size(), 1u);
  EXPECT_EQ(ctl->history().audit()[0].outcome, AuditRecord::Outcome::kPolicy);
}

TEST_F(DecisionTest, MalformedViewIsRefusedAndChangesNothing) {
  auto ctl = Make(NonDedicated());
  ClusterView v = SyncView(4, 1000);
  v.workers[3].id = "w0";
  EXPECT_EQ(ctl->Reconcile(At(v)).status().code(), absl::StatusCode::kInvalidArgument);
  ClusterView nan = SyncView(4, 1000);
  nan.workers[0].speed = std::nan("");
  EXPECT_EQ(ctl->Reconcile(At(nan)).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(ctl->history().audit().empty());
}

TEST_F(DecisionTest, ReconcileIsDeterministic) {
  // Same inputs, same decisions: two controllers fed the same script agree record for record.
  auto run = [&](SimulatedClock& clock) {
    auto ctl = Make(NonDedicated());
    ClusterView v = SyncView(8, 2048);
    v.job.restart_cost_s = 30;
    v.job.remaining_samples = 50'000'000;
    std::vector<std::string> log;
    for (int t = 0; t < 40; ++t) {
      if (t == 3) MakeStraggler(v, 2, 0.6, true);
      if (t == 9) MakeStraggler(v, 5, 0.4, true, false, SlowLevel::kNode);
      v.now_ms = clock.NowMs();
      v.job.throughput = 700 + 10 * t;
      auto r = ctl->Reconcile(v);
      for (const auto& a : r->dispatch)
        log.push_back(std::string(ActionKindName(a.kind)) + a.target + a.reason);
      clock.AdvanceMs(10'000);
    }
    return log;
  };
  SimulatedClock a, b;
  EXPECT_EQ(run(a), run(b));
}

}  // namespace
}  // namespace pacer
