// Hostile and malformed input: every bad report is refused or repaired with a counted reason,
// and nothing a worker sends changes another worker's estimate.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "monitor/monitor_state.h"
#include "tests/monitor/scenario_driver.h"

namespace pacer {
namespace {

using testing::ScenarioDriver;

class ReportValidationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    state_ = std::move(MonitorState::Create(MonitorOptions(), &clock_).value());
    ASSERT_TRUE(state_->RegisterWorker("w0", "n0").ok());
  }
  StepReport Good(uint64_t step = 1) {
    StepReport r;
    r.set_worker_id("w0");
    r.set_step(step);
    r.set_local_batch(32);
    r.set_samples(32);
    r.set_compute_s(1.0);
    r.set_comm_s(0.1);
    r.set_data_wait_s(0.01);
    r.set_wall_s(1.11);
    r.set_time_ms(clock_.NowMs());
    return r;
  }
  uint64_t Count(ReportIssue issue) const { return state_->issues().Get(issue); }

  SimulatedClock clock_{1'700'000'000'000};
  std::unique_ptr<MonitorState> state_;
};

TEST_F(ReportValidationTest, BadTimesAreRejectedWithTheirReason) {
  const double nan = std::nan(""), inf = std::numeric_limits<double>::infinity();
  uint64_t step = 1;
  for (double bad : {-1.0, 0.0, nan, inf, 1e9}) {
    StepReport r = Good(step++);
    r.set_compute_s(bad);
    EXPECT_EQ(state_->IngestStep(r), ReportIssue::kBadComputeTime) << bad;
  }
  EXPECT_EQ(Count(ReportIssue::kBadComputeTime), 5u);
  EXPECT_EQ(state_->accepted(), 0u);
}

TEST_F(ReportValidationTest, NegativeOrNanSideTimesAreClampedAndCounted) {
  StepReport r = Good();
  r.set_comm_s(-5);
  r.set_data_wait_s(std::nan(""));
  r.set_wall_s(0.2);  // shorter than its own compute time
  EXPECT_EQ(state_->IngestStep(r), ReportIssue::kNone);
  EXPECT_EQ(Count(ReportIssue::kClampedComm), 1u);
  EXPECT_EQ(Count(ReportIssue::kClampedDataWait), 1u);
  EXPECT_EQ(Count(ReportIssue::kClampedWall), 1u);
  EXPECT_EQ(state_->accepted(), 1u);
  EXPECT_EQ(state_->issues().TotalRejected(), 0u);
  EXPECT_EQ(state_->issues().ToMap().at("clamped_comm_time"), 1u);
}

TEST_F(ReportValidationTest, ARejectedReportCountsNoRepair) {
  StepReport r = Good();
  r.set_worker_id("intruder");
  r.set_comm_s(-1);
  EXPECT_EQ(state_->IngestStep(r), ReportIssue::kUnknownWorker);
  EXPECT_EQ(Count(ReportIssue::kClampedComm), 0u);
}

TEST_F(ReportValidationTest, AbsurdBatchesSamplesAndSpeedsAreRejected) {
  StepReport r = Good(1);
  r.set_local_batch(0);
  EXPECT_EQ(state_->IngestStep(r), ReportIssue::kBadBatch);
  r = Good(2);
  r.set_local_batch(1u << 30);
  EXPECT_EQ(state_->IngestStep(r), ReportIssue::kBadBatch);
  r = Good(3);
  r.set_samples(0);
  EXPECT_EQ(state_->IngestStep(r), ReportIssue::kBadSamples);
  r = Good(4);
  r.set_samples(32ull * 100'000);
  EXPECT_EQ(state_->IngestStep(r), ReportIssue::kBadSamples);
  r = Good(5);
  r.set_compute_s(1e-12);
  EXPECT_EQ(state_->IngestStep(r), ReportIssue::kImplausibleSpeed);
}

TEST_F(ReportValidationTest, UnknownWorkersBadIdsStaleAndFutureReportsAreRejected) {
  StepReport r = Good();
  r.set_worker_id("intruder");
  EXPECT_EQ(state_->IngestStep(r), ReportIssue::kUnknownWorker);
  r.set_worker_id("");
  EXPECT_EQ(state_->IngestStep(r), ReportIssue::kMissingId);
  r.set_worker_id(std::string(1000, 'x'));
  EXPECT_EQ(state_->IngestStep(r), ReportIssue::kIdTooLong);
  r = Good(7);
  r.set_time_ms(clock_.NowMs() - 3'600'000);
  EXPECT_EQ(state_->IngestStep(r), ReportIssue::kStale);
  r.set_time_ms(clock_.NowMs() + 3'600'000);
  EXPECT_EQ(state_->IngestStep(r), ReportIssue::kFutureTime);
  EXPECT_FALSE(state_->RegisterWorker("bad id", "n0").ok());
  EXPECT_FALSE(state_->RegisterWorker("w1", std::string(1000, 'n')).ok());
  const auto reasons = state_->issues().ToMap();
  EXPECT_EQ(reasons.at("unknown_worker"), 1u);
  EXPECT_EQ(reasons.at("stale"), 1u);
  EXPECT_EQ(reasons.at("future_time"), 1u);
}

TEST_F(ReportValidationTest, OutOfOrderStepsAreAcceptedDuplicatesAndVeryOldStepsAreNot) {
  for (uint64_t s : {10, 12, 11, 9}) EXPECT_EQ(state_->IngestStep(Good(s)), ReportIssue::kNone) << s;
  EXPECT_EQ(state_->IngestStep(Good(11)), ReportIssue::kDuplicateStep);
  EXPECT_EQ(state_->IngestStep(Good(200)), ReportIssue::kNone);
  EXPECT_EQ(state_->IngestStep(Good(100)), ReportIssue::kStale);  // > 64 behind the newest
  // A restarted worker counts from its checkpoint again after re-registering.
  ASSERT_TRUE(state_->RegisterWorker("w0", "n0").ok());
  EXPECT_EQ(state_->IngestStep(Good(100)), ReportIssue::kNone);
  EXPECT_EQ(state_->accepted(), 6u);
}

TEST_F(ReportValidationTest, FloodIsCutAtThePerWindowCap) {
  int accepted = 0;
  for (uint64_t s = 0; s < 5'000; ++s) accepted += state_->IngestStep(Good(s)) == ReportIssue::kNone;
  EXPECT_EQ(accepted, 2'000);
  EXPECT_EQ(Count(ReportIssue::kFlood), 3'000u);
}

TEST_F(ReportValidationTest, BadNodeMetricsAndLatencyAreRejected) {
  NodeMetrics m;
  m.set_node("n0");
  m.set_interval_s(5);
  m.set_cpu_steal_frac(1.5);
  EXPECT_EQ(state_->IngestNodeMetrics(m), ReportIssue::kBadNodeMetrics);
  m.set_cpu_steal_frac(std::nan(""));
  EXPECT_EQ(state_->IngestNodeMetrics(m), ReportIssue::kBadNodeMetrics);
  m.set_cpu_steal_frac(0.1);
  m.set_cpu_throttled_s(1e6);
  EXPECT_EQ(state_->IngestNodeMetrics(m), ReportIssue::kBadNodeMetrics);
  m.set_cpu_throttled_s(0.5);
  m.set_num_cpus(4);
  EXPECT_EQ(state_->IngestNodeMetrics(m), ReportIssue::kNone);
  ServerLatency l;
  l.set_server_id("ps0");
  l.set_reporter("w0");
  l.set_requests(10);
  l.set_mean_latency_ms(-3);
  EXPECT_EQ(state_->IngestServerLatency(l), ReportIssue::kBadLatency);
  l.set_mean_latency_ms(3);
  l.set_reporter("intruder");
  EXPECT_EQ(state_->IngestServerLatency(l), ReportIssue::kUnknownWorker);
  l.set_reporter("w0");
  EXPECT_EQ(state_->IngestServerLatency(l), ReportIssue::kNone);
}

TEST_F(ReportValidationTest, WorkerTableIsBounded) {
  MonitorOptions o;
  o.max_workers = 3;
  o.admit_unknown_workers = true;
  auto state = std::move(MonitorState::Create(o, &clock_).value());
  for (int i = 0; i < 10; ++i) {
    StepReport r = Good();
    r.set_worker_id("x" + std::to_string(i));
    state->IngestStep(r);
  }
  EXPECT_EQ(state->num_workers(), 3u);
  EXPECT_EQ(state->issues().Get(ReportIssue::kTooManyEntities), 7u);
}

// A worker re-registering under ever new node names holds one node row (its own, renamed), so it
// cannot fill the node table; a row another worker or an agent's report also names stays.
TEST_F(ReportValidationTest, AWorkerHoldsOneNodeRowWhateverTheNamesItTries) {
  MonitorOptions o;
  o.max_nodes = 4;
  auto state = std::move(MonitorState::Create(o, &clock_).value());
  ASSERT_TRUE(state->RegisterWorker("w0", "shared").ok());
  ASSERT_TRUE(state->RegisterWorker("w1", "shared").ok());
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(state->RegisterWorker("w1", "junk-" + std::to_string(i)).ok());
  EXPECT_EQ(state->Nodes().size(), 2u);  // "shared" (w0) and w1's latest name
  EXPECT_EQ(state->Worker("w1")->node(), "junk-99");
  NodeMetrics m;
  m.set_node("agent-node");
  m.set_interval_s(1);
  m.set_num_cpus(4);
  EXPECT_EQ(state->IngestNodeMetrics(m), ReportIssue::kNone);
  // w1 moves onto the agent's node: its junk row is freed, the agent's row is kept when w1 leaves.
  ASSERT_TRUE(state->RegisterWorker("w1", "agent-node").ok());
  EXPECT_EQ(state->Nodes().size(), 2u);
  ASSERT_TRUE(state->RegisterWorker("w1", "").ok());
  EXPECT_EQ(state->Nodes().size(), 2u);
  EXPECT_TRUE(state->RegisterWorker("w2", "n2").ok());
  EXPECT_TRUE(state->RegisterWorker("w3", "n3").ok());
  const absl::Status full = state->RegisterWorker("w4", "n4");
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted) << full;
  EXPECT_NE(full.message().find("max_nodes"), absl::string_view::npos) << full;
  EXPECT_EQ(state->num_workers(), 4u) << "a refused registration added a worker";
}

// Each reporter has one vote per server and window, and adds at most max_servers_per_reporter
// server rows: one worker's flood decides neither a server's latency nor the table.
TEST_F(ReportValidationTest, AServerLatencyIsTheMedianOverReportersAndTheTableIsBoundPerReporter) {
  MonitorOptions o;
  o.max_servers_per_reporter = 5;
  auto state = std::move(MonitorState::Create(o, &clock_).value());
  for (const char* w : {"w0", "w1", "w2"}) ASSERT_TRUE(state->RegisterWorker(w, "n0").ok());
  auto sample = [](const std::string& server, const std::string& reporter, double ms) {
    ServerLatency l;
    l.set_server_id(server);
    l.set_reporter(reporter);
    l.set_requests(10);
    l.set_mean_latency_ms(ms);
    return l;
  };
  EXPECT_EQ(state->IngestServerLatency(sample("ps0", "w0", 5)), ReportIssue::kNone);
  EXPECT_EQ(state->IngestServerLatency(sample("ps0", "w2", 6)), ReportIssue::kNone);
  for (int k = 0; k < 1000; ++k) state->IngestServerLatency(sample("ps0", "w1", 900));
  EXPECT_EQ(state->IngestServerLatency(sample("ps0", "", 900)), ReportIssue::kMissingId);
  for (int i = 0; i < 20; ++i) state->IngestServerLatency(sample("junk-" + std::to_string(i), "w1", 1));
  clock_.AdvanceMs(o.window_ms);
  state->AdvanceWindows(nullptr);
  const std::vector<WorkerStatus> servers = state->Servers();
  ASSERT_EQ(servers.size(), 6u);  // ps0 (added by w0) and the 5 junk rows w1 may add
  EXPECT_EQ(servers[0].id(), "ps0");
  EXPECT_DOUBLE_EQ(servers[0].latency_ms(), 6.0) << "the median of the votes 5, 6 and 900";
  EXPECT_EQ(state->IngestServerLatency(sample("ps1", "w0", 5)), ReportIssue::kNone) << "w0 may still add";
}

TEST(HostileWorkerTest, GarbageAndFloodsFromOneWorkerDoNotSkewAnyoneElse) {
  SyntheticTraceOptions o;
  o.workers = 32;
  o.seed = 5;
  ScenarioDriver honest(o), attacked(o);
  // The same trace into both; `attacked` also gets w0's hostile reports every tick.
  uint64_t step = 1'000'000;
  for (int tick = 0; tick < 120; ++tick) {
    honest.Tick();
    attacked.Tick();
    for (int i = 0; i < 50; ++i) {
      StepReport r;
      r.set_worker_id(i % 2 ? "w0" : "ghost");
      r.set_step(step++);
      r.set_local_batch(32);
      r.set_samples(32);
      r.set_compute_s(i % 3 == 0 ? 1e-6 : (i % 3 == 1 ? std::nan("") : 0.0001));  // 320 000 samples/s
      r.set_comm_s(-1);
      r.set_wall_s(-1);
      attacked.state().IngestStep(r);
    }
  }
  EXPECT_GT(attacked.state().issues().TotalRejected(), 0u);
  for (size_t i = 1; i < 32; ++i) {
    const std::string id = "w" + std::to_string(i);
    const WorkerStatus a = attacked.state().Worker(id).value();
    const WorkerStatus h = honest.state().Worker(id).value();
    EXPECT_DOUBLE_EQ(a.speed(), h.speed()) << id;                 // own estimate untouched
    EXPECT_NEAR(a.relative_speed(), h.relative_speed(), 0.02) << id;  // one vote in the median
    EXPECT_EQ(a.classification().worker_class(), WORKER_CLASS_NORMAL) << id;
  }
  // w0 itself is a "leader" by its claims, which is where the damage stays.
  EXPECT_EQ(attacked.state().Worker("w0")->classification().worker_class(), WORKER_CLASS_LEADER);
}

}  // namespace
}  // namespace pacer
