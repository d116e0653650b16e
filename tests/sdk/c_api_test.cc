// The C API (worker_sdk/c_api.h) from a C translation unit (c_api_scenario.c) against an
// in-process pacerd on loopback (tests/testing/pacerd_harness.h): bad input as codes +
// messages, exactly-once reading, exclusion opt-in with release_all / resume (leases go back,
// another worker finishes, each record once), and an unreachable pacerd reported within a short
// connect budget. Also: a C client that opts in receives the exclusion pacerd's reconciler
// decides (a ScriptedJob on the simulated clock, as tests/pacerd/exclusion_test.cc drives it).
#include <gtest/gtest.h>

#include "tests/testing/pacerd_harness.h"
#include "worker_sdk/c_api.h"

extern "C" int pacer_c_api_scenario(const char* address, const char* token, char* log, size_t log_len);

namespace pacer {
namespace {

using testing::HarnessOptions;
using testing::PacerdHarness;
using testing::ScriptedJob;

TEST(CApiTest, ScenarioFromC) {
  HarnessOptions ho;
  ho.real_clock = true;
  ho.adjust = [](PacerdOptions& o) { o.sharding.heartbeat_interval_ms = 100; };
  PacerdHarness h(ho);
  ASSERT_TRUE(h.ok());
  char log[2048] = "";
  EXPECT_EQ(pacer_c_api_scenario(h.address().c_str(), h.job_token().c_str(), log, sizeof log), 0) << log;
}

// Four scripted workers (all honoring exclusion) report steps on the simulated clock under the
// burst-exclusion-1s policy (a burst of 4 s is never persistent); w3 slows to a quarter speed,
// pacerd excludes it. Then C clients that opt in connect as w3 and w0: w3's learns it is
// excluded, w0's holds the same version and is not excluded.
TEST(CApiTest, AnOptedInClientReceivesTheExclusionPacerdDecides) {
  HarnessOptions ho;
  ho.policy = "burst-exclusion-1s";
  ho.adjust = [](PacerdOptions& o) { o.sharding.heartbeat_interval_ms = 100; };
  PacerdHarness h(ho);
  ASSERT_TRUE(h.ok());
  Pacerd& pacerd = h.pacerd();
  ScriptedJob::Options jo;
  jo.workers = 4;
  jo.batch = 64;
  jo.per_sample_s = 0.04 / 64;  // 10 steps/s of 64 samples, 0.04 s at full speed
  jo.comm_s = 0.005;
  jo.honors_exclusion = true;
  ScriptedJob job(h, jo);
  ASSERT_TRUE(job.Connect().ok());
  ASSERT_TRUE(job.Run(3000).ok());
  job.SetSpeed("w3", 0.25);
  ASSERT_TRUE(job.Run(4000).ok());
  const auto [version, who] = pacerd.reconciler()->Exclusion();
  ASSERT_EQ(who, std::vector<std::string>{"w3"}) << "the burst is excluded";
  ASSERT_GT(version, 0u);

  // The trainers behind w3 and w0 restart on the C API, opting in: their heartbeats hold no
  // version yet, so pacerd's replies carry the exclusion in force.
  auto connect = [&](const char* id, pacer_client** out) {
    pacer_client_options co{};
    co.address = pacerd.address().c_str();
    co.token = pacerd.job_token().c_str();
    co.worker_id = id;
    co.node = "n-c";
    co.honors_exclusion = 1;
    pacer_error err;
    ASSERT_EQ(pacer_client_connect(&co, out, &err), PACER_OK) << err.message;
  };
  pacer_client* w3 = nullptr;
  pacer_client* w0 = nullptr;
  ASSERT_NO_FATAL_FAILURE(connect("w3", &w3));
  ASSERT_NO_FATAL_FAILURE(connect("w0", &w0));
  EXPECT_TRUE(testing::WaitFor([&] { return pacer_client_exclusion_version(w3) >= version; }, std::chrono::seconds(30)))
      << "w3 never received the exclusion";
  EXPECT_EQ(pacer_client_excluded(w3), 1);
  EXPECT_TRUE(testing::WaitFor([&] { return pacer_client_exclusion_version(w0) >= version; }, std::chrono::seconds(30)))
      << "w0 never received the exclusion version";
  EXPECT_EQ(pacer_client_excluded(w0), 0);
  pacer_client_destroy(w0, 1000);
  pacer_client_destroy(w3, 1000);
}

TEST(CApiTest, UnreachablePacerdIsUnavailable) {
  pacer_client_options o{};
  o.address = "127.0.0.1:1";
  o.token = "t";
  o.worker_id = "w";
  o.connect_budget_ms = 500;
  pacer_client* c = nullptr;
  pacer_error err;
  EXPECT_EQ(pacer_client_connect(&o, &c, &err), PACER_UNAVAILABLE) << err.message;
  EXPECT_EQ(err.code, PACER_UNAVAILABLE);
  EXPECT_NE(std::string(err.message).find("127.0.0.1:1"), std::string::npos) << err.message;
  EXPECT_EQ(c, nullptr);
  pacer_client_destroy(nullptr, 0);  // no-op
}

}  // namespace
}  // namespace pacer
