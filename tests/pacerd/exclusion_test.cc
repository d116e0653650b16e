// EXCLUDE_WORKERS through pacerd, in process on a simulated clock (tests/testing/
// pacerd_harness.h: real gRPC on loopback, real RocksDB, production's housekeeping step): a
// ScriptedJob's workers report steps to the monitor and heartbeat as the SDK does (announcing
// whether their trainer honors exclusion and which exclusion version they hold, applying the
// ExclusionCommands of the replies). One worker goes through a short burst at a quarter of its
// speed; while excluded it reports probe steps, as pacer-train-mlp does.
//  - The burst leads to an exclusion that reaches exactly that worker, and once its probe
//    speed is back, to a re-inclusion; versions only move forward; the audit says where the
//    commands went.
//  - Nobody is excluded while one live worker's trainer cannot carry an exclusion out, and an
//    exclusion in force ends when such a worker joins.
//  - The exclusion in force survives a pacerd restart and is re-sent under a version no worker
//    can hold with a different state.
// (ShardReader::ReleaseAll, what an excluded SDK worker does with its leases, is in
// tests/sdk/client_test.cc: the SDK's threads need the real clock.)
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "tests/testing/pacerd_harness.h"

namespace pacer {
namespace {

using testing::HarnessOptions;
using testing::PacerdHarness;
using testing::ScriptedJob;
using testing::ScriptedWorker;

// burst-exclusion-1s: a burst of 4 s is never persistent (5 of 5 windows), so no batch plan
// gets in the way.
HarnessOptions Options() {
  HarnessOptions o;
  o.policy = "burst-exclusion-1s";
  return o;
}

// 4 workers, 10 steps/s of 64 samples (0.04 s at full speed), a heartbeat a second, all
// honoring exclusion unless the test says otherwise.
ScriptedJob::Options JobOptions() {
  ScriptedJob::Options o;
  o.workers = 4;
  o.batch = 64;
  o.per_sample_s = 0.04 / 64;
  o.comm_s = 0.005;
  o.honors_exclusion = true;
  return o;
}

class ExclusionTest : public ::testing::Test {
 protected:
  void StartJob() {
    ASSERT_TRUE(h_.ok());
    ASSERT_TRUE(job_.Connect().ok());
  }
  ScriptedWorker& W(const std::string& id) { return job_.worker(id); }

  // `seconds` of the job; then every exclusion command a worker received so far is checked:
  // none went to a worker that cannot carry it out, versions only move forward.
  void Run(int seconds) {
    absl::Status s = job_.Run(seconds * 1000);
    ASSERT_TRUE(s.ok()) << s;
    ASSERT_NO_FATAL_FAILURE(CheckReceived());
  }
  void Heartbeats() {
    absl::Status s = job_.Heartbeats();
    ASSERT_TRUE(s.ok()) << s;
    ASSERT_NO_FATAL_FAILURE(CheckReceived());
  }
  void CheckReceived() {
    for (const auto& w : job_.workers()) {
      for (const auto& r : w->exclusions_received()) {
        ASSERT_TRUE(r.honoring) << "an exclusion command went to " << w->id()
                                << ", which cannot carry it out";
        ASSERT_GT(r.command.version(), r.held_version) << "versions only move forward";
      }
    }
  }
  static size_t Commands(const ScriptedWorker& w) { return w.exclusions_received().size(); }

  std::vector<ActionRecord> Exclusions() {
    std::vector<ActionRecord> out;
    const ListActionsResponse a = h_.Actions();
    for (auto it = a.actions().rbegin(); it != a.actions().rend(); ++it) {  // oldest first
      if (it->kind() == "EXCLUDE_WORKERS" && it->outcome() == "executed") out.push_back(*it);
    }
    return out;
  }

  PacerdHarness h_{Options()};
  ScriptedJob job_{h_, JobOptions()};
};

TEST_F(ExclusionTest, ABurstIsExcludedAndTheWorkerIsWaitedForAgainWhenItRecovers) {
  ASSERT_NO_FATAL_FAILURE(StartJob());
  ASSERT_NO_FATAL_FAILURE(Run(6));
  EXPECT_TRUE(Exclusions().empty()) << "nobody is excluded at equal speeds";
  for (const auto& w : job_.workers()) EXPECT_FALSE(w->excluded());

  job_.SetSpeed("w3", 0.25);  // a burst of contention
  ASSERT_NO_FATAL_FAILURE(Run(4));
  ASSERT_TRUE(W("w3").excluded()) << "the burst is excluded within 4 s";
  for (const auto& w : job_.workers()) {
    if (w->id() != "w3") {
      EXPECT_FALSE(w->excluded()) << w->id();
    }
  }
  const auto [version, who] = h_->reconciler()->Exclusion();
  EXPECT_EQ(who, std::vector<std::string>{"w3"});
  std::vector<ActionRecord> ex = Exclusions();
  ASSERT_EQ(ex.size(), 1u);
  EXPECT_EQ(ex[0].id(), version) << "the command's version is the decision's audit id";
  EXPECT_EQ(ex[0].target(), "w3");
  EXPECT_GT(ex[0].predicted_gain(), 0.05);
  EXPECT_EQ(ex[0].dispatch(), "sent in heartbeat replies: excluded w3");
  EXPECT_EQ(W("w3").exclusion_version(), version);
  EXPECT_EQ(W("w0").exclusion_version(), version) << "every honoring worker holds the version";

  // While the burst lasts, the probe keeps showing it slow: still excluded, no flapping.
  ASSERT_NO_FATAL_FAILURE(Run(3));
  EXPECT_TRUE(W("w3").excluded());
  EXPECT_EQ(Exclusions().size(), 1u);

  job_.SetSpeed("w3", 1);  // the burst is over; only the probe can show it
  ASSERT_NO_FATAL_FAILURE(Run(4));
  EXPECT_FALSE(W("w3").excluded()) << "re-included once its probe speed is back";
  ex = Exclusions();
  ASSERT_EQ(ex.size(), 2u);
  EXPECT_EQ(ex[1].target(), "w3");
  EXPECT_NE(ex[1].reason().find("burst over"), std::string::npos) << ex[1].reason();
  EXPECT_EQ(ex[1].dispatch(), "sent in heartbeat replies: every worker counted");
  EXPECT_GT(W("w3").exclusion_version(), ex[0].id());
  EXPECT_EQ(Commands(W("w3")), 2u);

  // Workers that hold the version get nothing again (exclusion commands only: whether the
  // reply carries a batch plan depends on whether the reconciler made one).
  auto r = W("w3").Heartbeat();
  ASSERT_TRUE(r.ok()) << r.status();
  int exclusions = 0;
  for (const auto& cmd : r->commands()) exclusions += cmd.has_exclusion();
  EXPECT_EQ(exclusions, 0) << r->ShortDebugString();
}

TEST_F(ExclusionTest, NobodyIsExcludedWhileALiveWorkerCannotCarryItOut) {
  W("w1").set_honors_exclusion(false);  // e.g. a PyTorch trainer: its steps cannot skip a gradient
  ASSERT_NO_FATAL_FAILURE(StartJob());
  ASSERT_NO_FATAL_FAILURE(Run(3));
  job_.SetSpeed("w3", 0.25);
  ASSERT_NO_FATAL_FAILURE(Run(6));
  EXPECT_TRUE(Exclusions().empty());
  for (const auto& w : job_.workers()) {
    EXPECT_FALSE(w->excluded()) << w->id();
    EXPECT_EQ(Commands(*w), 0u) << w->id();
  }
  EXPECT_EQ(h_->reconciler()->Exclusion().first, 0u);
}

TEST_F(ExclusionTest, AnExclusionEndsWhenAWorkerThatCannotCarryItOutJoins) {
  ASSERT_NO_FATAL_FAILURE(StartJob());
  ASSERT_NO_FATAL_FAILURE(Run(3));
  job_.SetSpeed("w3", 0.25);
  ASSERT_NO_FATAL_FAILURE(Run(4));
  ASSERT_TRUE(W("w3").excluded());
  // w1 restarts with a trainer that cannot honor exclusion; the burst goes on.
  W("w1").set_honors_exclusion(false);
  W("w1").ForgetExclusion();
  ASSERT_NO_FATAL_FAILURE(Run(2));
  EXPECT_FALSE(W("w3").excluded()) << "everyone is waited for again";
  const std::vector<ActionRecord> ex = Exclusions();
  ASSERT_EQ(ex.size(), 2u);
  EXPECT_NE(ex[1].reason().find("cannot carry out an exclusion"), std::string::npos) << ex[1].reason();
  EXPECT_TRUE(h_->reconciler()->Exclusion().second.empty());
}

TEST_F(ExclusionTest, TheExclusionInForceSurvivesAPacerdRestart) {
  ASSERT_NO_FATAL_FAILURE(StartJob());
  ASSERT_NO_FATAL_FAILURE(Run(3));
  job_.SetSpeed("w3", 0.25);
  ASSERT_NO_FATAL_FAILURE(Run(4));
  ASSERT_TRUE(W("w3").excluded());
  const uint64_t held = W("w3").exclusion_version();

  h_.Restart();
  ASSERT_TRUE(h_.ok());
  ASSERT_TRUE(job_.Connect().ok());
  const auto [version, who] = h_->reconciler()->Exclusion();
  EXPECT_EQ(who, std::vector<std::string>{"w3"});
  EXPECT_GE(version, held);
  // A worker that restarted meanwhile (holds nothing) learns it is excluded; one that holds
  // the old version keeps its state (a newer version says the same, or nothing comes).
  W("w0").ForgetExclusion();
  ASSERT_NO_FATAL_FAILURE(Heartbeats());
  EXPECT_FALSE(W("w0").excluded());
  EXPECT_EQ(W("w0").exclusion_version(), version);
  EXPECT_TRUE(W("w3").excluded());
}

}  // namespace
}  // namespace pacer
