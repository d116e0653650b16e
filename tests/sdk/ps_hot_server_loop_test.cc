// A hot parameter server, the whole loop: monitor → controller →
// reconciler → agent → pacer-ps restart, with no step called by hand except the clock.
//
// An in-process pacerd (tests/testing/pacerd_harness.h) runs on a SimulatedClock; every 100 ms
// of it the harness runs production's housekeeping step (lease expiry, the monitor's windows,
// a reconcile when due). A real
// pacer-agent supervises three real pacer-ps servers, ps0..ps2 (--worker-id-prefix ps, the
// names a PsClient reports latency under), each with a --state-dir. Rows are pushed to ps0
// through a PsClient. Four scripted async workers then report their steps and, as the CTR
// trainer does (PsClient::ReportLatency), the mean latency they saw to each server: ps0 at four
// times the others' (the monitor needs three servers for a median). Once ps0 is a persistent
// hot server, the non-dedicated policy proposes RESTART_SERVER, the reconciler executes it and
// hands it to the agent dispatcher, the agent restarts exactly ps0, and its rows survive (the
// agent's SIGTERM makes pacer-ps save its snapshot). Every wait is a condition with a deadline.
#include <signal.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>

#include "agent/agent_registry.h"
#include "common/auth.h"
#include "tests/testing/pacerd_harness.h"
#include "worker_sdk/ps/parameter_store.h"
#include "worker_sdk/ps/ps_client.h"

namespace pacer {
namespace {

using testing::BinaryPath;
using testing::HarnessOptions;
using testing::PacerdHarness;
using testing::ReadFileOrEmpty;
using testing::Subprocess;
using testing::WaitFor;
using namespace std::chrono_literals;

// An async job under hot-server-restart-1s: only the server rule on; one-second windows, hot
// in 2 of the last 3 → persistent. The cooldown outlasts the test's simulated time: one
// restart per server at most.
HarnessOptions Options() {
  HarnessOptions o;
  o.policy = "hot-server-restart-1s";
  o.start_ms = RealClock::Get()->NowMs();  // the agent's node metrics carry real time
  o.adjust = [](PacerdOptions& p) {
    p.reconciler.mode = JobMode::kAsync;
    p.reconciler.restart_cost_s = 1;  // not used by the server rule; kept small regardless
    p.agents.heartbeat_interval_ms = 200;
  };
  return o;
}

constexpr int kWorkers = 4;
const std::vector<std::string> kServers = {"ps0", "ps1", "ps2"};

// The port a pacer-ps wrote to its --port-file; 0 while there is none.
int PortIn(const std::string& port_file) {
  std::smatch m;
  const std::string text = ReadFileOrEmpty(port_file);
  static const std::regex re("\"port\":([0-9]+)");
  return std::regex_search(text, m, re) ? std::stoi(m[1]) : 0;
}

PsTableSpec EmbSpec() {
  PsTableSpec s;
  s.set_name("emb");
  s.set_dim(4);
  s.mutable_optimizer()->set_kind(PsOptimizer::ADAGRAD);
  s.mutable_optimizer()->set_learning_rate(0.3f);
  s.mutable_optimizer()->set_initial_accumulator(0.1f);
  s.set_init_scale(0.05f);
  s.set_seed(11);
  return s;
}

std::unique_ptr<PsClient> ClientFor(int port, const std::string& token) {
  PsClientOptions o;
  o.servers = {"127.0.0.1:" + std::to_string(port)};
  o.token = token;  // pacer-ps checks the job token
  o.reporter = "w0";
  o.rpc_timeout_ms = 10'000;
  auto c = PsClient::Connect(o);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? std::move(*c) : nullptr;
}

class PsHotServerLoopTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(h_.ok());
    monitor_ = Monitor::NewStub(h_.channel());
    for (int i = 0; i < kWorkers; ++i) {
      grpc::ClientContext ctx;
      AttachToken(&ctx, h_.job_token());
      MonitorRegisterRequest req;
      req.set_worker_id("w" + std::to_string(i));
      req.set_node("n" + std::to_string(i));
      MonitorRegisterResponse resp;
      ASSERT_TRUE(monitor_->RegisterWorker(&ctx, req, &resp).ok());
    }
  }

  void TearDown() override {
    if (agent_.pid() > 0) {
      agent_.Signal(SIGTERM);
      EXPECT_GE(agent_.Wait(20s), 0) << "pacer-agent did not stop";
    }
    h_.Stop();
  }

  // The supervised server's pid while it runs, else 0.
  int64_t RunningPid(const std::string& id) {
    auto w = h_->agents()->Worker(id);
    return w.ok() && w->state() == WORKER_STATE_RUNNING ? w->pid() : 0;
  }
  uint32_t Restarts(const std::string& id) {
    auto w = h_->agents()->Worker(id);
    return w.ok() ? w->restarts() : 0;
  }
  std::string PortFile(const std::string& id) { return h_.dir().Sub("ps/" + id + ".port"); }

  // One simulated second of async training: every worker reports ten steps and, with each,
  // the mean latency it saw to every server (ps0 `ps0_factor` times the others); the harness
  // runs housekeeping after each 100 ms, so the window closes and pacerd reconciles.
  void Second(double ps0_factor) {
    for (int tick = 0; tick < 10; ++tick) {
      h_.Advance(100);
      ++step_;
      ReportStepsRequest req;
      for (int i = 0; i < kWorkers; ++i) {
        const std::string id = "w" + std::to_string(i);
        StepReport* r = req.add_steps();
        r->set_worker_id(id);
        r->set_step(step_);
        r->set_local_batch(64);
        r->set_samples(64);
        r->set_compute_s(0.06);
        r->set_comm_s(0.03);
        r->set_wall_s(0.09);
        r->set_time_ms(h_.clock()->NowMs());
        for (const std::string& s : kServers) {
          ServerLatency* l = req.add_server_latency();
          l->set_server_id(s);
          l->set_reporter(id);
          l->set_requests(20);
          const double mean = s == "ps0" ? 5.0 * ps0_factor : 5.0;
          l->set_mean_latency_ms(mean);
          l->set_p99_latency_ms(mean * 2);
          l->set_time_ms(h_.clock()->NowMs());
        }
      }
      grpc::ClientContext ctx;
      AttachToken(&ctx, h_.job_token());
      ReportStepsResponse resp;
      ASSERT_TRUE(monitor_->ReportSteps(&ctx, req, &resp).ok());
      ASSERT_EQ(resp.rejected(), 0u) << resp.ShortDebugString();
    }
  }

  std::vector<ActionRecord> Actions() {
    const ListActionsResponse actions = h_.Actions();
    return {actions.actions().begin(), actions.actions().end()};
  }
  std::string Audit() {
    std::string out;
    for (const auto& a : Actions())
      out += "\n" + a.kind() + " " + a.target() + " " + a.outcome() + " " + a.reason() + " " +
             a.veto_reason() + " [" + a.dispatch() + "] | " + a.inputs();
    return out;
  }
  std::vector<ActionRecord> ExecutedServerRestarts() {
    std::vector<ActionRecord> out;
    for (const auto& a : Actions())
      if (a.kind() == "RESTART_SERVER" && a.outcome() == "executed") out.push_back(a);
    return out;
  }

  PacerdHarness h_{Options()};
  std::unique_ptr<Monitor::Stub> monitor_;
  Subprocess agent_;
  uint64_t step_ = 0;
};

TEST_F(PsHotServerLoopTest, PersistentHotServerIsRestartedByItsAgentAndKeepsItsRows) {
  std::filesystem::create_directories(h_.dir().Sub("ps"));
  agent_ = Subprocess::Start(
      {BinaryPath("pacer-agent"), "--addr", h_.address(), "--token-file", h_.options().data_dir + "/job.token",
       "--node", "node-ps", "--job", "psjob", "--workers", std::to_string(kServers.size()),
       "--worker-id-prefix", "ps", "--heartbeat-ms", "200", "--stop-grace-ms", "10000", "--no-nvml",
       "--restart-scope", "worker", "--worker-credentials", "inherit", "--",  // pacer-ps needs the job token
       BinaryPath("pacer-ps"), "--server-id", "{worker_id}", "--state-dir", h_.dir().Sub("ps/{worker_id}"),
       "--port-file", h_.dir().Sub("ps/{worker_id}.port"), "--snapshot-ms", "600000"},
      {}, h_.dir().Sub("agent.log"));
  ASSERT_TRUE(WaitFor([&] {
    for (const std::string& s : kServers)
      if (RunningPid(s) == 0 || PortIn(PortFile(s)) == 0) return false;
    return true;
  }, 20s)) << ReadFileOrEmpty(h_.dir().Sub("agent.log"));
  std::map<std::string, int64_t> pids;
  for (const std::string& s : kServers) {
    pids[s] = RunningPid(s);
    EXPECT_EQ(Restarts(s), 0u) << s;
  }

  // Rows on ps0, and the same pushes on a reference store.
  std::vector<uint64_t> keys;
  for (uint64_t k = 0; k < 64; ++k) keys.push_back(k * 7919 + 5);
  ParameterStore reference;
  ASSERT_TRUE(reference.CreateTable(EmbSpec()).ok());
  std::vector<float> before;
  {
    auto c = ClientFor(PortIn(PortFile("ps0")), h_.job_token());
    ASSERT_NE(c, nullptr);
    ASSERT_TRUE(c->CreateTable(EmbSpec()).ok());
    for (int step = 0; step < 3; ++step) {
      std::vector<float> g;
      for (size_t i = 0; i < keys.size() * 4; ++i) g.push_back(0.01f * static_cast<float>((i + step) % 13) - 0.06f);
      ASSERT_TRUE(c->Push("emb", keys, g).ok());
      ASSERT_TRUE(reference.Push("emb", keys, g).ok());
    }
    ASSERT_TRUE(c->Pull("emb", keys, &before).ok());
    std::vector<float> want;
    ASSERT_TRUE(reference.Pull("emb", keys, &want).ok());
    ASSERT_EQ(before, want);
  }
  // ps0 wrote its port long ago; a port file from now on is the restarted server's.
  std::filesystem::remove(PortFile("ps0"));

  // Two even windows, then ps0 at 4× the others' latency until the controller acts.
  ASSERT_NO_FATAL_FAILURE(Second(1.0));
  ASSERT_NO_FATAL_FAILURE(Second(1.0));
  EXPECT_TRUE(ExecutedServerRestarts().empty()) << Audit();
  int hot_seconds = 0;
  while (ExecutedServerRestarts().empty() && hot_seconds < 10) {
    ASSERT_NO_FATAL_FAILURE(Second(4.0));
    ++hot_seconds;
  }
  const std::vector<ActionRecord> executed = ExecutedServerRestarts();
  ASSERT_EQ(executed.size(), 1u) << "no RESTART_SERVER after " << hot_seconds << " hot windows; audit:" << Audit();
  const ActionRecord& restart = executed[0];
  EXPECT_EQ(restart.target(), "ps0") << Audit();
  EXPECT_NE(restart.reason().find("persistent hot server"), std::string::npos) << restart.reason();
  EXPECT_NE(restart.dispatch().find("server restart sent to the agent"), std::string::npos)
      << "dispatch: " << restart.dispatch();
  // Hot in 2 of the last 3 windows: the second hot window makes it persistent.
  EXPECT_LE(hot_seconds, 3) << Audit();

  // The agent restarts ps0 (a new process, serving again) ...
  ASSERT_TRUE(WaitFor([&] {
    const int64_t pid = RunningPid("ps0");
    return pid > 0 && pid != pids["ps0"] && Restarts("ps0") == 1 && PortIn(PortFile("ps0")) != 0;
  }, 20s)) << ReadFileOrEmpty(h_.dir().Sub("agent.log"));
  EXPECT_EQ(ReadFileOrEmpty("/proc/" + std::to_string(pids["ps0"]) + "/cmdline").find("pacer-ps"),
            std::string::npos)
      << "the old ps0 still runs";
  // ... and only ps0.
  for (const std::string s : {"ps1", "ps2"}) {
    EXPECT_EQ(RunningPid(s), pids[s]) << s << " was restarted";
    EXPECT_EQ(Restarts(s), 0u) << s;
  }
  for (const auto& a : Actions())
    EXPECT_FALSE(a.kind() == "RESTART_SERVER" && a.target() != "ps0")
        << a.target() << " " << a.outcome() << " " << a.reason();

  // ps0's rows survived the restart.
  auto c = ClientFor(PortIn(PortFile("ps0")), h_.job_token());
  ASSERT_NE(c, nullptr);
  ASSERT_TRUE(c->CreateTable(EmbSpec()).ok());  // the identical spec: the table came back
  std::vector<float> after;
  ASSERT_TRUE(c->Pull("emb", keys, &after).ok());
  EXPECT_EQ(after, before) << "rows lost in the restart";
}

}  // namespace
}  // namespace pacer
