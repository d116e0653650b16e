// The burst rule decided inside the heartbeat that brings the evidence (HeartbeatRequest.
// step_timings, Reconciler::OnHeartbeat): pacerd in process on a simulated clock (tests/testing/
// pacerd_harness.h: real gRPC on loopback, real RocksDB journal, production's housekeeping step),
// a sync job whose trainers honour exclusion. After a few steady seconds (reconciled, the rule
// has decided once), one worker stalls in the middle of a step. No housekeeping round runs after
// the stall begins, so nothing but the heartbeat handler can decide:
//  - a scripted worker whose heartbeat says its running step has computed 10× the median's step
//    gets the exclusion in the reply to that very heartbeat; the same heartbeat without the
//    timing gets none;
//  - the SDK (Client + StepTimer, a step begun and not ended) reports its running step in its
//    heartbeats by itself, and is excluded from the reply to one of them;
//  - the replies hand the step line (HeartbeatResponse.step_line_s); an SDK worker whose step
//    passes it reports at once (Client::ReportStepPastLine) and that report's reply excludes it;
//  - the running step's progress (StepTimer::NoteProgress) reaches the monitor, which measures a
//    slowed worker's speed within its step (detection.running_step_bound).
// Leases and records: the exclusion is the same EXCLUDE_WORKERS command as before (an excluded
// trainer hands its leases back: ShardReader::ReleaseAll, tests/sdk/client_test.cc,
// sdk_exclusion_e2e_test).
#include <gtest/gtest.h>

#include <chrono>

#include "tests/testing/pacerd_harness.h"
#include "tests/testing/test_util.h"
#include "worker_sdk/client.h"
#include "worker_sdk/step_timer.h"

namespace pacer {
namespace {

using testing::HarnessOptions;
using testing::PacerdHarness;
using testing::ScriptedJob;
using testing::ScriptedWorker;

HarnessOptions Options() {
  HarnessOptions o;
  o.policy = "burst-step-rule-1s";  // non-dedicated, step_factor 2, rejoin 1.5, max 1 worker
  return o;
}

// 64 samples a step computed in 0.1 s (one tick of the scripted job), a heartbeat a second.
ScriptedJob::Options JobOptions(int workers) {
  ScriptedJob::Options o;
  o.workers = workers;
  o.batch = 64;
  o.per_sample_s = 0.1 / 64;
  o.comm_s = 0.005;
  o.honors_exclusion = true;
  return o;
}

std::vector<ActionRecord> Exclusions(PacerdHarness& h) {
  std::vector<ActionRecord> out;
  const ListActionsResponse a = h.Actions();
  for (auto it = a.actions().rbegin(); it != a.actions().rend(); ++it)  // oldest first
    if (it->kind() == "EXCLUDE_WORKERS" && it->outcome() == "executed") out.push_back(*it);
  return out;
}

// The SDK worker "sdk" of these tests: it honours exclusion.
ClientOptions SdkWorker(PacerdHarness& h, int64_t heartbeat_interval_ms) {
  ClientOptions o;
  o.address = h.address();
  o.token = h.job_token();
  o.worker_id = "sdk";
  o.node = "n-sdk";
  o.connect_budget_ms = 20'000;
  o.heartbeat_interval_ms = heartbeat_interval_ms;
  o.honors_exclusion = true;
  return o;
}

const ExclusionCommand* FindExclusion(const HeartbeatResponse& r) {
  for (const WorkerCommand& c : r.commands())
    if (c.has_exclusion()) return &c.exclusion();
  return nullptr;
}

// The SDK worker's steps beside the scripted job's: `ticks` steps of 64 samples in 0.1 s (as
// the scripted workers), each followed by a round (a Flush wakes the reporter: its heartbeat
// reply brings the step line) and its step report reaching the monitor before the job goes on.
void FlushedSteps(ScriptedJob& job, Client& client, StepTimer& timer, uint64_t* step, int ticks) {
  for (int tick = 0; tick < ticks; ++tick) {
    const uint64_t sent = client.stats().steps_sent;
    timer.BeginStep(*step, 64);
    ASSERT_TRUE(job.Run(100).ok());
    timer.EndStep(64, 64);
    ++*step;
    ASSERT_TRUE(client.Flush(10'000).ok());
    ASSERT_TRUE(testing::WaitFor([&] { return client.stats().steps_sent > sent; },
                                 std::chrono::seconds(30)));
  }
}

TEST(HeartbeatExclusionTest, TheReplyToTheHeartbeatCarryingAStalledStepExcludesTheWorker) {
  PacerdHarness h(Options());
  ASSERT_TRUE(h.ok());
  ScriptedJob job(h, JobOptions(4));
  ASSERT_TRUE(job.Connect().ok());
  ASSERT_TRUE(job.Run(6000).ok());
  ASSERT_TRUE(Exclusions(h).empty()) << "nobody is excluded at equal speeds";

  // w3 began its next step and has computed for 1 s; a step takes 0.1 s. No housekeeping
  // round runs from here on: only the heartbeat handler can decide.
  h.sim_clock().AdvanceMs(1000);
  ScriptedWorker& w3 = job.worker("w3");
  auto plain = w3.Heartbeat();
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(FindExclusion(*plain), nullptr)
      << "a heartbeat without the running step brings no evidence: " << plain->ShortDebugString();
  // The reply hands the step line: step_factor 2 x the median step of 0.1 s.
  EXPECT_NEAR(plain->step_line_s(), 0.2, 0.02) << plain->ShortDebugString();

  HeartbeatStepTiming running;
  running.set_step(w3.step() + 1);
  running.set_compute_s(1.0);
  running.set_wall_s(1.0);
  running.set_samples(64);
  running.set_in_progress(true);
  auto r = w3.Heartbeat({running});
  ASSERT_TRUE(r.ok()) << r.status();
  const ExclusionCommand* ex = FindExclusion(*r);
  ASSERT_NE(ex, nullptr) << "the reply to the heartbeat carrying the stall: "
                         << r->ShortDebugString();
  EXPECT_TRUE(ex->excluded());
  EXPECT_TRUE(w3.excluded());
  EXPECT_EQ(r->step_line_s(), 0) << "no line for an excluded worker";
  const auto [version, who] = h->reconciler()->Exclusion();
  EXPECT_EQ(who, std::vector<std::string>{"w3"});
  EXPECT_EQ(ex->version(), version) << "the command's version is the decision's audit id";
  std::vector<ActionRecord> decided = Exclusions(h);
  ASSERT_EQ(decided.size(), 1u);
  EXPECT_EQ(decided[0].id(), version);
  EXPECT_EQ(decided[0].target(), "w3");
  EXPECT_EQ(decided[0].dispatch(), "sent in heartbeat replies: excluded w3");

  // The others learn the version from their next replies; nobody else is excluded.
  ASSERT_TRUE(job.Heartbeats().ok());
  for (const auto& w : job.workers()) {
    EXPECT_EQ(w->exclusion_version(), version) << w->id();
    if (w->id() != "w3") {
      EXPECT_FALSE(w->excluded()) << w->id();
    }
  }
}

TEST(HeartbeatExclusionTest, AnSdkWorkerStalledMidStepIsExcludedFromItsOwnHeartbeat) {
  PacerdHarness h(Options());
  ASSERT_TRUE(h.ok());
  ScriptedJob job(h, JobOptions(3));
  ASSERT_TRUE(job.Connect().ok());
  // Real time: heartbeat rounds while the simulated job goes on.
  auto client = Client::Connect(SdkWorker(h, /*heartbeat_interval_ms=*/20));
  ASSERT_TRUE(client.ok()) << client.status();
  // The trainer's StepTimer reads pacerd's simulated clock: a step lasts what the job's do.
  StepTimer timer(client->get(), &h.sim_clock());
  uint64_t step = 0;
  for (int tick = 0; tick < 60; ++tick) {
    const uint64_t sent = (*client)->stats().steps_sent;
    timer.BeginStep(step, 64);
    ASSERT_TRUE(job.Run(100).ok());
    {
      auto comm = timer.Time(StepTimer::Phase::kCommunication);
    }
    timer.EndStep(64, 64);
    ++step;
    // Its report reached the monitor before the job goes on (the SDK reports on its own thread).
    ASSERT_TRUE(testing::WaitFor([&] { return (*client)->stats().steps_sent > sent; },
                                 std::chrono::seconds(30)));
  }
  ASSERT_TRUE(Exclusions(h).empty()) << "nobody is excluded at equal speeds";
  ASSERT_FALSE((*client)->excluded());

  // The SDK worker begins a step and stalls in it: 1 s of compute where a step takes 0.1 s. The
  // job's clock stops there (no housekeeping round, no other worker's step); the SDK's
  // heartbeats say how long the running step has computed, and one reply excludes it.
  timer.BeginStep(step, 64);
  h.sim_clock().AdvanceMs(1000);
  ASSERT_TRUE(testing::WaitFor([&] { return (*client)->excluded(); }, std::chrono::seconds(30)))
      << "no heartbeat reply carried the exclusion";
  const auto [version, who] = h->reconciler()->Exclusion();
  EXPECT_EQ(who, std::vector<std::string>{"sdk"});
  EXPECT_EQ((*client)->exclusion_version(), version);
  (*client)->Close(5'000);
}

// The step line end to end through the SDK: the heartbeat replies hand it (Client::
// step_line_s), StepTimer::PastStepLine tells the trainer its running step passed it, and
// Client::ReportStepPastLine sends a heartbeat at once whose reply -- decided inside that
// heartbeat -- excludes the worker before the call returns. The SDK's own heartbeats are too
// far apart (60 s) to carry the stall first: only the line report can decide here.
TEST(HeartbeatExclusionTest, AWorkerPastTheStepLineIsExcludedByTheReplyToItsOwnReport) {
  PacerdHarness h(Options());
  ASSERT_TRUE(h.ok());
  ScriptedJob job(h, JobOptions(3));
  ASSERT_TRUE(job.Connect().ok());
  auto client = Client::Connect(SdkWorker(h, /*heartbeat_interval_ms=*/60'000));
  ASSERT_TRUE(client.ok()) << client.status();
  StepTimer timer(client->get(), &h.sim_clock());
  uint64_t step = 0;
  ASSERT_NO_FATAL_FAILURE(FlushedSteps(job, **client, timer, &step, 60));
  ASSERT_TRUE(Exclusions(h).empty()) << "nobody is excluded at equal speeds";
  ASSERT_NEAR((*client)->step_line_s(), 0.2, 0.02) << "the line: 2 x the median step of 0.1 s";

  timer.BeginStep(step, 64);
  h.sim_clock().AdvanceMs(150);
  EXPECT_FALSE(timer.PastStepLine()) << "0.15 s of compute is within the line";
  h.sim_clock().AdvanceMs(100);
  ASSERT_TRUE(timer.PastStepLine()) << "0.25 s is past it";
  const uint64_t heartbeats = (*client)->stats().heartbeats_ok;
  absl::StatusOr<bool> out = (*client)->ReportStepPastLine(30'000);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE(*out) << "the reply to the line's report excludes the worker";
  EXPECT_TRUE((*client)->excluded());
  EXPECT_EQ((*client)->stats().heartbeats_ok, heartbeats + 1) << "one heartbeat: the report";
  EXPECT_EQ((*client)->stats().step_line_reports, 1u);
  const auto [version, who] = h->reconciler()->Exclusion();
  EXPECT_EQ(who, std::vector<std::string>{"sdk"});
  EXPECT_EQ((*client)->exclusion_version(), version);
  const std::vector<ActionRecord> decided = Exclusions(h);
  ASSERT_EQ(decided.size(), 1u);
  EXPECT_EQ(decided[0].target(), "sdk");
  EXPECT_EQ((*client)->step_line_s(), 0) << "an excluded worker keeps no line";
  (*client)->Close(5'000);
}

// The running step's progress end to end: StepTimer::NoteProgress, the SDK's heartbeat
// (HeartbeatStepTiming.samples_done / done_compute_s), pacerd's monitor under
// detection.running_step_bound. A worker slowed from 640 to 20 samples/s has computed 2 s of a
// step of 64 samples and done 40 of them: the window in which it finishes nothing gets the
// speed measured over its progress, 20/s, where the step's bound alone says 64 / 2 s = 32/s
// (what it gets without a progress note).
TEST(HeartbeatStepTimingTest, TheRunningStepsProgressMeasuresASlowedWorkersSpeed) {
  for (const bool progress : {false, true}) {
    SCOPED_TRACE(progress ? "progress noted" : "no progress noted");
    HarnessOptions o;
    o.policy = "running-step-bound-1s";
    PacerdHarness h(o);
    ASSERT_TRUE(h.ok());
    ScriptedJob job(h, JobOptions(3));
    ASSERT_TRUE(job.Connect().ok());
    // Heartbeats only when the test flushes: each one's content is known.
    auto client = Client::Connect(SdkWorker(h, /*heartbeat_interval_ms=*/60'000));
    ASSERT_TRUE(client.ok()) << client.status();
    StepTimer timer(client->get(), &h.sim_clock());
    uint64_t step = 0;
    ASSERT_NO_FATAL_FAILURE(FlushedSteps(job, **client, timer, &step, 40));
    const WorkerStatus before = h->monitor()->Worker("sdk").value();
    ASSERT_NEAR(before.speed(), 640, 20) << before.ShortDebugString();

    // The slow step: 2 s of compute so far (no other worker steps: they wait for it), 40 of its
    // 64 samples done. The window holding the heartbeat begins after the last step report.
    timer.BeginStep(step, 64);
    h.sim_clock().AdvanceMs(2000);
    if (progress) timer.NoteProgress(40);
    // Two rounds now (Flush wakes the reporter; nothing is queued, so it returns at once): the
    // reporter sends one heartbeat at a time, so the second was built after the note even if the
    // first to end was already on its way.
    for (int round = 0; round < 2; ++round) {
      const uint64_t heartbeats = (*client)->stats().heartbeats_ok;
      ASSERT_TRUE((*client)->Flush(10'000).ok());
      ASSERT_TRUE(testing::WaitFor([&] { return (*client)->stats().heartbeats_ok > heartbeats; },
                                   std::chrono::seconds(30)));
    }
    h.Advance(1000);  // that window closes
    const WorkerStatus slow = h->monitor()->Worker("sdk").value();
    EXPECT_NEAR(slow.speed(), progress ? 40 / 2.0 : 64 / 2.0, 0.5) << slow.ShortDebugString();
    (*client)->Close(5'000);
  }
}

}  // namespace
}  // namespace pacer
