// Noise only: on sim/scenarios/noise-only.yaml — 32 sync replicas, no
// lasting straggler, skewed per-step noise (std 12 %) — every preset finishes within 1 % of
// doing nothing, on several seeds, and loses no record and counts none twice. And the rule
// that keeps them quiet (a worker is planned at its own speed only when its steps show the
// difference: adjust_batch.speed_significance) still acts on a real straggler in the same noise.
// The real monitor, controller and sharding state in-process (the simulator library); ~5 s.
#include <gtest/gtest.h>

#include "sim/comparison.h"
#include "sim/report.h"
#include "sim/scenario.h"

namespace pacer::sim {
namespace {

Scenario NoiseOnly() {
  absl::StatusOr<Scenario> sc = LoadScenarioFile(PACER_SOURCE_DIR "/sim/scenarios/noise-only.yaml");
  EXPECT_TRUE(sc.ok()) << sc.status();
  return *sc;
}

std::vector<PolicyChoice> Policies(const std::vector<std::string>& names) {
  std::vector<PolicyChoice> out;
  for (const auto& n : names) {
    auto p = ResolvePolicy(n, PACER_SOURCE_DIR "/policies");
    EXPECT_TRUE(p.ok()) << p.status();
    out.push_back(*p);
  }
  return out;
}

void ExpectExactlyOnce(const Comparison& c) {
  for (const auto& r : c.runs) {
    SCOPED_TRACE(r.name);
    EXPECT_TRUE(r.finished);
    EXPECT_EQ(r.records_lost, 0u);
    EXPECT_EQ(r.records_duplicated, 0u);
    EXPECT_EQ(r.state_done_mismatch, 0u);
  }
}

TEST(NoiseOnly, EveryPresetWithinOnePercentOfNoneOnFiveSeeds) {
  const std::vector<PolicyChoice> policies = Policies({"none", "dedicated", "non-dedicated"});
  for (uint64_t seed : {67, 1, 2, 3, 4}) {
    Scenario sc = NoiseOnly();
    sc.seed = seed;
    SCOPED_TRACE("seed " + std::to_string(seed));
    absl::StatusOr<Comparison> c = RunComparison(sc, policies, 2);
    ASSERT_TRUE(c.ok()) << c.status();
    ExpectExactlyOnce(*c);
    const double none = c->runs[FindRun(*c, "none")].jct_s;
    for (const char* preset : {"dedicated", "non-dedicated"}) {
      const PolicyRun& r = c->runs[FindRun(*c, preset)];
      EXPECT_LE(r.jct_s, 1.01 * none)
          << preset << ": " << r.jct_s << " s vs none " << none << " s (" << r.plans
          << " plans, " << r.rollbacks << " rollbacks, " << r.exclusions << " exclusions)";
    }
  }
}

TEST(NoiseOnly, ARealStragglerInTheSameNoiseIsStillPlannedFor) {
  // Worker 5 at 0.6× from t = 300 s to the end: every step waits for it (1.67× its share)
  // until a plan gives it a share its speed can carry. The presets plan for it, and no later
  // than they did when every unflagged worker was planned at its own windowed speed.
  Scenario sc = NoiseOnly();
  ScenarioEvent slow;
  slow.kind = EventKind::kSlowdown;
  slow.at_s = 300;
  slow.worker = 5;
  slow.factor = 0.6;
  slow.contention = false;
  sc.events.push_back(slow);
  ASSERT_TRUE(ValidateScenario(sc).ok());
  std::vector<PolicyChoice> policies = Policies({"none", "dedicated", "non-dedicated"});
  for (const char* preset : {"dedicated", "non-dedicated"}) {
    PolicyChoice off = Policies({preset})[0];
    off.name = std::string(preset) + " (speed_significance 0)";
    off.config.adjust_batch.speed_significance = 0;
    policies.push_back(off);
  }
  absl::StatusOr<Comparison> c = RunComparison(sc, policies, 2);
  ASSERT_TRUE(c.ok()) << c.status();
  ExpectExactlyOnce(*c);
  const double none = c->runs[FindRun(*c, "none")].jct_s;
  for (const std::string preset : {"dedicated", "non-dedicated"}) {
    const PolicyRun& r = c->runs[FindRun(*c, preset)];
    const PolicyRun& off = c->runs[FindRun(*c, preset + " (speed_significance 0)")];
    EXPECT_GE(r.plans, 1u) << preset;
    EXPECT_LT(r.jct_s, 0.9 * none) << preset << ": " << r.jct_s << " s vs none " << none << " s";
    EXPECT_LE(r.jct_s, 1.005 * off.jct_s) << preset << ": " << r.jct_s << " s vs " << off.jct_s
                                          << " s planned on every window speed";
  }
}

}  // namespace
}  // namespace pacer::sim
