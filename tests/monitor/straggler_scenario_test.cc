// Scripted scenarios on the simulated clock, one per class of docs/design.md §3. Each asserts the
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

// The batch planner predicts a plan's gain from each worker's step-time fit: the fit of a worker
// that turned a persistent straggler must describe its steps now, not a blend with the long
// fast history before (which predicted almost no gain for the plan the windows called for).
TEST(StragglerScenarioTest, StepModelOfAPersistentStragglerDescribesItsStepsNow) {
  ScenarioDriver d(Cluster());
  d.RunForMs(30 * kWindow);  // a long history of fast steps
  d.RunForMs(3'000);
  d.trace().AddSlowdown({Kind::kHardware, "w5", 2.5, d.now_ms()});
  const int persistent = d.RunUntil([&] {
    const Classification c = d.Of("w5");
    return c.worker_class() == WORKER_CLASS_STRAGGLER && c.persistence() == PERSISTENCE_PERSISTENT;
  }, 10);
  ASSERT_GE(persistent, 0);
  d.RunForMs(kWindow);  // one window of reports after the change
  const WorkerStatus w = *d.state().Worker("w5");
  ASSERT_GT(w.speed(), 0);
  ASSERT_GT(w.local_batch(), 0u);
  const double measured = w.local_batch() / w.speed();  // compute seconds per step, last window
  const double predicted = *d.state().PredictStepSeconds("w5", w.local_batch());
  EXPECT_NEAR(predicted / measured, 1.0, 0.15) << "predicted " << predicted << " s, measured " << measured << " s";
  // A normal worker keeps its long fit.
  const WorkerStatus n = *d.state().Worker("w6");
  EXPECT_NEAR(*d.state().PredictStepSeconds("w6", n.local_batch()) / (n.local_batch() / n.speed()), 1.0, 0.15);
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

// ---- How many workers each rule needs (docs/design.md §3) ----

// A pair is the smallest job: the slower of two is compared with the faster (the median of two
// is their mean, under which a 3x straggler reads 0.5 and its partner 1.5 — a "leader").
TEST(StragglerScenarioTest, PairThreeXStragglerIsFlaggedWithinThreeWindowsAndThePartnerIsNot) {
  ScenarioDriver d(Cluster(2));
  d.RunForMs(4 * kWindow);
  EXPECT_EQ(d.Class("w0"), WORKER_CLASS_NORMAL) << d.Of("w0").evidence();
  EXPECT_EQ(d.Class("w1"), WORKER_CLASS_NORMAL) << d.Of("w1").evidence();
  const uint64_t seq = d.last_seq();
  d.trace().AddSlowdown({Kind::kHardware, "w1", 3.0, d.now_ms()});
  const int persistent = d.RunUntil(
      [&] {
        const Classification c = d.Of("w1");
        return c.worker_class() == WORKER_CLASS_STRAGGLER &&
               c.persistence() == PERSISTENCE_PERSISTENT;
      },
      10);
  EXPECT_GE(persistent, 1);
  EXPECT_LE(persistent, 3) << "windows until a persistent straggler";
  d.RunForMs(3 * kWindow);
  EXPECT_NEAR(d.state().Worker("w1")->relative_speed(), 1 / 3.0, 0.05);
  EXPECT_NEAR(d.state().Worker("w0")->relative_speed(), 1.0, 1e-6);  // the reference
  EXPECT_EQ(d.Class("w0"), WORKER_CLASS_NORMAL) << "no leaders in a pair";
  EXPECT_NEAR(d.state().reference_speed(), d.state().Worker("w0")->speed(), 1e-3);
  EXPECT_TRUE(d.FlaggedSince(seq, {"w1"}).empty());
}

TEST(StragglerScenarioTest, PairThirtyPercentSlowdownIsFlagged) {
  ScenarioDriver d(Cluster(2, 3));
  d.RunForMs(4 * kWindow);
  d.trace().AddSlowdown({Kind::kHardware, "w0", 1.3, d.now_ms()});
  const int flagged = d.RunUntil([&] { return d.Class("w0") == WORKER_CLASS_STRAGGLER; }, 10);
  EXPECT_GE(flagged, 1);
  EXPECT_LE(flagged, 3);
  EXPECT_EQ(d.Class("w1"), WORKER_CLASS_NORMAL);
}

TEST(StragglerScenarioTest, PairNoiseOnlyRaisesNoFlagsOverAnHour) {
  for (uint64_t seed : {1, 2, 3}) {
    ScenarioDriver d(Cluster(2, seed));
    d.RunForMs(3'600'000);
    EXPECT_TRUE(d.FlaggedSince(0, {}).empty()) << "seed " << seed << ": " << d.FlaggedSince(0, {}).front();
  }
}

// Short windows (the demo's 1 s, about one step per window per worker): the ratio of two noisy
// speeds is noisier than a speed against a median, but a persistent flag still needs K of W.
TEST(StragglerScenarioTest, PairNoiseWithShortWindowsRaisesNoPersistentFlag) {
  MonitorOptions mo;
  mo.window_ms = 2'000;
  mo.history_ms = 600'000;
  for (uint64_t seed : {1, 2, 3}) {
    ScenarioDriver d(Cluster(2, seed), mo);
    d.RunForMs(1'800'000);
    int persistent = 0, transient = 0;
    for (const ClassificationEvent& e : d.events()) {
      if (e.current().worker_class() != WORKER_CLASS_STRAGGLER) continue;
      (e.current().persistence() == PERSISTENCE_PERSISTENT ? persistent : transient)++;
    }
    EXPECT_EQ(persistent, 0) << "seed " << seed << ", " << transient << " transient flags";
  }
}

TEST(StragglerScenarioTest, PairRuleOffOrOneWorkerClassifiesNobody) {
  MonitorOptions off;
  off.pair_detection = false;
  ScenarioDriver pair(Cluster(2), off);
  pair.trace().AddSlowdown({Kind::kHardware, "w1", 3.0, 0});
  pair.RunForMs(8 * kWindow);
  EXPECT_EQ(pair.Class("w1"), WORKER_CLASS_UNKNOWN);
  EXPECT_EQ(pair.state().reference_speed(), 0);

  ScenarioDriver one(Cluster(1));
  one.trace().AddSlowdown({Kind::kHardware, "w0", 3.0, 2 * kWindow});
  one.RunForMs(8 * kWindow);
  EXPECT_EQ(one.Class("w0"), WORKER_CLASS_UNKNOWN);
  EXPECT_GT(one.state().Worker("w0")->speed(), 0);  // measured, only not compared
}

// With three or more the median stays the reference: one hostile worker claiming a huge speed
// moves it by one rank and flags nobody honest (the pair rule does not apply).
TEST(StragglerScenarioTest, ThreeWorkersOneLiarFlagsNobodyHonest) {
  ScenarioDriver d(Cluster(3));
  d.trace().AddSlowdown({Kind::kHardware, "w2", 0.2, 0});  // reports 5x the speed
  d.RunForMs(8 * kWindow);
  EXPECT_EQ(d.Class("w0"), WORKER_CLASS_NORMAL) << d.Of("w0").evidence();
  EXPECT_EQ(d.Class("w1"), WORKER_CLASS_NORMAL) << d.Of("w1").evidence();
  EXPECT_EQ(d.Class("w2"), WORKER_CLASS_LEADER);
}

// Once a straggler is persistent its smoothed speed (what the planner plans from) is the median
// of a growing history: stable_smoothed_windows once its class held that long.
TEST(StragglerScenarioTest, PersistentStragglerSmoothedSpeedUsesALongHistory) {
  MonitorOptions mo;
  mo.smoothed_windows = 3;
  mo.stable_smoothed_windows = 10;
  ScenarioDriver d(Cluster(4, 5), mo);
  d.RunForMs(4 * kWindow);
  d.trace().AddSlowdown({Kind::kHardware, "w1", 3.0, d.now_ms()});
  ASSERT_GE(d.RunUntil([&] { return d.Of("w1").persistence() == PERSISTENCE_PERSISTENT; }, 10), 1);
  d.RunForMs(20 * kWindow);
  const auto history = d.state().History("w1").value();
  ASSERT_GE(history.size(), 10u);
  std::vector<double> last10;
  for (size_t i = history.size() - 10; i < history.size(); ++i) last10.push_back(history[i].speed);
  std::sort(last10.begin(), last10.end());
  EXPECT_NEAR(d.state().Worker("w1")->smoothed_speed(), 0.5 * (last10[4] + last10[5]), 1e-3);
  // A new regime starts from the short median again: the straggler recovers.
  d.trace().AddSlowdown({Kind::kHardware, "w1", 1.0 / 3.0, d.now_ms()});  // cancels the 3x
  ASSERT_GE(d.RunUntil([&] { return d.Class("w1") == WORKER_CLASS_NORMAL; }, 10), 1);
  d.RunForMs(3 * kWindow);
  EXPECT_NEAR(d.state().Worker("w1")->smoothed_speed() / d.state().median_speed(), 1.0, 0.1);
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

// The index path (IngestStepAt, used by pacer-sim at 4 096 workers) is IngestStep without the
// message: fed the same reports — slowdowns of every kind, a refused report and duplicates —
// two states end identical, evidence text included (formatted on demand in both).
TEST(StragglerScenarioTest, IngestStepAtMatchesIngestStep) {
  const int64_t start = 1'700'000'000'000 - 1'700'000'000'000 % kWindow;
  SimulatedClock clock(start);
  auto by_message = MonitorState::Create(MonitorOptions(), &clock).value();
  auto by_index = MonitorState::Create(MonitorOptions(), &clock).value();
  SyntheticTrace trace(Cluster(16, 5), &clock);
  for (size_t i = 0; i < trace.num_workers(); ++i) {
    ASSERT_TRUE(by_message->RegisterWorker(trace.worker_id(i), trace.node_of(i)).ok());
    ASSERT_TRUE(by_index->RegisterWorker(trace.worker_id(i), trace.node_of(i)).ok());
  }
  trace.AddSlowdown({Kind::kHardware, "w3", 1.6, start + 2 * kWindow});
  trace.AddSlowdown({Kind::kContention, "w9", 1.5, start + 3 * kWindow});
  trace.AddSlowdown({Kind::kNodeContention, "n2", 1.8, start + 4 * kWindow, start + 7 * kWindow});
  EXPECT_FALSE(by_index->WorkerIndex("nobody").has_value());
  std::vector<ClassificationEvent> ev_message, ev_index;
  for (int tick = 0; tick < 12 * kWindow / 1000; ++tick) {
    SyntheticTrace::Batch b = trace.Next();
    by_message->AdvanceWindows(&ev_message);
    by_index->AdvanceWindows(&ev_index);
    for (const NodeMetrics& m : b.nodes) {
      by_message->IngestNodeMetrics(m);
      by_index->IngestNodeMetrics(m);
    }
    for (StepReport r : b.steps) {
      if (tick == 30 && r.worker_id() == "w1") r.set_local_batch(0);  // refused: bad batch
      for (int copy = 0; copy < (tick % 7 == 0 ? 2 : 1); ++copy) {  // some duplicates
        const ReportIssue a = by_message->IngestStep(r);
        const ReportIssue b2 = by_index->IngestStepAt(*by_index->WorkerIndex(r.worker_id()),
                                                      StepSample::Of(r));
        EXPECT_EQ(a, b2) << r.worker_id() << " step " << r.step();
      }
    }
  }
  EXPECT_GT(by_message->issues().Get(ReportIssue::kDuplicateStep), 0u);
  EXPECT_GT(by_message->issues().Get(ReportIssue::kBadBatch), 0u);
  EXPECT_EQ(by_message->issues().ToMap(), by_index->issues().ToMap());
  EXPECT_EQ(by_message->accepted(), by_index->accepted());
  const std::vector<WorkerStatus> a = by_message->Workers(), b = by_index->Workers();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_EQ(a[i].SerializeAsString(), b[i].SerializeAsString()) << a[i].id();
  ASSERT_EQ(ev_message.size(), ev_index.size());
  for (size_t i = 0; i < ev_message.size(); ++i)
    EXPECT_EQ(ev_message[i].SerializeAsString(), ev_index[i].SerializeAsString());
  // w3 ends a persistent hardware straggler; its evidence is there, with the numbers.
  const WorkerStatus& w3 = a[3];
  EXPECT_EQ(w3.classification().worker_class(), WORKER_CLASS_STRAGGLER);
  EXPECT_NE(w3.classification().evidence().find("windows"), std::string::npos)
      << w3.classification().evidence();
  EXPECT_TRUE(by_index->Workers(/*with_evidence=*/false)[3].classification().evidence().empty());
}

}  // namespace
}  // namespace pacer
