// The differential test: one scripted trace drives the simulator's job
// model twice -- once on the simulator's own control plane (InProcessControlPlane: the real
// monitor, controller and sharding state called directly, as pacer-sim runs), once on a real
// in-process pacerd on the simulated clock (PacerdControlPlane: its services, agent registry and
// reconciler) -- and the two make the same sequence of decisions, for every preset and baseline.
//
// A decision is one audit record: time, outcome, kind, target, payload (DescribeAction: the
// plan's version, effective step, global batch and per-worker micro-batches x accumulation; the
// allocations; the nodes), reason, veto reason, predicted gain, repeats and rollback. Both
// control planes are asked at the same model instants (the model's window closes, reconciles and
// heartbeats), so the times must match to the millisecond: no tolerance.
//
// Traces (tests/sim/testdata/): a sync job and a PS job of 16 workers for six simulated minutes,
// each with a persistent straggler, a short burst and a worker crash; the PS one a hot server.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "sim/comparison.h"
#include "sim/job_simulation.h"
#include "sim/scenario.h"
#include "sim/speed_model.h"
#include "tests/testing/pacerd_control_plane.h"

namespace pacer::sim {
namespace {

std::string PolicyFile(const std::string& name) {
  const bool baseline = name == "none" || name == "backup-workers" || name == "lb-bsp" ||
                        name == "timeout-relaunch";
  return std::string(PACER_SOURCE_DIR "/policies/") + (baseline ? "baseline-" : "") + name + ".yaml";
}

std::string Line(const Decision& d) {
  return absl::StrFormat("t=%.3f %s %s %s | %s | %s | veto: %s | gain %.6f x%d%s",
                         (d.time_ms - kSimStartMs) / 1000.0, d.outcome, d.kind, d.target, d.detail,
                         d.reason, d.veto_reason, d.predicted_gain, d.repeats,
                         d.rolled_back ? " rolled back" : "");
}

std::vector<std::string> Lines(const std::vector<Decision>& ds) {
  std::vector<std::string> out;
  for (const Decision& d : ds) out.push_back(Line(d));
  return out;
}

struct Case {
  std::string trace;
  std::string policy;
};

class Differential : public ::testing::TestWithParam<Case> {};

TEST_P(Differential, PacerdAndSimulatorDecideAlike) {
  const Case& c = GetParam();
  absl::StatusOr<Scenario> sc =
      LoadScenarioFile(std::string(PACER_SOURCE_DIR "/tests/sim/testdata/") + c.trace + ".yaml");
  ASSERT_TRUE(sc.ok()) << sc.status();
  absl::StatusOr<PolicyChoice> policy = ResolvePolicy(c.policy, PACER_SOURCE_DIR "/policies");
  ASSERT_TRUE(policy.ok()) << policy.status();
  const SpeedModel model(*sc);
  const ControlPlaneJob job = ControlPlaneJobFor(*sc);

  // 1. The simulator's own control plane.
  absl::StatusOr<std::unique_ptr<InProcessControlPlane>> own = InProcessControlPlane::Create(
      policy->config, MonitorOptionsForPolicy(policy->config), job, kSimStartMs);
  ASSERT_TRUE(own.ok()) << own.status();
  absl::StatusOr<PolicyRun> sim_run = RunPolicyOn(model, policy->config, c.policy, sc->sim.max_sim_s, **own);
  ASSERT_TRUE(sim_run.ok()) << sim_run.status();

  // 2. A real pacerd deciding, the same model carrying its decisions out.
  testing::PacerdControlPlane pacerd(PolicyFile(c.policy), job, kSimStartMs);
  ASSERT_TRUE(pacerd.ok());
  absl::StatusOr<PolicyRun> pacerd_run = RunPolicyOn(model, policy->config, c.policy, sc->sim.max_sim_s, pacerd);
  ASSERT_TRUE(pacerd_run.ok()) << pacerd_run.status();
  EXPECT_TRUE(pacerd.errors().empty()) << pacerd.errors().front();

  const std::vector<std::string> a = Lines((*own)->Decisions());
  const std::vector<std::string> b = Lines(pacerd.Decisions());
  if (getenv("PACER_DIFF_DUMP")) {  // both sequences in full, for a reader chasing a difference
    for (const std::string& l : a) std::printf("simulator %s\n", l.c_str());
    for (const std::string& l : b) std::printf("pacerd    %s\n", l.c_str());
  }
  size_t first = 0;
  while (first < a.size() && first < b.size() && a[first] == b[first]) ++first;
  std::string shown;
  for (size_t i = first; i < std::max(a.size(), b.size()) && i < first + 4; ++i) {
    absl::StrAppend(&shown, "\n  #", i, "\n    simulator: ", i < a.size() ? a[i] : "(none)",
                    "\n    pacerd:    ", i < b.size() ? b[i] : "(none)");
  }
  EXPECT_TRUE(a == b) << c.trace << " / " << c.policy << ": " << a.size() << " vs " << b.size()
                  << " decisions, the first " << first << " alike; from there:" << shown;
  // What was compared (ctest --output-on-failure / -V shows it).
  int executed = 0;
  for (const Decision& d : (*own)->Decisions()) executed += d.outcome == "executed";
  std::printf("[differential] %s / %s: %zu decisions (%d executed), %zu alike\n", c.trace.c_str(),
              c.policy.c_str(), a.size(), executed, first);
  // The model saw the same job both times only while the decisions agreed.
  if (a == b) {
    EXPECT_EQ(sim_run->plans, pacerd_run->plans);
    EXPECT_EQ(sim_run->restarts, pacerd_run->restarts);
    EXPECT_EQ(sim_run->exclusions, pacerd_run->exclusions);
  }
}

std::vector<Case> Cases() {
  std::vector<Case> out;
  for (const char* trace : {"differential-sync", "differential-ps"})
    for (const std::string& p : DefaultPolicies()) out.push_back({trace, p});
  return out;
}

INSTANTIATE_TEST_SUITE_P(EveryPolicy, Differential, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           std::string n = i.param.trace.substr(13) + "_" + i.param.policy;
                           for (char& ch : n)
                             if (ch == '-') ch = '_';
                           return n;
                         });

}  // namespace
}  // namespace pacer::sim
