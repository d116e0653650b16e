// The step-granular burst rule (controller/burst_detector.h) and its path through the
// Controller (ObserveSteps / DecideBursts): scripted per-step timings on a simulated clock, no
// threads, no real time.
#include "controller/burst_detector.h"

#include <gtest/gtest.h>

#include "common/clock.h"
#include "controller/controller.h"
#include "tests/controller/test_views.h"

namespace pacer {
namespace {

using testing::SyncView;
using testing::Timing;

BurstExclusionConfig Rule(int64_t max_workers = 8) {
  BurstExclusionConfig c;
  c.max_workers = max_workers;
  c.step_factor = 2;
  c.rejoin_factor = 1.5;
  return c;
}

// n workers at 0.16 s per 64-sample step, one timing each at step `step`, time `ms`.
void Steady(BurstDetector& d, int n, int64_t step, int64_t ms, double noise = 0) {
  for (int i = 0; i < n; ++i)
    d.Observe(Timing("w" + std::to_string(i), step, 0.16 * (1 + noise * ((i % 3) - 1)), 64, ms));
}

TEST(BurstDetector, ExcludesAWorkerWhoseNewestStepIsFourTimesTheMedian) {
  BurstDetector d;
  Steady(d, 16, 10, 1000, 0.05);
  d.Observe(Timing("w5", 11, 0.64, 64, 1200));
  BurstDecision r = d.Decide({}, Rule(), 1500);
  ASSERT_EQ(r.excluded, std::vector<std::string>{"w5"});
  EXPECT_EQ(r.added, std::vector<std::string>{"w5"});
  EXPECT_TRUE(r.rejoined.empty());
  EXPECT_NEAR(r.median_step_s, 0.16, 0.01);
  // (1 − 1/16) × 0.64 / 0.168 − 1 ≈ 2.57.
  EXPECT_GT(r.predicted_gain, 2.0);
  EXPECT_NE(r.add_reason.find("w5"), std::string::npos) << r.add_reason;
}

TEST(BurstDetector, OrdinaryNoiseAndTheSlowestOfManyNoisyStepsAreNotABurst) {
  BurstDetector d;
  Steady(d, 32, 10, 1000, 0.12);
  d.Observe(Timing("w7", 11, 0.16 * 1.9, 64, 1100));  // a slow step, below 2× the median
  EXPECT_TRUE(d.Decide({}, Rule(), 1500).excluded.empty());
}

TEST(BurstDetector, SeveralEquallySlowWorkersAreDroppedTogether) {
  BurstDetector d;
  Steady(d, 32, 10, 1000);
  for (const char* id : {"w1", "w2", "w3"}) d.Observe(Timing(id, 11, 0.64, 64, 1100));
  BurstDecision r = d.Decide({}, Rule(), 1500);
  EXPECT_EQ(r.excluded, (std::vector<std::string>{"w1", "w2", "w3"}));
  // Not more than max_workers: with room for two only, dropping two of three equally slow
  // workers gains nothing, so nobody is dropped.
  EXPECT_TRUE(d.Decide({}, Rule(2), 1500).excluded.empty());
}

// At thousands of workers dozens are in a burst at once: a count sized for a 128-worker job
// (16) leaves most of them waited for; max_fraction scales the cap with the job.
TEST(BurstDetector, TheCapGrowsWithTheJobWhenAFractionIsSet) {
  BurstDetector d;
  Steady(d, 64, 10, 1000);
  for (int i = 0; i < 6; ++i) d.Observe(Timing("w" + std::to_string(i), 11, 0.64, 64, 1100));
  // Two may be out: dropping two of six equally slow workers gains nothing.
  EXPECT_TRUE(d.Decide({}, Rule(2), 1500).excluded.empty());
  BurstExclusionConfig c = Rule(2);
  c.max_fraction = 0.1;  // 6.4 of 64 workers: 6
  EXPECT_EQ(BurstExclusionCap(c, 64), 6);
  EXPECT_EQ(d.Decide({}, c, 1500).excluded.size(), 6u);
  // The count stays the floor in a small job; no count, no rule.
  EXPECT_EQ(BurstExclusionCap(c, 8), 2);
  c.max_workers = 0;
  EXPECT_EQ(BurstExclusionCap(c, 64), 0);
}

// StepTiming::worker_index is a lookup hint: a wrong one (another worker's index) changes
// nothing, and the records are the same as without hints.
TEST(BurstDetector, AWorkerIndexHintIsCheckedAgainstTheId) {
  BurstDetector hinted, plain;
  for (int i = 0; i < 8; ++i) {
    StepTiming t = Timing("w" + std::to_string(i), 10, 0.16, 64, 1000);
    plain.Observe(t);
    t.worker_index = static_cast<uint32_t>(i + 1);
    hinted.Observe(t);
  }
  StepTiming slow = Timing("w5", 11, 0.64, 64, 1100);
  slow.worker_index = 3;  // w2's index
  hinted.Observe(slow);
  plain.Observe(Timing("w5", 11, 0.64, 64, 1100));
  EXPECT_EQ(hinted.workers(), 8u);
  EXPECT_EQ(hinted.StepSeconds("w2", 1500), plain.StepSeconds("w2", 1500));
  EXPECT_EQ(hinted.StepSeconds("w5", 1500), plain.StepSeconds("w5", 1500));
  EXPECT_EQ(hinted.Decide({}, Rule(), 1500).excluded, std::vector<std::string>{"w5"});
  // A forgotten worker's slot is reused by the next one, found by id and by its hint.
  hinted.Forget("w3");
  StepTiming late = Timing("w9", 10, 0.16, 64, 1200);
  late.worker_index = 4;
  hinted.Observe(late);
  EXPECT_EQ(hinted.workers(), 8u);
  EXPECT_FALSE(hinted.StepSeconds("w3", 1500).has_value());
  EXPECT_NEAR(*hinted.StepSeconds("w9", 1500), 0.16, 1e-12);
}

TEST(BurstDetector, ABatchPlanOrAHalfBatchProbeIsNotABurst) {
  BurstDetector d;
  Steady(d, 8, 10, 1000);
  // A plan gave a worker twice as fast twice the samples: the same step seconds.
  d.Observe(Timing("w0", 11, 0.16, 128, 1100));
  // A worker's newest timing is a probe (half its batch) at the median's pace: its step at
  // its training batch is the median's, not half of it (and not a burst either).
  d.Observe(Timing("w1", 11, 0.08, 32, 1100, /*probe=*/true));
  BurstDecision r = d.Decide({}, Rule(), 1500);
  EXPECT_TRUE(r.excluded.empty());
  EXPECT_NEAR(r.median_step_s, 0.16, 1e-9);
  // Its batch is the newest training step's: at 3× the median per sample, a probe shows a
  // worker in a burst even though the probe itself took less time than a full step.
  d.Observe(Timing("w2", 12, 0.24, 32, 1200, /*probe=*/true));
  EXPECT_EQ(d.Decide({}, Rule(), 1500).excluded, std::vector<std::string>{"w2"});
}

TEST(BurstDetector, StaysExcludedWhileItsProbeIsSlowAndRejoinsWhenItIsFast) {
  BurstDetector d;
  Steady(d, 8, 10, 1000);
  d.Observe(Timing("w3", 11, 0.64, 64, 1100));
  ASSERT_EQ(d.Decide({}, Rule(), 1500).excluded, std::vector<std::string>{"w3"});
  // Excluded: others go on; its probe (half batch) at 3× per sample: still slow enough to stay
  // (above the rejoin line of 1.5×, below the entry line of 2× would also stay).
  Steady(d, 8, 20, 3000);
  d.Observe(Timing("w3", 21, 0.24, 32, 3100, /*probe=*/true));
  BurstDecision r = d.Decide({"w3"}, Rule(), 3500);
  EXPECT_EQ(r.excluded, std::vector<std::string>{"w3"});
  EXPECT_TRUE(r.added.empty());
  EXPECT_TRUE(r.rejoined.empty());
  // The probe back at the median's pace: waited for again.
  Steady(d, 8, 30, 5000);
  d.Observe(Timing("w3", 31, 0.085, 32, 5100, /*probe=*/true));
  r = d.Decide({"w3"}, Rule(), 5500);
  EXPECT_TRUE(r.excluded.empty());
  EXPECT_EQ(r.rejoined, std::vector<std::string>{"w3"});
  EXPECT_NE(r.rejoin_reason.find("burst over"), std::string::npos) << r.rejoin_reason;
}

TEST(BurstDetector, AQuietWorkerIsNotCountedAndAQuietExcludedOneIsWaitedForAgain) {
  BurstDetector d;
  Steady(d, 8, 10, 1000);
  d.Observe(Timing("w3", 11, 0.64, 64, 1100));
  // 10 s later only the others report: w3's timing is stale (> 5 s and > 3 of its steps).
  for (int i = 0; i < 8; ++i)
    if (i != 3) d.Observe(Timing("w" + std::to_string(i), 70, 0.16, 64, 11000));
  BurstDecision r = d.Decide({"w3"}, Rule(), 11500);
  EXPECT_TRUE(r.excluded.empty());
  EXPECT_EQ(r.rejoined, std::vector<std::string>{"w3"});
  EXPECT_FALSE(BurstDetector().HasFreshTimings(0));
}

TEST(BurstDetector, OlderTimingsDoNotReplaceNewerOnesAndBadOnesAreIgnored) {
  BurstDetector d;
  Steady(d, 8, 10, 1000);
  d.Observe(Timing("w2", 12, 0.16, 64, 1200));
  d.Observe(Timing("w2", 11, 0.64, 64, 1300));  // an older step arriving late
  d.Observe(Timing("w2", 13, -1, 64, 1300));    // nonsense
  d.Observe(Timing("w2", 13, 0.64, 0, 1300));
  EXPECT_TRUE(d.Decide({}, Rule(), 1500).excluded.empty());
}

// Decide looks for the median around the last decision's first (a job's steps move little from
// one decision to the next) and keeps only the steps that may be out; what it decides must not
// depend on that. After decisions on other medians -- a plan that doubled every step, one that
// halved them, a shift within the band -- each decision is a fresh detector's on the same
// timings, to the bit.
TEST(BurstDetector, ADecisionDoesNotDependOnTheMediansBefore) {
  BurstDetector seasoned;
  int64_t ms = 1000;
  for (double scale : {1.0, 1.005, 2.0, 0.5, 0.5, 1.0}) {
    BurstDetector fresh;
    for (BurstDetector* d : {&seasoned, &fresh}) {
      for (int i = 0; i < 200; ++i) {
        const double noise = 0.12 * (((i * 37) % 11) / 10.0 - 0.5);
        d->Observe(Timing("w" + std::to_string(i), ms, scale * 0.16 * (1 + noise), 64, ms));
      }
      // A burst on three workers; w7 excluded before and back to its pace, w3 still slow.
      for (const char* id : {"w3", "w40", "w41"})
        d->Observe(Timing(id, ms + 1, scale * 0.64, 64, ms + 100));
    }
    const BurstDecision a = seasoned.Decide({"w3", "w7"}, Rule(), ms + 200);
    const BurstDecision b = fresh.Decide({"w3", "w7"}, Rule(), ms + 200);
    EXPECT_EQ(a.excluded, (std::vector<std::string>{"w3", "w40", "w41"})) << scale;
    EXPECT_EQ(a.excluded, b.excluded) << scale;
    EXPECT_EQ(a.added, b.added) << scale;
    EXPECT_EQ(a.rejoined, b.rejoined) << scale;
    EXPECT_EQ(a.median_step_s, b.median_step_s) << scale;
    EXPECT_EQ(a.predicted_gain, b.predicted_gain) << scale;
    EXPECT_EQ(a.add_reason, b.add_reason) << scale;
    EXPECT_EQ(a.rejoin_reason, b.rejoin_reason) << scale;
    ms += 1000;
  }
}

TEST(BurstDetector, TooFewWorkersOrTheRuleOffDecideNothing) {
  BurstDetector d;
  Steady(d, 2, 10, 1000);
  d.Observe(Timing("w1", 11, 0.64, 64, 1100));
  EXPECT_TRUE(d.Decide({}, Rule(), 1500).excluded.empty());
  Steady(d, 8, 10, 1000);
  d.Observe(Timing("w1", 11, 0.64, 64, 1100));
  BurstExclusionConfig off = Rule();
  off.step_factor = 0;
  EXPECT_TRUE(d.Decide({}, off, 1500).excluded.empty());
  // The rule off with workers excluded: they are waited for again.
  EXPECT_EQ(d.Decide({"w1"}, off, 1500).rejoined, std::vector<std::string>{"w1"});
}

// Through the Controller: the gate, the audit, and the window rule kept out of the way.
PolicyConfig StepPolicy() {
  PolicyConfig c;
  c.name = "test-nd-steps";
  c.policy = "non-dedicated";
  c.adjust_batch.enabled = false;
  c.safety.min_gain = 0.05;
  c.safety.cooldown_s = 120;
  c.safety.window_s = 600;
  c.safety.max_actions_per_window = 400;
  c.safety.min_live_workers = 2;
  c.safety.rollback.evaluate_after_s = 60;
  c.burst_exclusion.max_workers = 8;
  c.burst_exclusion.step_factor = 2;
  c.burst_exclusion.rejoin_factor = 1.5;
  return c;
}

class BurstControllerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto c = Controller::Create(StepPolicy());
    ASSERT_TRUE(c.ok()) << c.status();
    ctl_ = std::move(*c);
    view_ = SyncView(8, 512);  // 64 samples each
    view_.job.can_exclude_workers = true;
  }
  void Steps(int64_t step, double w3_compute_s, bool w3_probe = false) {
    std::vector<StepTiming> ts;
    for (int i = 0; i < 8; ++i) {
      const std::string id = "w" + std::to_string(i);
      if (id == "w3")
        ts.push_back(Timing(id, step, w3_compute_s, w3_probe ? 32 : 64, clock_.NowMs(), w3_probe));
      else
        ts.push_back(Timing(id, step, 0.16, 64, clock_.NowMs()));
    }
    ctl_->ObserveSteps(ts);
  }
  ReconcileResult Reconcile() {
    view_.now_ms = clock_.NowMs();
    auto r = ctl_->Reconcile(view_);
    EXPECT_TRUE(r.ok()) << r.status();
    return *r;
  }
  ReconcileResult Bursts() {
    auto r = ctl_->DecideBursts(clock_.NowMs());
    EXPECT_TRUE(r.ok()) << r.status();
    return *r;
  }
  SimulatedClock clock_;
  std::unique_ptr<Controller> ctl_;
  ClusterView view_;
};

TEST_F(BurstControllerTest, ExcludedWithinOneHeartbeatRejoinedByItsProbeAndAudited) {
  Reconcile();  // the view the step path works from
  Steps(10, 0.16);
  EXPECT_TRUE(Bursts().dispatch.empty());
  clock_.AdvanceMs(1000);
  Steps(11, 0.64);  // the burst's first step
  ReconcileResult r = Bursts();
  ASSERT_EQ(r.dispatch.size(), 1u);
  EXPECT_EQ(r.dispatch[0].kind, ActionKind::kExcludeWorkers);
  EXPECT_EQ(r.dispatch[0].excluded_workers, std::vector<std::string>{"w3"});
  EXPECT_EQ(ctl_->history().excluded_workers(), std::vector<std::string>{"w3"});
  EXPECT_TRUE(ctl_->StepRuleActive(clock_.NowMs()));

  // While it is excluded, the window rule (last window's speeds) does not touch the set, and
  // a 60 s evaluation does not roll the exclusion back on the job's throughput.
  for (int s = 0; s < 70; ++s) {
    clock_.AdvanceMs(1000);
    Steps(12 + s, 0.24, /*probe=*/true);
    EXPECT_TRUE(Bursts().dispatch.empty());
    if (s % 10 == 9) {
      view_.job.throughput = 100;  // a bad window, for whatever reason
      EXPECT_TRUE(Reconcile().dispatch.empty());
    }
  }
  EXPECT_EQ(ctl_->history().excluded_workers(), std::vector<std::string>{"w3"});

  clock_.AdvanceMs(1000);
  Steps(100, 0.08, /*probe=*/true);  // its probe is fast again
  r = Bursts();
  ASSERT_EQ(r.dispatch.size(), 1u);
  EXPECT_TRUE(r.dispatch[0].mandatory);
  EXPECT_TRUE(r.dispatch[0].excluded_workers.empty());
  EXPECT_TRUE(ctl_->history().excluded_workers().empty());
  int executed = 0;
  for (const auto& rec : ctl_->history().audit())
    executed += rec.outcome == AuditRecord::Outcome::kExecuted &&
                rec.action.kind == ActionKind::kExcludeWorkers;
  EXPECT_EQ(executed, 2);
}

// pacerd decides inside the heartbeat that brings the evidence (Reconciler::OnHeartbeat): a
// heartbeat's timings are news when the worker's step -- a finished one, or the one it is still
// computing, with its time so far -- is past the entry line, or an excluded worker's probe is
// back; anything else waits for the once-a-heartbeat round.
TEST_F(BurstControllerTest, AHeartbeatCarryingARunningSlowStepIsNewsTheRuleActsOn) {
  Reconcile();
  Steps(10, 0.16);
  EXPECT_FALSE(ctl_->ObserveHeartbeatSteps({Timing("w3", 10, 0.16, 64, clock_.NowMs())},
                                           clock_.NowMs()))
      << "no decision has measured the median yet: the housekeeping round decides first";
  EXPECT_TRUE(Bursts().dispatch.empty());
  clock_.AdvanceMs(1000);
  Steps(11, 0.16);
  EXPECT_FALSE(ctl_->ObserveHeartbeatSteps({Timing("w3", 11, 0.17, 64, clock_.NowMs())},
                                           clock_.NowMs()))
      << "an ordinary step is not news";

  // w3's step 12 has computed 0.5 s so far (a normal step takes 0.16 s): a per-step deadline.
  StepTiming running = Timing("w3", 12, 0.5, 64, clock_.NowMs() + 300);
  running.in_progress = true;
  clock_.AdvanceMs(300);
  ASSERT_TRUE(ctl_->ObserveHeartbeatSteps({Timing("w3", 11, 0.16, 64, clock_.NowMs()), running},
                                          clock_.NowMs()));
  ReconcileResult r = Bursts();
  ASSERT_EQ(r.dispatch.size(), 1u);
  EXPECT_EQ(r.dispatch[0].excluded_workers, std::vector<std::string>{"w3"});
  EXPECT_FALSE(ctl_->ObserveHeartbeatSteps({running}, clock_.NowMs()))
      << "excluded and still slow: nothing new";

  // Its probe (half its batch) is back at the median's pace: news, and the rule rejoins it.
  clock_.AdvanceMs(2000);
  Steps(14, 0.16);
  ASSERT_TRUE(ctl_->ObserveHeartbeatSteps({Timing("w3", 14, 0.08, 32, clock_.NowMs(), true)},
                                          clock_.NowMs()));
  r = Bursts();
  ASSERT_EQ(r.dispatch.size(), 1u);
  EXPECT_TRUE(r.dispatch[0].excluded_workers.empty());

  view_.job.can_exclude_workers = false;
  Reconcile();
  StepTiming late = Timing("w5", 20, 2.0, 64, clock_.NowMs());
  EXPECT_FALSE(ctl_->ObserveHeartbeatSteps({late}, clock_.NowMs()))
      << "nothing is news while a live worker cannot carry an exclusion out";
}

TEST_F(BurstControllerTest, NothingBeforeAViewOrWhileAWorkerCannotCarryItOut) {
  Steps(11, 0.64);
  EXPECT_TRUE(Bursts().dispatch.empty()) << "no view reconciled yet";
  view_.job.can_exclude_workers = false;
  Reconcile();
  EXPECT_FALSE(ctl_->StepRuleActive(clock_.NowMs()));
  EXPECT_TRUE(Bursts().dispatch.empty());
}

TEST_F(BurstControllerTest, ACooldownWhenSetStopsOneWorkerFlapping) {
  PolicyConfig c = StepPolicy();
  c.burst_exclusion.cooldown_s = 10;
  ASSERT_TRUE(ctl_->ApplyPolicy(c, clock_.NowMs()).ok());
  Reconcile();
  Steps(11, 0.64);
  ASSERT_EQ(Bursts().dispatch.size(), 1u);
  clock_.AdvanceMs(1000);
  Steps(12, 0.08, true);
  ASSERT_EQ(Bursts().dispatch.size(), 1u);  // rejoined
  clock_.AdvanceMs(1000);
  Steps(13, 0.64);  // slow again within cooldown_s
  ReconcileResult r = Bursts();
  EXPECT_TRUE(r.dispatch.empty());
  EXPECT_TRUE(ctl_->history().excluded_workers().empty());
}

TEST_F(BurstControllerTest, WithoutTimingsTheWindowRuleStillRuns) {
  // pacerd that does not feed step timings: a slow last window excludes as before.
  view_.workers[3].speed = view_.workers[3].last_window_speed = 25;
  ReconcileResult r = Reconcile();
  ASSERT_EQ(r.dispatch.size(), 1u);
  EXPECT_EQ(r.dispatch[0].kind, ActionKind::kExcludeWorkers);
  EXPECT_FALSE(ctl_->StepRuleActive(clock_.NowMs()));
}

}  // namespace
}  // namespace pacer
