// The controller's durable state across pacerd restarts (the controller state as journaled
// updates, controller/controller_store.h), in process on a simulated clock
// (tests/testing/pacerd_harness.h: real gRPC, real RocksDB, production's housekeeping step).
//  - An exclusion the per-step burst rule made survives a restart while the burst lasts: the
//    same workers, the same version (the deciding audit id) and the same reason go out in the
//    heartbeat replies, no other rule ends it for lack of fresh timings, every audit record is
//    kept with its dispatch note, and the rule still lets the worker back in once it is fast.
//    The same for an exclusion the window rule made.
//  - A damaged controller journal is refused at start with DATA_LOSS naming the folder.
#include <gtest/gtest.h>
#include <rocksdb/db.h>

#include <map>
#include <string>

#include "tests/testing/fault_injection_fs.h"
#include "tests/testing/pacerd_harness.h"

namespace pacer {
namespace {

using testing::HarnessOptions;
using testing::PacerdHarness;
using testing::ScriptedJob;

ScriptedJob::Options JobOptions() {
  ScriptedJob::Options o;
  o.workers = 4;
  o.batch = 64;
  o.per_sample_s = 0.04 / 64;
  o.honors_exclusion = true;
  return o;
}

HarnessOptions StepRule() {
  HarnessOptions o;
  o.policy = "burst-step-rule-1s";
  return o;
}

std::vector<ActionRecord> Executed(const ListActionsResponse& a, const std::string& kind,
                                   uint64_t after_id = 0) {
  std::vector<ActionRecord> out;
  for (auto it = a.actions().rbegin(); it != a.actions().rend(); ++it) {  // oldest first
    if (it->kind() == kind && it->outcome() == "executed" && it->id() > after_id) out.push_back(*it);
  }
  return out;
}

// What a worker that holds no exclusion version is told now (command id, excluded, reason).
struct Told {
  uint64_t version = 0;
  bool excluded = false;
  std::string reason;
};
Told AskAfresh(testing::ScriptedWorker& w) {
  w.ForgetExclusion();
  Told t;
  auto r = w.Heartbeat();
  EXPECT_TRUE(r.ok()) << r.status();
  if (!r.ok()) return t;
  for (const WorkerCommand& c : r->commands()) {
    if (!c.has_exclusion()) continue;
    t.version = c.exclusion().version();
    t.excluded = c.exclusion().excluded();
    t.reason = c.reason();
  }
  return t;
}

TEST(ControllerRestartTest, TheStepRulesExclusionSurvivesARestartWhileTheBurstLasts) {
  PacerdHarness h(StepRule());
  ASSERT_TRUE(h.ok());
  ScriptedJob job(h, JobOptions());
  ASSERT_TRUE(job.Connect().ok());
  ASSERT_TRUE(job.Run(5'000).ok());
  job.SetSpeed("w1", 0.25);  // a burst that outlasts the restart
  ASSERT_TRUE(job.Run(3'000).ok());
  ASSERT_TRUE(job.worker("w1").excluded()) << "the step rule excludes the burst within 3 s";
  const ListActionsResponse before = h.Actions();
  const std::vector<ActionRecord> exclusions = Executed(before, "EXCLUDE_WORKERS");
  ASSERT_EQ(exclusions.size(), 1u);
  const ActionRecord decided = exclusions[0];
  ASSERT_EQ(h->reconciler()->Exclusion().first, decided.id());
  const Told told_before = AskAfresh(job.worker("w2"));
  EXPECT_EQ(told_before.version, decided.id());
  EXPECT_EQ(told_before.reason, decided.reason());
  uint64_t newest_before = 0;
  for (const auto& r : before.actions()) newest_before = std::max<uint64_t>(newest_before, r.id());

  h.Restart();
  ASSERT_TRUE(h.ok());
  ASSERT_TRUE(job.Connect().ok());
  // Who, since which decision and why: as before the restart.
  EXPECT_EQ(h->reconciler()->Exclusion(),
            (std::pair<uint64_t, std::vector<std::string>>{decided.id(), {"w1"}}));
  const Told told_after = AskAfresh(job.worker("w2"));
  EXPECT_EQ(told_after.version, decided.id()) << "a worker holding the decision's version keeps it";
  EXPECT_FALSE(told_after.excluded);
  EXPECT_EQ(told_after.reason, decided.reason()) << "why w1 is excluded is kept";
  // Every decision before the restart is still in the audit, with where it went.
  const ListActionsResponse restored = h.Actions();
  std::map<uint64_t, const ActionRecord*> by_id;
  for (const auto& r : restored.actions()) by_id[r.id()] = &r;
  for (const auto& r : before.actions()) {
    ASSERT_TRUE(by_id.count(r.id())) << "audit record " << r.id() << " lost";
    EXPECT_EQ(by_id[r.id()]->kind(), r.kind());
    EXPECT_EQ(by_id[r.id()]->reason(), r.reason());
    EXPECT_EQ(by_id[r.id()]->dispatch(), r.dispatch());
  }

  // The burst goes on: nobody ends the exclusion (the window rule has no windows yet and the
  // step rule sees w1's probes still slow).
  ASSERT_TRUE(job.Run(4'000).ok());
  EXPECT_TRUE(job.worker("w1").excluded()) << "the exclusion was lost at the restart";
  EXPECT_TRUE(Executed(h.Actions(), "EXCLUDE_WORKERS", newest_before).empty())
      << "an exclusion decision after the restart: " << Executed(h.Actions(), "EXCLUDE_WORKERS", newest_before)[0].reason();

  // Once w1 is fast again the step rule lets it back in, as without a restart.
  job.SetSpeed("w1", 1);
  ASSERT_TRUE(job.Run(4'000).ok());
  EXPECT_FALSE(job.worker("w1").excluded());
  const std::vector<ActionRecord> after = Executed(h.Actions(), "EXCLUDE_WORKERS", newest_before);
  ASSERT_EQ(after.size(), 1u);
  EXPECT_NE(after[0].reason().find("burst over"), std::string::npos) << after[0].reason();
}

// The same for an exclusion the window rule made (burst-exclusion-1s): kept across the restart
// and past the hold, while the monitor's windows fill again and show the burst going on.
TEST(ControllerRestartTest, TheWindowRulesExclusionSurvivesARestartWhileTheBurstLasts) {
  HarnessOptions ho;
  ho.policy = "burst-exclusion-1s";
  PacerdHarness h(ho);
  ASSERT_TRUE(h.ok());
  ScriptedJob job(h, JobOptions());
  ASSERT_TRUE(job.Connect().ok());
  ASSERT_TRUE(job.Run(3'000).ok());
  job.SetSpeed("w3", 0.25);
  ASSERT_TRUE(job.Run(4'000).ok());
  ASSERT_TRUE(job.worker("w3").excluded());
  const ListActionsResponse before = h.Actions();
  uint64_t newest_before = 0;
  for (const auto& r : before.actions()) newest_before = std::max<uint64_t>(newest_before, r.id());
  const auto exclusion = h->reconciler()->Exclusion();

  h.Restart();
  ASSERT_TRUE(h.ok());
  ASSERT_TRUE(job.Connect().ok());
  EXPECT_EQ(h->reconciler()->Exclusion(), exclusion);
  ASSERT_TRUE(job.Run(8'000).ok());  // past the hold (5 s)
  EXPECT_TRUE(job.worker("w3").excluded()) << "the exclusion was lost at the restart";
  const std::vector<ActionRecord> after = Executed(h.Actions(), "EXCLUDE_WORKERS", newest_before);
  EXPECT_TRUE(after.empty()) << after.size() << " exclusion decisions after the restart, first: "
                             << (after.empty() ? "" : after[0].reason());
}

// The newest record of the controller's journal is overwritten with bytes that are no record:
// pacerd refuses to start, naming the folder and the update, instead of starting without the
// decisions.
TEST(ControllerRestartTest, ADamagedControllerJournalIsRefusedAtStart) {
  PacerdHarness h(StepRule());
  ASSERT_TRUE(h.ok());
  ScriptedJob job(h, JobOptions());
  ASSERT_TRUE(job.Connect().ok());
  ASSERT_TRUE(job.Run(3'000).ok());
  h->reconciler()->RecordOperatorEvent("before the damage");
  h.Stop();
  const std::string dir = h.options().data_dir + "/controller";
  {
    rocksdb::DB* raw = nullptr;
    ASSERT_TRUE(rocksdb::DB::Open(rocksdb::Options(), dir, &raw).ok());
    std::unique_ptr<rocksdb::DB> db(raw);
    std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(rocksdb::ReadOptions()));
    it->SeekForPrev(std::string("j\xff\xff\xff\xff\xff\xff\xff\xff", 9));
    ASSERT_TRUE(it->Valid() && it->key().size() == 9 && it->key()[0] == 'j') << "no record";
    const std::string key = it->key().ToString();
    rocksdb::WriteOptions wo;
    wo.sync = true;
    ASSERT_TRUE(db->Put(wo, key, "\x0a\x05garbage").ok());
  }
  const absl::Status s = h.TryStart();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find(dir), std::string::npos) << s;
  EXPECT_NE(s.message().find("corrupt"), std::string::npos) << s;
  EXPECT_FALSE(h.ok());
}

// A controller decision is carried out only once it is durable. While the journals' file
// system refuses writes (a full disk) the controller's journal write fails: the plan it decided
// reaches no worker, and its memory is rebuilt from its journal. Once writes succeed again it
// decides again; the plan it carries out is the one a restarted pacerd restores.
TEST(ControllerRestartTest, ADecisionIsCarriedOutOnlyOnceItIsDurable) {
  auto faults = std::make_shared<testing::FaultInjectionFs>();
  testing::HarnessOptions ho;
  ho.policy = "dedicated-1s";
  ho.adjust = [faults](PacerdOptions& o) {
    o.journal_retry_ms = 0;
    o.sharding.journal.fs = faults;
  };
  testing::PacerdHarness h(ho);
  ASSERT_TRUE(h.ok());
  testing::ScriptedJob job(h, {});
  ASSERT_TRUE(job.Connect().ok());
  ASSERT_TRUE(job.Run(2'000).ok());
  ASSERT_FALSE(h->reconciler()->PlanFor("w0").has_value());
  faults->SetFault(testing::FaultInjectionFs::Fault::kNoSpace);
  job.SetSpeed("w3", 0.5);  // a persistent straggler: the policy plans after two windows
  for (int s = 0; s < 12; ++s) (void)job.Run(1'000);  // heartbeats may fail: nothing is written
  EXPECT_GT(faults->refused(), 0u);
  EXPECT_FALSE(h->reconciler()->PlanFor("w0").has_value())
      << "a plan was carried out whose decision is not durable";
  for (auto& w : job.workers()) EXPECT_EQ(w->plan_version(), 0u) << w->id();

  faults->SetFault(testing::FaultInjectionFs::Fault::kNone);
  for (int s = 0; s < 20 && !h->reconciler()->PlanFor("w0"); ++s) (void)job.Run(1'000);
  auto plan = h->reconciler()->PlanFor("w0");
  ASSERT_TRUE(plan.has_value()) << "no plan once the journal takes writes again";
  const uint64_t version = plan->version();
  ASSERT_TRUE(job.Run(2'000).ok());
  for (auto& w : job.workers()) EXPECT_EQ(w->plan_version(), version) << w->id();

  h.Restart();
  ASSERT_TRUE(h.ok());
  plan = h->reconciler()->PlanFor("w0");
  ASSERT_TRUE(plan.has_value()) << "the plan carried out is not restored";
  EXPECT_EQ(plan->version(), version);
  ListActionsResponse actions;
  h->reconciler()->ListActions(ListActionsRequest(), &actions);
  for (const ActionRecord& a : actions.actions()) {
    if (a.kind() != "ADJUST_BS" || a.outcome() != "executed") continue;
    EXPECT_FALSE(a.dispatch().empty()) << "executed but never carried out: action " << a.id();
  }
}

}  // namespace
}  // namespace pacer
