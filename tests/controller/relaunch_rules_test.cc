// How the controller relaunches in a large job (hand-made views, a SimulatedClock):
//  - a relaunch is judged by the cost model, not by `min_gain`: one worker of 100 is far below
//    5 % of the job however slow it is, and min_gain used to veto every such relaunch;
//  - a migration that did not cure its worker is not repeated (the cause travels with it);
//  - worker relaunches and server restarts have separate max_restarts_per_window budgets, and a
//    hot server is proposed before straggling workers;
//  - the monitor calls a server hot at the policy's `actions.server.hot_threshold`.
#include <gtest/gtest.h>

#include <string>

#include "common/clock.h"
#include "controller/controller.h"
#include "controller/view_builder.h"
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
  c.safety.window_s = 600;
  c.safety.max_actions_per_window = 1000;
  c.safety.max_restarts_per_window = 2;
  c.safety.min_live_workers = 2;
  c.reallocate.enabled = false;  // only relaunches and servers here
  return c;
}

// An async PS job of `n` workers at 100 samples/s with a day of work left and a measured
// restart cost.
ClusterView AsyncJob(int n) {
  ClusterView v = SyncView(n, 0);
  v.job.mode = JobMode::kAsync;
  v.job.restart_cost_s = 60;
  v.job.lost_work_s = 5;
  v.job.remaining_samples = static_cast<int64_t>(100) * n * 86400;
  return v;
}

int Count(const ReconcileResult& r, ActionKind kind) {
  int n = 0;
  for (const auto& a : r.dispatch) n += a.kind == kind ? 1 : 0;
  return n;
}

const AuditRecord* NewestOf(const History& h, ActionKind kind, const std::string& target) {
  for (auto it = h.audit().rbegin(); it != h.audit().rend(); ++it)
    if (it->action.kind == kind && it->action.target == target) return &*it;
  return nullptr;
}

class RelaunchRulesTest : public ::testing::Test {
 protected:
  ReconcileResult Reconcile(Controller& ctl, ClusterView v) {
    v.now_ms = clock_.NowMs();
    auto r = ctl.Reconcile(v);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : ReconcileResult{};
  }
  SimulatedClock clock_;
};

TEST_F(RelaunchRulesTest, ASlowWorkerOfAHundredIsRelaunchedWhenTheCostModelSaysItPays) {
  auto ctl = Controller::Create(NonDedicated());
  ASSERT_TRUE(ctl.ok());
  ClusterView v = AsyncJob(100);
  MakeStraggler(v, 7, 0.2, true, /*contention=*/true);
  const ReconcileResult r = Reconcile(**ctl, v);
  ASSERT_EQ(Count(r, ActionKind::kRestart), 1);
  const Action& a = r.dispatch[0];
  EXPECT_EQ(a.target, "w7");
  EXPECT_LT(a.predicted_gain, 0.05);                 // far below min_gain ...
  EXPECT_GT(a.saved_s, a.cost_s * 1.2);               // ... but the relaunch pays
  EXPECT_DOUBLE_EQ(a.relative_speed_before, 0.2);     // kept to judge it later
  // The same worker when the relaunch cannot pay (little work left): nothing.
  auto ctl2 = Controller::Create(NonDedicated());
  ASSERT_TRUE(ctl2.ok());
  v.job.remaining_samples = 1000;
  EXPECT_EQ(Count(Reconcile(**ctl2, v), ActionKind::kRestart), 0);
}

TEST_F(RelaunchRulesTest, AMigrationThatDidNotCureItsWorkerIsNotRepeated) {
  PolicyConfig c = NonDedicated();
  c.restart.migrate = true;
  auto ctl = Controller::Create(c);
  ASSERT_TRUE(ctl.ok());
  ClusterView v = AsyncJob(100);
  // Deterministic stragglers: restarting in place cannot help, migrating may.
  MakeStraggler(v, 7, 0.3, true, /*contention=*/false);
  MakeStraggler(v, 8, 0.3, true, /*contention=*/false);
  ASSERT_EQ(Count(Reconcile(**ctl, v), ActionKind::kMigrate), 2);
  // Twenty minutes on (past the cooldown and the window): w7 is as slow on its new node as it
  // was; w8 came back cured and has slowed down again since, to 0.5.
  clock_.AdvanceMs(20 * 60 * 1000);
  MakeStraggler(v, 7, 0.31, true, /*contention=*/false);
  MakeStraggler(v, 8, 0.5, true, /*contention=*/false);
  const ReconcileResult r = Reconcile(**ctl, v);
  ASSERT_EQ(Count(r, ActionKind::kMigrate), 1);
  EXPECT_EQ(r.dispatch[0].target, "w8");
  // Once bad_node_ttl_s has passed, w7 may be tried again.
  clock_.AdvanceMs(static_cast<int64_t>(c.restart.bad_node_ttl_s * 1000));
  MakeStraggler(v, 8, 1.0, false);
  v.workers[8].straggler = false;
  const ReconcileResult later = Reconcile(**ctl, v);
  ASSERT_EQ(Count(later, ActionKind::kMigrate), 1);
  EXPECT_EQ(later.dispatch[0].target, "w7");
}

TEST_F(RelaunchRulesTest, AHotServerIsRestartedThoughWorkerRelaunchesUsedTheirBudget) {
  auto ctl = Controller::Create(NonDedicated());
  ASSERT_TRUE(ctl.ok());
  ClusterView v = AsyncJob(100);
  for (int i : {3, 4, 5}) MakeStraggler(v, i, 0.2 + 0.01 * i, true, /*contention=*/true);
  v.servers.push_back(ServerView{"ps0", "n90", 10, 1.0, false, false});
  v.servers.push_back(ServerView{"ps1", "n91", 10, 1.0, false, false});
  const ReconcileResult first = Reconcile(**ctl, v);
  EXPECT_EQ(Count(first, ActionKind::kRestart), 2);  // the budget of the window, slowest first
  const AuditRecord* held = NewestOf((*ctl)->history(), ActionKind::kRestart, "w5");
  ASSERT_NE(held, nullptr);
  EXPECT_NE(held->veto_reason.find("max_restarts_per_window: 2 relaunches"), std::string::npos)
      << held->veto_reason;
  // Five minutes on a server turns hot: its restart has a budget of its own.
  clock_.AdvanceMs(5 * 60 * 1000);
  v.servers[1] = ServerView{"ps1", "n91", 30, 3.0, true, true};
  const ReconcileResult second = Reconcile(**ctl, v);
  EXPECT_EQ(Count(second, ActionKind::kRestartServer), 1);
  EXPECT_EQ(Count(second, ActionKind::kRestart), 0);
}

TEST(MonitorOptionsFromPolicyTest, TheMonitorCallsAServerHotAtThePolicysThreshold) {
  PolicyConfig p;
  p.server.hot_threshold = 1.5;
  EXPECT_DOUBLE_EQ(MonitorOptionsFromPolicy(p, MonitorOptions()).hot_server_ratio, 1.5);
  p.server.hot_threshold = 1;  // "every server": not a ratio the monitor accepts; its default stays
  EXPECT_DOUBLE_EQ(MonitorOptionsFromPolicy(p, MonitorOptions()).hot_server_ratio,
                   MonitorOptions().hot_server_ratio);
}

}  // namespace
}  // namespace pacer
