// The C API (worker_sdk/c_api.h) from a C translation unit (c_api_scenario.c) against an
// in-process pacerd on loopback: bad input as codes + messages, exactly-once reading, exclusion
// opt-in with release_all / resume (leases go back, another worker finishes, each record once),
// and an unreachable pacerd reported within a short connect budget. Also: a C client that opts
// in receives the exclusion pacerd's reconciler decides (driven on a simulated clock, as
// tests/pacerd/exclusion_test.cc does).
#include <gtest/gtest.h>

#include <fstream>
#include <map>

#include "cmd/pacerd/pacerd.h"
#include "common/auth.h"
#include "proto/pacer/monitor.grpc.pb.h"
#include "tests/testing/test_util.h"
#include "worker_sdk/c_api.h"
#include "worker_sdk/sharding_client.h"

extern "C" int pacer_c_api_scenario(const char* address, const char* token, char* log, size_t log_len);

namespace pacer {
namespace {

TEST(CApiTest, ScenarioFromC) {
  testing::TempDir dir;
  PacerdOptions o;
  o.data_dir = dir.Sub("data");
  o.listen = "127.0.0.1:0";
  o.metrics_listen = "";
  o.sharding.heartbeat_interval_ms = 100;
  auto d = Pacerd::Start(o);
  ASSERT_TRUE(d.ok()) << d.status();
  char log[2048] = "";
  EXPECT_EQ(pacer_c_api_scenario((*d)->address().c_str(), (*d)->job_token().c_str(), log, sizeof log), 0) << log;
}

// Burst exclusion as in tests/pacerd/exclusion_test.cc: a burst of 4 s is never persistent.
constexpr char kBurstPolicy[] = R"(version: 1
name: test-burst
policy: non-dedicated
detection:
  straggler_threshold: 0.8
  leader_threshold: 1.2
  window_s: 1
  persistent_windows: 5
  history_windows: 5
  min_confidence: 0.1
actions:
  adjust_batch:
    enabled: true
    accumulation: false
    hysteresis: 0.15
    lead_heartbeats: 3
    min_steps_ahead: 2
  restart:
    enabled: false
  burst_exclusion:
    max_workers: 1
safety:
  min_gain: 0.05
  cooldown_s: 1
  adjust_batch_cooldown_s: 1
  max_actions_per_window: 100
  min_live_workers: 2
  rollback:
    enabled: false
)";

// Four simulated workers (raw RPCs, all honoring exclusion) report steps on a simulated clock;
// w3 slows to a quarter speed, pacerd excludes it. Then C clients that opt in connect as w3 and
// w0: w3's learns it is excluded, w0's holds the same version and is not excluded.
TEST(CApiTest, AnOptedInClientReceivesTheExclusionPacerdDecides) {
  testing::TempDir dir;
  std::ofstream(dir.Sub("policy.yaml")) << kBurstPolicy;
  SimulatedClock clock(RealClock::Get()->NowMs());
  PacerdOptions o;
  o.data_dir = dir.Sub("data");
  o.listen = "127.0.0.1:0";
  o.metrics_listen = "";
  o.policy_file = dir.Sub("policy.yaml");
  o.reconciler.interval_ms = 1000;
  o.sharding.heartbeat_interval_ms = 100;
  o.housekeeping = false;  // the script ticks the monitor and reconciles
  auto d = Pacerd::Start(o, &clock);
  ASSERT_TRUE(d.ok()) << d.status();
  Pacerd& pacerd = **d;
  auto channel = grpc::CreateChannel(pacerd.address(), grpc::InsecureChannelCredentials());
  auto monitor = Monitor::NewStub(channel);
  const std::vector<std::string> ids = {"w0", "w1", "w2", "w3"};
  std::map<std::string, std::unique_ptr<ShardingClient>> sim;
  std::map<std::string, uint64_t> held;  // exclusion version each simulated worker holds
  std::map<std::string, bool> excluded;
  for (const auto& id : ids) {
    ShardingClientOptions co;
    co.address = pacerd.address();
    co.token = pacerd.job_token();
    co.worker_id = id;
    co.node = "n-" + id;
    auto c = ShardingClient::Connect(co);
    ASSERT_TRUE(c.ok()) << c.status();
    sim[id] = std::move(*c);
    grpc::ClientContext ctx;
    AttachToken(&ctx, pacerd.job_token());
    MonitorRegisterRequest req;
    req.set_worker_id(id);
    req.set_node(co.node);
    MonitorRegisterResponse resp;
    ASSERT_TRUE(monitor->RegisterWorker(&ctx, req, &resp).ok());
  }
  uint64_t step = 0;
  auto heartbeats = [&] {
    for (const auto& id : ids) {
      HeartbeatRequest hb;
      hb.set_step(step);
      hb.set_honors_exclusion(true);
      hb.set_exclusion_version(held[id]);
      auto r = sim[id]->Heartbeat(hb);
      ASSERT_TRUE(r.ok()) << r.status();
      for (const auto& cmd : r->commands()) {
        if (!cmd.has_exclusion()) continue;
        held[id] = cmd.exclusion().version();
        excluded[id] = cmd.exclusion().excluded();
      }
    }
  };
  // 10 steps/s of 64 samples (0.04 s at full speed); w3 at `w3_speed`. An excluded worker
  // reports a quarter-batch probe.
  auto run = [&](int seconds, double w3_speed) {
    for (int tick = 0; tick < seconds * 10; ++tick) {
      clock.AdvanceMs(100);
      ++step;
      ReportStepsRequest req;
      double slowest = 0;
      for (const auto& id : ids) {
        if (!excluded[id]) slowest = std::max(slowest, 0.04 / (id == "w3" ? w3_speed : 1.0));
      }
      for (const auto& id : ids) {
        const uint32_t samples = excluded[id] ? 16 : 64;
        const double compute = 0.04 * samples / 64 / (id == "w3" ? w3_speed : 1.0);
        StepReport* r = req.add_steps();
        r->set_worker_id(id);
        r->set_step(step);
        r->set_local_batch(64);
        r->set_samples(samples);
        r->set_compute_s(compute);
        const double wall = std::max(slowest, compute) + 0.005;
        r->set_comm_s(wall - compute);
        r->set_wall_s(wall);
        r->set_time_ms(clock.NowMs());
      }
      grpc::ClientContext ctx;
      AttachToken(&ctx, pacerd.job_token());
      ReportStepsResponse resp;
      ASSERT_TRUE(monitor->ReportSteps(&ctx, req, &resp).ok());
      if (tick % 10 == 9) {
        ASSERT_NO_FATAL_FAILURE(heartbeats());
        pacerd.monitor()->Tick();
        pacerd.reconciler()->MaybeReconcile();
        ASSERT_NO_FATAL_FAILURE(heartbeats());
      }
    }
  };
  ASSERT_NO_FATAL_FAILURE(run(3, 1.0));
  ASSERT_NO_FATAL_FAILURE(run(4, 0.25));
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
