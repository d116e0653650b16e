// Scripted scenarios on the simulated clock, one per class of DESIGN.md §3. Each asserts the
// property that matters: the right worker is flagged with the right class within a few
// windows, and nobody else is flagged. Seeds are fixed; nothing sleeps.
#include <gtest/gtest.h>

#include "tests/monitor/scenario_driver.h"

namespace pacer {
namespace {

using testing::ScenarioDriver;
using Kind = SyntheticTrace::SlowdownKind;

constexpr int64_t kWindow = 10'000;

SyntheticTraceOptions Cluster(uint32_t workers = 32, uint64_t seed = 7) {
  SyntheticTraceOptions o;
  o.workers = workers;
  o.workers_per_node = 4;
  o.seed = seed;
  return o;
}

TEST(StragglerScenarioTest, PersistentThirtyPercentSlowdownIsFlaggedWithinThreeWindows) {
  ScenarioDriver d(Cluster());
  d.RunForMs(6 * kWindow);
  const uint64_t seq = d.last_seq();
  // Onset in the middle of a window: that window is only partly slow.
  d.RunForMs(3'000);
  d.trace().AddSlowdown({Kind::kHardware, "w5", 1.3, d.now_ms()});
  const int flagged = d.RunUntil([&] { return d.Class("w5") == WORKER_CLASS_STRAGGLER; }, 10);
  EXPECT_GE(flagged, 1);
  EXPECT_LE(flagged, 3) << "windows until flagged";
  const int persistent = d.RunUntil(
      [&] { return d.Of("w5").persistence() == PERSISTENCE_PERSISTENT; }, 10);
  EXPECT_GE(persistent, 0);
  EXPECT_LE(flagged + persistent, 5) << "windows until persistent";
  d.RunForMs(3 * kWindow);
  const Classification c = d.Of("w5");
  EXPECT_EQ(c.worker_class(), WORKER_CLASS_STRAGGLER);
  EXPECT_EQ(c.persistence(), PERSISTENCE_PERSISTENT);
  EXPECT_EQ(c.cause(), CAUSE_DETERMINISTIC) << c.evidence();
  EXPECT_EQ(c.scope(), SCOPE_WORKER);
  EXPECT_GT(c.confidence(), 0.6);
  EXPECT_NEAR(d.state().Worker("w5")->relative_speed(), 1 / 1.3, 0.05);
  const double median = d.state().median_speed();
  EXPECT_NEAR(d.state().Worker("w5")->smoothed_speed() / median, 1 / 1.3, 0.05);
  EXPECT_TRUE(d.FlaggedSince(seq, {"w5"}).empty());
}

TEST(StragglerScenarioTest, TwoXSlowdownFor20SecondsIsTransientAndClears) {
  ScenarioDriver d(Cluster());
  d.RunForMs(6 * kWindow);
  const uint64_t seq = d.last_seq();
  d.trace().AddSlowdown({Kind::kHardware, "w3", 2.0, d.now_ms(), d.now_ms() + 20'000});
  bool seen_straggler = false, seen_persistent = false;
  for (int w = 0; w < 8; ++w) {
    d.RunForMs(kWindow);
    const Classification c = d.Of("w3");
    seen_straggler |= c.worker_class() == WORKER_CLASS_STRAGGLER;
    seen_persistent |= c.persistence() == PERSISTENCE_PERSISTENT;
    if (c.worker_class() == WORKER_CLASS_STRAGGLER) {
      EXPECT_EQ(c.persistence(), PERSISTENCE_TRANSIENT);
    }
  }
  EXPECT_TRUE(seen_straggler);
  EXPECT_FALSE(seen_persistent);
  EXPECT_EQ(d.Class("w3"), WORKER_CLASS_NORMAL);
  EXPECT_TRUE(d.FlaggedSince(seq, {"w3"}).empty());
  // Its events: normal -> transient straggler -> normal.
  std::vector<WorkerClass> classes;
  for (const ClassificationEvent& e : d.events()) {
    if (e.seq() > seq && e.id() == "w3") classes.push_back(e.current().worker_class());
  }
  EXPECT_EQ(classes, (std::vector<WorkerClass>{WORKER_CLASS_STRAGGLER, WORKER_CLASS_NORMAL}));
}

TEST(StragglerScenarioTest, NodeLevelContentionFlagsEveryWorkerOfTheNode) {
  ScenarioDriver d(Cluster());
  d.RunForMs(6 * kWindow);
  const uint64_t seq = d.last_seq();
  d.trace().AddSlowdown({Kind::kNodeContention, "n2", 1.5, d.now_ms()});
  d.RunForMs(6 * kWindow);
  for (const char* w : {"w8", "w9", "w10", "w11"}) {
    const Classification c = d.Of(w);
    EXPECT_EQ(c.worker_class(), WORKER_CLASS_STRAGGLER) << w;
    EXPECT_EQ(c.persistence(), PERSISTENCE_PERSISTENT) << w;
    EXPECT_EQ(c.scope(), SCOPE_NODE) << w << ": " << c.evidence();
    EXPECT_EQ(c.cause(), CAUSE_CONTENTION) << w << ": " << c.evidence();
  }
  EXPECT_TRUE(d.FlaggedSince(seq, {"w8", "w9", "w10", "w11"}).empty());
  bool found = false;
  for (const NodeStatus& n : d.state().Nodes()) {
    if (n.node() != "n2") continue;
    found = true;
    EXPECT_EQ(n.stragglers(), 4u);
    EXPECT_GE(n.contention_score(), 1.0);
    EXPECT_NEAR(n.median_relative_speed(), 1 / 1.5, 0.05);
  }
  EXPECT_TRUE(found);
}

TEST(StragglerScenarioTest, ContentionOnOneWorkerIsWorkerLevelContention) {
  ScenarioDriver d(Cluster());
  d.RunForMs(6 * kWindow);
  d.trace().AddSlowdown({Kind::kContention, "w9", 1.4, d.now_ms()});
  d.RunForMs(6 * kWindow);
  const Classification c = d.Of("w9");
  EXPECT_EQ(c.worker_class(), WORKER_CLASS_STRAGGLER);
  EXPECT_EQ(c.cause(), CAUSE_CONTENTION) << c.evidence();
  EXPECT_EQ(c.scope(), SCOPE_WORKER) << c.evidence();
  EXPECT_EQ(d.Class("w8"), WORKER_CLASS_NORMAL);
}

TEST(StragglerScenarioTest, HardwareSlowWorkerIsPersistentAndDeterministic) {
  ScenarioDriver d(Cluster(32, 11));
  // Slow from the very start, as an older machine would be.
  d.trace().AddSlowdown({Kind::kHardware, "w20", 1.6, 0});
  d.RunForMs(8 * kWindow);
  const Classification c = d.Of("w20");
  EXPECT_EQ(c.worker_class(), WORKER_CLASS_STRAGGLER);
  EXPECT_EQ(c.persistence(), PERSISTENCE_PERSISTENT);
  EXPECT_EQ(c.cause(), CAUSE_DETERMINISTIC) << c.evidence();
  EXPECT_NE(c.evidence().find("hardware"), std::string::npos) << c.evidence();
  EXPECT_TRUE(d.FlaggedSince(0, {"w20"}).empty());
}

TEST(StragglerScenarioTest, HotPsServerIsServerLevelAndWorkersStayNormal) {
  SyntheticTraceOptions o = Cluster(16);
  o.servers = 4;
  ScenarioDriver d(o);
  d.RunForMs(6 * kWindow);
  const uint64_t seq = d.last_seq();
  d.trace().AddHotServer({"ps2", 5.0, d.now_ms()});
  d.RunForMs(6 * kWindow);
  const Classification c = d.ServerOf("ps2");
  EXPECT_EQ(c.worker_class(), WORKER_CLASS_STRAGGLER) << c.evidence();
  EXPECT_EQ(c.scope(), SCOPE_SERVER);
  EXPECT_EQ(c.persistence(), PERSISTENCE_PERSISTENT);
  for (const char* s : {"ps0", "ps1", "ps3"}) EXPECT_EQ(d.ServerOf(s).worker_class(), WORKER_CLASS_NORMAL) << s;
  // Relative speed of a server = median latency / its latency: the hot one far below 1.
  for (const WorkerStatus& s : d.Servers()) {
    if (s.id() == "ps2") {
      EXPECT_LT(s.relative_speed(), 0.5) << s.latency_ms();
    } else {
      EXPECT_NEAR(s.relative_speed(), 1.0, 0.2) << s.id();
    }
  }
  // Compute speed is unaffected: no worker is flagged (their comm time grew, not compute).
  EXPECT_TRUE(d.FlaggedSince(seq, {"ps2"}).empty());
}

TEST(StragglerScenarioTest, FastWorkerIsAPersistentLeader) {
  ScenarioDriver d(Cluster());
  d.trace().AddSlowdown({Kind::kHardware, "w7", 0.7, 0});  // 1/0.7 = 1.43x faster
  d.RunForMs(8 * kWindow);
  const Classification c = d.Of("w7");
  EXPECT_EQ(c.worker_class(), WORKER_CLASS_LEADER) << c.evidence();
  EXPECT_EQ(c.persistence(), PERSISTENCE_PERSISTENT);
  EXPECT_NEAR(d.state().Worker("w7")->relative_speed(), 1 / 0.7, 0.07);
  EXPECT_TRUE(d.FlaggedSince(0, {"w7"}).empty());
}

TEST(StragglerScenarioTest, NoiseOnlyRaisesNoFlagsOverAnHour) {
  for (uint64_t seed : {1, 2}) {
    ScenarioDriver d(Cluster(64, seed));
    d.RunForMs(3'600'000);
    EXPECT_TRUE(d.FlaggedSince(0, {}).empty()) << "seed " << seed << ": " << d.FlaggedSince(0, {}).front();
    for (const WorkerStatus& w : d.state().Workers()) {
      EXPECT_EQ(w.classification().worker_class(), WORKER_CLASS_NORMAL) << w.id();
    }
  }
}

TEST(StragglerScenarioTest, SilentWorkerBecomesUnknown) {
  MonitorOptions mo;
  ScenarioDriver d(Cluster(8), mo);
  d.RunForMs(4 * kWindow);
  EXPECT_EQ(d.Class("w1"), WORKER_CLASS_NORMAL);
  // w1 stops (a 1000x slowdown: no step ends for a long time).
  d.trace().AddSlowdown({Kind::kHardware, "w1", 1000, d.now_ms(), d.now_ms() + 5 * kWindow});
  d.RunForMs(5 * kWindow);
  EXPECT_EQ(d.Class("w1"), WORKER_CLASS_UNKNOWN) << d.Of("w1").evidence();
}

TEST(StragglerScenarioTest, EventsCarryPreviousAndCurrentWithIncreasingSeq) {
  ScenarioDriver d(Cluster());
  d.RunForMs(4 * kWindow);
  d.trace().AddSlowdown({Kind::kHardware, "w5", 1.5, d.now_ms()});
  d.RunForMs(6 * kWindow);
  uint64_t last = 0;
  std::vector<std::pair<WorkerClass, Persistence>> w5;
  for (const ClassificationEvent& e : d.events()) {
    EXPECT_GT(e.seq(), last);
    last = e.seq();
    if (e.id() == "w5" && e.previous().worker_class() != WORKER_CLASS_UNKNOWN) {
      w5.emplace_back(e.current().worker_class(), e.current().persistence());
      EXPECT_FALSE(e.current().evidence().empty());
    }
  }
  ASSERT_GE(w5.size(), 2u);
  EXPECT_EQ(w5.front(), std::make_pair(WORKER_CLASS_STRAGGLER, PERSISTENCE_TRANSIENT));
  EXPECT_EQ(w5.back().second, PERSISTENCE_PERSISTENT);
  EXPECT_EQ(d.state().EventsAfter(last - 1, 10).size(), 1u);
}

}  // namespace
}  // namespace pacer
