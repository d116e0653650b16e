// Scenario files: every shipped one loads; malformed ones are refused with file, line, field.
#include <gtest/gtest.h>

#include <filesystem>

#include "sim/scenario.h"

namespace pacer::sim {
namespace {

constexpr char kGood[] = R"(name: t
seed: 3
job: {mode: sync, workers: 8, workers_per_node: 4, global_batch: 64, total_samples: 6400}
speeds: {median: 100}
)";

TEST(ScenarioLoader, EveryShippedScenarioLoads) {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(PACER_SOURCE_DIR "/sim/scenarios")) {
    if (e.path().extension() != ".yaml") continue;
    ++n;
    absl::StatusOr<Scenario> sc = LoadScenarioFile(e.path().string());
    EXPECT_TRUE(sc.ok()) << sc.status();
  }
  EXPECT_GE(n, 9);
}

TEST(ScenarioLoader, ReadsEveryKeyOfTheBaseFormat) {
  absl::StatusOr<Scenario> sc = ParseScenario(R"(name: mixed-hardware
seed: 7
job: {mode: sync, workers: 64, workers_per_node: 8, global_batch: 4096, total_samples: 20000000,
      sync_cost_s: 0.02, restart_cost_s: 120, batch_cap: 256}
speeds: {median: 400, sigma: 0.05, groups: [{fraction: 0.25, factor: 0.5}]}
noise: 0.05
events:
  - {at_s: 600, kind: slowdown, worker: 3, factor: 0.5, duration_s: 0}
  - {at_s: 0, kind: transient, rate_per_worker_hour: 2, factor: 0.3, mean_duration_s: 30}
  - {at_s: 1200, kind: node_contention, node: 2, factor: 0.6, duration_s: 3600}
  - {at_s: 1800, kind: failure, worker: 10}
)", "x.yaml");
  ASSERT_TRUE(sc.ok()) << sc.status();
  EXPECT_EQ(sc->job.workers, 64);
  EXPECT_EQ(sc->nodes(), 8);
  ASSERT_EQ(sc->events.size(), 4u);
  EXPECT_EQ(sc->events[2].kind, EventKind::kNodeContention);
  EXPECT_EQ(sc->events[2].node, 2);
  EXPECT_DOUBLE_EQ(sc->speeds.groups[0].factor, 0.5);
}

void ExpectRefused(const std::string& text, const std::string& where, const std::string& field) {
  absl::StatusOr<Scenario> sc = ParseScenario(text, "bad.yaml");
  ASSERT_FALSE(sc.ok());
  EXPECT_EQ(sc.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string msg(sc.status().message());
  EXPECT_NE(msg.find(where), std::string::npos) << msg;
  EXPECT_NE(msg.find(field), std::string::npos) << msg;
}

TEST(ScenarioLoader, UnknownKeyNamesFileLineAndField) {
  ExpectRefused(std::string(kGood) + "speeds2: 1\n", "bad.yaml:5:", "field 'speeds2': unknown field");
  ExpectRefused(R"(name: t
seed: 3
job: {mode: sync, workers: 8, workerz: 4, global_batch: 64, total_samples: 6400}
speeds: {median: 100}
)", "bad.yaml:3:", "field 'job.workerz': unknown field");
  ExpectRefused(std::string(kGood) + "events:\n  - {at_s: 1, kind: slowdown, worker: 1, factr: 0.5}\n",
                "bad.yaml:6:", "field 'events[0].factr'");
}

TEST(ScenarioLoader, BadValuesAreLocated) {
  ExpectRefused(R"(name: t
seed: 3
job: {mode: sink, workers: 8, global_batch: 64, total_samples: 6400}
speeds: {median: 100}
)", "bad.yaml:3:", "field 'job.mode'");
  ExpectRefused(R"(name: t
seed: 3
job: {mode: sync, workers: -2, global_batch: 64, total_samples: 6400}
speeds: {median: 100}
)", "bad.yaml:3:", "field 'job.workers'");
  ExpectRefused(std::string(kGood) + "noise: lots\n", "bad.yaml:5:", "field 'noise'");
  ExpectRefused(std::string(kGood) + "noise_dist: gaussian\n", "bad.yaml:5:", "field 'noise_dist'");
  ExpectRefused(std::string(kGood) + "sim: {decision_heartbeats: 2}\n", "bad.yaml:5:",
                "field 'sim.decision_heartbeats'");
  {
    absl::StatusOr<Scenario> sc = ParseScenario(
        std::string(kGood) +
            "noise: 0.12\nnoise_dist: exponential\nsim: {decision_heartbeats: 1, step_deadline: false}\n",
        "good.yaml");
    ASSERT_TRUE(sc.ok()) << sc.status();
    EXPECT_EQ(sc->noise_dist, NoiseDist::kExponential);
    EXPECT_EQ(sc->sim.decision_heartbeats, 1);
    EXPECT_FALSE(sc->sim.step_deadline);
    EXPECT_FALSE(sc->sim.trainer_deadline);  // the default: trainers that do not keep the step line
    // The defaults model what pacerd does: the decision in the reply to the heartbeat that
    // carried the step timings, and the running step's time so far in the heartbeat.
    absl::StatusOr<Scenario> plain = ParseScenario(kGood, "good.yaml");
    ASSERT_TRUE(plain.ok()) << plain.status();
    EXPECT_EQ(plain->sim.decision_heartbeats, 0);
    EXPECT_TRUE(plain->sim.step_deadline);
  }
  ExpectRefused(std::string(kGood) + "events:\n  - {at_s: 1, kind: slowdown, worker: 99, factor: 0.5}\n",
                "bad.yaml:6:", "field 'events[0].worker'");
  ExpectRefused(std::string(kGood) + "events:\n  - {at_s: 1, kind: meteor}\n", "bad.yaml:6:",
                "field 'events[0].kind'");
  ExpectRefused(std::string(kGood) + "events:\n  - {at_s: 1, kind: hot_server, server: 0}\n",
                "bad.yaml:", "field 'events[0].server'");
}

TEST(ScenarioLoader, MissingAndDuplicateFields) {
  ExpectRefused("name: t\nseed: 1\nspeeds: {median: 1}\n", "bad.yaml:1:", "field 'job': is required");
  ExpectRefused(std::string(kGood) + "seed: 4\n", "bad.yaml:5:", "field 'seed': appears twice");
}

TEST(ScenarioLoader, MalformedYamlIsAnErrorNotACrash) {
  ExpectRefused("name: [unclosed\n", "bad.yaml:", "malformed YAML");
  ExpectRefused("", "bad.yaml", "empty");
  ExpectRefused("- a\n- b\n", "bad.yaml:1:", "mapping");
}

}  // namespace
}  // namespace pacer::sim
